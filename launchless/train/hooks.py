"""What a training step may not do while it is being captured, and what is deferred to replay time.

Capturing runs the user's step once with these patches in place:

- ``LRScheduler.step`` is recorded, not run (a graph would freeze its result); replays call it.
- Whole step: ``GradScaler.unscale_`` (its skip-on-inf is a host sync) is refused before it touches
  anything. Forward+backward level: ``optimizer.step`` and ``GradScaler.step/unscale_/update`` are
  recorded and run eager after each replay.
- ``MutationLog`` notes every pre-existing tensor the step writes, so verification saves it too,
  and whether the step reads the gradients it found (gradient accumulation).
"""

from __future__ import annotations

import collections
import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.optim.lr_scheduler import LRScheduler
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from ..core import capture as _capture
from ..core.storage import storage_address

_SCALER = torch.amp.GradScaler


@contextlib.contextmanager
def _patched(owner: Any, name: str, replacement: Any) -> Iterator[None]:
    had_own = name in vars(owner)
    original = vars(owner).get(name)
    setattr(owner, name, replacement)
    try:
        yield
    finally:
        if had_own:
            setattr(owner, name, original)
        else:
            delattr(owner, name)


@contextlib.contextmanager
def deferred_schedulers(calls: list[LRScheduler]) -> Iterator[None]:
    def record(self: LRScheduler, *args: Any, **kwargs: Any) -> None:
        if args or kwargs:
            raise _capture.CaptureFailed("capture", None, "scheduler.step() with arguments cannot be replayed")
        calls.append(self)

    with _patched(LRScheduler, "step", record):
        yield


@contextlib.contextmanager
def watch_scalers(seen: set[torch.amp.GradScaler]) -> Iterator[None]:
    """Remember which GradScalers the step uses: their scale and growth tracker are training state."""
    original = _SCALER.scale

    def scale(self: torch.amp.GradScaler, outputs: Any) -> Any:
        if self.is_enabled():
            seen.add(self)
        return original(self, outputs)

    with _patched(_SCALER, "scale", scale):
        yield


@contextlib.contextmanager
def refuse_scaler_sync() -> Iterator[None]:
    """(Fused optimizers take the scaler's device-side path, which never calls unscale_ from step.)"""
    original = _SCALER.unscale_

    def refuse(self: torch.amp.GradScaler, optimizer: torch.optim.Optimizer) -> None:
        if not self.is_enabled():
            return original(self, optimizer)
        raise _capture.CaptureFailed(
            "capture",
            None,
            "GradScaler.unscale_ needs a host sync to skip steps with inf/NaN gradients (use bf16, or a fused "
            "optimizer, to capture the whole step)",
        )

    with _patched(_SCALER, "unscale_", refuse):
        yield


@contextlib.contextmanager
def deferred_optimizer(optimizer: torch.optim.Optimizer, calls: list[Callable[[], Any]]) -> Iterator[None]:
    """Record optimizer and scaler calls for eager replay after the forward+backward graph."""

    def recorder(original: Callable[..., Any], bound: Any = None) -> Callable[..., Any]:
        def record(*args: Any, **kwargs: Any) -> None:
            if bound is None and isinstance(args[0], _SCALER) and not args[0].is_enabled():
                return original(*args, **kwargs)
            calls.append(functools.partial(original, *args, **kwargs))
            return None

        return record

    with contextlib.ExitStack() as stack:
        stack.enter_context(_patched(optimizer, "step", recorder(optimizer.step, bound=optimizer)))
        for name in ("step", "unscale_", "update"):
            stack.enter_context(_patched(_SCALER, name, recorder(getattr(_SCALER, name))))
        yield


def scaler_tensors(scaler: torch.amp.GradScaler) -> list[torch.Tensor]:
    return [t for t in (getattr(scaler, "_scale", None), getattr(scaler, "_growth_tracker", None)) if t is not None]


def reset_scaler(scaler: torch.amp.GradScaler) -> None:
    """A capture that failed between scaler.step and scaler.update leaves the scaler's bookkeeping 'stepped'."""
    refresh = getattr(torch.amp.grad_scaler, "_refresh_per_optimizer_state", None)
    if refresh is not None:
        scaler._per_optimizer_states = collections.defaultdict(refresh)


# ops that update BatchNorm running statistics in place without saying so in their schema
_UNANNOTATED_WRITES = {
    name: ("running_mean", "running_var")
    for name in ("aten::native_batch_norm", "aten::cudnn_batch_norm", "aten::miopen_batch_norm")
}


