"""Which operations a forward may run eager between two graphs (``core.junctions``), decided without a GPU: an
operation whose value or shape reaches the host, that draws random numbers or reads a host tensor never is."""

from __future__ import annotations

import pytest
import torch

from launchless.core import junctions
from launchless.core.junctions import (
    HOST_READS,
    Junction,
    JunctionShapeChanged,
    JunctionValueChanged,
    NotAJunction,
    SegmentedGraph,
    SegmentingMode,
    guard_note,
    is_capture_error,
    operation_name,
    same_value,
    site_of,
)

aten = torch.ops.aten
CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)


@pytest.mark.parametrize(
    ("op", "why"),
    [
        (aten.nonzero.default, "shape depends on the values"),
        (aten.masked_select.default, "shape depends on the values"),
        (aten.bernoulli.default, "random numbers"),
    ],
    ids=["nonzero", "masked_select", "bernoulli"],
)
def test_operations_tagged_data_dependent_or_random_are_never_junctions(op, why: str) -> None:
    site = site_of(op, (torch.ones(3),), {}, CPU)
    assert not site.eligible and why in site.why_not, site


def test_an_operation_reading_a_tensor_off_the_capture_device_is_not_a_junction() -> None:
    site = site_of(aten.histc.default, (torch.ones(3),), {"bins": 4}, CUDA)
    assert not site.eligible and "host tensor" in site.why_not
    assert site_of(aten.histc.default, (torch.ones(3),), {"bins": 4}, CPU).eligible


def test_a_site_names_the_operation_and_the_line_that_called_it() -> None:
    site = site_of(aten.histc.default, (torch.ones(3),), {"bins": 4}, CPU)
    assert site.name == "aten::histc" and "test_junctions.py" in site.source, site


def test_a_junction_returning_a_host_value_is_refused_unless_it_is_a_host_read() -> None:
    x = torch.ones(3)
    with pytest.raises(NotAJunction, match="aten::max returns float"):
        Junction(aten.max.default, (x,), {}, 1.0, CPU, None)
    with pytest.raises(NotAJunction, match="cpu"):
        Junction(aten.clone.default, (x,), {}, x.clone(), CUDA, None)
    assert Junction(aten._local_scalar_dense.default, (x,), {}, 1.0, CPU, None).read == 1.0


@pytest.mark.parametrize("op", sorted(HOST_READS, key=str), ids=str)
def test_a_host_read_of_the_graphs_tensors_is_a_junction_and_of_a_host_tensor_is_not(op) -> None:
    """``.item()``, ``bool(t)``, ``torch.equal``: guarded by the value they return, on the capture device only."""
    args = (torch.ones(1), torch.ones(1)) if op in (aten.equal.default, aten.allclose.default) else (torch.ones(1),)
    assert site_of(op, args, {}, CPU).eligible
    site = site_of(op, args, {}, CUDA)
    assert not site.eligible and "host tensor" in site.why_not, site


def test_a_host_read_is_read_again_at_each_replay_and_must_return_the_captured_value() -> None:
    lengths = torch.tensor([16, 12])
    junction = Junction(aten._local_scalar_dense.default, (lengths.max(),), {}, 16, CPU, "modeling_xlm.py:793")
    maximum = junction.args[0]
    junction.run()  # the same value: the Python code after it took the recorded path
    assert junction.row() == {"op": "aten::_local_scalar_dense", "source": "modeling_xlm.py:793", "value_read": 16}
    maximum.fill_(15)  # what the graph before it wrote this time
    with pytest.raises(JunctionValueChanged, match=r"aten::_local_scalar_dense at modeling_xlm.py:793 read 15 on "):
        junction.run()


def test_values_are_the_same_to_python_only_with_their_type_sign_and_nan() -> None:
    assert same_value(16, 16) and same_value(True, True) and same_value(float("nan"), float("nan"))
    assert not same_value(1, True) and not same_value(1, 1.0), "another type can take another path"
    assert not same_value(0.0, -0.0) and not same_value(1.5, float("nan")) and same_value(0.25, 0.25)


