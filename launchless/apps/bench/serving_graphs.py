"""The CUDA graphs a serving mode holds, and the memory they keep: what trading graphs for padding saves.

launchless keeps its own account: every graph it holds is registered with the process's memory budget, sized by
what its capture added to PyTorch's reserved memory and its static input buffers. torch.compile keeps no such
account, so for its modes the graphs are counted in its CUDA graph trees and their memory is what PyTorch reserved
beyond the mark taken before the mode ran (with the cached free blocks released both times). A worker serves one
model at a time, so whatever the process holds is that model's. Beside both, the driver's count: the device memory
the mode's pass left in use (``cudaMemGetInfo``, with the cached free blocks released), which also sees what CUDA
keeps for each instantiated graph. On a CPU there are no CUDA graphs: nothing is counted.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import launchless


@dataclass(frozen=True)
class GraphsHeld:
    graphs: int | None
    bytes: int | None


NOT_ON_CPU = GraphsHeld(None, None)


def held_by_launchless(wrapped: launchless.GraphedModule) -> GraphsHeld:
    """The wrapped model's graphs, and what every launchless graph of this process holds."""
    return GraphsHeld(len(wrapped.graph_info()["graphs"]), launchless.memory_budget()["held_bytes"])


def reserved_mark() -> int:
    """PyTorch's reserved memory with its cached free blocks given back: a mark to measure growth from."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return torch.cuda.memory_reserved()


def device_free_mark() -> int:
    """The device's free memory as the driver counts it, with PyTorch's cached free blocks given back: a mark to
    measure what a mode leaves in use from."""
    reserved_mark()
    return torch.cuda.mem_get_info()[0]


def held_by_compile(mark: int) -> GraphsHeld:
    """The CUDA graphs torch.compile's graph trees recorded on this GPU, and the reserved memory grown since
    ``mark`` (``reserved_mark()``)."""
    return GraphsHeld(compiled_graphs(), reserved_mark() - mark)


def compiled_graphs() -> int:
    """The CUDA graphs torch.compile's graph trees recorded on this GPU (reduce-overhead records one per input shape
    and graph break)."""
    from torch._inductor import cudagraph_trees

    manager = cudagraph_trees.get_manager(torch.cuda.current_device(), create_if_none_exists=False)
    nodes = list(manager.get_roots()) if manager is not None else []
    count = 0
    while nodes:  # a tree per compiled function: a node per recording, its children the recordings that follow it
        node = nodes.pop()
        count += 1
        nodes.extend(child for children in node.children.values() for child in children)
    return count
