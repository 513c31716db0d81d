"""GPU behaviour of the runtime: capture, verified replay, modes, eviction, invalidation, recovery.

Run on a CUDA machine: ``python -m pytest -m cuda``. Skipped elsewhere.
"""

from __future__ import annotations

import logging
import threading

import pytest
import torch
from torch import nn

import launchless as ll
from launchless.core.status import VerifyStatus
from launchless.core.verify import identical

pytestmark = pytest.mark.cuda

REAL_MODELS = [
    "timm:resnet18",
    "timm:mobilenetv3_small_100",
    "timm:efficientnet_b0",
    "timm:convnext_atto",
    "timm:vit_tiny_patch16_224",
    "hf:bert-base",
    "hf:gpt2",
    "hf:t5-small",
]
# Models seen replaying bit-identically on the H200; BERT takes a capture-dependent path in transformers.
BIT_IDENTICAL_MODELS = {n for n in REAL_MODELS if n != "hf:bert-base"}


def _zoo(name: str):
    from launchless.apps import zoo

    if not zoo.available(name):
        pytest.skip(f"{name} needs launchless[zoo]")
    return zoo.build(name, device="cuda")


class Mlp(nn.Module):
    """``depth`` layers: launch-bound, so "auto" finds its graph faster than eager and keeps it (a forward of two
    or three kernels is not: a replay's copies in and out cost as much as the launches it saves)."""

    def __init__(self, width: int = 64, depth: int = 8) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Linear(width, width)]
        for _ in range(depth - 1):
            layers += [nn.GELU(), nn.Linear(width, width)]
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class SyncsOnItem(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        if y.sum().item() > 1e9:  # the host sync under test
            y = y * 2
        return y


class CopiesFromHost(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        offsets = torch.arange(300_000).to(x.device)[:8]  # a host tensor too large to be a constant: data
        return self.lin(x) + offsets


class KeepsPositive(nn.Module):
    """A shape read from the values (a boolean mask): neither one graph nor graphs around it."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        return y + y[y > 0].sum()  # the data-dependent shape under test


class DataDependent(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[x > 0].sum().reshape(1)


class MovesInputItself(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x.to(self.lin.weight.device, non_blocking=True))


def _eager(model: nn.Module, args: tuple, kwargs: dict):
    with torch.no_grad():
        return model(*args, **kwargs)


@pytest.mark.parametrize("name", REAL_MODELS)
def test_real_model_replay_is_verified(name: str) -> None:
    w = _zoo(name)
    m = ll.wrap(w.model, cuda_graph=True)
    with torch.no_grad():
        info = m.capture_graph(*w.args, **w.kwargs)
        report = info["verification"]
        print(f"{name}: {report}")
        assert report["passed"], report
        args, kwargs = w.inputs()
        got = m(*args, **kwargs)
        want = _eager(w.model, args, kwargs)
    if name in BIT_IDENTICAL_MODELS:
        assert report["status"] == VerifyStatus.BIT_IDENTICAL
        assert identical(got, want)
    else:
        assert report["status"] in (VerifyStatus.BIT_IDENTICAL, VerifyStatus.CAPTURE_PATH, VerifyStatus.EAGER_NOISE)
        if report["status"] != VerifyStatus.BIT_IDENTICAL:
            assert report["max_abs_diff"] <= report["bound"]
    assert m.graph_info()["graphs"][0]["replays"] >= 3  # two probes + the call


def test_bert_strict_mode_names_the_class() -> None:
    w = _zoo("hf:bert-base")
    m = ll.wrap(w.model, cuda_graph=True, verify="strict")
    with torch.no_grad():
        try:
            info = m.capture_graph(*w.args, **w.kwargs)
        except ll.VerificationError as exc:
            assert exc.report["status"] in (VerifyStatus.CAPTURE_PATH, VerifyStatus.EAGER_NOISE)
            assert "strict" in str(exc) and "max abs diff" in str(exc)
            print(f"bert strict: {exc.report}")
        else:
            assert info["verification"]["status"] == VerifyStatus.BIT_IDENTICAL


def test_auto_captures_only_repeated_signatures() -> None:
    model = Mlp().cuda().eval()
    m = ll.wrap(model, cuda_graph="auto", capture_after=3)
    x = torch.randn(4, 64, device="cuda")
    with torch.no_grad():
        for i in range(2):
            m(x)
            assert m.graph_info()["graphs"] == [], f"captured after {i + 1} calls"
        for n in range(1, 6):  # one-shot shapes never pay for capture
            m(torch.randn(n + 10, 64, device="cuda"))
        assert m.graph_info()["graphs"] == []
        y = m(x)
        assert len(m.graph_info()["graphs"]) == 1
        assert identical(y, model(x))


def test_lru_eviction_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    model = Mlp().cuda().eval()
    m = ll.wrap(model, cuda_graph=True, max_graphs=2)
    with caplog.at_level(logging.WARNING, logger="launchless"), torch.no_grad():
        for n in (1, 2, 3, 4, 1):
            x = torch.randn(n, 64, device="cuda")
            assert identical(m(x), model(x))
    info = m.graph_info()
    assert len(info["graphs"]) == 2 and info["evictions"] == 3
    assert sum("max_graphs=2" in r.getMessage() for r in caplog.records) == 1


def test_auto_stops_evicting_when_more_shapes_are_in_use_than_max_graphs(caplog: pytest.LogCaptureFixture) -> None:
    model = Mlp().cuda().eval()
    m = ll.wrap(model, cuda_graph="auto", capture_after=1, max_graphs=2)
    replays = []
    with caplog.at_level(logging.INFO, logger="launchless"), torch.no_grad():
        for _ in range(5):
            for n in (1, 2, 3):  # three shapes every round, room for two graphs
                x = torch.randn(n, 64, device="cuda")
                assert identical(m(x), model(x))
            replays.append([g["replays"] for g in m.graph_info()["graphs"]])
    info = m.graph_info()
    # round 1 captures 1, 2, then 3 evicting 1; round 2 finds 1 evicted: nothing more is captured or evicted
    assert len(info["graphs"]) == 2 and info["evictions"] == 1 and info["calls_over_max_graphs"] == 4
    assert [b - a for a, b in zip(replays[1], replays[4], strict=True)] == [3, 3]  # the two held graphs replay
    assert sum("needs more than max_graphs=2 shapes at once" in r.getMessage() for r in caplog.records) == 1


def test_invalidation_after_half() -> None:
    model = Mlp().cuda().eval()
    m = ll.wrap(model, cuda_graph=True)
    with torch.no_grad():
        m(torch.randn(4, 64, device="cuda"))
        model.to(torch.float16)
        x = torch.randn(4, 64, device="cuda", dtype=torch.float16)
        y = m(x)
        assert identical(y, model(x))
    info = m.graph_info()
    assert info["invalidations"] == 1 and len(info["graphs"]) == 1


def test_invalidation_after_load_state_dict_assign_but_not_in_place() -> None:
    model = Mlp().cuda().eval()
    other = Mlp().cuda().eval()
    m = ll.wrap(model, cuda_graph=True)
    x = torch.randn(4, 64, device="cuda")
    with torch.no_grad():
        m(x)
        model.load_state_dict(other.state_dict())  # in place: same addresses, graph stays valid
        assert identical(m(x), other(x))
        assert m.graph_info()["invalidations"] == 0
        model.load_state_dict({k: v.clone() * 2 for k, v in other.state_dict().items()}, assign=True)
        y = m(x)
        assert identical(y, model(x)) and not identical(y, other(x))
    assert m.graph_info()["invalidations"] == 1


def test_invalidation_after_submodule_swap() -> None:
    model = Mlp().cuda().eval()
    m = ll.wrap(model, cuda_graph=True)
    x = torch.randn(4, 64, device="cuda")
    with torch.no_grad():
        m(x)
        model.net[2] = nn.Linear(64, 64).cuda()
        assert identical(m(x), model(x))
    assert m.graph_info()["invalidations"] == 1


def test_item_raises_documented_error_where_one_graph_is_asked_for_and_process_recovers() -> None:
    """``capture_graph()`` asks for the one graph, which ``.item()`` refuses: named, with its line and the fixes. A
    call replays graphs around the read instead (checked at every replay: tests/test_cuda_region_split.py)."""
    model = SyncsOnItem().cuda().eval()
    bad = ll.wrap(model, cuda_graph=True)
    x = torch.randn(2, 8, device="cuda")
    with torch.no_grad(), pytest.raises(ll.CaptureError) as info:
        bad.capture_graph(x)
    message = str(info.value)
    assert "SyncsOnItem.forward" in message and "host sync" in message
    assert "_local_scalar_dense" in message
    assert "test_cuda_runtime.py" in message and "y.sum().item()" in message
    assert "cuda_graph=False" in message and "'auto'" in message and "split" in message
    # The process is not poisoned: eager works, the same capture raises again, calls work, and other models capture.
    with torch.no_grad():
        eager = SyncsOnItem().cuda().eval()
        assert eager(x).shape == (2, 8)
        with pytest.raises(ll.CaptureError):
            bad.capture_graph(x)
        auto = ll.wrap(model, capture_after=1)
        for _ in range(3):
            fresh = torch.randn(2, 8, device="cuda")
            assert identical(auto(fresh), model(fresh))
        good_model = Mlp().cuda().eval()
        good = ll.wrap(good_model, cuda_graph=True)
        z = torch.randn(3, 64, device="cuda")
        assert identical(good(z), good_model(z))
    torch.cuda.synchronize()


def test_host_copy_names_the_copy_and_the_line() -> None:
    m = ll.wrap(CopiesFromHost().cuda().eval(), cuda_graph=True)
    with torch.no_grad(), pytest.raises(ll.CaptureError) as info:
        m(torch.randn(2, 8, device="cuda"))
    message = str(info.value)
    assert "CPU<->GPU copy" in message and "torch.arange(300_000).to(x.device)" in message
    assert info.value.source and "test_cuda_runtime.py" in info.value.source


def test_data_dependent_shape_is_refused() -> None:
    m = ll.wrap(DataDependent().cuda().eval(), cuda_graph=True)
    with torch.no_grad(), pytest.raises(ll.CaptureError) as info:
        m(torch.randn(16, device="cuda"))
    assert "x[x > 0]" in str(info.value)


def test_auto_falls_back_with_one_log_line(caplog: pytest.LogCaptureFixture) -> None:
    model = KeepsPositive().cuda().eval()
    m = ll.wrap(model, cuda_graph="auto", capture_after=1)
    x = torch.randn(2, 8, device="cuda")
    with caplog.at_level(logging.INFO, logger="launchless"), torch.no_grad():
        for _ in range(5):
            assert identical(m(x), model(x))
    lines = [r for r in caplog.records if "cannot be captured whole" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in caplog.records]  # the split's decision, once
    fallback = m.graph_info()["fallbacks"][0]
    assert fallback["reason"] == "data-dependent shape" and "test_cuda_runtime.py" in fallback["source"]


@pytest.mark.parametrize("pinned", [False, True])
def test_cpu_tensor_input_is_copied_straight_into_the_static_buffer(pinned: bool) -> None:
    model = MovesInputItself().cuda().eval()
    m = ll.wrap(model, cuda_graph=True)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(2, 8)
            x = x.pin_memory() if pinned else x
            y = m(x)
            assert y.is_cuda and identical(y, model(x))
    assert m.graph_info()["graphs"][0]["signature"].startswith("(float32[2x8]@cpu")


def test_static_outputs_and_static_input_passthrough() -> None:
    model = Mlp().cuda().eval()
    m = ll.wrap(model, cuda_graph=True, outputs="static")
    with torch.no_grad():
        a, b = torch.randn(4, 64, device="cuda"), torch.randn(4, 64, device="cuda")
        ya = m(a)
        want_a = model(a)
        assert identical(ya, want_a)
        yb = m(b)
        assert yb is ya and identical(ya, model(b))  # documented: overwritten by the next replay
        graph = next(iter(m._cache.graphs.values()))
        static_input = graph.static_leaves[0]
        static_input.copy_(a)
        assert identical(m(static_input), want_a)


def test_autocast_gets_its_own_graph() -> None:
    model = Mlp().cuda().eval()
    m = ll.wrap(model, cuda_graph=True)
    x = torch.randn(4, 64, device="cuda")
    with torch.no_grad():
        fp32 = m(x)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            bf16 = m(x)
            want = model(x)
    assert bf16.dtype == torch.bfloat16 and identical(bf16, want)
    assert fp32.dtype == torch.float32
    assert len(m.graph_info()["graphs"]) == 2


def test_grad_mode_and_training_mode_run_eager() -> None:
    model = Mlp().cuda()
    m = ll.wrap(model, cuda_graph=True)
    x = torch.randn(4, 64, device="cuda")
    m.eval()
    y = m(x)  # grad mode on: autograd must record, so eager
    assert y.requires_grad
    m.train()
    with torch.no_grad():
        m(x)
    info = m.graph_info()
    assert info["graphs"] == [] and len(info["eager_calls"]) == 2


def test_two_threads_capture_at_once() -> None:
    models = [Mlp().cuda().eval() for _ in range(2)]
    wrapped = [ll.wrap(model, cuda_graph=True) for model in models]
    inputs = [torch.randn(8, 64, device="cuda") for _ in range(2)]
    errors: list[BaseException] = []
    results: list = [None, None]

    def work(i: int) -> None:
        try:
            with torch.no_grad(), torch.cuda.stream(torch.cuda.Stream()):
                for _ in range(5):
                    results[i] = wrapped[i](inputs[i])
                torch.cuda.current_stream().synchronize()
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    with torch.no_grad():
        for i in range(2):
            assert identical(results[i], models[i](inputs[i]))
            assert wrapped[i].graph_info()["graphs"][0]["verification"]["status"] == VerifyStatus.BIT_IDENTICAL


def test_release_graphs_frees_the_pool() -> None:
    model = Mlp(1024).cuda().eval()
    m = ll.wrap(model, cuda_graph=True)
    with torch.no_grad():
        m(torch.randn(64, 1024, device="cuda"))
    assert m.graph_info()["pool_bytes"] > 0
    m.release_graphs()
    info = m.graph_info()
    assert info["graphs"] == [] and info["pool_bytes"] == 0
    with torch.no_grad():
        x = torch.randn(64, 1024, device="cuda")
        assert identical(m(x), model(x))


class Noisy(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.rand_like(x)


def test_random_ops_advance_on_every_replay() -> None:
    m = ll.wrap(Noisy().cuda().eval(), cuda_graph=True, verify="off")
    x = torch.zeros(1024, device="cuda")
    with torch.no_grad():
        a, b, c = m(x), m(x), m(x)
    assert len(m.graph_info()["graphs"]) == 1 and m.graph_info()["graphs"][0]["replays"] == 3
    assert not identical(a, b) and not identical(b, c)  # graph-safe RNG: not frozen at capture


def test_random_ops_verify_bit_identically_from_one_generator_state() -> None:
    """Eager and the replay draw the same numbers from the same generator state: verification runs both from one
    state, and the call that captured returns eager's draws and leaves the generator where eager leaves it."""
    model = Noisy().cuda().eval()
    m = ll.wrap(model, cuda_graph=True)
    x = torch.zeros(1024, device="cuda")
    with torch.no_grad():
        torch.manual_seed(5)
        want = model(x)
        after = torch.cuda.get_rng_state()
        torch.manual_seed(5)
        got = m(x)
    assert identical(got, want) and torch.equal(torch.cuda.get_rng_state(), after)
    assert m.graph_info()["graphs"][0]["verification"]["status"] == VerifyStatus.BIT_IDENTICAL


class CaptureAware(nn.Module):
    """Takes another path under capture, like transformers' SDPA mask check: same math, other rounding."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        if torch.cuda.is_current_stream_capturing():  # the capture-dependent branch under test
            return y * 3 / 3
        return y


def test_capture_dependent_path_is_named_measured_and_bounded() -> None:
    model = CaptureAware().cuda().eval()
    m = ll.wrap(model, cuda_graph=True)
    x = torch.randn(16, 64, device="cuda")
    with torch.no_grad():
        report = m.capture_graph(x)["verification"]
    assert report["status"] == VerifyStatus.CAPTURE_PATH and report["passed"]
    assert 0 < report["max_abs_diff"] <= report["bound"]
    assert "reproduces the graph bit for bit" in report["detail"]
    assert any("test_cuda_runtime.py" in branch for branch in report["capture_branches"])
    strict = ll.wrap(CaptureAware().cuda().eval(), cuda_graph=True, verify="strict")
    with torch.no_grad(), pytest.raises(ll.VerificationError) as info:
        strict(x)
    assert "capture-path" in str(info.value) and "strict" in str(info.value)


def test_torchvision_detector_error_names_the_blocker_in_torchvision_and_the_split() -> None:
    """The transform's host copies (mean, std, image sizes) are host constants now; the proposal step's
    data-dependent shapes are what refuse the whole graph, and the message names the split a call runs."""
    w = _zoo("tv:fasterrcnn_mobilenet_v3_large_fpn")
    m = ll.wrap(w.model, cuda_graph=True)
    with torch.no_grad(), pytest.raises(ll.CaptureError) as info:
        m.capture_graph(*w.args, **w.kwargs)
    print(info.value)
    assert info.value.reason in ("data-dependent shape", "host sync"), info.value.reason
    assert "torchvision" in info.value.source and "FasterRCNN.forward" in str(info.value)
    assert "runs it split by submodule" in str(info.value) and "backbone" in str(info.value)
    with torch.no_grad():  # eager still works afterwards
        assert isinstance(w.model(*w.args, **w.kwargs), list)


class NestedOutputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> dict:
        y = self.lin(x)
        return {"y": y, "more": [(y + 1,), {"z": y * 2}]}


def test_nested_outputs_survive_the_next_replay() -> None:
    model = NestedOutputs().cuda().eval()
    m = ll.wrap(model, cuda_graph=True)
    a, b = torch.randn(2, 8, device="cuda"), torch.randn(2, 8, device="cuda")
    with torch.no_grad():
        ya = m(a)
        yb = m(b)
        assert identical(ya, model(a)) and identical(yb, model(b))
    assert m.graph_info()["graphs"][0]["verification"]["status"] == VerifyStatus.BIT_IDENTICAL


class TakesAList(Mlp):
    def forward(self, xs: list[torch.Tensor]) -> torch.Tensor:
        return self.net(xs[0])


def test_nested_input_requiring_grad_runs_eager() -> None:
    model = TakesAList().cuda().eval().requires_grad_(False)
    m = ll.wrap(model, cuda_graph=True)
    x = torch.randn(2, 64, device="cuda", requires_grad=True)
    y = m([x])
    y.sum().backward()
    assert x.grad is not None and m.graph_info()["graphs"] == []


def test_full_address_check_sees_a_single_data_swap() -> None:
    model = Mlp().cuda().eval()
    m = ll.wrap(model, cuda_graph=True, address_check="full")
    x = torch.randn(4, 64, device="cuda")
    with torch.no_grad():
        m(x)
        model.net[0].bias.data = torch.randn(64, device="cuda")
        assert identical(m(x), model(x))
    assert m.graph_info()["invalidations"] == 1


class _Denoiser(nn.Module):
    """A float timestep indexing a noise schedule (diffusers' pattern): random timesteps index out of range. Cast by
    ``.long()`` or by ``type_as`` an integer buffer (an operation made of others, which a dispatch mode sees whole
    under ``inference_mode``)."""

    def __init__(self, cast: str = "long") -> None:
        super().__init__()
        self.cast = cast
        self.conv = nn.Conv2d(3, 3, 3, padding=1)
        self.register_buffer("alphas", torch.linspace(1, 0, 1000))
        self.register_buffer("steps", torch.zeros(1, dtype=torch.long))

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        index = t.long() if self.cast == "long" else t.type_as(self.steps)
        return self.conv(x) * self.alphas[index].view(-1, 1, 1, 1)


@pytest.mark.parametrize("grad_mode", [torch.no_grad, torch.inference_mode], ids=["no_grad", "inference_mode"])
@pytest.mark.parametrize("cast", ["long", "type_as"])
def test_a_float_timestep_is_verified_on_the_calls_own_values(grad_mode, cast: str) -> None:
    model = _Denoiser(cast).cuda().eval()
    m = ll.wrap(model, cuda_graph=True)
    x, t = torch.randn(4, 3, 16, 16, device="cuda"), torch.tensor([10.0, 200.0, 500.0, 999.0], device="cuda")
    with grad_mode():
        report = m.capture_graph(x, t)["verification"]
        assert report["status"] == VerifyStatus.BIT_IDENTICAL and report["probes_differ"], report
        assert report["inputs_probed_from_the_call"] == [1], report  # t, found by the warm-up's trace
        x2, t2 = torch.randn_like(x), t.flip(0)
        assert identical(m(x2, t2), _eager(model, (x2, t2), {}))


GRAD_MODES = [pytest.param(torch.no_grad, id="no_grad"), pytest.param(torch.inference_mode, id="inference_mode")]


@pytest.mark.parametrize("grad_mode", GRAD_MODES)
@pytest.mark.parametrize("mode", [True, "auto"])
def test_captures_and_replays_under_both_grad_modes(grad_mode, mode) -> None:
    model = Mlp().cuda().eval()
    m = ll.wrap(model, cuda_graph=mode, capture_after=2)
    xs = [torch.randn(4, 64, device="cuda") for _ in range(5)]
    with grad_mode():
        outs = [m(x) for x in xs]
        expected = [model(x) for x in xs]
    assert all(identical(o, e) for o, e in zip(outs, expected, strict=True))
    (graph,) = m.graph_info()["graphs"]
    assert graph["replays"] >= 3 and graph["verification"]["status"] == VerifyStatus.BIT_IDENTICAL
    assert graph["state"] == "replaying"
    assert all(o.is_inference() == (grad_mode is torch.inference_mode) for o in outs)  # as eager's would be


@pytest.mark.parametrize("made_under", GRAD_MODES)
@pytest.mark.parametrize("called_under", GRAD_MODES)
def test_inputs_made_under_one_grad_mode_replay_under_the_other(made_under, called_under) -> None:
    model = Mlp().cuda().eval()
    m = ll.wrap(model, cuda_graph=True)
    with made_under():
        xs = [torch.randn(4, 64, device="cuda") for _ in range(3)]
    with called_under():
        outs = [m(x) for x in xs]
        expected = [model(x) for x in xs]
    assert all(identical(o, e) for o, e in zip(outs, expected, strict=True))
    assert m.graph_info()["graphs"][0]["replays"] >= 3  # and the two verification probes


class LeavesAGraphAsGarbage(nn.Module):
    """Its forward drops the last plain reference to a CUDA graph held in a reference cycle and then allocates
    Python containers: with the collector at threshold 1, the cycle is collected inside the forward -- during a
    capture, unless collection is held off."""

    def __init__(self, graveyard: list) -> None:
        super().__init__()
        self.lin = nn.Linear(64, 64)
        self.graveyard = graveyard

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch._C._cuda_isCurrentStreamCapturing() and self.graveyard:  # really capturing, not a warm-up told so
            cycle = [self.graveyard.pop()]
            cycle.append(cycle)
            del cycle
            _ = [[i] for i in range(100)]  # allocations: the collector runs here
        return self.lin(x)


def test_a_graph_collected_as_garbage_during_a_capture_cannot_break_it() -> None:
    """Earlier code left CUDA graphs in reference cycles; the cyclic collector may free them at any allocation. A
    graph destroyed while this thread captures invalidates the capture (cudaGraphExecDestroy is not permitted then):
    seen as a whole training step refused after other tests had run. Collections must not run during a capture."""
    import gc

    x = torch.randn(4, 64, device="cuda")
    graveyard = []
    for _ in range(2):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = x * 2
        graveyard.append(graph)
        del graph, y
    model = LeavesAGraphAsGarbage(graveyard).cuda().eval()
    m = ll.wrap(model, cuda_graph=True)
    threshold = gc.get_threshold()
    gc.set_threshold(1)
    try:
        with torch.no_grad():
            out = m(x)
    finally:
        gc.set_threshold(*threshold)
    assert len(graveyard) == 1  # the capture dropped one graph into the collector's reach
    assert identical(out, model(x)) and len(m.graph_info()["graphs"]) == 1


# ---- "auto" keeps a whole graph only when it is faster than eager ----------------------------------------------


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_auto_keeps_a_launch_bound_graph_with_the_timing_that_settled_it(mode: str) -> None:
    """A small MLP is launch-bound: three waited-for rounds settle it, and graph_info() shows the figures; the
    judge's own replays are not counted as the caller's."""
    model = Mlp().cuda().eval()
    m = ll.wrap(model, cuda_graph="auto", capture_after=1)
    grad = torch.no_grad if mode == "no_grad" else torch.inference_mode
    with grad():
        for _ in range(3):
            x = torch.randn(4, 64, device="cuda")
            assert identical(m(x), model(x))
    (row,) = m.graph_info()["graphs"]
    speed = row["speed"]
    assert speed["speedup"] >= 1.5 and speed["graph_back_to_back_ms"] is None, speed
    assert row["replays"] == 3, row  # every call's result (the capturing one's too), none of the judge's


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_auto_drops_a_whole_graph_that_is_not_faster_and_says_so_once(
    mode: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A verified graph the judge finds no faster than eager is dropped: the calls run eager (eager's results),
    graph_info() names the stage and the figures, one log line; cuda_graph=True keeps its graph (not judged)."""
    from launchless.runtime import capture_flow
    from launchless.timing import SpeedVerdict

    def not_faster(eager, candidate, **options):
        assert options == {"min_speedup": 1.0, "settle_early": True}, options
        eager(), candidate()
        return SpeedVerdict(2.0, 2.1, 2.0, 2.1, "not faster than eager (2.100 ms against 2.000 ms a call)")

    monkeypatch.setattr(capture_flow, "judge_speed", not_faster)
    model = Mlp().cuda().eval()
    m = ll.wrap(model, cuda_graph="auto", capture_after=1)
    grad = torch.no_grad if mode == "no_grad" else torch.inference_mode
    with caplog.at_level(logging.INFO, logger="launchless"), grad():
        for _ in range(5):
            x = torch.randn(4, 64, device="cuda")
            assert identical(m(x), model(x))
    info = m.graph_info()
    assert info["graphs"] == [], info
    (refused,) = info["fallbacks"]
    assert refused["stage"] == "speed" and refused["reason"] == "not faster than eager", refused
    assert "not faster than eager (2.100 ms against 2.000 ms a call)" in refused["message"], refused
    assert sum("not faster than eager" in r.getMessage() for r in caplog.records) == 1
    explicit = ll.wrap(model, cuda_graph=True)
    with grad():
        explicit(torch.randn(4, 64, device="cuda"))
    assert len(explicit.graph_info()["graphs"]) == 1


# ---- the eager lane: a signature refused for good beside one that graphs -----------------------------------------


class MaskedAtFourRows(nn.Module):
    """Launch-bound; at 4 rows a boolean mask makes the output's shape depend on the values (refused for good: no
    submodule to split), at any other size it graphs."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(64, 64) / 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(16):
            x = torch.tanh(x @ self.weight)
        return x[x > 0] if x.shape[0] == 4 else x


@pytest.mark.parametrize("grad_mode", GRAD_MODES)
def test_the_eager_lane_of_a_refused_signature_lets_another_capture_and_replay(grad_mode) -> None:
    """The lane opens once the only signature is refused for good; a signature that graphs, first seen while it is
    open, is still captured and replayed (fresh inputs, eager's results), and with a graph held the lane stays shut.
    capture_graph() shuts it as well: its graph replays from the next call."""
    from launchless.runtime.eager_lane import OPEN_AFTER, SAMPLE

    model = MaskedAtFourRows().cuda().eval()
    wrapped = ll.wrap(model)
    with grad_mode():
        for _ in range(4 * OPEN_AFTER):
            x = torch.randn(4, 64, device="cuda")
            assert identical(wrapped(x), model(x))
        assert wrapped.graph_info()["eager_lane"]["open"]
        for _ in range(20 * SAMPLE):  # the new signature is seen at a sample, a few dozen calls in
            for rows in (4, 2):
                x = torch.randn(rows, 64, device="cuda")
                assert identical(wrapped(x), model(x))
        (graph,) = wrapped.graph_info()["graphs"]
        assert graph["signature"] == "(float32[2x64]@cuda:0)", graph
        for _ in range(2 * SAMPLE):  # with a graph held the lane stays shut: every call of it replays
            for rows in (4, 2):
                x = torch.randn(rows, 64, device="cuda")
                assert identical(wrapped(x), model(x))
        info = wrapped.graph_info()
        assert info["graphs"][0]["replays"] == graph["replays"] + 2 * SAMPLE, info["graphs"]
        assert not info["eager_lane"]["open"]
        assert [row["reason"] for row in info["fallbacks"]] == ["data-dependent shape"]

        again = ll.wrap(model)
        for _ in range(4 * OPEN_AFTER):
            again(torch.randn(4, 64, device="cuda"))
        assert again.graph_info()["eager_lane"]["open"]
        captured = again.capture_graph(torch.randn(3, 64, device="cuda"))
        x = torch.randn(3, 64, device="cuda")
        assert identical(again(x), model(x))
        (graph,) = again.graph_info()["graphs"]
        assert graph["replays"] == captured["replays"] + 1, (captured, graph)
