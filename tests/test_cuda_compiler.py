"""GPU behaviour of the torch.compile backend. Run with ``python -m pytest -m cuda``."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from launchless.compiler import backend as ll_backend
from launchless.compiler.compiled_graphs import CompiledGraphs

pytestmark = pytest.mark.cuda


def _compiled(model: nn.Module, **options):
    torch._dynamo.reset()
    ll_backend._registry.clear()  # _graphs() lists this test's graphs only
    options.setdefault("selective", False)  # these tests are about capture; selection has its own tests
    return torch.compile(model, backend=ll_backend.make_backend(**options))


def _graphs() -> list[CompiledGraphs]:
    return sorted(ll_backend._registry, key=lambda g: int(g.name.split()[-1]))


@torch.no_grad()
def test_resnet18_replays_inductor_kernels_bit_identically_without_copying_parameters() -> None:
    timm = pytest.importorskip("timm")
    model = timm.create_model("resnet18").cuda().eval()
    x = torch.randn(1, 3, 224, 224, device="cuda")
    compiled = _compiled(model)
    outs = [compiled(x) for _ in range(4)]
    (graphs,) = [g for g in _graphs() if g.graph_info()["graphs"]]
    info = graphs.graph_info()
    assert info["graphs"][0]["replays"] >= 3 and info["graphs"][0]["verification"]["status"] == "bit-identical", info
    captured = next(iter(graphs._graphs.graphs.values())).graph
    assert len(captured.tensor_slots) == 1 and info["static_inputs"] >= 60  # only the image is copied
    reference = graphs.compiled(*_inputs(graphs, x))  # Inductor's callable itself, without the graph
    assert torch.equal(outs[-1], outs[-2])
    assert torch.equal(outs[-1], reference[0] if isinstance(reference, (list, tuple)) else reference)


def _inputs(graphs: CompiledGraphs, x: torch.Tensor) -> list:
    """The flat inputs Dynamo passed last time: static ones from the captured graph, the image in its slot."""
    captured = next(iter(graphs._graphs.graphs.values())).graph
    leaves = list(captured.static_leaves)
    for i in captured.tensor_slots:
        leaves[i] = x
    return leaves


@torch.no_grad()
def test_parameters_moved_are_captured_again() -> None:
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).cuda().eval()
    x = torch.randn(8, 16, device="cuda")
    compiled = _compiled(model)
    for _ in range(3):
        compiled(x)
    fresh = {k: torch.randn_like(v) for k, v in model.state_dict().items()}
    model.load_state_dict(fresh, assign=True)  # new tensors at new addresses
    for _ in range(3):
        out = compiled(x)
    assert torch.equal(out, model(x))
    assert any(g.graph_info()["graphs"] for g in _graphs())


@torch.no_grad()
def test_graph_break_gives_two_graphs_each_captured() -> None:
    class Broken(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.a(x).relu()
            torch._dynamo.graph_break()
            return self.b(y)

    model = Broken().cuda().eval()
    x = torch.randn(4, 16, device="cuda")
    compiled = _compiled(model)
    for _ in range(4):
        out = compiled(x)
    assert torch.allclose(out, model(x), rtol=1e-5, atol=1e-6)
    captured = [g for g in _graphs() if g.graph_info()["graphs"]]
    assert len(captured) == 2, [g.graph_info() for g in _graphs()]


@torch.no_grad()
def _cycle_shapes(rounds: int, caplog: pytest.LogCaptureFixture) -> tuple[dict, list[str]]:
    """Batches 2, 3, 5 each round through a dynamic-shape graph allowed two graphs: its info and the log lines."""
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4)).cuda().eval()
    torch._dynamo.reset()
    ll_backend._registry.clear()
    compiled = torch.compile(model, backend=ll_backend.make_backend(max_graphs=2, selective=False), dynamic=True)
    with caplog.at_level(logging.INFO, logger="launchless"):
        for _ in range(rounds):
            for batch in (2, 3, 5):
                x = torch.randn(batch, 16, device="cuda")
                assert torch.allclose(compiled(x), model(x), rtol=1e-5, atol=1e-6)
    (graphs,) = [g for g in _graphs() if g.graph_info()["graphs"]]
    return graphs.graph_info(), [r.getMessage() for r in caplog.records]


def test_dynamic_shapes_one_graph_per_shape_with_eviction(caplog: pytest.LogCaptureFixture) -> None:
    info, messages = _cycle_shapes(3, caplog)
    assert len(info["graphs"]) == 2
    assert sum("evicting" in m for m in messages) == 1


def test_more_shapes_in_use_than_max_graphs_keep_the_graphs_held(caplog: pytest.LogCaptureFixture) -> None:
    info, messages = _cycle_shapes(6, caplog)  # round 2 evicts batch 2; round 4 finds it evicted and stops there
    assert len(info["graphs"]) == 2 and info["calls_over_max_graphs"] == 3, info
    assert sum("needs more than max_graphs=2 shapes at once" in m for m in messages) == 1


@torch.no_grad()
def test_a_cpu_input_runs_compiled_with_one_line(caplog: pytest.LogCaptureFixture) -> None:
    class Mixed(nn.Module):
        def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
            return x * scale.to(x.device)

    x, scale = torch.randn(4, device="cuda"), torch.tensor(2.0)
    compiled = _compiled(Mixed())
    with caplog.at_level(logging.INFO, logger="launchless"):
        for _ in range(4):
            assert torch.equal(compiled(x, scale), x * 2)
    lines = [r.getMessage() for r in caplog.records if "without a CUDA graph" in r.getMessage()]
    assert len(lines) == 1, lines


def test_training_graph_runs_compiled_with_one_line(caplog: pytest.LogCaptureFixture) -> None:
    model = nn.Linear(8, 2).cuda()
    x = torch.randn(4, 8, device="cuda")
    compiled = _compiled(model)
    with caplog.at_level(logging.INFO, logger="launchless"):
        for _ in range(3):
            compiled(x).sum().backward()
    assert model.weight.grad is not None
    lines = [r for r in caplog.records if "compiled in grad mode" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING  # the caller controls grad mode: a warning


def test_pointer_indirection_reads_new_inputs_in_place_bit_identically() -> None:
    from launchless.compiler.indirection import IndirectGraph, unavailable_reason
    from launchless.core import capture as cap
    from launchless.core.pool import new_pool
    from launchless.core.signature import flatten_inputs

    if unavailable_reason():
        pytest.skip(unavailable_reason())
    weight = torch.randn(256, 256, device="cuda")

    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ weight) + y.sin()

    x, y = torch.randn(64, 256, device="cuda"), torch.randn(64, 256, device="cuda")
    flat = flatten_inputs((x, y), {})
    graph = cap.capture(fn, flat, device=torch.device("cuda"), pool=new_pool(), keep_graph=True)
    indirect = IndirectGraph(graph)
    assert indirect.pi.patched_nodes >= 2
    for _ in range(3):
        nx, ny = torch.randn_like(x), torch.randn_like(y)  # new addresses each time
        assert torch.equal(indirect.replay_cloned([nx, ny]), fn(nx, ny))
    assert indirect.copied_bytes == 0
    odd = torch.randn(64 * 256 + 1, device="cuda")[1:].view(64, 256)  # 4-byte aligned only: copied instead
    assert torch.equal(indirect.replay_cloned([odd, y]), fn(odd, y)) and indirect.copied_bytes == odd.nbytes
    indirect.reset()
    assert torch.equal(graph.replay_cloned([x, y]), fn(x, y))  # the copying path still works afterwards


@torch.no_grad()
def test_selective_graphs_measure_decide_and_reuse_the_cached_decision(tmp_path, monkeypatch) -> None:
    from launchless.compiler import select
    from launchless.compiler.decisions import choose

    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)  # Inductor's channels-last convs round
    # differently from eager's under TF32; without it both are fp32 and close
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 3, 3, padding=1)).cuda().eval()
    x = torch.randn(1, 3, 512, 512, device="cuda")  # a large input: copying it costs
    compiled = _compiled(model, selective=True, cache_dir=str(tmp_path))
    for _ in range(4):
        out = compiled(x)
    assert torch.allclose(out, model(x), rtol=1e-4, atol=1e-5)
    (info,) = [g.graph_info() for g in _graphs() if g.graph_info()["graphs"]]
    chosen = info["graphs"][0]
    print(chosen)
    assert set(chosen["times_ms"]) >= {"no-graph", "graph"} and chosen["variant"] in chosen["times_ms"]
    assert chosen["variant"] == choose(chosen["times_ms"])  # the measured times decided
    assert len(list(tmp_path.glob("*.json"))) == 1  # the decision is on disk

    calls = []
    original = select.measure
    monkeypatch.setattr(select, "measure", lambda *a, **k: calls.append(1) or original(*a, **k))
    compiled = _compiled(model, selective=True, cache_dir=str(tmp_path))  # a new compile: the cache decides
    for _ in range(4):
        compiled(x)
    assert calls == []
    compiled = _compiled(model, selective=True, cache_dir=str(tmp_path), reprofile=True)
    for _ in range(4):
        compiled(x)
    assert calls == [1]


def test_explain_resnet18_reports_coverage_kernels_and_the_chosen_variant(tmp_path, monkeypatch) -> None:
    timm = pytest.importorskip("timm")
    import launchless as ll

    monkeypatch.setenv("LAUNCHLESS_CACHE_DIR", str(tmp_path))
    model = timm.create_model("resnet18").cuda().eval()
    explanation = ll.explain(model, torch.randn(1, 3, 224, 224, device="cuda"))
    print(explanation)
    (graph,) = explanation.graphs
    assert graph.blockers == [] and graph.info["graphs"][0]["variant"] in ("graph", "graph+pi")
    assert graph.kernels and graph.kernels > 20
    assert explanation.coverage is not None and explanation.coverage > 0.9


@torch.no_grad()
def test_cgct_rewrites_a_host_constructor_so_the_graph_captures(caplog: pytest.LogCaptureFixture) -> None:
    class Offsets(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            # built on the host (Inductor moves a bare arange to the GPU itself, not one feeding a cumsum)...
            offsets = torch.arange(x.shape[1], dtype=torch.float32).cumsum(0)
            return self.fc(x) + offsets.to(x.device)  # ...and copied to the GPU on every call

    model = Offsets().cuda().eval()
    x = torch.randn(4, 8, device="cuda")
    compiled = _compiled(model)
    with caplog.at_level(logging.INFO, logger="launchless"):
        for _ in range(4):
            out = compiled(x)
    assert torch.allclose(out, model(x), rtol=1e-5, atol=1e-6)
    (graphs,) = [g for g in _graphs() if g.cgct is not None]
    info = graphs.graph_info()
    print(info, [r.getMessage() for r in caplog.records])
    assert info["cgct"]["applied"] and info["graphs"], info  # rewritten, proven, then captured
    assert sum("CGCT rewrote host copies" in r.getMessage() for r in caplog.records) == 1


@torch.no_grad()
def test_cgct_moves_a_host_attribute_table_once_and_keeps_it_current(caplog: pytest.LogCaptureFixture) -> None:
    class Table(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 8)
            self.table = torch.linspace(0, 1, 8)  # a plain attribute: .cuda() leaves it on the host

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x) + self.table.to(x.device)  # Dynamo passes it in as a static input

    model = Table().cuda().eval()
    x = torch.randn(4, 8, device="cuda")
    compiled = _compiled(model)
    with caplog.at_level(logging.INFO, logger="launchless"):
        for _ in range(4):
            out = compiled(x)
        assert torch.allclose(out, model(x), rtol=1e-5, atol=1e-6)  # Inductor's kernels, not eager's
        (graphs,) = [g for g in _graphs() if g.cgct is not None]
        info = graphs.graph_info()
        print(info, [r.getMessage() for r in caplog.records])
        assert info["graphs"] and info["cgct"]["in_use"], info  # rewritten, proven, captured
        replays = info["graphs"][0]["replays"]
        model.table.mul_(2)  # changed in place: copied into the device tensor the graph reads
        out = compiled(x)
        assert torch.allclose(out, model(x), rtol=1e-5, atol=1e-6)  # a stale table would be off by up to 1
        assert graphs.graph_info()["graphs"][0]["replays"] == replays + 1
        assert graphs.graph_info()["cgct"]["constants_refreshed"] == 1
        model.table = torch.linspace(0, 1, 16)[:8].clone()  # re-assigned, same shape: followed as well
        assert torch.allclose(compiled(x), model(x), rtol=1e-5, atol=1e-6)
    assert sum("CGCT" in r.getMessage() for r in caplog.records) == 1  # the rewrite's line, nothing per call


class _AnchorGenerator(nn.Module):
    """torchvision's AnchorGenerator pattern: ``self.cell_anchors`` is reassigned from its own ``.to()`` in every
    forward, and the anchors are returned; a replay that cloned them would move the attribute on every call."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.cell_anchors = [torch.randn(15, 4, device="cuda")]

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.cell_anchors = [a.to(dtype=x.dtype, device=x.device) for a in self.cell_anchors]
        base = self.cell_anchors[0]
        return self.conv(x).flatten(1)[:, :60].reshape(-1, 15, 4) + base, base


