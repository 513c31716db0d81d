"""A stand-in for a CUDA graph in CPU tests: ``replay()`` runs the captured function again on the static inputs,
into the static outputs (the library itself never captures on a CPU; the ``cuda`` tests run the real graphs)."""

from __future__ import annotations

import torch
from torch.utils import _pytree as pytree

from launchless.core.capture import CapturedGraph, CaptureFailed, _static_like
from launchless.core.status import Stage


class RecomputingGraph:
    """replay() runs the captured function again on the static inputs, into the static outputs."""

    def __init__(self, fn, flat, static_leaves: list, static_outputs) -> None:
        self.fn, self.flat, self.static_leaves, self.static_outputs = fn, flat, static_leaves, static_outputs

    def replay(self) -> None:
        args, kwargs = self.flat.rebuild(self.static_leaves)
        fresh = self.fn(*args, **kwargs)
        for dst, src in zip(pytree.tree_leaves(self.static_outputs), pytree.tree_leaves(fresh), strict=True):
            dst.copy_(src)


def recorded_capture(captures: list):
    """A stand-in for ``core.capture.capture``: warm-up runs as the real one makes them (they write the cache, and a
    forward that writes into its own inputs is refused as the real capture refuses it), then a graph that
    recomputes."""

    def capture(fn, flat, *, device, pool, warmup=3, **_):
        static = [_static_like(x, x.device) if isinstance(x, torch.Tensor) else x for x in flat.leaves]
        args, kwargs = flat.rebuild(static)
        slots = [i for i, x in enumerate(static) if isinstance(x, torch.Tensor)]
        versions = [static[i]._version for i in slots]
        for _ in range(warmup):
            outputs = fn(*args, **kwargs)
        if [static[i]._version for i in slots] != versions:
            raise CaptureFailed(Stage.INPUT_MUTATION, None, "the forward writes into its own input in place")
        captures.append(flat)
        graph = RecomputingGraph(fn, flat, static, outputs)
        return CapturedGraph(graph, static, slots, outputs, capture_ms=0.0, pool_growth=0)  # type: ignore[arg-type]

    return capture
