"""The layers of a transformers static cache, as a decode graph sees them.

A decode graph replays a step's kernels: what a cache layer does on the device (writing the step's keys and values
at the position its length tensor holds) replays; what it does in Python does not. transformers' plain
``StaticLayer`` keeps all of it on the device. Its ``StaticSlidingWindowLayer`` also counts its length in Python
(``cumulative_length_int``) and decides by that count between writing at the position (the window not yet full) and
rolling the window (full), and gives the attention mask's sizes from it. While the window does not fill -- the
generation is no longer than the window -- every step takes the same branch and the same mask sizes, and the count
only grows by the step's tokens: a graph replays the step exactly when the count is advanced on the host for it
(``HostCounters``). That the step reads the count for nothing else is proven at capture, not assumed: the step run
eager with the count one off must leave the same outputs and cache (``DecodeSteps._count_free``). A generation that
would fill a window goes through ``generate()`` as called.

A linear-attention layer (``LinearAttentionLayer``: the convolution and recurrent states of a state-space or
gated-delta mixer, in hybrid models such as Jamba, Bamba or Qwen3.5) holds states of fixed shapes that each step
updates in place (``copy_``); its flags on the host (``has_previous_state``) are set by the prefill and do not change
while decoding. transformers' own layer is followed, unless it records its past (``record_past``: its states then
grow and are assigned, not copied); a subclass that changes how the states are updated is not. A layer that holds a
dynamic, growing attention cache beside them is not followed either.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import torch

from ..core.snapshot import Snapshot

COUNT = "cumulative_length_int"  # where transformers' sliding-window layer counts its length on the host


def _layer_classes() -> tuple[type | None, type | None]:
    """transformers' ``StaticLayer`` and ``StaticSlidingWindowLayer``, where the installed release has them."""
    try:
        from transformers import cache_utils
    except ImportError:
        return None, None
    return getattr(cache_utils, "StaticLayer", None), getattr(cache_utils, "StaticSlidingWindowLayer", None)


def _cache_utils_class(name: str) -> type | None:
    """A class of transformers' ``cache_utils``, where the installed release has it."""
    try:
        from transformers import cache_utils
    except ImportError:
        return None
    return getattr(cache_utils, name, None)


def linear_states_followed(layer: Any) -> bool | None:
    """Whether a decode graph follows ``layer``'s linear-attention states (None: it has none): transformers' own
    in-place updates of fixed-shape states, not recording its past."""
    linear = _cache_utils_class("LinearAttentionLayer")
    if linear is None or not isinstance(layer, linear):
        return None
    kind = type(layer)
    return (
        getattr(kind, "update_conv_state", None) is linear.update_conv_state
        and getattr(kind, "update_recurrent_state", None) is linear.update_recurrent_state
        and not getattr(layer, "record_past", False)
    )


def followed(layer: Any) -> bool:
    """Whether a decode graph follows every part of ``layer``: its attention cache (transformers' static layer, or its
    sliding-window layer counted on the host) and its linear-attention states, whichever it has. transformers' own
    ``DummyLayer`` (a layer that needs no cache: an MLP or mixture of experts in a hybrid) holds nothing to follow."""
    static, _ = _layer_classes()
    dummy = _cache_utils_class("DummyLayer")
    if dummy is not None and getattr(type(layer), "update", None) is dummy.update:
        return True
    linear = linear_states_followed(layer)
    if linear is False:
        return False
    update = getattr(type(layer), "update", None)
    if update is None:  # no attention cache: a linear-attention layer alone (or one of a layer that needs none)
        return linear is True
    return update is static.update or counts_on_host(layer)


def counts_on_host(layer: Any) -> bool:
    """Whether ``layer`` is transformers' own sliding-window layer, update and mask sizes as it defines them (a
    subclass that changes either is not followed: its use of the count is unknown)."""
    _, sliding = _layer_classes()
    if sliding is None:
        return False
    kind = type(layer)
    return (
        getattr(kind, "update", None) is sliding.update
        and getattr(kind, "get_mask_sizes", None) is sliding.get_mask_sizes
        and isinstance(getattr(layer, COUNT, None), int)
        and isinstance(getattr(layer, "max_cache_len", None), int)
    )