@torch.no_grad()
def test_an_attribute_returned_by_the_graph_stays_put_and_the_graph_is_replayed(caplog) -> None:
    model = _AnchorGenerator().cuda().eval()
    anchors = model.cell_anchors[0]
    compiled = _compiled(model)
    x = torch.randn(2, 3, 8, 8, device="cuda")
    with caplog.at_level(logging.INFO, logger="launchless"):
        for _ in range(10):
            out, base = compiled(x)
    assert base is anchors and model.cell_anchors[0] is anchors  # as in eager: the same tensor, not a copy
    (graphs,) = [g for g in _graphs() if g.graph_info()["graphs"]]
    info = graphs.graph_info()
    assert info["graphs"][0]["replays"] >= 7 and not info["demoted_inputs"], info  # captured once, never again
    assert not [r for r in caplog.records if "moved" in r.getMessage() or "new tensor" in r.getMessage()]
    # Inductor picks its own convolution layout: equal to eager up to rounding (the graph itself is verified)
    torch.testing.assert_close(out, model.conv(x).flatten(1)[:, :60].reshape(-1, 15, 4) + anchors)


class _Reassigned(nn.Module):
    """An attribute given a new tensor by every forward: it cannot stay a static input."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.state = torch.zeros(16, device="cuda")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x) + self.state
        self.state = y.mean(0)  # a new tensor each call
        return y


@torch.no_grad()
def test_an_attribute_reassigned_every_call_becomes_a_copied_input_with_one_line(caplog) -> None:
    model, twin = _Reassigned().cuda().eval(), _Reassigned().cuda().eval()
    twin.load_state_dict(model.state_dict())
    compiled = _compiled(model)
    x = torch.randn(4, 16, device="cuda")
    with caplog.at_level(logging.INFO, logger="launchless"):
        for _ in range(12):  # the running state is carried from call to call as in eager (Inductor's rounding)
            torch.testing.assert_close(compiled(x), twin(x), rtol=1e-5, atol=1e-6)
    (graphs,) = [g for g in _graphs() if g.graph_info()["graphs"]]
    info = graphs.graph_info()
    assert len(info["demoted_inputs"]) == 1 and "state" in info["demoted_inputs"][0], info
    assert info["graphs"][0]["replays"] >= 4 and info["graphs"][0]["verification"]["status"] == "bit-identical"
    assert sum("gets a new tensor on every call" in r.getMessage() for r in caplog.records) == 1
    from launchless import explain

    explanation = explain(_Reassigned().cuda().eval(), x, calls=8, backend_options={"selective": False})
    assert any("copied like an input (reassigned every call)" in g.note for g in explanation.graphs), explanation


class _DefaultBoxes(nn.Module):
    """torchvision's DefaultBoxGenerator (SSD) pattern: box math on the host from ``arange`` and a host attribute,
    copied to the GPU. Built on the GPU, ``/ 3.0`` becomes ``* (1 / 3.0)`` and is off by an ulp: CGCT folds it."""

    def __init__(self) -> None:
        super().__init__()
        self.wh = torch.rand(4, 2) * 1.2  # on the host, as SSD's _wh_pairs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shifts = (torch.arange(0, 1024) + 0.5) / 3.0
        boxes = torch.cat((shifts.reshape(-1, 1).repeat(1, 2), self.wh.clamp(min=0, max=1).repeat(256, 1)), dim=1)
        return x * boxes.to(x.device)


@torch.no_grad()
def test_cgct_folds_host_box_math_that_the_device_would_round_differently(caplog) -> None:
    from launchless.compiler.rewrite import FOLDED

    model = _DefaultBoxes()
    x = torch.randn(1024, 4, device="cuda")
    compiled = _compiled(model)
    with caplog.at_level(logging.INFO, logger="launchless"):
        outs = [compiled(x) for _ in range(5)]
    assert all(torch.equal(out, model(x)) for out in outs)  # eager's bits: the host math ran on the host
    (graphs,) = [g for g in _graphs() if g.graph_info()["graphs"]]
    info = graphs.graph_info()
    assert info["graphs"][0]["replays"] >= 2 and info["cgct"]["in_use"], info
    assert [a.split(":")[0] for a in info["cgct"]["applied"]] == [FOLDED], info


class _BoxHead(nn.Module):
    """R-CNN's box head: roi_align on a large feature map, the boxes (with their batch index as a float) given."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 256, 3, padding=1)

    def forward(self, image: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        from torchvision.ops import roi_align

        return roi_align(self.conv(image), boxes, (7, 7), 0.25, 2, True)


@torch.no_grad()
def test_boxes_are_verified_on_the_calls_own_rows_not_random_ones() -> None:
    """Random boxes put batch indices near 10 into a batch of one: on a 56 MB feature map eager and the graph
    read far out of bounds, which ended R-CNN ResNet-50 FPN runs with a CUDA fault before this was known."""
    pytest.importorskip("torchvision")
    model = _BoxHead().cuda().eval()
    image = torch.randn(1, 3, 200, 272, device="cuda")
    corners = torch.rand(16, 2, device="cuda") * 400
    boxes = torch.cat([torch.zeros(16, 1, device="cuda"), corners, corners + 300], 1)
    compiled = _compiled(model)
    for _ in range(5):
        out = compiled(image, boxes)
    torch.cuda.synchronize()  # a fault would surface here
    (graphs,) = [g for g in _graphs() if g.graph_info()["graphs"]]
    info = graphs.graph_info()
    assert len(info["index_inputs"]) == 1 and "boxes" in info["index_inputs"][0], info
    (graph,) = info["graphs"]
    assert graph["verification"]["status"] == "bit-identical" and graph["replays"] >= 2, info
    torch.testing.assert_close(out, model(image, boxes))


@pytest.mark.parametrize(
    "grad_mode", [pytest.param(torch.no_grad, id="no_grad"), pytest.param(torch.inference_mode, id="inference_mode")]
)
def test_the_backend_captures_under_both_grad_modes(grad_mode) -> None:
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64)).cuda().eval()
    compiled = _compiled(model)
    with grad_mode():
        xs = [torch.randn(4, 64, device="cuda") for _ in range(5)]
        outs = [compiled(x) for x in xs]
        again = [compiled(x) for x in xs]  # replays on the same inputs give the same bits
    (graphs,) = [g for g in _graphs() if g.graph_info()["graphs"]]
    (row,) = graphs.graph_info()["graphs"]
    assert row["replays"] >= 8 and row["verification"]["status"] == "bit-identical"
    assert all(torch.equal(a, b) for a, b in zip(outs, again, strict=True))
    assert not torch.equal(outs[0], outs[1])  # not a stale graph


