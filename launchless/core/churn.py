"""Keep a per-shape graph cache from thrashing when more shapes are in use than it may hold.

A graph cache holds at most ``max_graphs`` graphs, least recently used evicted. That serves a workload whose
shapes drift (a new batch size for a while), but not one that cycles through more shapes than the cap on every
call -- Mask R-CNN pastes each detected mask at its own size, ~100 shapes per image: each capture evicts a graph
that is needed again a moment later, and every call pays captures, verifications and measurements (393 ms a call
instead of 63 on an H200). An evicted shape coming back is the sign: from then on the cache keeps what it holds
and shapes without a graph run without one, and the caller says so in one log line.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable


class ShapeChurn:
    """Remembers recently evicted shapes; ``stop_evicting`` turns true once one of them is needed again."""

    def __init__(self, remember: int = 256) -> None:
        self._evicted: OrderedDict[Hashable, None] = OrderedDict()
        self._remember = remember
        self.stop_evicting = False
        self.calls_without_graph = 0  # calls of shapes left without a graph once eviction stopped

    def evicted(self, key: Hashable) -> None:
        self._evicted[key] = None
        if len(self._evicted) > self._remember:
            self._evicted.popitem(last=False)

    def admits(self, key: Hashable, held: int, cap: int) -> bool:
        """Whether a graph for ``key`` may be captured now: always while the cache has room; when it is full,
        only until an evicted shape comes back (the shapes in use outnumber the cap)."""
        if held < cap:
            return True
        if not self.stop_evicting and key in self._evicted:
            self.stop_evicting = True
        if self.stop_evicting:
            self.calls_without_graph += 1
            return False
        return True

    def message(self, name: str, cap: int, option: str) -> str:
        return (
            f"launchless: {name} needs more than max_graphs={cap} shapes at once (a shape whose graph was evicted "
            f"came back); it keeps its {cap} graphs and runs other shapes without a CUDA graph instead of capturing "
            f"one per call. Raise {option}, or pad inputs to fewer shapes"
        )

    def reset(self) -> None:
        """Every graph was dropped (parameters moved): the cache fills again; what was learnt about churn stays."""
        self._evicted.clear()
