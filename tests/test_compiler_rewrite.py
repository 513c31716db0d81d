"""CPU tests of CGCT rewriting: aten graphs traced with fake CUDA tensors, and real-CPU differential checks."""

from __future__ import annotations

import copy

import pytest
import torch
from fake_cuda import trace_on_fake_cuda
from torch import fx, nn
from torch.fx.experimental.proxy_tensor import make_fx

from launchless.compiler.diagnose import INPUT_MUTATION, diagnose
from launchless.compiler.differential import differential_check
from launchless.compiler.rewrite import (
    ATTRIBUTE,
    CONSTANT,
    CONSTRUCT,
    FOLDED,
    constant_guards,
    constants_still_valid,
    rewrite,
)
from launchless.diagnose.blockers import COPY

aten = torch.ops.aten


def _cross_device_copies(gm: fx.GraphModule) -> list[str]:
    """Nodes whose value and inputs' values live on different devices."""
    found = []
    for node in gm.graph.nodes:
        devices = {
            a.meta["val"].device.type for a in node.all_input_nodes if isinstance(a.meta.get("val"), torch.Tensor)
        }
        out = node.meta.get("val")
        if isinstance(out, torch.Tensor) and devices and devices != {out.device.type}:
            found.append(node.name)
    return found


def _node(gm: fx.GraphModule, target) -> fx.Node:
    return next(n for n in gm.graph.nodes if n.target is target)


def _moved_buffers(gm: fx.GraphModule) -> list[str]:
    return [name for name, _ in gm.named_buffers() if name.startswith("_launchless_const_")]


