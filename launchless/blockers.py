"""What stops a forward from being captured, and where in whose code it happens.

PyTorch's own message ("Cannot copy between CPU and CUDA tensors during CUDA graph capture",
"operation not permitted when stream is capturing") names neither the operation nor the line.
Two tools fix that:
- ``locate``: the innermost frame of an exception's traceback (or of the current stack) that is
  not PyTorch's or launchless's own -- the line that asked for the forbidden thing -- and, when
  that is library code, the outermost frame of the caller's own code that reached it.
- ``dry_run``: runs the forward on the ``meta`` device under a dispatch mode that stops at the
  first operation a capture could not record. It needs no GPU, so ``launchless demo`` on a CPU
  machine (and the CPU tests) can say where capture would fail.
"""

from __future__ import annotations

import copy
import os
import sysconfig
import traceback
from dataclasses import dataclass
from types import TracebackType

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_OWN_DIR = os.path.dirname(__file__) + os.sep
_STDLIB = sysconfig.get_paths()["stdlib"] + os.sep

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
    "histc",
    "masked_scatter",
}
_COPY_OPS = {"_to_copy", "copy_", "copy", "to", "_copy_from", "_copy_from_and_resize"}

FIXES = {
    HOST_SYNC: "remove the host sync (.item(), float(t), bool(t), print(t), `if tensor:`) from the forward, "
    "or move it after the call",
    COPY: "create the tensor on the GPU (device=x.device) or move it once in __init__ (register a buffer) "
    "instead of copying it on every forward",
    DATA_DEPENDENT: "keep data-dependent shapes (nonzero, boolean masks, unique, NMS) out of the graphed part",
    CAPTURE_ERROR: "check that the forward uses only the current stream and allocates no pinned memory",
}


@dataclass(frozen=True)
class Location:
    """Where an operation was asked for: the line itself and, for library code, the caller's line."""

    file: str
    line: int
    function: str
    code: str
    owner: str
    caller: str | None = None

    def __str__(self) -> str:
        owner = "your code" if self.owner == "user" else f"{self.owner} code"
        text = f"{self.file}:{self.line} in {self.function} ({owner}): `{self.code}`"
        return text + (f", reached from your code at {self.caller}" if self.caller else "")


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


def _owner(filename: str) -> str:
    """'user' for the caller's own files, else the top-level package that ships the file."""
    for marker in ("site-packages" + os.sep, "dist-packages" + os.sep):
        if marker in filename:
            return filename.split(marker, 1)[1].split(os.sep, 1)[0].removesuffix(".py")
    return "user"


def _in_packages(filename: str) -> bool:
    return ("site-packages" + os.sep) in filename or ("dist-packages" + os.sep) in filename


def is_foreign(filename: str) -> bool:
    """PyTorch's, launchless's, the standard library's or the test runner's own frames."""
    if filename.startswith((_TORCH_DIR, _OWN_DIR)) or filename.startswith("<"):
        return True
    if "/_pytest/" in filename or "/pluggy/" in filename:
        return True
    # conda and python:3.x images keep site-packages inside the stdlib folder: those are libraries
    return filename.startswith(_STDLIB) and not _in_packages(filename)


def locate(frames: list[traceback.FrameSummary]) -> Location | None:
    """Innermost frame outside torch/launchless/stdlib; plus the outermost user frame if it is library code."""
    inside = [f for f in frames if not is_foreign(f.filename)]
    if not inside:
        return None
    frame = inside[-1]
    owner = _owner(frame.filename)
    caller = None
    if owner != "user":
        users = [f for f in inside if _owner(f.filename) == "user"]
        if users:
            caller = f"{users[-1].filename}:{users[-1].lineno}"
    return Location(frame.filename, frame.lineno or 0, frame.name, (frame.line or "").strip(), owner, caller)


def locate_exception(exc: BaseException) -> Location | None:
    tb: TracebackType | None = exc.__traceback__
    return locate(traceback.extract_tb(tb)) if tb else None


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


