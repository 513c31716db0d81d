"""The states and outcomes every graph goes through, as enums: the same words in logs, errors and ``graph_info()``.

They are ``str`` enums, so they compare equal to, format as and serialise to their plain value
(``graph_info()`` stays JSON).
"""

from __future__ import annotations

from enum import Enum


class Label(str, Enum):
    """A ``str`` enum that prints as its value (``f"{x}"`` gives ``"verified"``, not ``"State.VERIFIED"``)."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class SignatureState(Label):
    """Where one input signature stands: seen -> captured -> verified | refused -> replaying."""

    SEEN = "seen"  # counted towards capture_after, no graph yet
    CAPTURED = "captured"  # captured, being verified
    VERIFIED = "verified"  # proven against eager, held, not replayed yet
    REPLAYING = "replaying"  # verified and replayed at least once
    REFUSED = "refused"  # capture or verification failed: runs without a graph


class Stage(Label):
    """Where a signature was refused."""

    NO_DEVICE = "no CUDA device"
    WARM_UP = "warm-up"
    INPUT_MUTATION = "input mutation"
    CAPTURE = "capture"
    OUTPUTS = "outputs"
    VERIFICATION = "verification"
    SPEED = "speed"  # verified, but not faster than eager: "auto" never runs slower than eager
    UNSUPPORTED = "unsupported"


class VerifyStatus(Label):
    """The outcome of proving one graph against eager (``verify``)."""

    BIT_IDENTICAL = "bit-identical"
    IDENTICAL_VALUES = "identical values"  # equal values; only the sign of a zero differs
    EAGER_NOISE = "eager-noise"  # eager differs from itself: held to a bound
    CAPTURE_PATH = "capture-path"  # library code branches on is_current_stream_capturing()
    FAILED = "failed"
    SKIPPED = "skipped"  # verify="off"


class Admission(Label):
    """What a call of a signature without a held graph does (``GraphCache.admit``)."""

    REFUSED = "refused"  # refused before: runs without a graph (or raises under cuda_graph=True)
    WAIT = "wait"  # seen fewer than capture_after times
    OVER_CAPACITY = "over capacity"  # more shapes in use than max_graphs: keeps the graphs held
    CAPTURE = "capture"


class SplitStatus(Label):
    """Where the split of a forward that cannot be captured whole stands, per input signature."""

    SEARCHING = "searching"  # pieces being captured; the calls run them already (each piece is verified)
    VERIFIED = "verified"  # the joined forward equals eager and is faster: calls run it
    DROPPED = "dropped"  # not equal to eager, or not faster: calls run eager