class _Anchors(nn.Module):
    """A detector-style CPU anchor table, read twice and used only on the GPU."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.arange(8.0).reshape(2, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.table.to(x.device) + self.table.cuda().sum(0)


def test_arange_copied_to_the_gpu_is_built_there_and_nothing_blocks_capture() -> None:
    gm = trace_on_fake_cuda(lambda x: x + torch.arange(4).cuda(), (4,))
    assert [b.kind for b in diagnose(gm)] == [COPY]
    report = rewrite(gm)
    assert [a.kind for a in report.applied] == [CONSTRUCT] and report.skipped == []
    arange = _node(gm, aten.arange.default)
    assert arange.kwargs["device"] == torch.device("cuda", 0)
    assert arange.meta["val"].device.type == "cuda" and arange.meta["val"].dtype == torch.int64
    assert _cross_device_copies(gm) == [] and _node(gm, aten.add.Tensor).args[1] is arange  # the copy is gone
    assert diagnose(gm) == []


def test_pure_cpu_ops_on_a_constructor_move_with_it_and_keep_their_dtype() -> None:
    gm = trace_on_fake_cuda(lambda x: x + torch.arange(4).float().mul(2).cuda(), (4,))
    report = rewrite(gm)
    assert report.applied[0].moved == ("arange", "_to_copy", "mul")
    values = [n.meta["val"] for n in gm.graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)]
    assert {v.device.type for v in values} == {"cuda"}
    assert _node(gm, aten.mul.Tensor).meta["val"].dtype == torch.float32
    assert diagnose(gm) == []


def test_a_copy_into_a_device_tensor_reads_a_constructor_built_on_the_device() -> None:
    def fn(x, y):
        y.copy_(torch.arange(4.0))  # copy_(dst, src): the host side is the second argument
        return x + y

    gm = trace_on_fake_cuda(fn, (4,), (4,))
    report = rewrite(gm)
    assert [a.kind for a in report.applied] == [CONSTRUCT]
    assert _node(gm, aten.copy_.default).args[1] is _node(gm, aten.arange.default)  # the write itself stays
    assert _cross_device_copies(gm) == []
    assert [b.kind for b in diagnose(gm)] == [INPUT_MUTATION]


def test_a_tensor_literal_is_copied_to_the_device_once_at_compile_time() -> None:
    gm = trace_on_fake_cuda(lambda x: x + torch.tensor([1.0, 2.0, 3.0, 4.0]).to(x.device), (4,))
    report = rewrite(gm)
    assert [a.kind for a in report.applied] == [CONSTANT]
    moved = gm._launchless_const_0
    assert moved.device.type == "cuda" and moved.shape == (4,) and moved.dtype == torch.float32
    assert [n.target for n in gm.graph.nodes if n.op == "get_attr"] == ["_launchless_const_0"]
    assert _cross_device_copies(gm) == [] and diagnose(gm) == []
    assert constants_still_valid(gm)


def test_a_module_attribute_is_moved_once_and_guarded_against_in_place_changes() -> None:
    model = _Anchors()
    gm = trace_on_fake_cuda(model, (2, 4))
    report = rewrite(gm)
    assert [a.kind for a in report.applied] == [ATTRIBUTE, ATTRIBUTE]
    assert _moved_buffers(gm) == ["_launchless_const_0"]  # two reads, one device copy
    assert diagnose(gm) == []
    (guard,) = constant_guards(gm)
    assert guard.source is model.table and constants_still_valid(gm)
    model.table.mul_(2)
    assert not constants_still_valid(gm)


@pytest.mark.parametrize(
    ("fn", "reason"),
    [
        (lambda x: x + (x.cpu() * 2).to(x.device), "depends on graph input x_1"),
        (lambda x: x + torch.full((4,), x.sum().item()).cuda(), "depends on a host sync"),
        (lambda x: x + torch.randn(4).cuda(), "randn in randn draws random numbers"),
        (lambda x: x[:2] + (lambda a: a[a > 1])(torch.arange(4.0)).cuda(), "data-dependent output shape"),
        (lambda x: (lambda a: (x + a.cuda(), a * 2))(torch.arange(4)), "also used on the host by mul"),
        (lambda x: (lambda a: (x + a.cuda(), a))(torch.arange(4)), "returned on the host"),
    ],
    ids=["input", "item", "random", "data-dependent", "host-use", "returned"],
)
def test_a_copy_that_is_not_provably_safe_is_left_alone_with_its_reason(fn, reason) -> None:
    gm = trace_on_fake_cuda(fn, (4,))
    before = gm.code
    report = rewrite(gm)
    assert report.applied == [] and gm.code == before
    copy_node = next(s for s in report.skipped if "_to_copy" in s.target)
    assert reason in copy_node.reason and reason in report.describe()


def test_a_host_sync_is_reported_as_not_rewritable() -> None:
    gm = trace_on_fake_cuda(lambda x: x * x.sum().item(), (4,))
    before = gm.code
    report = rewrite(gm)
    assert report.applied == [] and gm.code == before
    (sync,) = report.skipped
    assert "_local_scalar_dense" in sync.target and "host sync" in sync.reason


def test_the_report_carries_the_user_source_line() -> None:
    gm = trace_on_fake_cuda(lambda x: x + torch.arange(4).cuda(), (4,))
    _node(gm, aten._to_copy.default).meta["stack_trace"] = (
        '  File "/home/me/model.py", line 12, in forward\n    return x + torch.arange(4).cuda()\n'
    )
    report = rewrite(gm)
    where = "/home/me/model.py:12 in forward: `return x + torch.arange(4).cuda()`"
    assert report.applied[0].source == where and where in report.describe()


def _cpu_graph(table: torch.Tensor) -> fx.GraphModule:
    """A real-CPU graph whose `.to(device, copy=True)` calls stand in for host->device copies."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        return x * table.to(x.device, copy=True) + torch.arange(4.0).to(x.device, copy=True)

    return make_fx(fn)(torch.randn(4))


def test_differential_check_passes_a_correct_rewrite_on_real_cpu_tensors() -> None:
    table = torch.randn(4)
    gm = _cpu_graph(table)
    original = copy.deepcopy(gm)
    assert rewrite(gm).applied == []  # no cross-device copy: nothing to do unless the target is named
    report = rewrite(gm, "cpu")
    assert [a.kind for a in report.applied] == [ATTRIBUTE, CONSTRUCT]
    assert not any(n.target is aten._to_copy.default for n in gm.graph.nodes)
    assert gm._launchless_const_0 is not table and torch.equal(gm._launchless_const_0, table)
    assert differential_check(original, gm, lambda: [torch.randn(4)]) == (True, 0.0)


def test_differential_check_fails_a_wrong_rewrite_that_the_guard_cannot_see() -> None:
    table = torch.randn(4)
    gm = _cpu_graph(table)
    original = copy.deepcopy(gm)
    rewrite(gm, "cpu")
    gm._launchless_const_0.add_(0.5)  # a broken compile-time copy; its source is untouched
    identical, diff = differential_check(original, gm, lambda: [torch.ones(4)])
    assert not identical and diff == pytest.approx(0.5)
    assert constants_still_valid(gm)


