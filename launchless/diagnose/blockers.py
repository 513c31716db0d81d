"""What stops a forward from being captured: the kinds of blocker, how to recognise them, and their fixes.

PyTorch's own message ("Cannot copy between CPU and CUDA tensors during CUDA graph capture",
"operation not permitted when stream is capturing") names neither the operation nor the line.
``classify_op`` and ``classify_message`` name the kind; ``FailureRecorder`` names the aten op that
raised during a diagnostic capture, with the line (``source.locate``) that called it.
"""

from __future__ import annotations

import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..core.composites import run_decomposed
from .source import Location, locate, locate_exception

HOST_SYNC = "host sync"
COPY = "CPU<->GPU copy"
DATA_DEPENDENT = "data-dependent shape"
CAPTURE_ERROR = "capture error"

HOST_SYNC_OPS = {"_local_scalar_dense", "item", "equal", "is_nonzero", "allclose"}
DATA_DEPENDENT_OPS = {
    "nonzero",
    "nonzero_static",
    "masked_select",
    "unique",
    "_unique",
    "_unique2",
    "unique_dim",
    "unique_consecutive",
    "bincount",
    "masked_scatter",
}
# operations that read their input's minimum and maximum on the host when called without a range: ``histc``, whose
# output (``bins`` counts) has a fixed shape either way, so with a range it is a device kernel like any other
RANGE_READ_OPS = {"histc"}
_COPY_OPS = {"_to_copy", "copy_", "copy", "to", "_copy_from", "_copy_from_and_resize"}
# indexing ops that take a list of index tensors: with a boolean mask among them, the rows they select (a nonzero
# inside the op) depend on the values
_INDEX_OPS = {"index", "_unsafe_index", "index_put", "index_put_", "_index_put_impl_", "_unsafe_index_put"}

FIXES = {
    HOST_SYNC: "remove the host sync (.item(), float(t), bool(t), print(t), `if tensor:`) from the forward, "
    "or move it after the call (a value that is the same at every call may stay: a call replays graphs around "
    "the read and reads it again, checked, at each replay)",
    COPY: "create the tensor on the GPU (device=x.device) or move it once in __init__ (register a buffer) "
    "instead of copying it on every forward",
    DATA_DEPENDENT: "keep data-dependent shapes (nonzero, boolean masks, unique, NMS) out of the graphed part",
    CAPTURE_ERROR: "check that the forward uses only the current stream and allocates no pinned memory",
}


@dataclass(frozen=True)
class Blocker:
    """One reason a forward cannot be captured."""

    kind: str
    operation: str
    location: Location | None

    def describe(self) -> str:
        where = f" at {self.location}" if self.location else ""
        return f"{self.kind}: {self.operation}{where}"

    @property
    def fix(self) -> str:
        return FIXES[self.kind]


def classify_message(message: str) -> str:
    """Map PyTorch's capture error text to a blocker kind."""
    text = message.lower()
    if "cannot copy between cpu and cuda" in text or "pinned" in text:
        return COPY
    if "nonzero" in text or "data-dependent" in text or "data dependent" in text:
        return DATA_DEPENDENT
    if "not permitted when stream is capturing" in text or "synchroniz" in text or "item()" in text:
        return HOST_SYNC
    return CAPTURE_ERROR


def describe_failure(cause: BaseException | None, message: str) -> str:
    """ "<kind>: <first line> at <user's line>" for a failed capture (``message`` when there is no cause)."""
    text = str(cause or message).strip()
    kind = classify_message(text) if cause is not None else CAPTURE_ERROR
    where = locate_exception(cause) if cause is not None else None
    return f"{kind}: {text.splitlines()[0] if text else kind}" + (f" at {where}" if where else "")


def op_name(func: object) -> str:
    return getattr(func, "__name__", str(func)).split(".")[0]


def _devices(args: tuple, kwargs: dict) -> set[str]:
    """Device types among a copy's tensor arguments and target (a 0-dim CPU source is a copy too)."""
    found = {a.device.type for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)}
    if isinstance(kwargs.get("device"), torch.device):
        found.add(kwargs["device"].type)
    return found


def _masks(args: tuple) -> bool:
    """Whether an indexing op's index list (its second argument) holds a boolean mask (``x[x > 0]``)."""
    indices = args[1] if len(args) > 1 and isinstance(args[1], (list, tuple)) else ()
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices)


def reads_its_range(name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
    """Whether a call of ``name`` (``histc``) reads its input's minimum and maximum on the host: without a range
    (``min == max``, both 0 by default) it does; with one (transformers' experts count tokens with
    ``histc(..., min=0, max=num_experts - 1)``) the counts are computed on the device. A range given as anything
    but two numbers (a traced value) is taken to read."""
    if name not in RANGE_READ_OPS:
        return False
    low = kwargs.get("min", args[2] if len(args) > 2 else 0)
    high = kwargs.get("max", args[3] if len(args) > 3 else 0)
    numbers = all(isinstance(v, (int, float)) for v in (low, high))
    return not numbers or low == high


def syncs_with_the_host(name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
    """Whether a call of the operation ``name`` hands the host a value read from its tensors (``.item()``,
    ``bool(t)``, ``histc`` without a range)."""
    return name in HOST_SYNC_OPS or reads_its_range(name, args, kwargs)


def classify_op(func: object, args: tuple, kwargs: dict) -> str | None:
    """The blocker kind of one aten op on device tensors, or None when a capture can record it."""
    name = op_name(func)
    if syncs_with_the_host(name, args, kwargs):
        return HOST_SYNC
    if name in DATA_DEPENDENT_OPS or (name in _INDEX_OPS and _masks(args)):
        return DATA_DEPENDENT
    if name in _COPY_OPS and len(_devices(args, kwargs)) > 1:
        return COPY
    return None


class FailureRecorder(TorchDispatchMode):
    """Names the aten op that raised during a (diagnostic) capture, with the line that called it.

    Only used to explain a capture that already failed: an active dispatch mode can send some ops
    down composite paths, so the graph that is kept is never captured under it.
    """

    def __init__(self) -> None:
        super().__init__()
        self.blocker: Blocker | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if (out := run_decomposed(self, func, args, kwargs)) is not NotImplemented:  # what no_grad shows
            return out
        try:
            return func(*args, **kwargs)
        except Exception as exc:
            if self.blocker is None:
                kind = classify_op(func, args, kwargs) or classify_message(str(exc))
                self.blocker = Blocker(kind, f"aten.{op_name(func)}", locate(traceback.extract_stack()))
            raise
