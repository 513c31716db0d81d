"""GPU tests of coverage: forwards that cannot be captured whole run split by submodule (pieces verified, the
joined forward verified against eager and faster), and transformers models capture with their default cache
outputs. Real models use random weights (``launchless.apps.zoo``)."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

import launchless as ll
from launchless.core.verify import identical

pytestmark = pytest.mark.cuda

GRAD_MODES = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}


@pytest.fixture(params=list(GRAD_MODES))
def grad_mode(request):
    return GRAD_MODES[request.param]


def _zoo(name: str):
    from launchless.apps import zoo

    if not zoo.available(name):
        pytest.skip(f"{name} needs launchless[zoo]")
    return zoo.build(name, device="cuda")


class Backbone(nn.Module):
    """Twenty small layers: launch-bound at batch 1, where a graph pays off."""

    def __init__(self, width: int = 128, depth: int = 20) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + layer(x)
        return x


class Detector(nn.Module):
    """A host copy in the root's own code (as torchvision's transform normalises with a host tensor), and a
    head that syncs on the values (a data-dependent filter): the whole forward cannot be captured."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.backbone = Backbone()
        self.head = Head()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        offsets = torch.arange(300_000, device="cpu").to(x.device)[:128]  # a host copy too large for a constant
        x = x - (offsets / 1e6).to(x.dtype)
        return self.head(self.backbone(x))


class Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.score = nn.Linear(128, 128)
        self.box = nn.Linear(128, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.score(x)
        keep = scores.mean(-1) > -10  # data-dependent: nonzero syncs
        return self.box(scores[keep.nonzero().squeeze(-1)])


def split_info(m) -> dict:
    info = m.graph_info()["split"]
    assert info is not None, m.graph_info()
    return info


def test_a_forward_refused_whole_runs_split_verified_and_faster(grad_mode, caplog) -> None:
    model = Detector().cuda().eval()
    m = ll.wrap(model, cuda_graph="auto", capture_after=1)
    x, x2 = torch.randn(1, 128, device="cuda"), torch.randn(1, 128, device="cuda")
    with grad_mode(), caplog.at_level(logging.INFO, logger="launchless"):
        assert identical(m(x), model(x))
        for _ in range(3):
            assert identical(m(x2), model(x2))
    info = split_info(m)
    pieces = {row["module"]: row for row in info["pieces"]}
    assert set(pieces) == {"backbone", "head.score", "head.box"}, info
    assert pieces["backbone"]["replays"] >= 4 and pieces["backbone"]["verification"] == ["bit-identical"]
    assert [row["module"] for row in info["eager"]] == ["(root)", "head"]
    assert "test_cuda_coverage.py" in info["eager"][0]["source"] and info["eager"][1]["source"]
    (sig,) = info["signatures"]
    assert sig["status"] == "verified" and sig["verification"]["status"] == "bit-identical", sig
    assert sig["speedup"] > 1.03 and 0 < sig["captured_share"] <= 1, sig
    lines = [r.getMessage() for r in caplog.records if "split by submodule" in r.getMessage()]
    assert len(lines) == 1 and "verified against eager" in lines[0], lines
    assert not any("forward" in mod.__dict__ for mod in model.modules()), "a route outlived the call"


def test_cuda_graph_true_runs_the_verified_split_at_first_sight(grad_mode, caplog) -> None:
    """True asks for graphs at the first call: a forward that cannot be one graph runs its verified, faster split
    from the first call on (one log line), a fresh input each call; capture_graph() still asks for the one graph,
    and its error names what a call runs instead."""
    model = Detector().cuda().eval()
    m = ll.wrap(model, cuda_graph=True)
    with grad_mode(), caplog.at_level(logging.INFO, logger="launchless"):
        for _ in range(4):
            x = torch.randn(1, 128, device="cuda")
            assert identical(m(x), model(x))
    (sig,) = split_info(m)["signatures"]
    assert sig["status"] == "verified" and sig["speedup"] > 1.03, sig
    assert {row["module"] for row in split_info(m)["pieces"]} == {"backbone", "head.score", "head.box"}
    lines = [r.getMessage() for r in caplog.records if "split by submodule" in r.getMessage()]
    assert len(lines) == 1 and "verified against eager" in lines[0], lines
    with grad_mode(), pytest.raises(ll.CaptureError) as caught:
        ll.wrap(model, cuda_graph=True).capture_graph(x)
    message = str(caught.value)
    assert "A call runs it split by submodule" in message and "backbone" in message, message


def test_cuda_graph_true_raises_where_no_split_is_faster(grad_mode) -> None:
    """A forward that cannot be one graph and whose split does not pay (one tiny layer): True raises the refusal,
    saying the split was tried and why it was dropped -- at every call, as before."""

    class Tiny(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.lin(x)
            return y[y > 0]  # data-dependent shape

    model = Tiny().cuda().eval()
    m = ll.wrap(model, cuda_graph=True)
    x = torch.randn(4, 8, device="cuda")
    for _ in range(2):
        with grad_mode(), pytest.raises(ll.CaptureError) as caught:
            m(x)
        assert "y[y > 0]" in str(caught.value) and "tried and dropped" in str(caught.value), caught.value
    with grad_mode():
        assert identical(model(x), model(x))  # eager still works


def test_a_split_that_is_not_faster_is_dropped(caplog) -> None:
    class Slow(nn.Module):  # one tiny layer: a replay costs more than its one launch
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            y = self.lin(x)
            return y + y[y > 0].sum()  # a data-dependent shape: no graphs around it either

    model = Slow().cuda().eval()
    m = ll.wrap(model, cuda_graph="auto", capture_after=1)
    x = torch.randn(2, 8, device="cuda")
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="launchless"):
        for _ in range(3):
            assert identical(m(x), model(x))
    (sig,) = split_info(m)["signatures"]
    assert sig["status"] == "dropped" and "not faster than eager" in sig["detail"], sig
    assert split_info(m)["pieces"][0]["graphs"] == 0, "the dropped split's graphs are released"
    assert any("split by submodule is dropped" in r.getMessage() for r in caplog.records)


def test_a_split_follows_the_model_when_a_submodule_is_swapped(judged_faster) -> None:
    model = Detector().cuda().eval()
    m = ll.wrap(model, cuda_graph="auto", capture_after=1)
    x = torch.randn(1, 128, device="cuda")
    with torch.no_grad():
        m(x)
        assert split_info(m)["signatures"][0]["status"] == "verified"
        model.backbone = Backbone().cuda().eval()  # new weights: the old pieces must not replay
        assert identical(m(x), model(x))
        assert identical(m(x), model(x))
    info = split_info(m)
    assert {row["module"] for row in info["pieces"]} >= {"backbone"} and info["signatures"][0]["status"] == "verified"


@pytest.mark.parametrize("name", ["tv:fasterrcnn_mobilenet_v3_large_fpn", "tv:raft_small"])
def test_real_models_blocked_by_host_work_graph_their_backbone(name: str) -> None:
    w = _zoo(name)
    m = ll.wrap(w.model, cuda_graph="auto", capture_after=1)
    with torch.no_grad():
        for _ in range(3):
            args, kwargs = w.inputs()
            assert identical(m(*args, **kwargs), w.model(*args, **kwargs)), name
    info = m.graph_info()
    if any(g["replays"] for g in info["graphs"]):  # its host copies were small: constants, one whole graph
        print(name, "whole graph", info["graphs"][0]["verification"]["status"])
        assert info["graphs"][0]["verification"]["passed"], info
        return
    info = split_info(m)
    (sig,) = info["signatures"][:1]
    print(name, sig["status"], sig["speedup"], sig["captured_share"], [p["module"] for p in info["pieces"]])
    assert sig["status"] == "verified", sig
    modules = {row["module"] for row in info["pieces"] if row["graphs"]}
    backbone = {"backbone", "backbone.body", "feature_encoder", "context_encoder"}
    assert any(piece == b or piece.startswith(b + ".") for piece in modules for b in backbone), info


def test_a_decoder_captures_whole_with_its_default_cache_and_a_cache_passed_in_runs_eager(caplog) -> None:
    transformers = pytest.importorskip("transformers")
    transformers.utils.logging.set_verbosity_error()
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(cfg).cuda().eval()
    m = ll.wrap(model, cuda_graph=True)
    ids, ids2 = (torch.randint(0, 128, (1, 8), device="cuda") for _ in range(2))
    with torch.no_grad():
        first = m(ids)
        second = m(ids2)
        want = model(ids2)
    assert identical(second, want), "logits and the returned cache, bit for bit"
    assert type(second.past_key_values) is type(want.past_key_values)
    row = m.graph_info()["graphs"][0]
    assert row["replays"] >= 1 and row["verification"]["status"] == "bit-identical", row
    nxt = torch.randint(0, 128, (1, 1), device="cuda")
    soft = ll.wrap(model, cuda_graph="auto", capture_after=1)
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="launchless"):
        cont = model(nxt, past_key_values=first.past_key_values).logits  # the returned cache keeps decoding
        decoded = soft(nxt, past_key_values=second.past_key_values).logits
        assert identical(decoded, model(nxt, past_key_values=want.past_key_values).logits)
    assert cont.shape == (1, 1, 128)
    assert any("updates it in place" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("arch", ["T5ForConditionalGeneration", "BartForConditionalGeneration"])
def test_encoder_decoders_capture_whole_with_their_default_cache(arch: str) -> None:
    transformers = pytest.importorskip("transformers")
    transformers.utils.logging.set_verbosity_error()
    torch.manual_seed(0)
    if arch.startswith("T5"):
        cfg = transformers.T5Config(vocab_size=128, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                                    decoder_start_token_id=0)  # fmt: skip
    else:
        cfg = transformers.BartConfig(vocab_size=128, d_model=64, encoder_layers=2, decoder_layers=2,
                                      encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                                      decoder_ffn_dim=128, max_position_embeddings=64)  # fmt: skip
    model = getattr(transformers, arch)(cfg).cuda().eval()
    m = ll.wrap(model, cuda_graph=True)
    ids = torch.randint(3, 128, (1, 10), device="cuda")
    dec = torch.randint(3, 128, (1, 4), device="cuda")
    with torch.no_grad():
        m(input_ids=ids, decoder_input_ids=dec)
        out = m(input_ids=ids.flip(1), decoder_input_ids=dec)
        want = model(input_ids=ids.flip(1), decoder_input_ids=dec)
    assert identical(out, want) or m.graph_info()["graphs"][0]["verification"]["passed"]
    assert m.graph_info()["graphs"][0]["replays"] >= 1


def test_a_model_in_a_split_keeps_its_hooks_and_the_user_can_call_it_plain_meanwhile() -> None:
    model = Detector().cuda().eval()
    seen = []
    model.backbone.register_forward_hook(lambda mod, args, out: seen.append(out.shape))
    m = ll.wrap(model, cuda_graph="auto", capture_after=1)
    x = torch.randn(1, 128, device="cuda")
    with torch.no_grad():
        m(x)
        count = len(seen)
        assert identical(m(x), model(x))
    assert len(seen) == count + 2, "the hook runs around the replay and in the plain call"


class HostBuilt(nn.Module):
    """Builds tensors on the host inside forward: a size from Python values and a table the module holds."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.table = torch.linspace(0, 1, 16)  # a host tensor, not a buffer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size = torch.tensor([x.shape[0], x.shape[1]], dtype=x.dtype, device=x.device)
        return self.lin(x) * self.table.to(x.device) + size.sum()


def test_host_constants_are_made_once_on_the_device_and_watched(grad_mode) -> None:
    model = HostBuilt().cuda().eval()
    m = ll.wrap(model, cuda_graph=True)
    x, x2 = torch.randn(4, 16, device="cuda"), torch.randn(4, 16, device="cuda")
    with grad_mode():
        m(x)
        assert identical(m(x2), model(x2))
        row = m.graph_info()["graphs"][0]
        assert row["replays"] >= 2 and row["verification"]["status"] == "bit-identical", row
        model.table.mul_(2)  # the host tensor changes: the graph holding its old value must not replay
        assert identical(m(x2), model(x2))
        assert m.graph_info()["invalidations"] == 1
        assert identical(m(x), model(x))


class RelativeBuckets(nn.Module):
    """SEW-D's and DeBERTa-v2's relative positions: built on the host, and a host scalar moved by ``type_as`` (an
    operation made of others, which a dispatch mode sees whole under ``inference_mode`` and as its ``_to_copy``
    under ``no_grad``)."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        steps = x.shape[1]
        relative = (torch.arange(steps)[None, :] - torch.arange(steps)[:, None]).to(x.device)
        mid = 4
        near = (relative < mid) & (relative > -mid)
        buckets = torch.where(near, torch.tensor(mid - 1).type_as(relative), relative.abs()).clamp(0, 15)
        return x @ self.embedding(buckets).sum(1).T


def test_a_host_scalar_moved_by_type_as_is_a_constant_in_both_grad_modes(grad_mode) -> None:
    model = RelativeBuckets().cuda().eval()
    m = ll.wrap(model, cuda_graph=True)
    with grad_mode():
        for _ in range(4):  # a fresh input every call
            x = torch.randn(2, 12, 16, device="cuda")
            assert identical(m(x), model(x))
    info = m.graph_info()
    assert not info["fallbacks"] and info["graphs"][0]["replays"] >= 3, info


def test_a_host_value_that_changes_every_call_is_refused_with_the_reason() -> None:
    import itertools

    counter = itertools.count()

    class Clocked(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            return self.lin(x) + torch.tensor(float(next(counter)), device=x.device)

    model = Clocked().cuda().eval()
    with torch.no_grad(), pytest.raises(ll.CaptureError, match="differs between two runs"):
        ll.wrap(model, cuda_graph=True)(torch.randn(2, 8, device="cuda"))


def test_a_split_model_called_from_threads_and_after_a_failing_call() -> None:
    import threading

    model = Detector().cuda().eval()
    m = ll.wrap(model, cuda_graph="auto", capture_after=1)
    x = torch.randn(1, 128, device="cuda")
    with torch.no_grad():
        want = model(x)
        assert identical(m(x), want)
    errors: list[BaseException] = []

    def serve() -> None:
        try:
            with torch.no_grad():
                for _ in range(20):
                    assert identical(m(x), want)
        except BaseException as exc:  # re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=serve) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    with torch.no_grad(), pytest.raises(RuntimeError):
        m(torch.randn(1, 64, device="cuda"))  # a wrong shape: the model's own error, raised as eager raises it
    assert not any("forward" in mod.__dict__ for mod in model.modules()), "a route outlived the failing call"
    with torch.no_grad():
        assert identical(m(x), want)


def test_a_split_model_converted_to_half_or_switched_to_training_and_back(caplog) -> None:
    model = Detector().cuda().eval()
    m = ll.wrap(model, cuda_graph="auto", capture_after=1)
    x = torch.randn(1, 128, device="cuda")
    with torch.no_grad():
        m(x)
        assert split_info(m)["signatures"][0]["status"] == "verified"
        model.train()  # training mode: eager with one WARNING, the split untouched
        with caplog.at_level(logging.WARNING, logger="launchless"):
            assert identical(m(x), model(x))
        assert any("training mode" in r.getMessage() for r in caplog.records)
        model.eval()
        assert identical(m(x), model(x))
        model.half()  # relocated: the split goes with the graphs and is searched again for the new dtype
        xh = x.half()
        assert identical(m(xh), model(xh))
    info = split_info(m)
    assert info["signatures"] and all("float16" in s["signature"] for s in info["signatures"]), info


def test_a_host_table_the_module_replaces_is_not_replayed_stale() -> None:
    model = HostBuilt().cuda().eval()
    m = ll.wrap(model, cuda_graph=True)
    x = torch.randn(4, 16, device="cuda")
    with torch.no_grad():
        m(x)
        model.table = torch.linspace(1, 2, 16)  # a new host tensor: the graph's constant is the old one's value
        assert identical(m(x), model(x))
        assert m.graph_info()["invalidations"] == 1


def test_a_copy_from_pinned_memory_stays_a_live_copy() -> None:
    class Staged(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 8)
            self.staging = torch.zeros(8).pin_memory()  # the caller fills it before each call

        def forward(self, x):
            return self.lin(x) + self.staging.to(x.device, non_blocking=True)

    model = Staged().cuda().eval()
    m = ll.wrap(model, cuda_graph=True)
    x = torch.randn(2, 8, device="cuda")
    with torch.no_grad():
        for step in range(4):
            model.staging.fill_(float(step))
            assert identical(m(x), model(x)), f"step {step}"
    assert m.graph_info()["invalidations"] == 0 and m.graph_info()["graphs"][0]["replays"] >= 3


def test_a_piece_captures_a_new_shape_only_once_it_repeats() -> None:
    """A detector's head sees another number of boxes per image with the same image size: after the search, a
    shape seen once runs eager in its piece instead of paying a capture on every call."""

    class Filtering(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.backbone = Backbone()
            self.box = nn.Sequential(nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 4))

        def forward(self, x):
            keep = (x.mean(-1) > 0).nonzero().squeeze(-1)  # data-dependent: the rows whose mean is positive go on
            return self.box(self.backbone(x)[keep])

    def rows(kept: int) -> torch.Tensor:
        x = torch.randn(64, 128, device="cuda").abs() * -1
        x[:kept] *= -1
        return x

    model = Filtering().cuda().eval()
    m = ll.wrap(model, cuda_graph="auto", capture_after=1)
    with torch.no_grad():
        x = rows(20)
        assert identical(m(x), model(x))
        after_search = {p["module"]: p["graphs"] for p in split_info(m)["pieces"]}
        for kept in range(21, 27):  # six new row counts, each seen once: no capture each
            x = rows(kept)
            assert identical(m(x), model(x))
        assert {p["module"]: p["graphs"] for p in split_info(m)["pieces"]} == after_search
        for _ in range(3):  # a count that repeats is captured
            x = rows(50)  # far from what random probes keep (about 32 of 64)
            assert identical(m(x), model(x))
    pieces = {p["module"]: p["graphs"] for p in split_info(m)["pieces"]}
    assert pieces["box"] == after_search["box"] + 1 and pieces["backbone"] == 1, (after_search, pieces)


def test_launchless_verify_exits_0_for_a_verified_model_and_1_for_one_that_runs_eager(tmp_path, monkeypatch) -> None:
    import textwrap

    from launchless.apps import cli

    (tmp_path / "user_models.py").write_text(
        textwrap.dedent(
            """
            import torch

            class KeepsPositive(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.lin = torch.nn.Linear(8, 8)

                def forward(self, x):
                    y = self.lin(x)
                    return y + y[y > 0].sum()  # a data-dependent shape; one small layer: no faster split

            def mlp():
                model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(8)])
                return model, lambda: ((torch.randn(4, 64),), {})

            def keeps_positive():
                return KeepsPositive(), (torch.randn(2, 8),)
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cli.main(["verify", "user_models:mlp", "--iters", "10"]) == 0
    assert cli.main(["verify", "user_models:keeps_positive", "--iters", "10"]) == 1
