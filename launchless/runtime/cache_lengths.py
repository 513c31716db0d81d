"""A static cache's lengths read on the host by a decode step, answered without reading the device while the step is
captured.

transformers' ``StaticLayer`` holds how many positions it has written in a device tensor (``cumulative_length``) that
each step advances in place, and its ``get_seq_length()`` returns that very tensor. Decoders that build positions
from it in Python -- ``torch.arange(length, length + n)`` (TrOCR's, MVP's and RoFormer's position embeddings), ``if
2 + n + length > table_size`` (XGLM's sinusoidal table) -- read the device: under capture that is an error (a graph
cannot wait for the host), and a value read once would be replayed at every later step.

While a decode step is captured, ``CacheLengths`` (a torch-function mode) follows the arithmetic on those lengths:

- ``length + k`` and ``length - k``, for a Python int ``k``, are the length offset by ``k``;
- ``torch.arange(length + a, length + b)`` over integers, both ends offset from the same length and the length not
  written in between, is ``torch.arange(b - a) + (length + a)`` on the length's device: each replay reads the length
  the step finds, as eager does;
- a comparison of an offset length with a Python int that comes out the same for every length the layer can hold
  (0 to its ``max_cache_len``: a write past the end is an error, never a longer cache) is that answer, handed to
  Python without reading the device -- and so is ``bool()`` of an offset length, where it is never (or always) zero.

Everything else runs as written: a read the mode cannot answer still stops the capture and is named as before. The
rewritten ``arange`` returns eager's very integers for every length, and the graph is verified against the step run
without the mode. Only plain ``StaticLayer`` lengths are followed (a sliding window's layer counts on the host too,
``cache_layers.HostCounters``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakIdKeyDictionary

from .cache_layers import bounded_layers

_T = torch.Tensor
# the sign the Python int is applied with (``k + length`` reaches the mode as an add of the tensor and ``k``)
_SHIFTS = {_T.add: 1, _T.__add__: 1, _T.__radd__: 1, torch.add: 1, _T.sub: -1, _T.__sub__: -1, torch.sub: -1}
_COMPARISONS = {
    fn: name
    for name in ("gt", "ge", "lt", "le", "eq", "ne")
    for fn in (getattr(_T, name), getattr(torch, name), getattr(_T, f"__{name}__"))
}
_READS_BOOL = {_T.__bool__}


@dataclasses.dataclass(frozen=True)
class _Offset:
    """A 0-dim integer tensor that holds a cache length (``base``, after its ``version``-th write) plus ``offset``;
    the length is between 0 and ``top``."""

    base: torch.Tensor
    version: int
    offset: int
    top: int


class CacheLengths(TorchFunctionMode):
    """The lengths of one static cache, followed through a decode step's Python while it is captured (module
    docstring). ``with lengths:`` around each run of the step; ``bool(lengths)``: whether the cache has any."""

    def __init__(self, cache: Any) -> None:
        super().__init__()
        self._bases = [
            (layer.cumulative_length, int(layer.max_cache_len))
            for layer in bounded_layers(cache)
            if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor)
            and layer.cumulative_length.dim() == 0
            and not layer.cumulative_length.is_floating_point()
            and isinstance(getattr(layer, "max_cache_len", None), int)
        ]
        self._writes = [0] * len(self._bases)  # in-place writes seen per length (an inference tensor has no version)
        self._offsets: WeakIdKeyDictionary = WeakIdKeyDictionary()  # tensor -> _Offset
        self._decided: WeakIdKeyDictionary = WeakIdKeyDictionary()  # comparison result -> its answer
        self.answered = 0  # host reads answered without the device, and aranges moved onto it

    def __bool__(self) -> bool:
        return bool(self._bases)

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in _READS_BOOL and len(args) == 1:
            answer = self._decided.get(args[0])
            known = self._offset(args[0]) if answer is None else None
            if known is not None:  # ``if length:``: whether it is not zero
                answer = _decided("ne", known.offset, known.top + known.offset, 0)
            if answer is not None:
                self.answered += 1
                return answer
        if func is torch.arange:
            moved = self._arange(args, kwargs)
            if moved is not None:
                self.answered += 1
                return moved
        if _writes_in_place(func, kwargs):
            self._count_writes(args, kwargs)
        out = func(*args, **kwargs)
        if func in _SHIFTS:
            self._follow(_SHIFTS[func], args, kwargs, out)
        elif func in _COMPARISONS:
            self._decide(_COMPARISONS[func], args, kwargs, out)
        return out

    def _offset(self, x: Any) -> _Offset | None:
        if not isinstance(x, torch.Tensor):
            return None
        known = self._offsets.get(x)
        if known is not None:
            return known
        for i, (base, top) in enumerate(self._bases):
            if x is base:
                return _Offset(base, self._version(i), 0, top)
        return None

    def _version(self, i: int) -> int:
        base = self._bases[i][0]
        return self._writes[i] if base.is_inference() else base._version

    def _count_writes(self, args: tuple, kwargs: dict) -> None:
        """An in-place operation: a length it writes (itself or a view of it) counts one more write."""
        written = [
            x for x in (*args[:1], kwargs.get("out")) if isinstance(x, torch.Tensor) and x.layout == torch.strided
        ]
        for i, (base, _) in enumerate(self._bases):
            if any(x.untyped_storage().data_ptr() == base.untyped_storage().data_ptr() for x in written):
                self._writes[i] += 1

    def _follow(self, sign: int, args: tuple, kwargs: dict, out: Any) -> None:
        """``length + k`` (either order for an add) or ``length - k``: the length offset by ``sign * k``."""
        if kwargs or len(args) != 2 or not isinstance(out, torch.Tensor) or out.dim() != 0:
            return
        first, second = args
        pairs = [(first, second)] if sign < 0 else [(first, second), (second, first)]
        for tensor, number in pairs:
            known = self._offset(tensor)
            if known is not None and _python_int(number):
                self._offsets[out] = dataclasses.replace(known, offset=known.offset + sign * number)
                return

    def _decide(self, name: str, args: tuple, kwargs: dict, out: Any) -> None:
        """A comparison of an offset length with an int, where every length the layer can hold answers alike."""
        if kwargs or len(args) != 2 or not isinstance(out, torch.Tensor) or out.dim() != 0:
            return
        known, number = self._offset(args[0]), args[1]
        if known is None or not _python_int(number):
            return
        low, high = known.offset, known.top + known.offset
        answer = _decided(name, low, high, number)
        if answer is not None:
            self._decided[out] = answer

    def _arange(self, args: tuple, kwargs: dict) -> torch.Tensor | None:
        """``torch.arange(length + a, length + b)`` on the length's device as ``arange(b - a) + (length + a)``; None
        where the call is anything else (it then runs as written)."""
        if len(args) not in (2, 3) or set(kwargs) - {"dtype", "device", "layout", "requires_grad", "pin_memory"}:
            return None
        start, end = self._offset(args[0]), self._offset(args[1])
        dtype = kwargs.get("dtype")
        if (
            start is None
            or end is None
            or (len(args) == 3 and not (_python_int(args[2]) and args[2] == 1))
            or start.base is not end.base
            or start.version != end.version  # a tensor taken from the length keeps the value it had then
            or end.offset < start.offset
            or (dtype is not None and (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool))
            or kwargs.get("layout") not in (None, torch.strided)
            or kwargs.get("requires_grad")
            or kwargs.get("pin_memory")
            or not _same_device(kwargs.get("device"), start.base.device)
        ):
            return None
        first = args[0]
        return torch.arange(end.offset - start.offset, dtype=dtype or torch.int64, device=first.device) + first


def _writes_in_place(func: Any, kwargs: dict) -> bool:
    """Whether ``func`` writes its first argument (``add_``, ``+=``) or an ``out=`` tensor."""
    name = getattr(func, "__name__", "")
    return "out" in kwargs or name.startswith("__i") or (name.endswith("_") and not name.startswith("__"))


def _python_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _decided(name: str, low: int, high: int, number: int) -> bool | None:
    """``value <name> number`` for every value in [low, high], where all agree; None where they do not."""
    if name in ("eq", "ne"):
        if low == high == number:
            return name == "eq"
        if number < low or number > high:
            return name == "ne"
        return None
    always, never = {
        "gt": (low > number, high <= number),
        "ge": (low >= number, high < number),
        "lt": (high < number, low >= number),
        "le": (high <= number, low > number),
    }[name]
    return True if always else False if never else None


def _same_device(requested: Any, actual: torch.device) -> bool:
    """Whether ``torch.arange(..., device=requested)`` lands on ``actual`` (no device: the default device)."""
    wanted = torch.device(requested) if requested is not None else torch.empty(0).device
    if wanted.type != actual.type:
        return False
    if wanted.type != "cuda":
        return True
    index = wanted.index if wanted.index is not None else torch.cuda.current_device()
    return index == actual.index