def test_guards_of_a_deep_copy_still_watch_the_original_source() -> None:
    table = torch.randn(4)
    gm = _cpu_graph(table)
    rewrite(gm, "cpu")
    clone = copy.deepcopy(gm)
    assert len(constant_guards(clone)) == 1 and constants_still_valid(clone)
    table.add_(1)
    assert not constants_still_valid(gm) and not constants_still_valid(clone)


def _static_input_graph() -> tuple[fx.GraphModule, list[str]]:
    """``x * table`` where ``table`` is a graph input: how Dynamo passes a plain tensor attribute of a module."""
    gm = make_fx(lambda x, table: x * table.to(x.device, copy=True))(torch.randn(4), torch.randn(4))
    return gm, [n.name for n in gm.graph.nodes if n.op == "placeholder"]


def test_a_static_host_input_is_moved_once_guarded_and_left_unread() -> None:
    table = torch.randn(4)
    gm, names = _static_input_graph()
    original = copy.deepcopy(gm)
    before = rewrite(gm, "cpu")  # an input like any other: it may change on every call
    assert before.applied == [] and "depends on graph input" in before.skipped[0].reason
    report = rewrite(gm, "cpu", {names[1]: table})
    assert [a.kind for a in report.applied] == [ATTRIBUTE]
    (guard,) = constant_guards(gm)
    assert guard.input_name == names[1] and guard.source is table and guard.source_attr == f"input {names[1]}"
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    assert [n.name for n in placeholders] == names and not placeholders[1].users  # same signature, input unread
    assert torch.equal(gm._launchless_const_0, table)
    assert differential_check(original, gm, lambda: [torch.randn(4), table]) == (True, 0.0)
    table.mul_(2)
    assert not constants_still_valid(gm)


def test_a_static_input_written_in_the_graph_is_left_alone() -> None:
    def fn(x, table):
        table.add_(1)
        return x * table.to(x.device, copy=True)

    gm = make_fx(fn)(torch.randn(4), torch.randn(4))
    name = [n.name for n in gm.graph.nodes if n.op == "placeholder"][1]
    report = rewrite(gm, "cpu", {name: torch.randn(4)})
    assert report.applied == [] and any("writes in place" in s.reason for s in report.skipped), report.describe()


def test_constant_watch_refreshes_the_device_copy_in_place_and_names_a_change_it_cannot_follow() -> None:
    from launchless.compiler.cgct import ConstantWatch, MovedConstant

    table = torch.randn(4)
    gm, names = _static_input_graph()
    rewrite(gm, "cpu", {names[1]: table})
    (guard,) = constant_guards(gm)
    device_copy = gm._launchless_const_0
    watch = ConstantWatch([MovedConstant(guard, device_copy, 1)])
    x = torch.randn(4)
    assert watch.check([x, table]) is None and watch.refreshed == 0
    table.mul_(3)  # changed in place: copied into the same tensor the graphs read
    address = device_copy.data_ptr()
    assert watch.check([x, table]) is None and watch.refreshed == 1
    assert torch.equal(device_copy, table) and device_copy.data_ptr() == address
    assert watch.check([x, table]) is None and watch.refreshed == 1  # current again: no second copy
    other = torch.randn(4)  # the attribute re-assigned: a different tensor in the input's place
    assert watch.check([x, other]) is None and torch.equal(device_copy, other) and watch.refreshed == 2
    assert "changed shape or dtype" in watch.check([x, torch.randn(5)])


class ConvThenShape(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return y.flatten(1).sum(1) * y.shape[-1]


def test_tracing_inside_a_dynamo_backend_leaves_dynamos_shape_env_alone() -> None:
    """CGCT traces the graph Dynamo hands over while Dynamo is still compiling the frame: tracing inside
    Dynamo's fake mode added guards Dynamo could not build (torchvision's detectors crashed on torch 2.11)."""
    from launchless.compiler.cgct import traced

    model, seen = ConvThenShape(), []

    def backend(gm: fx.GraphModule, example_inputs: list) -> object:
        seen.append(traced(gm, example_inputs, "fake"))
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, dynamic=True)
    for shape in ((2, 3, 8, 8), (3, 3, 9, 9)):
        x = torch.randn(shape)
        assert torch.equal(compiled(x), model(x))
    assert len(seen) == 1 and any(n.target == torch.ops.aten.convolution.default for n in seen[0].graph.nodes)
    torch._dynamo.reset()


