"""Selective graphs (GraCE's SCG): per graph, run no-graph / graph / graph+PI on the real inputs, keep the fastest.

A graph is not always faster (GraCE saw 29 of 116 slow down): when a graph is short, or its inputs
are large, copying them in can cost more than the launches it saves. Each variant is timed with CUDA
events on the inputs of the call that captured it, calls not synchronized between them (production
calls are not), with the CUDA random state restored between variants; graph+PI runs
alternately on a copy of the inputs at other addresses, so that it pays the rebinding it does in
production. The decision is cached on disk (``decisions.DecisionCache``) under the graph's hash, the
input signature, the GPU, driver and library versions, so later processes reuse it without measuring.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..timing import cuda_time
from .decisions import Decision, choose

Variant = Callable[[], Any]


def time_ms(call: Variant, device: torch.device, warmup: int = 3, runs: int = 30) -> float:
    """Median ms per call over ``runs`` calls not synchronized between them (``timing.cuda_time``, as the bench
    times): whatever a variant does while its previous call still runs on the GPU (rebinding a graph in flight,
    a host sync) is paid, as in production."""
    with torch.cuda.device(device):
        return cuda_time(call, warmup=warmup, iters=runs).median_ms


def alternating(leaves: list, slots: Sequence[int]) -> Callable[[], list]:
    """The call's inputs, then a copy whose tensors in ``slots`` live elsewhere (same values and layout), in
    turn. Pointer indirection is timed so: each call then rebinds the graph's kernels, as a production call
    does whenever its inputs moved, instead of measuring only the case where nothing moved."""
    other = list(leaves)
    for i in slots:
        t = leaves[i]
        other[i] = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device).copy_(t)
    inputs = itertools.cycle((leaves, other))
    return lambda: next(inputs)


def measure(variants: dict[str, Variant], device: torch.device, margin: float = 0.03) -> Decision:
    """Time every variant (random state restored after each) and decide."""
    rng = torch.cuda.get_rng_state(device)
    times = {}
    for name, call in variants.items():
        times[name] = time_ms(call, device)
        torch.cuda.set_rng_state(rng, device)
    return Decision(variant=choose(times, margin), times_ms=times)