class _Graph:
    """Test double of one CUDA graph of a chain: what ``SegmentingMode`` asks of it (tests only)."""

    def __init__(self) -> None:
        self.replays = 0

    def capture_end(self) -> None:
        pass

    def replay(self) -> None:
        self.replays += 1


def _segmenting(chain: SegmentedGraph, ops: frozenset) -> SegmentingMode:
    def begin() -> None:
        chain.graphs.append(_Graph())
        chain.empty.append(False)

    return SegmentingMode(chain, junction_ops=ops, device=CPU, begin=begin)


def test_item_and_bool_are_named_as_the_read_no_grad_shows() -> None:
    """Under inference_mode a dispatch mode sees ``.item()`` and ``bool(t)`` whole, under no_grad their part that
    reads: one name in a row or a message whatever the grad mode."""
    names = {
        operation_name(op) for op in (aten.item.default, aten.is_nonzero.default, aten._local_scalar_dense.default)
    }
    assert names == {"aten::_local_scalar_dense"}
    assert operation_name(aten.equal.default) == "aten::equal"


@pytest.mark.parametrize(
    ("grad_mode", "op"),
    [(torch.no_grad, aten._local_scalar_dense.default), (torch.inference_mode, aten.item.default)],
    ids=["no_grad", "inference_mode"],
)
def test_a_chain_reads_host_values_between_its_graphs_and_checks_them_at_replay(grad_mode, op) -> None:
    """Under inference_mode a dispatch mode sees ``.item()`` undecomposed: the read is a junction either way, named
    alike, and a host read of a host tensor (the capture device here is the CPU: none is) stays host code."""
    x = torch.tensor([3.0, 4.0])
    chain = SegmentedGraph()
    with grad_mode():
        mode = _segmenting(chain, frozenset({op}))
        mode.start()
        with mode:
            total = (x * 2).sum()
            assert total.item() == 14.0
            y = x + 1
        mode.end()
    assert len(chain.graphs) == 2 and [j.read for j in chain.junctions] == [14.0], chain.junctions
    assert chain.junctions[0].row()["op"] == "aten::_local_scalar_dense", "one name for the read in both grad modes"
    assert "1 value(s) read on the host" in guard_note(chain.junctions), guard_note(chain.junctions)
    chain.replay()
    assert [g.replays for g in chain.graphs] == [2, 2], "each graph ran once at its capture and once now"
    with torch.inference_mode():  # the first graph wrote another sum this time (a graph writes any tensor)
        total.fill_(15.0)
    with pytest.raises(JunctionValueChanged, match=r"read 15\.0 on replay, 14\.0 when captured"):
        chain.replay()
    assert chain.graphs[1].replays == 2, "the graph after a changed read is not replayed"
    assert torch.equal(y, x + 1)


def test_a_forward_calling_a_junction_too_often_is_not_captured_as_a_chain(monkeypatch) -> None:
    monkeypatch.setattr(junctions, "MAX_JUNCTION_CALLS", 3)
    chain = SegmentedGraph()
    mode = _segmenting(chain, frozenset({aten._local_scalar_dense.default}))
    x = torch.arange(8.0)
    mode.start()
    with torch.no_grad(), mode, pytest.raises(NotAJunction, match="called more than 3 times in one forward"):
        for i in range(8):  # a read per token
            x[i].item()
    assert len(chain.junctions) == 3


def test_a_chain_with_no_host_read_has_no_guard_note() -> None:
    x = torch.ones(4)
    junction = Junction(aten.histc.default, (x,), {"bins": 4}, torch.histc(x, bins=4), CPU, None)
    assert guard_note([junction]) == "" and "value_read" not in junction.row()


def test_a_junction_writes_its_new_result_into_the_buffer_the_next_graph_reads() -> None:
    x = torch.tensor([0.0, 1.0, 1.0, 3.0])
    out = torch.histc(x, bins=4)
    junction = Junction(aten.histc.default, (x,), {"bins": 4}, out, CPU, "m.py:1")
    x.copy_(torch.tensor([3.0, 3.0, 3.0, 0.0]))  # what the graph before it wrote this time
    junction.run()
    assert torch.equal(out, torch.histc(x, bins=4)) and junction.row() == {"op": "aten::histc", "source": "m.py:1"}


