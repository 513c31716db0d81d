"""Fresh copies of a graph's outputs after each replay, in as few launches as possible.

The next replay overwrites a graph's output buffers, so each replay hands back copies. A clone per tensor
costs a launch per tensor (RT-DETR's graph returns 14 tensors, a transformers model's output often a dozen):
host time, and GPU time PyTorch's own graph mode does not spend (it hands out its buffers, overwritten by the
next run). ``torch._foreach_copy_`` copies all tensors of one dtype in one multi-tensor launch. The container
is rebuilt directly: rebuilding a transformers ModelOutput through its constructor costs tens of microseconds.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

IMMUTABLE_OUTPUTS = (type(None), bool, int, float, complex, str, torch.dtype, torch.device, torch.Size, type)


class TensorCopier:
    """``copier()``: fresh copies of ``tensors`` (fixed buffers), one ``_foreach_copy_`` per dtype."""

    def __init__(self, tensors: Sequence[torch.Tensor]) -> None:
        self.tensors = list(tensors)
        by_dtype: dict[torch.dtype, list[int]] = {}
        for i, t in enumerate(self.tensors):
            by_dtype.setdefault(t.dtype, []).append(i)
        self.groups = [(positions, [self.tensors[i] for i in positions]) for positions in by_dtype.values()]

    def __call__(self) -> list[torch.Tensor]:
        if len(self.tensors) == 1 or torch.is_grad_enabled():  # _foreach_copy_ has no autograd formula
            return [t.clone() for t in self.tensors]
        fresh = [torch.empty_like(t) for t in self.tensors]  # the buffers' layout, as clone() keeps it
        for positions, sources in self.groups:
            if len(positions) == 1:
                fresh[positions[0]].copy_(sources[0])
            else:
                torch._foreach_copy_([fresh[i] for i in positions], sources)
        return fresh


def _part(value: Any) -> tuple[list, Callable[[list], Any]]:
    """A value's leaves and how to rebuild it from new leaves (a tensor is its own single leaf)."""
    if isinstance(value, (torch.Tensor, *IMMUTABLE_OUTPUTS)):
        return [value], lambda leaves: leaves[0]
    leaves, spec = pytree.tree_flatten(value)
    return leaves, lambda new: pytree.tree_unflatten(new, spec)


def _container(outputs: Any) -> tuple[list, Callable[[list], Any]] | None:
    """The values of a tuple, list, dict or ModelOutput-like dataclass, and how to rebuild it from values."""
    kind = type(outputs)
    if kind in (tuple, list):
        return list(outputs), kind
    if kind is dict:
        keys = list(outputs)
        return list(outputs.values()), lambda values: dict(zip(keys, values, strict=True))
    if isinstance(outputs, OrderedDict) and dataclasses.is_dataclass(outputs):
        keys, attrs = list(outputs), dict(outputs.__dict__)

        def shallow(values: list) -> Any:
            new = kind.__new__(kind)
            for k, v in zip(keys, values, strict=True):
                OrderedDict.__setitem__(new, k, v)  # keeps the order, skips ModelOutput's slow hooks
            new.__dict__.update(attrs)
            new.__dict__.update(zip(keys, values, strict=True))
            return new

        return list(outputs.values()), shallow
    return None


def make_cloner(outputs: Any, keep: frozenset[int] = frozenset()) -> Callable[..., Any]:
    """``clone(fill=None)``: ``outputs`` with every tensor leaf a fresh copy. The leaves at ``keep`` (positions
    in pytree order) are not copied; ``fill(leaves)`` puts the caller's tensors there (``output_aliases``)."""
    if isinstance(outputs, torch.Tensor) and not keep:
        return lambda fill=None: outputs.clone()
    container = _container(outputs)
    values, build = container if container is not None else ([outputs], lambda values: values[0])
    parts = [_part(v) for v in values]
    leaves = [leaf for part_leaves, _ in parts for leaf in part_leaves]  # pytree's order: values in order
    slots = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor) and i not in keep]
    copier = TensorCopier([leaves[i] for i in slots]) if slots else list
    bounds, start = [], 0
    for part_leaves, rebuild in parts:
        bounds.append((start, start + len(part_leaves), rebuild))
        start += len(part_leaves)

    flat = type(outputs) in (tuple, list, dict) and all(isinstance(v, torch.Tensor) for v in values)
    if flat and not keep:  # a tuple of tensors, as every Dynamo graph returns: no leaves to rebuild
        return lambda fill=None: build(copier())

    def fresh_leaves(fill: Callable[[list], None] | None) -> list:
        new = list(leaves)
        for i, t in zip(slots, copier(), strict=True):
            new[i] = t
        if fill is not None:
            fill(new)
        return new

    def clone(fill: Callable[[list], None] | None = None) -> Any:
        new = fresh_leaves(fill)
        return build([rebuild(new[a:b]) for a, b, rebuild in bounds])

    if container is not None and type(outputs) not in (tuple, list, dict):  # ModelOutput-like: checked once
        probe = clone()
        if pytree.tree_structure(probe) != pytree.tree_structure(outputs) or list(probe.keys()) != list(outputs):
            spec = pytree.tree_structure(outputs)
            return lambda fill=None: pytree.tree_unflatten(fresh_leaves(fill), spec)
    return clone
