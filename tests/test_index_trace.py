"""CPU tests: which float inputs a forward reads as addresses, found while it runs once (the runtime's path)."""

from __future__ import annotations

import logging

import pytest
import torch

from launchless.core.index_trace import IndexTrace


def _found(fn, *inputs, grad_mode=torch.no_grad) -> set[int]:
    with grad_mode(), IndexTrace(list(inputs)) as trace:
        fn(*inputs)
    return trace.found


def test_a_float_timestep_cast_to_index_a_schedule_is_found_and_the_image_is_not() -> None:
    schedule = torch.linspace(0, 1, 1000)

    def denoise(image, t, scale):
        alpha = schedule[(t * scale).long()]  # diffusers' pattern: a float timestep indexes the schedule
        return image * alpha.view(-1, 1, 1, 1) + image.long().float()  # an int cast of the image: found too

    image, t, scale = torch.randn(2, 3, 4, 4), torch.tensor([10.0, 500.0]), torch.tensor(1.0)
    assert _found(denoise, image, t, scale) == {0, 1, 2}
    assert _found(lambda image, t: image * schedule[t.long()].sum(), image, t) == {1}


@pytest.mark.parametrize("grad_mode", [torch.no_grad, torch.inference_mode])
def test_a_cast_inside_an_operation_made_of_others_is_found_in_both_grad_modes(grad_mode) -> None:
    """``t.type_as(ids)`` and ``t.to(ids)`` cast a float to an integer inside an operation made of others, which a
    dispatch mode sees whole under ``inference_mode``: missed, the input would be probed at random and index out of
    bounds (on a GPU, a device-side assert that ends the process)."""
    schedule, ids = torch.linspace(0, 1, 1000), torch.zeros(2, dtype=torch.long)

    def by_type_as(t):
        return schedule[t.type_as(ids)]

    def by_to_other(t):
        return schedule[t.to(ids)]

    t = torch.tensor([10.0, 500.0])
    assert _found(by_type_as, t, grad_mode=grad_mode) == {0}
    assert _found(by_to_other, t, grad_mode=grad_mode) == {0}


def test_no_cast_to_an_integer_finds_nothing() -> None:
    def fn(x, y, ids, mask):
        return (x @ y).relu().half().float().sum() + ids.long().sum() + mask.int().sum()

    assert (
        _found(fn, torch.randn(3, 3), torch.randn(3, 3), torch.arange(3, dtype=torch.int32), torch.ones(3) > 0) == set()
    )


def test_roi_boxes_are_found_through_a_buffer_they_were_written_into() -> None:
    ops = pytest.importorskip("torchvision.ops")

    def head(features, corners, batch_index):
        rois = torch.zeros(corners.shape[0], 5)
        rois[:, 1:] = corners  # a write into a view of a fresh buffer: the buffer carries the input on
        rois[:, 0] = batch_index
        return ops.roi_align(features * 2, rois, (2, 2), 1.0, 2, True)

    features = torch.randn(1, 4, 16, 16)
    corners, batch_index = torch.tensor([[1.0, 1, 9, 9], [2, 0, 6, 8]]), torch.zeros(2)
    assert _found(head, features, corners, batch_index) == {1, 2}


def test_a_forward_the_trace_cannot_run_is_run_again_without_it_and_a_broken_one_still_fails(caplog) -> None:
    from torch.utils._python_dispatch import is_in_torch_dispatch_mode

    from launchless.core.capture import CaptureFailed, _traced_warmup

    runs = []

    def picky(x):  # fails under any dispatch mode, as an unsupported higher-order op would
        runs.append(is_in_torch_dispatch_mode())
        if runs[-1]:
            raise NotImplementedError("no rule for this mode")
        return x * 2

    x = torch.randn(3)
    with caplog.at_level(logging.INFO, logger="launchless"):
        assert _traced_warmup(picky, (x,), {}, [x]) == frozenset() and runs == [True, False]
    (line,) = [r.getMessage() for r in caplog.records]
    assert "could not be traced" in line and "NotImplementedError: no rule for this mode" in line
    assert _traced_warmup(lambda t: t[t.long().clamp(0, 2)], (x,), {}, [x]) == frozenset({0})

    def broken(t):
        raise ValueError("the model's own bug")

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="launchless"), pytest.raises(CaptureFailed, match="the model's own bug"):
        _traced_warmup(broken, (x,), {}, [x])
    assert not caplog.records, "a broken forward is not a trace problem: no line about tracing"