@dataclasses.dataclass(frozen=True)
class LayerPlan:
    """What a decode graph makes of a static cache's layers: the kinds it cannot follow, and the smallest sliding
    window among those it follows by counting on the host (None: none counts)."""

    unfollowed: tuple[str, ...]
    window: int | None

    @classmethod
    def of(cls, cache: Any) -> LayerPlan:
        static, _ = _layer_classes()
        if static is None:  # transformers without cache layers keeps plain tensors: nothing to follow
            return cls((), None)
        layers = list(getattr(cache, "layers", ()))
        kinds = {type(layer).__name__ for layer in layers if not followed(layer)}
        windows = [layer.max_cache_len for layer in layers if counts_on_host(layer)]
        return cls(tuple(sorted(kinds)), min(windows) if windows else None)

    def refusal(self, model: str, *, needed: int | None = None) -> str:
        """Why a decode graph of ``model`` cannot follow these layers through a generation of ``needed`` tokens
        (prompt and new ones); empty where it can."""
        if self.unfollowed:
            return (
                f"{model}'s static cache has {', '.join(self.unfollowed)} layers, whose update a decode graph cannot "
                "replay"
            )
        if self.window is not None and needed is not None and needed > self.window:
            return (
                f"{model}'s sliding window ({self.window} tokens) fills within this generation ({needed} tokens): a "
                "full window rolls by a length counted on the host, which a graph cannot replay"
            )
        return ""


def unfollowed_layers(model: torch.nn.Module, cache: Any, *, needed: int | None = None) -> str:
    """Why a decode graph cannot follow the layers of ``cache`` through a generation of ``needed`` tokens; empty
    where it can."""
    return LayerPlan.of(cache).refusal(type(model).__name__, needed=needed)


@dataclasses.dataclass
class HostCounters:
    """The lengths the layers of one static cache count in Python (``counts_on_host``): saved and put back around
    a capture and its verification, and advanced after each replayed step as the step itself would have."""

    layers: list[Any]

    @classmethod
    def of(cls, cache: Any) -> HostCounters:
        return cls([layer for layer in getattr(cache, "layers", ()) if counts_on_host(layer)])

    def __bool__(self) -> bool:
        return bool(self.layers)

    def names(self, cache: Any) -> set[str]:
        """The counts as ``DecodeSteps``'s host-state check names them (``layers[3].cumulative_length_int``)."""
        where = {id(layer): i for i, layer in enumerate(getattr(cache, "layers", ()))}
        return {f"layers[{where[id(layer)]}].{COUNT}" for layer in self.layers}

    def read(self) -> list[int]:
        return [getattr(layer, COUNT) for layer in self.layers]

    def write(self, values: list[int]) -> None:
        for layer, value in zip(self.layers, values, strict=True):
            setattr(layer, COUNT, value)

    def fits(self, tokens: int) -> bool:
        """Whether a step of ``tokens`` per sequence, from here, leaves every window not full (the branch and mask
        sizes a graph captured in that state replays)."""
        return all(getattr(layer, COUNT) + tokens <= layer.max_cache_len for layer in self.layers)

    def advance(self, tokens: int) -> None:
        for layer in self.layers:
            setattr(layer, COUNT, getattr(layer, COUNT) + tokens)

    def shifted(self) -> list[int]:
        """The counts one off: one more where a step still fits after it, else one less (a decode step follows a
        prompt, so each count is at least one)."""
        up = all(getattr(layer, COUNT) + 2 <= layer.max_cache_len for layer in self.layers)
        return [value + 1 if up else value - 1 for value in self.read()]