class WritesIntoItsInputs(nn.Module):
    """As pyhpc's isoneutral mixing: results written into tensors the caller passes in, and returned."""

    def forward(self, x: torch.Tensor, k: torch.Tensor, slopes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        k[1:-1] = torch.tanh(x[1:-1] * 2) + x[:-2]
        slopes[..., 0] = k * 0.5
        return k, slopes


@pytest.mark.parametrize(
    "grad_mode", [pytest.param(torch.no_grad, id="no_grad"), pytest.param(torch.inference_mode, id="inference_mode")]
)
def test_a_forward_writing_into_its_inputs_leaves_the_callers_tensors_as_eager_does(grad_mode) -> None:
    """Each call on fresh tensors: the returned tensors are the caller's own, holding what eager writes -- a graph
    that wrote its own copies of them would leave the caller's stale."""
    model = WritesIntoItsInputs()
    compiled = _compiled(model)
    with grad_mode():
        for call in range(5):
            x = torch.randn(64, 32, device="cuda")
            k, slopes = torch.randn(64, 32, device="cuda"), torch.zeros(64, 32, 2, device="cuda")
            k_eager, slopes_eager = model(x, k.clone(), slopes.clone())
            out_k, out_slopes = compiled(x, k, slopes)
            assert out_k.data_ptr() == k.data_ptr() and out_slopes.data_ptr() == slopes.data_ptr(), call
            torch.testing.assert_close(k, k_eager, rtol=0, atol=1e-6, msg=f"the caller's k after call {call}")
            torch.testing.assert_close(slopes, slopes_eager, rtol=0, atol=1e-6, msg=f"slopes after call {call}")


def test_options_passed_through_torch_compile_reach_the_graphs() -> None:
    torch._dynamo.reset()
    ll_backend._registry.clear()
    model = nn.Linear(8, 8).cuda().eval()
    compiled = torch.compile(
        model, backend=ll_backend.launchless_backend, options={"capture_after": 4, "selective": False}
    )
    with torch.no_grad():
        for i in range(4):
            compiled(torch.randn(2, 8, device="cuda"))
            captured = any(g.graph_info()["graphs"] for g in _graphs())
            assert captured == (i == 3), i  # captured at the fourth call, not the second (the default)


@torch.library.custom_op("launchless_test::grouped_mm_host", mutates_args=())
def _grouped_mm_host(x: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """As transformers' float32 grouped matmul under torch.compile: the group ends read on the host, one matmul per
    group; the output's shape follows from the inputs' shapes alone."""
    out = torch.zeros(x.shape[0], weight.shape[2], device=x.device, dtype=x.dtype)
    start = 0
    for group, end in enumerate(offs.tolist()):
        if end > start:
            torch.mm(x[start:end], weight[group], out=out[start:end])
        start = end
    return out


@_grouped_mm_host.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], weight.shape[2])