# ---- folding a host computation at compile time -----------------------------------------------------------------


def _boxes_graph() -> tuple[fx.GraphModule, list[str]]:
    """SSD's default boxes: host math on constructors and a host attribute (``wh``), copied to the device once."""

    def fn(x: torch.Tensor, wh: torch.Tensor) -> torch.Tensor:
        shifts = (torch.arange(0, 6) + 0.5) / 3.0
        boxes = torch.cat((shifts.reshape(-1, 1).repeat(1, 2), wh.clamp(min=0, max=1).repeat(3, 1)), dim=1)
        return x * boxes.to(x.device, copy=True)

    gm = make_fx(fn)(torch.randn(6, 4), torch.rand(2, 2))
    return gm, [n.name for n in gm.graph.nodes if n.op == "placeholder"]


def test_folding_runs_the_host_computation_once_with_eagers_ops_and_guards_its_sources() -> None:
    wh = torch.rand(2, 2) * 1.5
    gm, names = _boxes_graph()
    original = copy.deepcopy(gm)
    report = rewrite(gm, "cpu", {names[1]: wh}, fold=True)
    assert [a.kind for a in report.applied] == [FOLDED], report.describe()
    left = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert left == {"aten.mul.Tensor"}, left  # arange, div, cat, clamp, repeat and the copy: gone
    expected = torch.cat(
        (((torch.arange(0, 6) + 0.5) / 3.0).reshape(-1, 1).repeat(1, 2), wh.clamp(min=0, max=1).repeat(3, 1)), dim=1
    )
    assert torch.equal(gm._launchless_const_0, expected)
    (guard,) = constant_guards(gm)
    assert guard.input_name == names[1] and guard.source is wh and torch.equal(guard.folded, wh)
    assert not [n for n in gm.graph.nodes if n.op == "placeholder"][1].users  # unread, the signature unchanged
    assert differential_check(original, gm, lambda: [torch.randn(6, 4), wh]) == (True, 0.0)


def test_constant_watch_keeps_a_folded_constant_for_equal_values_and_names_a_real_change() -> None:
    from launchless.compiler.cgct import ConstantWatch, MovedConstant

    wh = torch.rand(2, 2)
    gm, names = _boxes_graph()
    rewrite(gm, "cpu", {names[1]: wh}, fold=True)
    (guard,) = constant_guards(gm)
    watch = ConstantWatch([MovedConstant(guard, gm._launchless_const_0, 1)])
    x = torch.randn(6, 4)
    assert watch.check([x, wh]) is None
    assert watch.check([x, wh.clone()]) is None and watch.refreshed == 0  # reassigned with the same values: kept
    wh.add_(0.25)
    assert "folded into a device constant at compile time, changed" in watch.check([x, wh])


def test_cgct_folds_when_building_on_the_device_rounds_differently(monkeypatch) -> None:
    import functools

    from launchless.compiler import cgct

    monkeypatch.setattr(cgct, "rewrite", functools.partial(rewrite, target_device="cpu"))  # CPU "transfers"
    monkeypatch.setattr(cgct, "trial_hazard", lambda gm, inputs: None)
    checks = []

    def device_rounding_first(original, rewritten, make_inputs):  # the device's first attempt is off by an ulp
        checks.append(rewritten)
        return (False, 6.1e-05) if len(checks) == 1 else differential_check(original, rewritten, make_inputs)

    monkeypatch.setattr(cgct, "differential_check", device_rounding_first)
    wh = torch.rand(2, 2)

    def fn(x: torch.Tensor, wh: torch.Tensor) -> torch.Tensor:
        return x * ((torch.arange(0, 4) + 0.5) / 3.0 + wh.sum()).to(x.device, copy=True)

    gm = make_fx(fn)(torch.randn(4), wh)
    result = cgct.try_rewrite(gm, [torch.randn(4), wh], frozenset({1}), lambda g, ex: g.forward)
    assert result.compiled is not None and [a.kind for a in result.report.applied] == [FOLDED]
    assert result.unread_inputs == frozenset({1}) and len(checks) == 2
    x = torch.randn(4)
    assert torch.equal(result.compiled(x, wh), fn(x, wh))
