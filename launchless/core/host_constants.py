"""Host constants at run time: tensors a forward builds on the host and copies to the GPU, made once on the device.

A capture cannot record a copy from pageable host memory: ``torch.tensor(image_size, device="cuda")``,
``anchors.to(x.device)`` or ``dst.copy_(cpu_table)`` inside a forward refuse the whole graph ("Cannot copy
between CPU and CUDA tensors during CUDA graph capture"). What such a copy carries cannot depend on the values
of the inputs -- those are on the GPU during a capture, and reading one on the host would have synchronised,
which a capture refuses as well -- only on Python values, shapes and host state. So, as the compiler path's
CGCT does:

- the last warm-up run goes through ``HostCopyRecorder``: every host-to-device copy is done as usual and, in
  order, its host source and a device copy of its result are kept;
- the capture run goes through ``HostCopyReplayer``: each host-to-device copy, met in the same order with an
  equal host source, becomes a device-to-device copy from the kept result (a fresh tensor each time, so a
  forward that writes into it in place cannot change the constant). A copy that is not met in the same order
  or with the same value means the host code does not compute the same thing twice (a clock, a counter): the
  capture is refused with that reason;
- verification then proves the graph on two probes whose values differ (the differential check);
- host sources that outlive the call (a CPU tensor the module holds) are watched: a graph whose source was
  written or replaced since its capture is dropped before it could replay a stale value
  (``HostSources.changed``). Sources made fresh by each call from Python values are frozen into the graph
  like any Python value the forward reads.
Only copies up to ``MAX_BYTES`` are taken as constants; a larger host tensor is data, and stays refused.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

MAX_BYTES = 1 << 20


class HostValueChanged(RuntimeError):
    """A host-to-device copy did not repeat between the warm-up and the capture."""


def _is_host(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "cpu"


def _small(t: torch.Tensor) -> bool:
    return t.numel() * t.element_size() <= MAX_BYTES


def _host_copy(func: Any, args: tuple, kwargs: dict) -> torch.Tensor | None:
    """The host source of a host-to-device copy, or None for any other op."""
    name = func._schema.name
    if name in ("aten::_to_copy", "aten::to") and args and _is_host(args[0]):  # aten::to: under inference_mode
        device = kwargs.get("device", next((a for a in args[1:] if isinstance(a, torch.device)), None))
        if device is not None and torch.device(device).type != "cpu" and _small(args[0]):
            return args[0]
    target = args[0] if name == "aten::copy_" and len(args) > 1 else None
    if isinstance(target, torch.Tensor) and target.device.type != "cpu" and _is_host(args[1]) and _small(args[1]):
        return args[1]
    return None


_FACTORIES = (torch.tensor, torch.as_tensor)


class _FactoriesViaHost(TorchFunctionMode):
    """``torch.tensor(data, device="cuda")`` copies its data to the device below the dispatcher's Python key, where
    no dispatch mode sees it: made on the host and moved with ``.to``, the copy is an ``aten::_to_copy`` like any."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        device = kwargs.get("device")
        from_values = not (args and isinstance(args[0], torch.Tensor))  # data from Python values (or numpy)
        if func in _FACTORIES and from_values and device is not None and torch.device(device).type != "cpu":
            return func(*args, **{**kwargs, "device": "cpu"}).to(device)
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
    """What one warm-up run copied to the device, in order: the host sources and device copies of the results."""

    def __init__(self) -> None:
        self.sources: list[torch.Tensor] = []  # host copies of the sources, to compare at capture
        self.results: list[torch.Tensor] = []  # device tensors the graph reads its constants from
        self.held: list[weakref.ref] = []  # the original sources: those still alive after the call are watched

    def __len__(self) -> int:
        return len(self.results)


class HostCopyRecorder(TorchDispatchMode):
    """Run once (a warm-up, not capturing): copies happen as usual and are recorded in ``copies``."""

    def __init__(self) -> None:
        super().__init__()
        self.copies = HostCopies()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        source = _host_copy(func, args, kwargs)
        if source is not None:
            self.copies.sources.append(source.clone())
            self.copies.results.append(out.detach().clone())
            self.copies.held.append(weakref.ref(source))
        return out


class HostCopyReplayer(TorchDispatchMode):
    """Run while capturing: the recorded copies come from the device instead of the host."""

    def __init__(self, copies: HostCopies) -> None:
        super().__init__()
        self.copies = copies
        self.position = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        source = _host_copy(func, args, kwargs)
        if source is None:
            return func(*args, **kwargs)
        i = self.position
        if i >= len(self.copies) or not _same(source, self.copies.sources[i]):
            raise HostValueChanged(
                f"a tensor copied from the host to the GPU inside the forward ({tuple(source.shape)} "
                f"{source.dtype}) differs between two runs with the same inputs, so it cannot be made a constant "
                "of the graph (does it read a clock, a counter or other changing host state?)"
            )
        self.position += 1
        constant = self.copies.results[i]
        if func._schema.name == "aten::copy_":
            return args[0].copy_(constant.to(dtype=args[0].dtype))
        return constant.clone()

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