class HostRoutedExperts(nn.Module):
    """Tokens sorted by their expert, each expert's rows multiplied by its own weight through the custom operation."""

    def __init__(self, experts: int = 4, width: int = 32) -> None:
        super().__init__()
        self.router = nn.Linear(width, experts)
        self.weight = nn.Parameter(torch.randn(experts, width, width) / width**0.5)
        self.out = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        expert = self.router(x).argmax(-1)
        order = expert.argsort(stable=True)
        experts = torch.arange(self.weight.shape[0], device=x.device)
        offs = (expert[:, None] == experts).sum(0).cumsum(0)  # (bincount would read the largest id on the host)
        mixed = torch.ops.launchless_test.grouped_mm_host(x[order], self.weight, offs)
        return self.out(torch.relu(mixed[order.argsort()]))


@pytest.mark.parametrize(
    "grad_mode", [pytest.param(torch.no_grad, id="no_grad"), pytest.param(torch.inference_mode, id="inference_mode")]
)
def test_a_compiled_graph_that_syncs_inside_an_operation_replays_as_graphs_around_it(grad_mode, caplog) -> None:
    """The operation reads its group ends on the host, so the compiled FX graph cannot be one CUDA graph; it can be
    a chain with that operation run eager between two graphs. Fresh inputs route their tokens to other experts on
    every call: a replay that reused the captured group ends would give other values."""
    model = HostRoutedExperts().cuda().eval()
    compiled = _compiled(model)
    with grad_mode(), caplog.at_level(logging.INFO, logger="launchless"):
        for call in range(6):
            x = torch.randn(64, 32, device="cuda")
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5, msg=f"call {call}")
    rows = [row for g in _graphs() for row in g.graph_info()["graphs"]]
    (row,) = [r for r in rows if r.get("region_split")]
    assert row["verification"]["passed"] and row["replays"] >= 3, row
    region = row["region_split"]
    assert region["graphs"] == 2 and [op["op"] for op in region["eager_ops"]] == ["launchless_test::grouped_mm_host"]
    assert row["indirection"] == "a chain of graphs around operations run eager"
    chained = [r.getMessage() for r in caplog.records if "cannot be captured as one graph" in r.getMessage()]
    assert len(chained) == 1 and "launchless_test::grouped_mm_host" in chained[0], chained


