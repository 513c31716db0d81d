"""The static KV cache decode graphs bring to ``generate()``, and what a graph reads of one.

transformers' ``StaticCache`` allocates keys and values for a fixed length up front and keeps the length written so
far on the device: every decode step runs the same shapes on the same memory, which is what a graph replays. Here:
the length a generation gets (a power of two, so that requests of similar lengths share a cache and a graph), the
keyword the model takes its cache by (and why a decode step does not run on the cache: a model that keeps its decoding
state in inputs of its own), a new cache for a model, and the tensors and host-side state a cache holds (a
graph reads and writes the former in place; a step that changed the latter could not be replayed).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..core.status import Label

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


class OffCache(Label):
    """Why a decode step's forward does not run on the static cache ``generate()`` was handed: decode graphs capture
    and replay steps on that cache's tensors only, so such a step runs eager."""

    POSITIONAL = "the forward is called with positional arguments"  # a graph takes a step's inputs by keyword
    NO_CACHE_ARGUMENT = "the forward takes no cache argument"  # the model keeps its decoding state in inputs of its own
    NOT_HANDED = "the forward is not handed the static cache"  # it takes one, but the step passes another or none


def off_cache(forward: Callable[..., Any], cache: Any, keyword: str, args: tuple, kwargs: Mapping[str, Any]) -> str:
    """Why a decode step of ``forward`` does not run on ``cache`` (an ``OffCache`` and what the step shows of it:
    the forward and where it is defined, the inputs that carry the model's own state); empty where it does."""
    if not args and kwargs.get(keyword) is cache:
        return ""
    where = _defined_at(forward)
    if args:
        return f"{OffCache.POSITIONAL}: {where} gets {len(args)} of a decode step's inputs by position"
    try:
        takes = keyword in inspect.signature(forward).parameters
    except (TypeError, ValueError):  # a forward without a signature: read as one that takes the keyword
        takes = True
    if takes:
        handed = kwargs.get(keyword)
        what = "none" if handed is None else f"a {type(handed).__name__}"
        return f"{OffCache.NOT_HANDED}: {where} is handed {what} as `{keyword}` at a decode step"
    own = [f"`{name}`" for name, value in kwargs.items() if value is not cache and _carries_state(value)]
    carried = f" and carries its own state in {', '.join(own)}" if own else ""
    return f"{OffCache.NO_CACHE_ARGUMENT}: {where} takes no `{keyword}`{carried}"


def _carries_state(value: Any) -> bool:
    """Whether a step's input looks like a model's own decoding state: a cache object, or tensors per layer."""
    if hasattr(value, "get_seq_length"):  # transformers' cache interface
        return True
    return isinstance(value, (list, tuple)) and bool(value) and all(isinstance(x, torch.Tensor) for x in _leaves(value))


def _defined_at(forward: Callable[..., Any]) -> str:
    """The forward's name and the source line that defines it (``RwkvForCausalLM.forward at modeling_rwkv.py:700``),
    read from its code object (no file read); its bare name where it has none."""
    function = inspect.unwrap(getattr(forward, "__func__", forward))
    name = getattr(function, "__qualname__", None) or type(forward).__name__
    code = getattr(function, "__code__", None)
    return f"{name} at {os.path.basename(code.co_filename)}:{code.co_firstlineno}" if code is not None else name


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
