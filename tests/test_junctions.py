"""Which operations a forward may run eager between two graphs (``core.junctions``), decided without a GPU: an
operation whose value or shape reaches the host, that draws random numbers or reads a host tensor never is."""

from __future__ import annotations

import pytest
import torch

from launchless.core.junctions import Junction, NotAJunction, is_capture_error, site_of

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
    with pytest.raises(RuntimeError, match="cannot be replayed"):
        junction.run()


def test_capture_errors_are_told_from_other_errors() -> None:
    assert is_capture_error(RuntimeError("CUDA error: operation not permitted when stream is capturing"))
    assert is_capture_error(RuntimeError("Cannot copy between CPU and CUDA tensors during CUDA graph capture"))
    assert not is_capture_error(ValueError("shapes (2, 3) and (4, 5) do not match"))