class MutationLog(TorchDispatchMode):
    """Records tensors that existed before the capture and that the step writes in place.

    The user's step may update state launchless was not told about (an EMA copy of the weights, a
    second model's BatchNorm statistics); verification runs the step twice from one state, so every
    such tensor must be saved and restored too, or it would be updated twice.
    """

    def __init__(self, watch: list[torch.Tensor] = ()) -> None:
        super().__init__()
        self.fresh: set[int] = set()  # storages created during the capture
        # GPU memory in use before the step: compiled code (Inductor's) allocates its buffers without passing the
        # dispatcher and then writes them with ``out=`` operations, so "not made by an operation seen here" does
        # not mean "existed before"; a block the allocator handed out during the step is the step's own
        self._blocks_before = _active_blocks()
        self._blocks_after: set[tuple[int, int]] | None = None
        self.mutated: dict[int, torch.Tensor] = {}
        self.writers: dict[int, str] = {}  # the operation that first wrote each mutated tensor
        self.watched = {storage_address(t) for t in watch}  # e.g. incoming gradients: does the step read them?
        self.read: set[int] = set()
        self.parameters: dict[int, torch.Tensor] = {}  # every nn.Parameter the step uses, by storage

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        for t in pytree.tree_leaves((args, kwargs)):
            if isinstance(t, torch.nn.Parameter):
                self.parameters.setdefault(storage_address(t), t)
            if self.watched and isinstance(t, torch.Tensor) and (ptr := storage_address(t)) in self.watched:
                self.read.add(ptr)
        out = func(*args, **kwargs)
        schema = func._schema
        unannotated = _UNANNOTATED_WRITES.get(schema.name, ())
        for i, arg in enumerate(schema.arguments):
            written = arg.alias_info is not None and arg.alias_info.is_write
            if not written and arg.name not in unannotated:
                continue
            value = args[i] if i < len(args) else kwargs.get(arg.name)
            for t in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(t, torch.Tensor) and storage_address(t) not in self.fresh:
                    self.mutated.setdefault(id(t), t)
                    self.writers.setdefault(id(t), schema.name)
        if not any(r.alias_info is not None for r in schema.returns):
            for t in out if isinstance(out, (list, tuple)) else (out,):
                if isinstance(t, torch.Tensor):
                    self.fresh.add(storage_address(t))
        return out

    def logging(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` with its writes logged: the step's own, not the capture's around it (beginning a capture fills
        the CUDA generator's seed and offset tensors, which live across graphs: no state of the step)."""

        @functools.wraps(fn)  # named as the step, in what a failed capture says
        def logged(*args: Any, **kwargs: Any) -> Any:
            with self:
                return fn(*args, **kwargs)

        return logged

    def foreign_parameters(self, model: torch.nn.Module) -> list[torch.Tensor]:
        """Parameters the step reads but neither holds in ``model`` nor writes: e.g. a distillation teacher."""
        own = {storage_address(p) for p in model.parameters()}
        written = {storage_address(t) for t in self.mutated.values()}
        return [t for ptr, t in self.parameters.items() if ptr not in own and ptr not in written]

    def was_read(self, t: torch.Tensor) -> bool:
        return storage_address(t) in self.read

    def state(self) -> list[torch.Tensor]:
        """The tensors that existed before the step and that it writes in place."""
        written = [t for t in self.mutated.values() if storage_address(t) not in self.fresh]
        if self._blocks_before is None or not any(t.is_cuda for t in written):
            return written
        if self._blocks_after is None:  # read once the step has run (the allocator's listing is not free)
            self._blocks_after = _active_blocks() or set()
        return [t for t in written if not _handed_out_since(t, self._blocks_before, self._blocks_after)]

    def describe(self, tensors: list[torch.Tensor]) -> str:
        """Tensors of ``state()`` as a reader can find them: dtype, shape and the operation that wrote each."""
        shown = [
            f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)} by {self.writers.get(id(t), '?')}"
            for t in tensors[:3]
        ]
        return ", ".join(shown) + (f" and {len(tensors) - 3} more" if len(tensors) > 3 else "")


def _active_blocks() -> set[tuple[int, int]] | None:
    """(device, address) of every block PyTorch's CUDA allocator has handed out and not taken back (None where CUDA
    is not in use: nothing to tell apart)."""
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    try:
        segments = torch.cuda.memory_snapshot()
    except RuntimeError:  # an allocator backend that keeps no blocks (cudaMallocAsync): every write counts as state
        return None
    active: set[tuple[int, int]] = set()
    for segment in segments:
        address = segment["address"]  # blocks lie end to end in their segment (a release without their address)
        for block in segment["blocks"]:
            if block["state"] == "active_allocated":
                active.add((segment["device"], block.get("address", address)))
            address += block["size"]
    return active


def _handed_out_since(t: torch.Tensor, before: set[tuple[int, int]], now: set[tuple[int, int]]) -> bool:
    """Whether ``t``'s storage is a block the allocator handed out after ``before`` was taken (memory from
    elsewhere -- another allocator, a DLPack import -- is in neither set and counts as existing before)."""
    if not t.is_cuda:
        return False
    block = (t.device.index, storage_address(t))
    return block in now and block not in before
