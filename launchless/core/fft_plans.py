"""cuFFT plans under graphs: a graph's FFT kernels read memory that PyTorch's plan cache may free.

A captured FFT reads device memory that cuFFT allocated for its plan when PyTorch made it -- outside every memory
pool, owned by PyTorch's plan cache of that device (``torch.backends.cuda.cufft_plan_cache``). The cache destroys
plans when it is cleared, when its ``max_size`` is lowered, and when a plan is added to a full cache (the least
recently used goes). A graph replayed after that reads freed memory: wrong values, or another tensor's. Python
cannot hold a plan, so the graphs are watched instead: a graph captured while its device holds cuFFT plans (any
graph that ran an FFT does) arms ``CufftPlanWatch``, which before every replay checks that none of that can have
happened since the capture, and otherwise says why every graph must be captured again (the warm-up makes new plans).

A clear is seen by counting the calls of ``torch._cufft_clear_plan_cache`` (what ``cufft_plan_cache.clear()``
calls), wrapped once a graph is watched; a shrinking size or ``max_size`` is read from the cache itself. A full
cache cannot be watched (the next new plan may evict one a graph reads): graphs are captured again until it has
room. A graph captured with no plans on its device is not watched at all, and costs nothing.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

_clears: Counter[int] = Counter()  # calls of torch._cufft_clear_plan_cache per device, since the wrap below
_wrap_lock = threading.Lock()


def _count_clears() -> None:
    """Wrap ``torch._cufft_clear_plan_cache`` so that every clear is counted (once per process)."""
    with _wrap_lock:
        original = torch._cufft_clear_plan_cache
        if getattr(original, "_launchless_counts_clears", False):
            return

        def clear_plan_cache(device_index: int) -> Any:
            _clears[int(device_index)] += 1
            return original(device_index)

        clear_plan_cache._launchless_counts_clears = True  # type: ignore[attr-defined]
        clear_plan_cache.__doc__ = original.__doc__
        torch._cufft_clear_plan_cache = clear_plan_cache


@dataclass(frozen=True)
class PlanCacheState:
    """What one device's plan cache held when a graph was captured."""

    clears: int
    size: int
    max_size: int


class PlanCaches:
    """Reads PyTorch's per-device cuFFT plan caches (a stand-in in CPU tests)."""

    def size(self, device: int) -> int:
        return int(torch._cufft_get_plan_cache_size(device))

    def max_size(self, device: int) -> int:
        return int(torch._cufft_get_plan_cache_max_size(device))

    def clears(self, device: int) -> int:
        return _clears[device]

    def start_counting(self) -> None:
        _count_clears()


def holds_plans(device: int, caches: PlanCaches | None = None) -> bool:
    """Whether ``device``'s plan cache holds cuFFT plans: a graph captured now may read them."""
    try:
        return (caches or PlanCaches()).size(device) > 0
    except (RuntimeError, AttributeError):  # a build without cuFFT
        return False


class CufftPlanWatch:
    """A ``GraphCache`` guard for graphs whose device held cuFFT plans when they were captured.

    ``watch(device)`` when such a graph is kept; ``stale`` before every replay says why every graph must be
    captured again once a plan they may read can have been destroyed; ``reset`` when the graphs are all gone."""

    def __init__(self, caches: PlanCaches | None = None) -> None:
        self.caches = caches or PlanCaches()
        self.watched: dict[int, PlanCacheState] = {}

    def watch(self, device: int) -> None:
        if device in self.watched:
            return
        self.caches.start_counting()
        caches = self.caches
        self.watched[device] = PlanCacheState(caches.clears(device), caches.size(device), caches.max_size(device))

    def reset(self) -> None:
        self.watched.clear()

    def arm(self, leaves: Sequence[Any]) -> None:
        """A first graph is kept after the others were evicted: what was watched for them is forgotten (``watch``
        records the plan caches as they are now)."""
        self.reset()

    def stale(self, leaves: Sequence[Any]) -> str | None:
        caches = self.caches
        for device, seen in self.watched.items():
            size, max_size = caches.size(device), caches.max_size(device)
            if caches.clears(device) != seen.clears or size < seen.size:
                return f"cuFFT's plan cache of cuda:{device} was cleared, destroying plans the graphs read"
            if max_size < seen.max_size:
                return f"cuFFT's plan cache of cuda:{device} was made smaller, destroying plans the graphs read"
            if size >= max_size:
                return (
                    f"cuFFT's plan cache of cuda:{device} is full ({size} plans): a new plan destroys one the graphs "
                    "may read (raise torch.backends.cuda.cufft_plan_cache.max_size)"
                )
        return None
