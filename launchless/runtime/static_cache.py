"""The static KV cache decode graphs bring to ``generate()``, and what a graph reads of one.

transformers' ``StaticCache`` allocates keys and values for a fixed length up front and keeps the length written so
far on the device: every decode step runs the same shapes on the same memory, which is what a graph replays. Here:
the length a generation gets (a power of two, so that requests of similar lengths share a cache and a graph), the
keyword the model takes its cache by, a new cache for a model, and the tensors and host-side state a cache holds (a
graph reads and writes the former in place; a step that changed the latter could not be replayed).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch

MIN_CACHE_LENGTH = 64


def cache_length(needed: int) -> int:
    """The static cache's length for a generation of ``needed`` tokens (prompt and new ones): the power of two that
    holds them, at least ``MIN_CACHE_LENGTH``."""
    return max(MIN_CACHE_LENGTH, 1 << (max(needed, 1) - 1).bit_length())


# transformers' newer name for the cache argument, the older, and Mamba-style models' (``cache_params``)
CACHE_KEYWORDS = ("cache", "past_key_values", "cache_params")


def given_cache(kwargs: Mapping[str, Any]) -> Any:
    """The cache a generate() call was handed, under either name; None where none was."""
    return next((kwargs[k] for k in CACHE_KEYWORDS if kwargs.get(k) is not None), None)


def cache_keyword(model: torch.nn.Module) -> str:
    """The keyword the model's forward (and ``generate()``) takes its cache by: ``cache`` in newer transformers,
    ``past_key_values`` before, ``cache_params`` where the forward takes only that (Mamba-style models)."""
    parameters = inspect.signature(model.forward).parameters
    if "cache" in parameters:
        return "cache"
    if "cache_params" in parameters and "past_key_values" not in parameters:
        return "cache_params"
    return "past_key_values"


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
