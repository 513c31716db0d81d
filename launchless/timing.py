"""Timing with CUDA events: medians over many calls after warm-up (host clocks lie about GPU work)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Timing:
    median_ms: float
    min_ms: float
    calls: int


def cuda_time(fn: Callable[[], object], *, warmup: int = 10, iters: int = 100) -> Timing:
    """Per-call GPU time of ``fn``: one event pair per call, median and min over ``iters`` calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for start, end in zip(starts, ends, strict=True):
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    times = [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]
    return Timing(statistics.median(times), min(times), iters)


def host_time_us(fn: Callable[[], object], *, warmup: int = 10, iters: int = 50, rounds: int = 20) -> float:
    """Median host (Python) microseconds per call, synchronising only between rounds.

    Measures what the CPU spends issuing a call; the GPU queue absorbs the work, so this is the
    wrapper's own cost plus its launches, not the kernels' time.
    """
    for _ in range(warmup):
        fn()
    per_call = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        per_call.append((time.perf_counter() - start) / iters * 1e6)
    torch.cuda.synchronize()
    return statistics.median(per_call)
