"""``dry_run``: where a capture would stop, found without a GPU.

Runs the forward on the ``meta`` device under a dispatch mode that stops at the first operation a
capture could not record. It needs no GPU, so ``launchless demo`` on a CPU machine (and the CPU
tests) can say where capture would fail.
"""

from __future__ import annotations

import copy
import traceback

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from ..core.capture_path import pretend_capturing
from ..errors import one_line
from .blockers import COPY, Blocker, classify_message, classify_op, op_name
from .source import locate, locate_exception


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
            self.blocker = Blocker(kind, f"aten.{op_name(func)}", locate(traceback.extract_stack()))
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
    model = getattr(model, "__launchless_model__", model)  # a wrapped model: its own forward
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
                one_line(exc),
                locate_exception(exc),
            )
    return watch.blocker
