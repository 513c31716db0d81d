"""The static caches one wrapped model decodes on, and what a decode graph makes of their layers.

A generation gets a transformers ``StaticCache`` of its batch and length (``static_cache.cache_length``); a later
generation of the same batch, length, grad mode, dtype and device gets the same cache back, emptied in place, so
that its decode steps replay the graphs captured on it. Inference tensors cannot be written outside inference mode
(nor the other way round): each mode gets its own; a model converted (``.half()``) or moved since writes keys of
another dtype or device. At most one cache is held per decode graph: the oldest goes, and its graphs with it.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import torch

from .cache_layers import LayerPlan
from .static_cache import cache_length, cache_tensors, new_static_cache

CacheKey = tuple[int, int, bool, torch.dtype, torch.device]  # sequences, length, inference mode, dtype, device


class StaticCaches:
    """The static caches of one wrapped model (see the module docstring); ``on_drop`` lets a dropped cache's graphs
    go. The layers of the cache a model class gets at a length are read once (``LayerPlan``)."""

    def __init__(self, *, limit: Callable[[], int], on_drop: Callable[[Any], None]) -> None:
        self._limit, self._on_drop = limit, on_drop
        self._caches: collections.OrderedDict[CacheKey, Any] = collections.OrderedDict()
        # (its config, the plan) per model class and cache length (the length bounds a sliding-window layer's window)
        self._plans: dict[tuple[type, int], tuple[Any, LayerPlan]] = {}

    def cache(self, model: torch.nn.Module, *, sequences: int, needed: int) -> Any:
        """The cache for a generation of ``sequences`` sequences of ``needed`` tokens each (prompt and new ones),
        emptied."""
        parameter = next(model.parameters())  # a model converted or moved since needs a cache like it
        key = (sequences, cache_length(needed), torch.is_inference_mode_enabled(), parameter.dtype, parameter.device)
        cache = self._caches.get(key)
        if cache is None:
            cache = self._caches[key] = new_static_cache(model, batch=sequences, length=key[1])
            while len(self._caches) > self._limit():  # a cache per graph at most
                _, old = self._caches.popitem(last=False)
                self._on_drop(old)
        else:
            self._caches.move_to_end(key)
            cache.reset()
        return cache

    def layers_refusal(self, model: torch.nn.Module, needed: int) -> str:
        """Why a decode graph could not follow the layers of the static cache this model gets for ``needed`` tokens
        (``LayerPlan.refusal``; empty where it can), its layers read once per model class, config and cache length (a
        cache made for it allocates nothing before its first step; older transformers allocate one small one)."""
        length = cache_length(needed)
        held = self._plans.get((type(model), length))
        if held is None or held[0] is not model.config:
            plan = LayerPlan.of(new_static_cache(model, batch=1, length=length))
            held = self._plans[(type(model), length)] = (model.config, plan)
        return held[1].refusal(type(model).__name__, needed=needed)

    def held(self) -> list[Any]:
        """The caches held, the least recently used first."""
        return list(self._caches.values())

    def rows(self) -> list[dict[str, Any]]:
        """The caches held, for ``graph_info()["decode"]["static_caches"]``."""
        return [
            {
                "batch": sequences,
                "length": length,
                "inference_mode": inference,
                "dtype": str(dtype).removeprefix("torch."),
                "bytes": sum(t.numel() * t.element_size() for t in cache_tensors(cache)),
            }
            for (sequences, length, inference, dtype, _), cache in self._caches.items()
        ]
