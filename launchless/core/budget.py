"""One memory budget for every graph the process holds: the graphs of all wrapped models, training steps and
compiled graphs stay under it, the least recently used evicted first, across them.

A server holds graphs for several models and many shapes; each graph keeps its outputs and intermediates in its
memory pool, and its static input buffers beside it, for as long as it lives. ``launchless.set_memory_budget(bytes)``
caps what all of them hold together. A graph's size is what its capture added to the memory PyTorch reserved
(``pool_growth``: the memory that goes back to PyTorch once the graph -- and every other graph sharing its pool -- is
gone) plus its static input buffers (``input_bytes``, freed with the graph). Every cache
registers here; each time one keeps a new graph the budget is enforced: while the total is over, the graph used
longest ago, in any cache, is evicted (one WARNING per cache). The graph just kept is never evicted for itself: a
single graph larger than the whole budget stays, with one WARNING that says so. The memory of an evicted graph
returns to PyTorch once the last graph of its pool goes (the graphs of one model share a pool).
"""

from __future__ import annotations

import itertools
import logging
import threading
import weakref
from collections.abc import Hashable
from typing import Any, Protocol

from ..errors import ConfigError

log = logging.getLogger("launchless")
_clock = itertools.count(1)


def tick() -> int:
    """A moment on the process's clock of graph use (comparable across caches)."""
    return next(_clock)


class BudgetedCache(Protocol):
    """What the budget needs of a graph cache."""

    name: str

    def held(self) -> list[tuple[Hashable, int, int]]: ...  # (key, bytes, last used) per graph held

    def evict(self, key: Hashable, why: str) -> None: ...


class MemoryBudget:
    """The process-wide budget (``BUDGET``); ``limit`` None: no cap."""

    def __init__(self) -> None:
        self.limit: int | None = None
        self._caches: weakref.WeakSet[Any] = weakref.WeakSet()
        self._lock = threading.RLock()
        self.evictions = 0

    def register(self, cache: BudgetedCache) -> None:
        self._caches.add(cache)

    def set(self, limit: int | None) -> None:
        """Cap the bytes every graph together may hold (None: no cap); enforced now and at every new graph."""
        with self._lock:
            self.limit = limit
        self.enforce()

    def usage(self) -> dict[str, Any]:
        """The limit, the total held and each cache's share, largest first."""
        shares: dict[str, int] = {}
        for cache in list(self._caches):
            total = sum(size for _, size, _ in cache.held())
            if total:
                shares[cache.name] = shares.get(cache.name, 0) + total
        return {
            "limit_bytes": self.limit,
            "held_bytes": sum(shares.values()),
            "evictions": self.evictions,
            "by_model": dict(sorted(shares.items(), key=lambda item: -item[1])),
        }

    def enforce(self, *, kept: tuple[Any, Hashable] | None = None) -> None:
        """Evict the least recently used graphs, across caches, until the total is within the limit; ``kept``
        (a cache and the key it just kept) is never evicted for itself."""
        if self.limit is None:
            return
        with self._lock:
            held = [(cache, key, size, used) for cache in list(self._caches) for key, size, used in cache.held()]
            total = sum(size for _, _, size, _ in held)
            for cache, key, size, _ in sorted(held, key=lambda item: item[3]):
                if total <= self.limit:
                    return
                if kept is not None and cache is kept[0] and key == kept[1]:
                    continue
                cache.evict(key, f"the memory budget of {_mib(self.limit)} is reached")
                self.evictions += 1
                total -= size
            if total > self.limit and kept is not None:
                log.warning(
                    "launchless: %s keeps a graph of %s, more than the whole memory budget of %s allows with "
                    "nothing else held; raise the budget (launchless.set_memory_budget) or use smaller batches",
                    kept[0].name,
                    _mib(total),
                    _mib(self.limit),
                )


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"


BUDGET = MemoryBudget()


def set_memory_budget(limit_bytes: int | None) -> None:
    """Cap the memory every CUDA graph of this process holds together, in bytes (None: no cap). Graphs over it are
    evicted least recently used first, across models, steps and compiled graphs (``launchless.core.budget``)."""
    bad = isinstance(limit_bytes, bool) or not isinstance(limit_bytes, int) or limit_bytes < 0
    if limit_bytes is not None and bad:
        raise ConfigError(
            f"set_memory_budget takes a number of bytes (e.g. 8 * 2**30 for 8 GiB) or None, got {limit_bytes!r}"
        )
    BUDGET.set(limit_bytes)


def memory_budget() -> dict[str, Any]:
    """The budget's limit, what all graphs hold, and each model's share (``graph_info()`` shows its own)."""
    return BUDGET.usage()
