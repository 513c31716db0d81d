"""The memory pool the graphs of one cache share, and the rules PyTorch sets for it.

- A pool is created lazily, at the first capture.
- A capture that failed midway leaves its pool marked as recording in the host allocator: it must not be
  captured into again (``retire``).
- PyTorch asserts when capturing into a pool none of whose graphs remain: once the last graph is gone, the
  next capture starts a new pool (``release_if_empty``).
The pools handed out stay listed while graphs may live in them, so their bytes can be reported.
"""

from __future__ import annotations

from typing import Any

import torch


def new_pool() -> Any:
    """A fresh graph memory pool handle."""
    return torch.cuda.graph_pool_handle()


class GraphPool:
    """One graph memory pool at a time, replaced whenever PyTorch's rules say it cannot be captured into."""

    def __init__(self) -> None:
        self._handle: Any = None
        self._held: list[Any] = []  # every pool that may still hold a graph of this cache

    def handle(self) -> Any:
        """The pool to capture into now."""
        if self._handle is None:
            self._handle = new_pool()
            self._held.append(self._handle)
        return self._handle

    def retire(self) -> None:
        """A capture failed midway: the next capture goes into a new pool."""
        self._handle = None

    def replace(self) -> Any:
        """A capture failed midway and is tried again (around junctions): the failed pool retired, a new one."""
        self.retire()
        return self.handle()

    def release_if_empty(self, graphs_held: int) -> None:
        """No graph is left in the pool: PyTorch would refuse to capture into it again."""
        if graphs_held == 0:
            self.release()

    def release(self) -> None:
        """Every graph is gone; their memory returns to PyTorch's allocator once they are freed."""
        self._handle = None
        self._held = []

    def bytes(self) -> int:
        """Bytes reserved by the pools that may hold this cache's graphs (reads the allocator: not per call)."""
        if not self._held or not torch.cuda.is_initialized():
            return 0
        try:
            segments = torch.cuda.memory_snapshot()
        except Exception:
            return 0
        ids = {tuple(p) for p in self._held}
        return sum(s.get("total_size", 0) for s in segments if tuple(s.get("segment_pool_id", ())) in ids)
