"""The timing pass: each model alone on the GPU, its rows run again and timed.

Correctness runs put a dozen workers side by side on one GPU, and there every call waits on the others: a speed-up
measured there says nothing about eager against launchless, and neither does a speed judgement of "auto" taken
there (a split judged slower than eager because another worker's kernels ran between its pieces). The timing pass
runs one model at a time in one process. Per grad mode, ``wrap(model)`` ("auto", what a user gets) runs its row
again as the correctness run does -- CALLS fresh calls, each compared with eager, capture, verification and its own
speed judgements included -- on other inputs than that run's (``TIMING_SEED``); then eager and accelerated are timed
in interleaved rounds on the last call's inputs, both the GPU time of calls issued back to back and the latency of
calls waited for, each timed twice a round, alternating so that neither runs right after itself (how far eager is
from itself, ``eager_spread``, is what a speed-up near 1 is read against); the row's speed-up is the smaller of the
two. A reading under ``CLOSE_CALL`` is decided by a repeat with three times the rounds, whose figures the row keeps
(``repeated``): the smaller of two noisy readings leans low, and a forward of tens of milliseconds with host work
between its kernels (a detector) strays by some percent from round to round. A causal LM adds greedy batch-1
decoding against ``model.generate()`` as called (waited for: a generation returns its tokens to the host), by the
same rule. The merge (``report.apply_timings``) lays the figures, the status alone and the worse of the two runs'
results over the correctness rows; the speed target reads only rows timed alone.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from ...timing import interleaved_ms
from ..environment import gpu_name
from .candidate import Candidate, Library
from .rows import Entry, GradMode
from .runner import CALLS, forward_row

TIMED: tuple[tuple[Entry, GradMode], ...] = (
    (Entry.WRAP_AUTO, GradMode.NO_GRAD),
    (Entry.WRAP_AUTO, GradMode.INFERENCE_MODE),
)
# greedy batch-1 decoding, timed under both grad modes as the correctness rows run it (graphs captured under one grad
# mode are not the other's)
DECODE_TIMED: tuple[tuple[Entry, GradMode], ...] = tuple((Entry.GENERATE_GREEDY_B1, mode) for mode in GradMode)
DECODE_ENTRY = Entry.GENERATE_GREEDY_B1
FORWARD = (Entry.WRAP_AUTO, Entry.WRAP_TRUE, Entry.COMPILE)
TIMABLE = (*FORWARD, DECODE_ENTRY)  # the entry points the timing pass can run again alone
ROUNDS = 9
PER_ROUND = 3
# the timing pass's calls draw other inputs than the correctness run's (its seed and the next CALLS ones)
TIMING_SEED = CALLS
TIMING_KEYS = (
    "entry",
    "grad_mode",
    "eager_ms",
    "accelerated_ms",
    "speedup",
    "measured",
    "eager_spread",
    "repeated",
    "status",
    "reason",
    "source",
    "result",
    "calls",
    "identical_calls",
    "max_abs_diff",
    "bound",
    "bound_class",
)
CLOSE_CALL = 0.97  # a speed-up under this is measured again, with REPEAT_ROUNDS rounds
REPEAT_ROUNDS = 3 * ROUNDS


def model_timings(
    candidate: Candidate, built: Any, seed: int, *, entries: frozenset[Entry] | None = None
) -> list[dict[str, Any]]:
    """One timing per entry and grad mode of ``TIMED`` (and ``DECODE_TIMED`` for a causal LM); with ``entries``,
    of those entry points instead: a forward entry under both grad modes, greedy batch-1 decoding as in
    ``DECODE_TIMED`` (a row whose status beside other workers came from a speed judgement, run again alone)."""
    if entries is None:
        forward, decode = list(TIMED), True
    else:
        forward = [(entry, mode) for entry in Entry if entry in entries and entry in FORWARD for mode in GradMode]
        decode = DECODE_ENTRY in entries
    timings = [_forward_timing(candidate, built, entry, mode, seed) for entry, mode in forward]
    if decode and candidate.library is Library.TRANSFORMERS_CAUSAL and hasattr(built.model, "generate"):
        timings += [_decode_timing(candidate, built, mode, seed) for _, mode in DECODE_TIMED]
    return timings


def _forward_timing(candidate: Candidate, built: Any, entry: Entry, mode: GradMode, seed: int) -> dict[str, Any]:
    return _timing_of(forward_row(candidate, built, entry, mode, seed + TIMING_SEED, measure=measured))


def _timing_of(row: dict[str, Any]) -> dict[str, Any]:
    """What the timing line keeps of a row run alone: its speed fields, what "auto" ran, and its verdict."""
    return {k: row[k] for k in TIMING_KEYS if row.get(k) is not None}


def measured(eager: Callable[[], Any], accelerated: Callable[[], Any], *, waited_only: bool = False) -> dict[str, Any]:
    """The reading of ``eager`` against ``accelerated``; one under ``CLOSE_CALL`` is replaced by a repeat in
    ``REPEAT_ROUNDS`` rounds (``repeated``). ``waited_only``: calls that wait for the GPU themselves (a generation
    returns its tokens to the host), timed only so."""
    reading = _reading(eager, accelerated, rounds=ROUNDS, waited_only=waited_only)
    if reading["speedup"] >= CLOSE_CALL:
        return {**reading, "repeated": False}
    return {**_reading(eager, accelerated, rounds=REPEAT_ROUNDS, waited_only=waited_only), "repeated": True}


def _reading(
    eager: Callable[[], Any], accelerated: Callable[[], Any], *, rounds: int, waited_only: bool
) -> dict[str, Any]:
    """Eager against accelerated, back to back and waited for, in ``rounds`` interleaved rounds: the smaller
    speed-up of the two, its milliseconds, and how far eager strays from itself (the larger of the two). Each runs
    twice a round, the two kinds alternating so that neither ever follows itself (``interleaved_ms``); each one's
    figure is the mean of its two medians, and the distance between eager's two is the spread."""
    calls = {"eager": eager, "accelerated": accelerated, "eager_again": eager, "accelerated_again": accelerated}
    readings = {}
    if not waited_only:
        readings["back_to_back"] = interleaved_ms(calls, waited=False, rounds=rounds, per_round=PER_ROUND, rotate_by=2)
    readings["waited"] = interleaved_ms(calls, waited=True, rounds=rounds, per_round=1, rotate_by=2)
    figures = {
        how: ((t["eager"] + t["eager_again"]) / 2, (t["accelerated"] + t["accelerated_again"]) / 2)
        for how, t in readings.items()
    }
    speedups = {how: eager_ms / accelerated_ms for how, (eager_ms, accelerated_ms) in figures.items()}
    slower = min(speedups, key=speedups.__getitem__)
    spread = max(abs(1 - t["eager"] / t["eager_again"]) for t in readings.values())
    return {
        "eager_ms": round(figures[slower][0], 4),
        "accelerated_ms": round(figures[slower][1], 4),
        "speedup": round(speedups[slower], 3),
        "measured": slower,
        "eager_spread": round(spread, 4),
    }


def _decode_timing(candidate: Candidate, built: Any, mode: GradMode, seed: int) -> dict[str, Any]:
    from .generate import generate_row

    entry = DECODE_ENTRY
    reading = functools.partial(measured, waited_only=True)  # a generation waits for its tokens
    return _timing_of(generate_row(candidate, built, entry, mode, seed + TIMING_SEED, measure=reading))


def timing_line(
    candidate: Candidate, built: Any, seed: int, *, entries: frozenset[Entry] | None = None
) -> dict[str, Any]:
    """The line a timing worker writes for ``candidate``, with the entry points the pass was asked for (``None``: all
    it times), so that a resumed pass knows the model done even where it had nothing of them to time."""
    return {
        "key": candidate.name,
        "library": candidate.library.value,
        "entries": None if entries is None else sorted(entry.value for entry in entries),
        "timings": model_timings(candidate, built, seed, entries=entries),
        "finished_at": time.time(),
        "gpu": gpu_name(),
    }
