"""Host constants at run time: tensors a forward builds on the host and copies to the GPU, made once on the device.

A capture cannot record a copy from pageable host memory: ``torch.tensor(image_size, device="cuda")``,
``anchors.to(x.device)`` or ``dst.copy_(cpu_table)`` inside a forward refuse the whole graph ("Cannot copy
between CPU and CUDA tensors during CUDA graph capture"). What such a copy carries cannot depend on the values
of the inputs -- those are on the GPU during a capture, and reading one on the host would have synchronised,
which a capture refuses as well -- only on Python values, shapes and host state. So, as the compiler path's
CGCT does:

- the last warm-up run goes through ``HostCopyRecorder``: every host-to-device copy is done as usual and, in
  order, its host source and a device copy are kept. A copy is a move (``.to``, ``.cuda()``, ``torch.tensor(...,
  device=)``) or a small host tensor handed to an op on device tensors, which copies it itself (``dst.copy_(host)``,
  an index list built on the host: ``x[:, [-2]]``, ``table[host_index]``);
- the capture run goes through ``HostCopyReplayer``: each such copy, met in the same order with an equal host
  value, becomes a device-to-device copy from the kept tensor (a fresh tensor each time, so a forward that writes
  into it in place cannot change the constant). A copy that is not met in the same order or with the same value
  means the host code does not compute the same thing twice (a clock, a counter): the capture is refused with
  that reason;
- verification then proves the graph on two probes whose values differ (the differential check);
- host sources that outlive the call (a CPU tensor the module holds) are watched: a graph whose source was
  written or replaced since its capture is dropped before it could replay a stale value
  (``HostSources.changed``). Sources made fresh by each call from Python values are frozen into the graph
  like any Python value the forward reads.
Only copies up to ``MAX_BYTES`` are taken as constants; a larger host tensor is data, and stays refused. A copy from
pinned memory is left as it is: a capture records it, and each replay reads the pinned buffer afresh.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from .composites import run_decomposed

MAX_BYTES = 1 << 20


class HostValueChanged(RuntimeError):
    """A host-to-device copy did not repeat between the warm-up and the capture."""


def _is_host(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "cpu"


def _small(t: torch.Tensor) -> bool:
    """Small enough to be a constant, and pageable: a copy from pinned memory is captured as it is (the graph
    reads the pinned buffer at each replay, as eager reads it at each call)."""
    return t.numel() * t.element_size() <= MAX_BYTES and not (torch.cuda.is_available() and t.is_pinned())


MOVES = ("aten::_to_copy",)


def _host_copy(func: Any, args: tuple, kwargs: dict) -> torch.Tensor | None:
    """The host source of a move to the device (``.to``, ``.cuda()``), or None for any other op."""
    if func._schema.name in MOVES and args and _is_host(args[0]):
        device = kwargs.get("device", next((a for a in args[1:] if isinstance(a, torch.device)), None))
        if device is not None and torch.device(device).type != "cpu" and _small(args[0]):
            return args[0]
    return None


def _host_operands(leaves: list) -> tuple[list[int], torch.device | None]:
    """Positions of the small host tensors (not 0-dim: those are scalars a kernel takes by value) among an op's
    operands, and the device of its other tensors -- an index list built on the host (``x[:, [-2]]``), the source
    of ``dst.copy_(host)``: the op copies them to the device itself, below what a dispatch mode sees."""
    device = next((t.device for t in leaves if isinstance(t, torch.Tensor) and t.device.type != "cpu"), None)
    if device is None:
        return [], None
    host = [i for i, t in enumerate(leaves) if _is_host(t) and t.dim() > 0 and _small(t)]
    return host, device


_FACTORIES = (torch.tensor, torch.as_tensor)


_INDEXING = (torch.Tensor.__getitem__, torch.Tensor.__setitem__)


def _lists_as_tensors(index: Any) -> Any:
    """An index with its Python lists as host tensors (the same advanced indexing)."""
    if isinstance(index, list):
        return torch.tensor(index)
    if isinstance(index, tuple):
        return tuple(torch.tensor(i) if isinstance(i, list) else i for i in index)
    return index


class _FactoriesViaHost(TorchFunctionMode):
    """Two ways host data reaches the device below the dispatcher's Python key, where no dispatch mode sees it,
    made visible: ``torch.tensor(data, device="cuda")`` is made on the host and moved with ``.to`` (an
    ``aten::_to_copy`` like any move), and a Python list in an index (``x[:, [-2]]``) becomes a host tensor,
    which the indexing op then copies (a host operand, see ``_host_operands``)."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in _FACTORIES:
            device = kwargs.get("device")
            from_values = not (args and isinstance(args[0], torch.Tensor))  # data from Python values (or numpy)
            if from_values and device is not None and torch.device(device).type != "cpu":
                return func(*args, **{**kwargs, "device": "cpu"}).to(device)
        elif func in _INDEXING and len(args) > 1 and isinstance(args[0], torch.Tensor) and args[0].device.type != "cpu":
            args = (args[0], _lists_as_tensors(args[1]), *args[2:])
        return func(*args, **kwargs)


