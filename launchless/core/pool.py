"""The memory pool the graphs of one cache share -- or of several caches, where the user asked for one pool across
models -- and the rules PyTorch sets for it.

- A pool is created lazily, at the first capture.
- A capture that failed midway leaves its pool marked as recording in the host allocator: it must not be
  captured into again (``retire``).
- PyTorch asserts when capturing into a pool none of whose graphs remain: once the last graph is gone (of every
  cache that shares it), the next capture starts a new pool (``release_if_empty``).
- Graphs in one pool reuse each other's intermediate memory (a graph's static outputs may sit where another graph
  keeps its intermediates): their replays must follow each other on the GPU and each replay's outputs must be
  copied before another replays. ``lock`` serialises the replays on the host, ``order`` on the GPU (a replay on
  another stream than the last waits for it); a shared pool is for callers whose outputs are copied at once.
The pools handed out stay listed while graphs may live in them, so their bytes can be reported.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import torch


def new_pool() -> Any:
    """A fresh graph memory pool handle."""
    return torch.cuda.graph_pool_handle()


class GraphPool:
    """One graph memory pool at a time, replaced whenever PyTorch's rules say it cannot be captured into.

    ``shared``: several caches capture into it (``join``); it is released only once none of them holds a graph.
    ``lock``: held around every replay into the pool (a cache's own pool takes the cache's lock)."""

    def __init__(self, *, shared: bool = False, lock: Any = None) -> None:
        self.shared = shared
        self.lock = lock if lock is not None else threading.RLock()
        self.last_stream: tuple[int, torch.cuda.Stream] | None = None  # (raw id, stream) of the last replay
        self._handle: Any = None
        self._held: list[Any] = []  # every pool that may still hold a graph of this cache
        self._members: weakref.WeakSet[Any] = weakref.WeakSet()  # the caches capturing into a shared pool

    def join(self, cache: Any) -> None:
        """``cache`` (anything with a ``graphs`` mapping) captures into this pool too."""
        self._members.add(cache)

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
        """No graph is left in the pool (of any cache sharing it): PyTorch would refuse to capture into it again."""
        if self._graphs_in_pool(graphs_held) == 0:
            self._release()

    def release(self) -> None:
        """A cache dropped every graph; their memory returns to PyTorch's allocator once they are freed (a shared
        pool stays while another cache holds a graph in it)."""
        self.release_if_empty(0)

    def _graphs_in_pool(self, own: int) -> int:
        return sum(len(cache.graphs) for cache in self._members) if self.shared else own

    def _release(self) -> None:
        self._handle = None
        self._held = []

    def order(self, device_index: int) -> None:
        """Before a replay into this pool: where it runs on another stream than the last replay, it waits for it."""
        raw = torch._C._cuda_getCurrentRawStream(device_index)
        last = self.last_stream
        if last is None or last[0] != raw:
            current = torch.cuda.current_stream(device_index)
            if last is not None:
                current.wait_stream(last[1])
            self.last_stream = (raw, current)

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


SHARED = GraphPool(shared=True)  # the pool of every model wrapped with memory_pool="shared"