def _op_name(func: object) -> str:
    return getattr(func, "__name__", str(func)).split(".")[0]


def _devices(args: tuple, kwargs: dict) -> set[str]:
    """Device types among a copy's tensor arguments and target (a 0-dim CPU source is a copy too)."""
    found = {a.device.type for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)}
    if isinstance(kwargs.get("device"), torch.device):
        found.add(kwargs["device"].type)
    return found


def classify_op(func: object, args: tuple, kwargs: dict) -> str | None:
    """The blocker kind of one aten op on device tensors, or None when a capture can record it."""
    name = _op_name(func)
    if name in HOST_SYNC_OPS:
        return HOST_SYNC
    if name in DATA_DEPENDENT_OPS:
        return DATA_DEPENDENT
    if name in _COPY_OPS and len(_devices(args, kwargs)) > 1:
        return COPY
    return None


class _StopDryRun(Exception):
    pass


class _DispatchWatch(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.blocker: Blocker | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        kind = classify_op(func, args, kwargs)
        if kind is not None and self.blocker is None:
            self.blocker = Blocker(kind, f"aten.{_op_name(func)}", locate(traceback.extract_stack()))
            raise _StopDryRun
        return func(*args, **kwargs)


class _FunctionWatch(TorchFunctionMode):
    """Sees tensor constructors from host data, which dispatch modes do not."""

    def __init__(self, dispatch: _DispatchWatch) -> None:
        super().__init__()
        self.dispatch = dispatch

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.tensor, torch.as_tensor) and self.dispatch.blocker is None:
            device = kwargs.get("device", args[2] if func is torch.as_tensor and len(args) > 2 else None)
            if device is not None and torch.device(device).type != "cpu":
                self.dispatch.blocker = Blocker(
                    COPY, f"torch.{func.__name__}(host data, device=...)", locate(traceback.extract_stack())
                )
                raise _StopDryRun
        return func(*args, **kwargs)


def _meta_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` whose parameters and buffers live on ``meta``, never duplicating their data."""
    memo: dict[int, object] = {}
    for t in (*model.parameters(), *model.buffers()):
        meta = t.detach().to("meta")
        memo[id(t)] = torch.nn.Parameter(meta, t.requires_grad) if isinstance(t, torch.nn.Parameter) else meta
    return copy.deepcopy(model, memo)


def _to_meta(value: object) -> object:
    return value.detach().to("meta") if isinstance(value, torch.Tensor) else value


def dry_run(model: torch.nn.Module, args: tuple, kwargs: dict) -> Blocker | None:
    """Run the forward on the meta device and return the first operation a capture could not record.

    Parameters and tensor inputs move to ``meta`` (a stand-in for the GPU that holds no data), so a
    CPU tensor created inside the forward meets "device" tensors exactly where it would under CUDA.
    The model itself is not modified.
    """
    from torch.utils._pytree import tree_map

    from .capture_path import pretend_capturing
    from .runtime import GraphedModule

    if isinstance(model, GraphedModule):
        model = model.model
    meta_model = _meta_copy(model)
    margs, mkwargs = tree_map(_to_meta, (args, kwargs))
    watch = _DispatchWatch()
    try:
        with torch.no_grad(), pretend_capturing(), _FunctionWatch(watch), watch:
            meta_model(*margs, **mkwargs)
    except _StopDryRun:
        pass
    except Exception as exc:  # the meta device refused something a real capture might also refuse
        if watch.blocker is None:
            return Blocker(
                classify_message(str(exc)),
                f"{type(exc).__name__}: {str(exc).splitlines()[0]}",
                locate_exception(exc),
            )
    return watch.blocker


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
        try:
            return func(*args, **kwargs)
        except Exception as exc:
            if self.blocker is None:
                kind = classify_op(func, args, kwargs) or classify_message(str(exc))
                self.blocker = Blocker(kind, f"aten.{_op_name(func)}", locate(traceback.extract_stack()))
            raise
