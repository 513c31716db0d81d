"""Outputs that are, or view, one of the graph's inputs: handed back as the caller's tensor, not a copy.

Eager returns the input itself for ``x.to(x.dtype)`` or ``return x``, and a view of it for ``x[0]``;
Dynamo then stores such an object back where the model keeps it: torchvision's ``AnchorGenerator``
assigns ``self.cell_anchors`` from its own ``.to()`` on every call. A replay that cloned those outputs
would hand back a new tensor each call, the attribute would move, and every graph reading it in place
would have to be captured again on the next call. So these outputs are rebuilt from the caller's
inputs on each replay: the input itself, or the same view of it -- a copy only where the caller's tensor
is laid out differently from the captured one (the view would then point elsewhere).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

from .storage import storage_address


@dataclasses.dataclass(frozen=True)
class InputAlias:
    """Output leaf ``position`` is input leaf ``leaf`` itself (``view`` None) or a view of it."""

    position: int
    leaf: int
    view: tuple[tuple[int, ...], tuple[int, ...], int] | None  # size, stride, offset from the input's own
    input_stride: tuple[int, ...]  # the captured input's strides: the view is only valid on this layout

    def take(self, inputs: Sequence[Any], captured: torch.Tensor) -> torch.Tensor:
        x = inputs[self.leaf]
        if self.view is None:
            return x
        if x.stride() != self.input_stride:
            return captured.clone()
        size, stride, offset = self.view
        return x.as_strided(size, stride, x.storage_offset() + offset)


def find_input_aliases(outputs: Any, inputs: Sequence[Any]) -> list[InputAlias]:
    """The output leaves that are an input leaf or share its memory, at capture time."""
    identity = {id(x): i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor)}
    storage = {}
    for i, x in enumerate(inputs):
        if isinstance(x, torch.Tensor) and storage_address(x):
            storage.setdefault(storage_address(x), i)
    aliases = []
    for position, t in enumerate(pytree.tree_leaves(outputs)):
        if not isinstance(t, torch.Tensor):
            continue
        if (i := identity.get(id(t))) is not None:
            aliases.append(InputAlias(position, i, None, tuple(inputs[i].stride())))
        elif (i := storage.get(storage_address(t) or -1)) is not None:
            base = inputs[i]
            view = (tuple(t.shape), tuple(t.stride()), t.storage_offset() - base.storage_offset())
            aliases.append(InputAlias(position, i, view, tuple(base.stride())))
    return aliases


def fill_aliases(aliases: Sequence[InputAlias], inputs: Sequence[Any], leaves: list) -> None:
    """Put the caller's tensor (or the same view of it) at each aliased position of the output ``leaves``,
    which still hold the captured tensors there (``output_copies.make_cloner``'s ``keep``)."""
    for alias in aliases:
        leaves[alias.position] = alias.take(inputs, leaves[alias.position])
