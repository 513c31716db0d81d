"""cuBLAS workspaces under graphs: each capture owns the one its matmuls use.

A captured matmul records the address of the workspace PyTorch keeps for its (cuBLAS handle, stream), in a
process-wide map that anyone may empty (``torch._C._cuda_clearCublasWorkspaces``: torch.compile's graph trees call
it around every warm-up and recording, memory clean-up code calls it). Captured with the workspace its warm-up
made, a graph reads and writes a block of the default pool that the map owns: once the map is emptied, a replay
writes into whatever tensor is given that block next, or into memory ``empty_cache()`` gave back -- and every
graph of the device shares that one block, so two models' graphs replayed at once on two streams race on it.

``own_blas_workspaces`` empties the map before a capture, so that its first matmul allocates a new workspace in
the pool being captured into, and after it, so that the block stays the pool's (scratch memory like the graph's
other intermediates: graphs of one pool never replay at once) and no later eager matmul can pick it up. It costs
one workspace per pool. Emptying the map also frees the workspace of a graph captured by other code in this process
without it (a plain ``torch.cuda.graph``): such code needs the same protection, which is why it is public.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


def clear_blas_workspaces() -> None:
    """Empty PyTorch's map of cuBLAS (and cuBLASLt) workspaces; the next matmul on each stream makes a new one."""
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()


@contextlib.contextmanager
def own_blas_workspaces() -> Iterator[None]:
    """Around a capture: the graph's matmuls get a cuBLAS workspace of their own, in the graph's memory pool.

    ``with launchless.own_blas_workspaces(), torch.cuda.graph(g): ...`` protects a graph captured by hand the same
    way launchless protects its own."""
    clear_blas_workspaces()
    try:
        yield
    finally:
        clear_blas_workspaces()
