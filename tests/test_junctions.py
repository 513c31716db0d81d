"""Which operations a forward may run eager between two graphs (``core.junctions``), decided without a GPU: an
operation whose value or shape reaches the host, that draws random numbers or reads a host tensor never is."""

from __future__ import annotations

import pytest
import torch

from launchless.core.junctions import Junction, JunctionShapeChanged, NotAJunction, is_capture_error, site_of

aten = torch.ops.aten
CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)


@pytest.mark.parametrize(
    ("op", "why"),
    [
        (aten._local_scalar_dense.default, "hands a value it read to the host"),
        (aten.nonzero.default, "shape depends on the values"),
        (aten.masked_select.default, "shape depends on the values"),
        (aten.bernoulli.default, "random numbers"),
    ],
    ids=["item", "nonzero", "masked_select", "bernoulli"],
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


def test_a_junction_returning_a_host_value_is_refused() -> None:
    x = torch.ones(3)
    with pytest.raises(NotAJunction, match="aten::_local_scalar_dense returns float"):
        Junction(aten._local_scalar_dense.default, (x,), {}, 1.0, CPU, None)
    with pytest.raises(NotAJunction, match="cpu"):
        Junction(aten.clone.default, (x,), {}, x.clone(), CUDA, None)


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