@pytest.mark.parametrize("grad_mode", [torch.no_grad, torch.inference_mode])
def test_a_graph_decided_to_run_without_a_cuda_graph_skips_its_signature_on_every_later_call(
    tmp_path, monkeypatch, grad_mode
) -> None:
    """GraCE's equation of state: one fused kernel, where a graph's replay gains nothing (the selective choice is no
    graph). Dynamo pins the inputs of its static graph, so once decided a call checks the autocast context and runs
    Inductor's program: no signature made per call, fresh inputs each call computed as eager-compiled Inductor does."""
    from launchless.apps.zoo._grace_ocean import OceanEquationOfState
    from launchless.compiler import compiled_graphs as graphs_module
    from launchless.compiler import select
    from launchless.compiler.decisions import Decision

    real = select.measure

    def no_graph_wins(runners, device, margin=0.03):  # the measured times, with no graph the faster
        measured = real(runners, device, margin)
        times = {**measured.times_ms, "no-graph": min(measured.times_ms.values()) / 2}
        return Decision("no-graph", times)

    monkeypatch.setattr(select, "measure", no_graph_wins)
    made = [0]
    signature = graphs_module.signature_of_leaves
    monkeypatch.setattr(
        graphs_module, "signature_of_leaves", lambda s, leaves: made.__setitem__(0, made[0] + 1) or signature(s, leaves)
    )

    def fresh() -> tuple[torch.Tensor, ...]:
        salinity = 30.0 + 10.0 * torch.rand(64, 64, 26, device="cuda", dtype=torch.float64)
        temperature = 25.0 * torch.rand(64, 64, 26, device="cuda", dtype=torch.float64)
        return salinity, temperature, torch.linspace(0.0, 5000.0, 26, device="cuda", dtype=torch.float64).view(1, 1, 26)

    model = OceanEquationOfState().cuda()
    compiled = _compiled(model, selective=True, cache_dir=str(tmp_path))
    reference = torch.compile(OceanEquationOfState().cuda(), backend="inductor")
    with grad_mode():
        for _ in range(4):  # compiled, seen, captured and measured: no graph kept
            compiled(*fresh())
        (graphs,) = _graphs()
        assert graphs.graph_info()["graphs"][0]["variant"] == "no-graph"
        assert graphs.fixed_signature and graphs._without_graph is not None
        before = made[0]
        for _ in range(5):
            inputs = fresh()
            assert torch.equal(compiled(*inputs), reference(*inputs))
        assert made[0] == before  # no signature made: the decided path