def test_a_junction_whose_result_changes_shape_raises_instead_of_replaying() -> None:
    x = torch.ones(4)
    junction = Junction(aten.clone.default, (x,), {}, torch.empty(3), CPU, None)
    with pytest.raises(JunctionShapeChanged, match=r"returned \(4,\) torch.float32 on replay, \(3,\) torch.float32"):
        junction.run()


class _SeenOps(torch.utils._python_dispatch.TorchDispatchMode):
    """The operations a dispatch mode sees (what ``SegmentingMode`` sees while a chain is captured)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.append((func, args, kwargs or {}))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("grad_mode", [torch.no_grad, torch.inference_mode], ids=["no_grad", "inference_mode"])
def test_where_of_a_mask_is_no_junction_in_either_grad_mode(grad_mode) -> None:
    """Under inference_mode a dispatch mode sees ``aten::where(condition)`` undecomposed and untagged (under no_grad:
    ``nonzero``): the verdict must not depend on which one it sees."""
    with grad_mode():
        mask = torch.tensor([True, False, True, True])
        with _SeenOps() as mode:
            torch.where(mask)
        func, args, kwargs = mode.seen[0]
        site = site_of(func, args, kwargs, CPU)
    assert not site.eligible and "shape depends on the values" in site.why_not, site


@pytest.mark.parametrize("grad_mode", [torch.no_grad, torch.inference_mode], ids=["no_grad", "inference_mode"])
def test_another_librarys_untagged_operation_with_a_data_dependent_shape_is_no_junction(grad_mode) -> None:
    pytest.importorskip("torchvision.ops")  # registers the operation and its shape function
    with grad_mode():
        boxes = torch.tensor([[0.0, 0.0, 10.0, 10.0], [1.0, 1.0, 11.0, 11.0], [50.0, 50.0, 60.0, 60.0]])
        scores = torch.tensor([0.9, 0.8, 0.7])
        site = site_of(torch.ops.torchvision.nms.default, (boxes, scores, 0.5), {}, CPU)
    assert not site.eligible and "shape depends on the values" in site.why_not, site


def test_an_operation_without_a_shape_function_is_not_proven_and_no_junction() -> None:
    library = torch.library.Library("launchless_test_junctions", "DEF")
    library.define("keep_positive(Tensor x) -> Tensor")
    library.impl("keep_positive", lambda x: x[x > 0], "CPU")
    op = torch.ops.launchless_test_junctions.keep_positive.default
    site = site_of(op, (torch.tensor([1.0, -1.0]),), {}, CPU)
    assert not site.eligible and "no shape function" in site.why_not, site


def test_operations_whose_shape_follows_from_shapes_stay_junctions() -> None:
    x = torch.rand(4, 8)
    assert site_of(aten.histc.default, (x,), {"bins": 4}, CPU).eligible
    assert site_of(aten.add.Tensor, (x, x), {}, CPU).eligible


def test_a_primitive_whose_shape_function_refuses_its_inputs_is_judged_by_its_tags() -> None:
    """``_grouped_mm``'s shape function asks for bfloat16; its CUDA kernel also takes float32 (syncing inside)."""
    weight, offsets = torch.rand(4, 32, 48), torch.tensor([2, 5, 5, 8], dtype=torch.int32)
    site = site_of(aten._grouped_mm.default, (torch.rand(8, 32), weight), {"offs": offsets}, CPU)
    assert site.eligible, site


def test_capture_errors_are_told_from_other_errors() -> None:
    assert is_capture_error(RuntimeError("CUDA error: operation not permitted when stream is capturing"))
    assert is_capture_error(RuntimeError("Cannot copy between CPU and CUDA tensors during CUDA graph capture"))
    assert not is_capture_error(ValueError("shapes (2, 3) and (4, 5) do not match"))
