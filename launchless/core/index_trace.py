"""Which float inputs a forward reads as addresses, seen while it runs once (the runtime has no FX graph).

A roi op's boxes carry their image's batch index as a float; a diffusion model's float timestep, cast to an
integer, indexes its noise schedule. Random probes there read out of bounds, and on a GPU an out-of-bounds
read or a failed index check ends the process. One warm-up run goes through ``IndexTrace``: every op's
outputs inherit the inputs their operands came from (keyed by storage, so a write into a view marks its base
too), and where a roi op's boxes or a float cast to an integer come from an input, that input is recorded.
Verification then probes it from the call's own values (``verify.make_probes``'s ``from_call``).
A storage address freed and reused can only mark an input too many: that input is then verified on the
call's values only, never probed out of its domain.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from .composites import run_decomposed
from .storage import storage_address

ROI_OPS = {"roi_align", "roi_pool", "ps_roi_align", "ps_roi_pool"}  # torchvision ops reading boxes as (index, x1, ...)


def is_integer_dtype(dtype: Any) -> bool:
    return isinstance(dtype, torch.dtype) and not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


def _address_operand(func: Any, args: tuple, kwargs: dict) -> torch.Tensor | None:
    """The operand ``func`` reads as addresses: a roi op's boxes, or a float it casts to an integer."""
    namespace, _, name = func._schema.name.partition("::")
    if namespace == "torchvision" and name in ROI_OPS:
        boxes = args[1] if len(args) > 1 else kwargs.get("rois", kwargs.get("boxes"))
        return boxes if isinstance(boxes, torch.Tensor) else None
    if name == "_to_copy" and args and isinstance(args[0], torch.Tensor) and args[0].is_floating_point():
        dtype = kwargs.get("dtype", next((a for a in args[1:] if isinstance(a, torch.dtype)), None))
        return args[0] if is_integer_dtype(dtype) else None
    return None


class IndexTrace(TorchDispatchMode):
    """``with IndexTrace(leaves) as trace: fn(...)``; then ``trace.found``: positions of float ``leaves``
    from which a value read as an address was computed."""

    def __init__(self, leaves: list) -> None:
        super().__init__()
        self.origin: dict[int, frozenset[int]] = {}
        for i, x in enumerate(leaves):
            if isinstance(x, torch.Tensor) and x.is_floating_point() and (key := storage_address(x)):
                self.origin[key] = self.origin.get(key, frozenset()) | {i}
        self.found: set[int] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if self.origin and (out := run_decomposed(self, func, args, kwargs)) is not NotImplemented:
            return out  # its parts, as under no_grad: a cast inside ``type_as`` is seen as a cast
        out = func(*args, **kwargs)
        if not self.origin:
            return out
        sources = frozenset().union(
            *(
                self.origin.get(storage_address(t), ())
                for t in pytree.tree_leaves((args, kwargs))
                if isinstance(t, torch.Tensor)
            )
        )
        if sources:
            operand = _address_operand(func, args, kwargs)
            if operand is not None:
                self.found |= self.origin.get(storage_address(operand), frozenset())
            for t in pytree.tree_leaves(out):
                if isinstance(t, torch.Tensor) and (key := storage_address(t)):
                    self.origin[key] = self.origin.get(key, frozenset()) | sources
        return out
