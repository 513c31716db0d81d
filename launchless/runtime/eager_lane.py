"""The eager lane: a wrapped model that runs eager for good skips the wrapper's bookkeeping on most calls.

Under "auto", a model whose every signature was refused (a host copy, a data-dependent shape, a split not faster
than eager) still pays, on every call, for what decides that: the validity checks, flattening the inputs, the
signature, the cache lookup. Warm, that is a few microseconds; measured after a launch-bound forward of a few
milliseconds of Python, whose run evicts the wrapper's code and data from the CPU's caches, it is 50-100 µs a call
-- 3-5 % of such a forward, which makes the wrapped model slower than eager without any graph in play.

Once the full path has ended in "refused for good, eager" ``OPEN_AFTER`` times in a row, with no graph held, no
split running and no refusal waiting to be tried again, the lane opens: a call goes straight to the model, except
one call in ``SAMPLE`` on average, which takes the full path and closes the lane if anything else happened (a new
signature seen, a graph captured, the model moved). Samples are drawn at random from the lane's own generator (the
process's ``random`` and torch's generators are untouched), so that calls alternating between two signatures
cannot fall into step with the samples and hide one of them. A call in grad mode or training mode never takes the
lane: those run the full path, which warns and counts them.

What the lane delays and never changes: a new signature is counted toward its capture only on sampled calls, and a
model moved or reloaded is noticed at the next sample; every call the lane runs is the model's own eager call.
"""

from __future__ import annotations

import random

OPEN_AFTER = 8  # full-path calls in a row refused for good before the lane opens
SAMPLE = 16  # on average one call in SAMPLE takes the full path while the lane is open


class EagerLane:
    """The streak of full-path calls that ended refused for good, and whether the next call may skip them."""

    def __init__(self) -> None:
        self._streak = 0
        self._draw = random.Random(0x1A9E).random  # its own generator: the process's random state is the user's
        self.calls = 0  # calls that went straight to the model

    @property
    def open(self) -> bool:
        return self._streak >= OPEN_AFTER

    def bypass(self) -> bool:
        """Whether this call goes straight to the model (the lane is open and this call is not a sample)."""
        if self._streak < OPEN_AFTER or self._draw() * SAMPLE < 1.0:
            return False
        self.calls += 1
        return True

    def full_call(self) -> int:
        """A call takes the full path: the streak so far, which ``eager_for_good`` continues; anything else ends it."""
        streak, self._streak = self._streak, 0
        return streak

    def eager_for_good(self, streak: int) -> None:
        """The full path ended in a refusal that stands (no graph, no split, no retry): the streak goes on."""
        self._streak = streak + 1

    def close(self) -> None:
        self._streak = 0

    def info(self) -> dict[str, object]:
        return {"open": self.open, "calls": self.calls}
