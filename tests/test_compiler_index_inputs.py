"""CPU tests: which float inputs of an FX graph are read as addresses (verified on the call's own values)."""

from __future__ import annotations

import pytest
import torch
from dynamo_graph import dynamo_graph

from launchless.compiler.cgct import aten_graph
from launchless.compiler.index_inputs import index_like_inputs


def _positions(inputs, *tensors) -> frozenset[int]:
    return frozenset(i for i, x in enumerate(inputs) if any(x is t for t in tensors))


def test_a_float_cast_to_an_index_marks_what_it_is_computed_from_and_nothing_else() -> None:
    def gather(table, weights, offsets, scale):
        rows = (offsets * scale).floor().long()  # floats become row ids
        return table[rows] * weights.sum()

    table, weights, offsets, scale = torch.randn(8, 3), torch.randn(3), torch.tensor([0.5, 2.5]), torch.tensor(2.0)
    gm, inputs = dynamo_graph(gather, table, weights, offsets, scale)
    assert index_like_inputs(gm, inputs) == _positions(inputs, offsets, scale)
    assert index_like_inputs(aten_graph(gm, inputs), inputs) == _positions(inputs, offsets, scale)


def test_integer_and_boolean_casts_and_float_casts_to_floats_mark_nothing() -> None:
    def fn(x, ids, mask):
        return x.to(torch.float64).sum() + ids.long().sum() + mask.int().sum() + x.half().float().sum()

    gm, inputs = dynamo_graph(fn, torch.randn(4), torch.arange(4, dtype=torch.int32), torch.rand(4) > 0.5)
    assert index_like_inputs(gm, inputs) == frozenset()


def test_roi_align_boxes_are_marked_and_its_feature_map_is_not() -> None:
    ops = pytest.importorskip("torchvision.ops")
    conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def head(image, boxes):
        return ops.roi_align(conv(image), boxes, (2, 2), 0.5, 2, True), ops.roi_pool(image, boxes * 1.0, (2, 2))

    image, boxes = torch.randn(1, 3, 16, 16), torch.tensor([[0.0, 1, 1, 9, 9], [0.0, 2, 0, 6, 8]])
    with torch.no_grad():
        gm, inputs = dynamo_graph(head, image, boxes)
        assert index_like_inputs(gm, inputs) == _positions(inputs, boxes)
        assert index_like_inputs(aten_graph(gm, inputs), inputs) == _positions(inputs, boxes)
