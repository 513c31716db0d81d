"""The static KV cache decode graphs bring to ``generate()``, and what a graph reads of one.

transformers' ``StaticCache`` allocates keys and values for a fixed length up front and keeps the length written so
far on the device: every decode step runs the same shapes on the same memory, which is what a graph replays. Here:
the length a generation gets (a power of two, so that requests of similar lengths share a cache and a graph), the
keyword the model takes its cache by, a new cache for a model, and the tensors and host-side state a cache holds (a
graph reads and writes the former in place; a step that changed the latter could not be replayed).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator, Mapping
from typing import Any

import torch

MIN_CACHE_LENGTH = 64


def cache_length(needed: int) -> int:
    """The static cache's length for a generation of ``needed`` tokens (prompt and new ones): the power of two that
    holds them, at least ``MIN_CACHE_LENGTH``."""
    return max(MIN_CACHE_LENGTH, 1 << (max(needed, 1) - 1).bit_length())


CACHE_KEYWORDS = ("cache", "past_key_values")  # transformers' newer name for the cache argument, and the older


def given_cache(kwargs: Mapping[str, Any]) -> Any:
    """The cache a generate() call was handed, under either name; None where none was."""
    return next((kwargs[k] for k in CACHE_KEYWORDS if kwargs.get(k) is not None), None)


def cache_keyword(model: torch.nn.Module) -> str:
    """The keyword the model's forward (and ``generate()``) takes its cache by: ``cache`` in newer transformers,
    ``past_key_values`` before."""
    parameters = inspect.signature(model.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def static_cache_class() -> type | None:
    """transformers' ``StaticCache``, where the installed release has it."""
    try:
        import transformers
    except ImportError:
        return None
    return getattr(transformers, "StaticCache", None)


def new_static_cache(model: torch.nn.Module, *, batch: int, length: int) -> Any:
    """A transformers ``StaticCache`` for ``batch`` sequences of ``length`` tokens, on the model's device and dtype
    where the installed transformers asks for them (newer ones allocate at the first step, from its keys)."""
    static_cache = static_cache_class()
    accepted = inspect.signature(static_cache.__init__).parameters
    parameter = next(iter(model.parameters()))
    offered = {
        "max_batch_size": batch,
        "batch_size": batch,
        "device": parameter.device,
        "dtype": parameter.dtype,
    }
    return static_cache(
        config=model.config, max_cache_len=length, **{k: v for k, v in offered.items() if k in accepted}
    )


def cache_tensors(cache: Any) -> list[torch.Tensor]:
    """Every tensor a static cache holds (per layer: keys, values, the length written so far, a linear-attention
    layer's states), in a fixed order."""
    return [tensor for _, _, tensor in cache_slots(cache)]


def cache_slots(cache: Any) -> list[tuple[dict, Any, torch.Tensor]]:
    """(mapping, key, tensor) for every tensor a static cache holds: what a decode graph reads and writes, and where
    (``mapping.get(key) is tensor`` while the cache still holds it: one lookup a slot per replayed step). The mapping
    is a layer's or the cache's attributes (``vars``); a linear-attention layer keeps its states in dicts by state
    index, which are their mappings."""
    holders = [*getattr(cache, "layers", ()), cache]
    slots: list[tuple[dict, Any, torch.Tensor]] = []
    for holder in holders:
        attributes = vars(holder)
        for name, value in sorted(attributes.items()):
            if isinstance(value, torch.Tensor):
                slots.append((attributes, name, value))
            elif isinstance(value, dict):
                slots += [(value, k, v) for k, v in sorted(value.items()) if isinstance(v, torch.Tensor)]
    return slots


def host_state(cache: Any) -> dict[str, str]:
    """The cache's attributes that hold no tensor (lengths, flags, sizes), as text: a step that changes one keeps
    state on the host, which a graph cannot replay."""
    holders = [*((f"layers[{i}].", layer) for i, layer in enumerate(getattr(cache, "layers", ()))), ("", cache)]
    return {
        f"{where}{name}": repr(value)
        for where, holder in holders
        for name, value in vars(holder).items()
        if not any(isinstance(leaf, torch.Tensor) for leaf in _leaves(value))
    }


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, dict):
        value = list(value.values())
    return [x for item in value for x in _leaves(item)] if isinstance(value, (list, tuple)) else [value]


class StaticCacheOverflow(IndexError):
    """A cache write that would land past a static cache layer's end (on the GPU: a device-side assert, fatal to the
    process), caught on the host before it is made."""


def _bounded_layers(cache: Any) -> list[Any]:
    """The layers of a static cache that write one position per token up to a fixed end: a full attention layer
    (a sliding window rolls over its end; a linear-attention layer keeps states of fixed shapes)."""
    return [
        layer
        for layer in getattr(cache, "layers", ())
        if getattr(layer, "max_cache_len", None) is not None
        and hasattr(layer, "get_seq_length")
        and not getattr(layer, "is_sliding", False)
    ]


@contextlib.contextmanager
def checked_writes(cache: Any) -> Iterator[None]:
    """While the block runs, every write to a full attention layer of ``cache`` is checked on the host first (a read
    of the device per layer and step) and raises ``StaticCacheOverflow`` where it would land past the layer's end:
    eager decoding of a model whose class does not vouch for the static cache, once per class of calls. Raises
    ``StaticCacheOverflow`` at once where the cache has no layer that can be checked so."""
    layers = _bounded_layers(cache)
    if not layers:
        raise StaticCacheOverflow(f"{type(cache).__name__} has no layer whose writes can be checked")
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
    lengths = [_written(layer) for layer in _bounded_layers(cache)]
    if len(set(lengths)) <= 1:
        return ""
    return f"its attention layers hold {lengths} positions after the generation, not one length"
