"""Timing with CUDA events: medians over many calls after warm-up (host clocks lie about GPU work)."""

from __future__ import annotations

import contextlib
import gc
import statistics
import time
from collections.abc import Callable, Iterator
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


def cuda_latency(fn: Callable[[], object], *, warmup: int = 3, iters: int = 100) -> Timing:
    """Per-call time of ``fn`` started on an idle GPU and waited for: what one request sees when its caller
    needs the result before the next (batch-1 serving). Host work before the first kernel is on the clock
    here; ``cuda_time``'s back-to-back calls hide it behind the previous call's kernels whenever the GPU is
    the slower of the two, so the difference between the two is the host overhead a mode leaves exposed.
    """
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return Timing(statistics.median(times), min(times), iters)


def host_overhead_us(
    fn: Callable[[], object], reference: Callable[[], object], *, iters: int = 20, rounds: int = 60
) -> float:
    """Median extra host (Python) microseconds per call of ``fn`` over ``reference``.

    Both issue the same GPU work; rounds alternate between them, each starting from an idle GPU
    (synchronise, then ``iters`` calls without syncing), so drift in clocks or queue state hits
    both alike. What remains is the wrapper's own Python cost.
    """
    for _ in range(5):
        fn()
        reference()
    diffs = []
    for _ in range(rounds):
        per_call = []
        for f in (fn, reference):
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(iters):
                f()
            per_call.append((time.perf_counter() - start) / iters * 1e6)
        diffs.append(per_call[0] - per_call[1])
    torch.cuda.synchronize()
    return statistics.median(diffs)


def interleaved_ms(
    calls: dict[str, Callable[[], object]],
    *,
    waited: bool,
    rounds: int = 7,
    per_round: int = 1,
    rotate_by: int = 1,
) -> dict[str, float]:
    """Median milliseconds per call of each of ``calls``, measured in interleaved rounds (each call in turn, the GPU
    idle before each, the order rotated by ``rotate_by`` places every round), so drift in clocks or load and
    whatever a call leaves for the next (allocator state, caches) hit all alike. Two kinds of call given
    alternately twice (a, b, a again, b again) with ``rotate_by=2`` never follow their own kind, across rounds
    too: a host-bound call that runs right after itself finds its code and memory warm, which the other kind
    would never get.

    ``waited``: ``per_round`` calls timed on the host clock up to the GPU's end -- host work on the clock, what a
    request that waits for its result sees. Otherwise ``per_round`` calls issued back to back between two CUDA
    events -- the GPU time a mode costs when the host keeps ahead."""
    for call in calls.values():
        call()
    times: dict[str, list[float]] = {name: [] for name in calls}
    order = list(calls.items())
    with garbage_collection_paused():
        for round_ in range(rounds):
            turn = (round_ * rotate_by) % len(order)
            for name, call in order[turn:] + order[:turn]:
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                began = time.perf_counter()
                start.record()
                for _ in range(per_round):
                    call()
                end.record()
                end.synchronize()
                elapsed = (time.perf_counter() - began) * 1e3 if waited else start.elapsed_time(end)
                times[name].append(elapsed / per_round)
    return {name: statistics.median(values) for name, values in times.items()}


@contextlib.contextmanager
def garbage_collection_paused() -> Iterator[None]:
    """Python's collector off for the rounds (collected once before): a forward that allocates many objects (a
    detector's post-processing) triggers a collection every few calls, and one that falls on the same side of
    each round biases the comparison by its pause."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


MIN_SPEEDUP = 1.03  # a graph that runs part of a forward eager must beat eager by this much, or it is dropped
WHOLE_GRAPH_MIN_SPEEDUP = 1.0  # a whole graph replays eager's own kernels: it only has to be faster at all
CLEARLY_FASTER = 1.5  # three waited-for rounds this far ahead settle it: no run-to-run spread is that wide


@dataclass(frozen=True)
class SpeedVerdict:
    """Eager against a candidate (a whole graph, or a split that runs part of the forward eager), waited-for and
    back to back."""

    eager_ms: float  # waited-for, per call
    candidate_ms: float
    eager_back_to_back_ms: float | None  # None: the waited-for rounds settled it (``CLEARLY_FASTER``)
    candidate_back_to_back_ms: float | None
    detail: str  # why the candidate is not worth it; empty when it is faster both ways

    @property
    def faster(self) -> bool:
        return not self.detail

    @property
    def speedup(self) -> float:
        return self.eager_ms / self.candidate_ms

    def row(self) -> dict[str, float | None]:
        """The figures for ``graph_info()``."""
        return {
            "eager_ms": round(self.eager_ms, 4),
            "graph_ms": round(self.candidate_ms, 4),
            "eager_back_to_back_ms": _rounded(self.eager_back_to_back_ms),
            "graph_back_to_back_ms": _rounded(self.candidate_back_to_back_ms),
            "speedup": round(self.speedup, 3),
        }


def judge_speed(
    eager: Callable[[], object],
    candidate: Callable[[], object],
    *,
    min_speedup: float = MIN_SPEEDUP,
    settle_early: bool = False,
) -> SpeedVerdict:
    """Whether ``candidate`` beats ``eager`` by ``min_speedup`` both waited-for and back to back: less host time
    can come with more GPU time (copies in and out, kernels run eager between graphs), and a margin under the
    run-to-run spread of a forward's time would keep a candidate that is as often slower as faster.

    ``settle_early``: three waited-for rounds first, and a candidate ``CLEARLY_FASTER`` than eager there is taken
    without more (a whole graph of a launch-bound forward: most are); a close call is measured in full. Judging
    costs calls of both at capture, so the clear cases, the common ones, stay cheap."""
    calls = {"eager": eager, "candidate": candidate}
    if settle_early:
        quick = interleaved_ms(calls, waited=True, rounds=3)
        if quick["candidate"] * CLEARLY_FASTER <= quick["eager"]:
            return SpeedVerdict(quick["eager"], quick["candidate"], None, None, "")
    waited = interleaved_ms(calls, waited=True)
    back_to_back = interleaved_ms(calls, waited=False, rounds=5, per_round=5)
    detail = ""
    if waited["candidate"] * min_speedup > waited["eager"]:
        detail = f"not faster than eager ({waited['candidate']:.3f} ms against {waited['eager']:.3f} ms a call)"
    elif back_to_back["candidate"] * min_speedup > back_to_back["eager"]:
        detail = (
            f"not faster than eager back to back ({back_to_back['candidate']:.3f} ms against "
            f"{back_to_back['eager']:.3f} ms a call), though faster waited-for"
        )
    return SpeedVerdict(waited["eager"], waited["candidate"], back_to_back["eager"], back_to_back["candidate"], detail)


def _rounded(ms: float | None) -> float | None:
    return None if ms is None else round(ms, 4)