class DevicePositions:
    """Where the layers of one static cache write next, as they count it on the device: transformers' static layers
    (a sliding window's too) hold their length in a tensor (``cumulative_length``) that each step advances, and a
    step writes at that position (``index_copy_``). A write past a layer's end is a device-side assert on the GPU,
    fatal to the process; steps run to capture or prove a graph (warm-up steps, timed replays) advance the lengths
    as decoding does, so they are run from positions that hold them, and put back (``rewind``)."""

    def __init__(self, cache: Any) -> None:
        self.layers = [
            layer
            for layer in getattr(cache, "layers", ())
            if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor)
            and isinstance(getattr(layer, "max_cache_len", None), int)
        ]
        self.tensors = [layer.cumulative_length for layer in self.layers]
        self.saved = [t.clone() for t in self.tensors]  # the positions now: rewind() writes them back

    def fits(self, tokens: int) -> bool:
        """Whether ``tokens`` more steps of one token each, from the positions now, stay within every layer (one read
        of each device the lengths are on: a layer no step has written yet -- Mllama's cross-attention layers, when
        it decodes text alone -- still holds its length on the host)."""
        by_device: dict[torch.device, list[int]] = {}
        for i, length in enumerate(self.tensors):
            by_device.setdefault(length.device, []).append(i)
        for device, held in by_device.items():
            room = torch.stack([self.tensors[i].reshape(()) for i in held]) + tokens
            ends = torch.tensor([self.layers[i].max_cache_len for i in held], device=device)
            if not bool((room <= ends).all()):
                return False
        return True

    def rewind(self) -> None:
        """The positions back to those at construction (one launch): between timed replays of a step's graph."""
        if self.tensors:
            torch._foreach_copy_(self.tensors, self.saved)


class CacheState(Snapshot):
    """A static cache's state before a step, restorable in place: its tensors (``Snapshot``) and the lengths its
    layers count on the host (``HostCounters``) -- a capture's warm-up steps and verification's eager runs advance
    both."""

    def __init__(self, tensors: list[torch.Tensor], counters: HostCounters) -> None:
        super().__init__(tensors)
        self.counters = counters
        self.counts = counters.read()

    def restore(self) -> None:
        super().restore()
        self.counters.write(self.counts)


class StaticCacheOverflow(IndexError):
    """A cache write that would land past a static cache layer's end (on the GPU: a device-side assert, fatal to the
    process), caught on the host before it is made."""


def bounded_layers(cache: Any) -> list[Any]:
    """The layers of a static cache that write at the position their length holds, up to a fixed end: transformers'
    ``StaticLayer`` (a sliding window rolls over its end; a linear-attention layer copies into states of fixed
    shapes; a layer of another kind is not followed at all, ``LayerPlan``)."""
    static, _ = _layer_classes()
    update = getattr(static, "update", None)
    return [
        layer
        for layer in getattr(cache, "layers", ())
        if update is not None and getattr(type(layer), "update", None) is update
    ]


@contextlib.contextmanager
def checked_writes(cache: Any) -> Iterator[None]:
    """While the block runs, every write to a full attention layer of ``cache`` is checked on the host first (a read
    of the device per layer and step) and raises ``StaticCacheOverflow`` where it would land past the layer's end:
    eager decoding of a model whose class does not vouch for the static cache, once per class of calls. Raises
    ``StaticCacheOverflow`` at once for a cache without layers (an older transformers'), whose writes cannot be
    checked so (or a transformers without ``StaticLayer``)."""
    if not hasattr(cache, "layers") or _layer_classes()[0] is None:
        raise StaticCacheOverflow(f"{type(cache).__name__} has no layers whose writes can be checked")
    layers = bounded_layers(cache)
    own = [layer.__dict__.get("update") for layer in layers]  # an update already set on a layer is put back
    for index, layer in enumerate(layers):
        update = layer.update

        def checked(key_states: torch.Tensor, *args: Any, _update: Any = update, _layer: Any = layer,
                    _index: int = index, **kwargs: Any) -> Any:  # fmt: skip
            written = _written(_layer)
            if written + key_states.shape[-2] > _layer.max_cache_len:
                raise StaticCacheOverflow(
                    f"layer {_index} of the static cache would be written past its end: {written} positions written, "
                    f"{key_states.shape[-2]} more, {_layer.max_cache_len} held"
                )
            return _update(key_states, *args, **kwargs)

        layer.update = checked
    try:
        yield
    finally:
        for layer, update in zip(layers, own, strict=True):
            if update is None:
                del layer.update
            else:
                layer.update = update


def _written(layer: Any) -> int:
    """The positions a static cache layer holds (a read of the device in newer transformers)."""
    return int(layer.get_seq_length()) if getattr(layer, "is_initialized", True) else 0


def uneven_lengths(cache: Any) -> str:
    """Where the full attention layers of ``cache`` hold different lengths after a generation (a model that writes
    some layer more often than once a token, or never); empty where they hold one length."""
    lengths = [_written(layer) for layer in bounded_layers(cache)]
    if len(set(lengths)) <= 1:
        return ""
    return f"its attention layers hold {lengths} positions after the generation, not one length"