class _Both:
    """Enter the factory rewrite and a dispatch mode together."""

    def __init__(self, mode: TorchDispatchMode) -> None:
        self._factories, self._mode = _FactoriesViaHost(), mode

    def __enter__(self) -> Any:
        self._factories.__enter__()
        return self._mode.__enter__()

    def __exit__(self, *exc: Any) -> None:
        try:
            self._mode.__exit__(*exc)
        finally:
            self._factories.__exit__(*exc)


def recording() -> _Both:
    """``with recording() as recorder: fn(...)``; then ``recorder.copies``."""
    return _Both(HostCopyRecorder())


def replaying(copies: HostCopies) -> _Both:
    """``with replaying(copies) as replayer: fn(...)`` while capturing; then ``replayer.check_all_used()``."""
    return _Both(HostCopyReplayer(copies))


class HostCopies:
    """What one warm-up run copied to the device, in order: per copy, the op, the operand it replaces (None for a
    move, whose result it replaces), the host value and the device tensor the graph reads instead."""

    def __init__(self) -> None:
        self.ops: list[tuple[str, int | None]] = []
        self.sources: list[torch.Tensor] = []  # host copies of the sources, to compare at capture
        self.results: list[torch.Tensor] = []  # device tensors the graph reads its constants from
        self.held: list[weakref.ref] = []  # the original sources: those still alive after the call are watched

    def add(self, op: str, position: int | None, source: torch.Tensor, result: torch.Tensor) -> None:
        self.ops.append((op, position))
        self.sources.append(source.clone())
        self.results.append(result)
        self.held.append(weakref.ref(source))

    def __len__(self) -> int:
        return len(self.results)


def _on_device(out: Any) -> bool:
    tensors = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    return bool(tensors) and all(t.device.type != "cpu" for t in tensors)


class HostCopyRecorder(TorchDispatchMode):
    """Run once (a warm-up, not capturing): ops run as usual; their host-to-device copies are recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.copies = HostCopies()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if (out := run_decomposed(self, func, args, kwargs)) is not NotImplemented:  # as under no_grad
            return out
        name = func._schema.name
        source = _host_copy(func, args, kwargs)
        if source is not None:
            out = func(*args, **kwargs)
            self.copies.add(name, None, source, out.detach().clone())
            return out
        leaves, _ = pytree.tree_flatten((args, kwargs))
        host, device = _host_operands(leaves)
        out = func(*args, **kwargs)
        if host and name not in MOVES and _on_device(out):  # the result is on the device, as the graph's will be
            for i in host:
                self.copies.add(name, i, leaves[i], leaves[i].to(device))
        return out


class HostCopyReplayer(TorchDispatchMode):
    """Run while capturing: the recorded copies come from the device instead of the host."""

    def __init__(self, copies: HostCopies) -> None:
        super().__init__()
        self.copies = copies
        self.position = 0

    def _constant(self, op: str, position: int | None, source: torch.Tensor) -> torch.Tensor:
        i = self.position
        if i >= len(self.copies) or self.copies.ops[i] != (op, position) or not _same(source, self.copies.sources[i]):
            raise HostValueChanged(
                f"a tensor copied from the host to the GPU inside the forward ({tuple(source.shape)} "
                f"{source.dtype}, by {op}) differs between two runs with the same inputs, so it cannot be made a "
                "constant of the graph (does it read a clock, a counter or other changing host state?)"
            )
        self.position += 1
        return self.copies.results[i].clone()  # a fresh tensor per use: the forward may write into it

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if (out := run_decomposed(self, func, args, kwargs)) is not NotImplemented:  # as under no_grad
            return out
        name = func._schema.name
        source = _host_copy(func, args, kwargs)
        if source is not None:
            return self._constant(name, None, source)
        if name in MOVES:
            return func(*args, **kwargs)
        leaves, spec = pytree.tree_flatten((args, kwargs))
        host, _ = _host_operands(leaves)
        replaced = False
        for i in host:  # an op's host operands were recorded together, in order -- or not at all (its result is
            if self.position < len(self.copies) and self.copies.ops[self.position] == (name, i):  # on the host:
                leaves[i] = self._constant(name, i, leaves[i])  # a copy to the host, left to fail as it must)
                replaced = True
        if not replaced:
            return func(*args, **kwargs)
        args, kwargs = pytree.tree_unflatten(leaves, spec)
        return func(*args, **kwargs)

    def check_all_used(self) -> None:
        if self.position != len(self.copies):
            raise HostValueChanged(
                f"the forward copied {len(self.copies)} host tensors to the GPU while warming up but "
                f"{self.position} while capturing: its host code does not do the same thing on every call"
            )


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b))


class HostSources:
    """Host tensors a graph copied constants from that outlive the call (a CPU tensor a module holds): replaced
    or written since the capture means the graph's constant is stale."""

    def __init__(self, copies: HostCopies) -> None:
        self._watched = [(ref, ref()._version) for ref in copies.held if ref() is not None]

    def __bool__(self) -> bool:
        return bool(self._watched)

    def changed(self) -> bool:
        return any((t := ref()) is None or t._version != version for ref, version in self._watched)
