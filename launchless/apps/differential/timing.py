"""The timing pass: speed-ups of a model measured with the GPU to itself.

Correctness runs put a dozen workers side by side on one GPU, and there every call waits on the others: a speed-up
measured there says nothing about eager against launchless. The timing pass runs one model at a time in one process:
per grad mode, ``wrap(model)`` ("auto", what a user gets) on a few fresh calls -- capture, verification and its own
speed judgement included -- then eager and accelerated in interleaved rounds on fresh inputs, both the GPU time of
calls issued back to back and the latency of calls waited for, each timed twice a round, alternating so that neither
runs right after itself (how far eager is from itself, ``eager_spread``, is what a speed-up near 1 is read against);
the row's speed-up is the smaller of the two. A reading under ``CLOSE_CALL`` is decided by a repeat with three times
the rounds, whose figures the row keeps (``repeated``): the smaller of two noisy readings leans low, and a forward
of tens of milliseconds with host work between its kernels (a detector) strays by some percent from round to round.
Its status is what ``graph_info()`` says the timed calls ran (a whole graph, a split, or eager: alone, the speed
judgements of "auto" may decide otherwise than beside other workers). A causal LM adds greedy batch-1 decoding
against ``model.generate()`` as called (waited for: a generation returns its tokens to the host), by the same rule.
The merge lays these figures over the correctness rows (``report.apply_timings``, the status as ``timed_status``);
the speed target reads only rows timed alone.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import torch

from ...errors import one_line
from ...timing import interleaved_ms
from .candidate import Candidate, Library
from .rows import Entry, GradMode
from .runner import accelerate, grad_mode, graph_info, release, status_of

TIMED: tuple[tuple[Entry, GradMode], ...] = (
    (Entry.WRAP_AUTO, GradMode.NO_GRAD),
    (Entry.WRAP_AUTO, GradMode.INFERENCE_MODE),
)
DECODE_TIMED = (Entry.GENERATE_GREEDY_B1, GradMode.INFERENCE_MODE)
WARM_CALLS = 3
ROUNDS = 9
PER_ROUND = 3
CLOSE_CALL = 0.97  # a speed-up under this is measured again, with REPEAT_ROUNDS rounds
REPEAT_ROUNDS = 3 * ROUNDS


def model_timings(candidate: Candidate, built: Any, seed: int) -> list[dict[str, Any]]:
    """One timing per entry and grad mode of ``TIMED`` (and ``DECODE_TIMED`` for a causal LM)."""
    timings = [_forward_timing(built, entry, mode, seed) for entry, mode in TIMED]
    if candidate.library is Library.TRANSFORMERS_CAUSAL and hasattr(built.model, "generate"):
        timings.append(_decode_timing(candidate, built, seed))
    return timings


def _timing(entry: Entry, mode: GradMode, **values: Any) -> dict[str, Any]:
    return {"entry": entry.value, "grad_mode": mode.value, **values}


def _forward_timing(built: Any, entry: Entry, mode: GradMode, seed: int) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(seed)
    accelerated: Any = None
    try:
        accelerated = accelerate(built.model, entry)
        with grad_mode(mode):
            for _ in range(WARM_CALLS):
                args, kwargs = built.make_inputs(generator, "cuda")
                accelerated(*args, **kwargs)
            args, kwargs = built.make_inputs(generator, "cuda")
            eager = functools.partial(built.model, *args, **kwargs)
            reading = measured(eager, functools.partial(accelerated, *args, **kwargs))  # called the same way
        status, reason, _ = status_of(graph_info(accelerated, entry), entry)  # what the timed calls ran
        return _timing(entry, mode, **reading, status=status.value, reason=reason)

    except Exception as exc:
        return _timing(entry, mode, error=one_line(exc))
    finally:
        release(accelerated)


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


def _decode_timing(candidate: Candidate, built: Any, seed: int) -> dict[str, Any]:
    from .generate import decode_speed

    entry, mode = DECODE_TIMED
    try:
        with grad_mode(mode):
            reading = functools.partial(measured, waited_only=True)  # a generation waits for its tokens
            return _timing(entry, mode, **decode_speed(built, entry, seed, reading))
    except Exception as exc:
        return _timing(entry, mode, error=one_line(exc))


def timing_line(candidate: Candidate, built: Any, seed: int) -> dict[str, Any]:
    """The line a timing worker writes for ``candidate``."""
    return {
        "key": candidate.name,
        "library": candidate.library.value,
        "timings": model_timings(candidate, built, seed),
        "finished_at": time.time(),
    }
