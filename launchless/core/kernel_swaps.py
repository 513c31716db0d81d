"""Where one signature's compiled kernels stand on their way to a swap: the compile, the decision and why, as every
policy that swaps Inductor's program into its graphs (``wrap``, ``graphed_step``) records and reports it."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator
from typing import Any

from ..timing import SpeedVerdict
from .accuracy import AccuracyReport
from .compiled_programs import CompileJob, JobState
from .status import Label


class KernelState(Label):
    """Where the compiled kernels of one signature stand."""

    COMPILING = "compiling"  # the child process compiles; the eager-kernel graph replays
    SWAPPED = "compiled"  # the compiled program's graph replays
    KEPT_EAGER = "eager"  # the program failed, is not as accurate as eager, not faster or not usable: eager's stay
    CANCELLED = "cancelled"  # the graphs were dropped while compiling


@dataclasses.dataclass
class KernelDecision:
    """One signature's compile and what was decided (``row()``: its line of ``graph_info()["compiled_kernels"]``)."""

    job: CompileJob | None  # None: decided before a compile was started
    started: float  # perf_counter when the compile was started
    state: KernelState = KernelState.COMPILING
    reason: str = ""
    swap_s: float | None = None  # from the start of the compile to the swap
    accuracy: AccuracyReport | None = None
    speed: SpeedVerdict | None = None
    # seconds of the proof's work per part (read, capture, accuracy, speed), each done inside a call: a part a call for
    # a forward or a decode step, all in one step for a training step
    proof_phases: dict[str, float] = dataclasses.field(default_factory=dict)

    @contextlib.contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        """Adds the block's wall time to ``proof_phases[phase]`` (on its way out, however it leaves)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.proof_phases[phase] = self.proof_phases.get(phase, 0.0) + time.perf_counter() - start

    @property
    def compile(self) -> CompileJob:
        """The compile of a decision that started one."""
        if self.job is None:
            raise RuntimeError(f"launchless: no compile was started ({self.reason})")
        return self.job

    def row(self, signature: str) -> dict[str, Any]:
        job = self.job
        return {
            "signature": signature,
            "kernels": str(self.state),
            "reason": self.reason,
            "compile_s": round(job.seconds, 2) if job is not None and job.seconds else None,
            # "found on disk": another process compiled it (no compile here); "compiled": this process's child did
            "program": None if job is None or job.state is not JobState.READY else job.reason,
            "compile_phases": {} if job is None else dict(job.phases),  # the compiler's seconds per phase
            # "package" (AOTInductor's, read without Inductor) or "artifact" (Inductor's: training, or where no
            # package could be built, "unpackaged" saying why)
            "program_format": None if job is None or not job.format else str(job.format),
            "unpackaged": None if job is None or not job.unpackaged else job.unpackaged,
            # the package of a program swapped in in Inductor's format is being built, for later processes
            "package_pending": job is not None and job.package_pending,
            "read_s": round(job.load_seconds, 2) if job is not None and job.load_seconds else None,  # into memory
            "swap_s": None if self.swap_s is None else round(self.swap_s, 2),
            # what the calls that proved the program waited for, per part (the swap's hiccups)
            "proof_phases": {phase: round(seconds, 3) for phase, seconds in self.proof_phases.items()},
            "accuracy": None if self.accuracy is None else self.accuracy.as_dict(),
            "speed": None if self.speed is None else self.speed.row(),
        }


def unpackaged_note(job: CompileJob) -> str:
    """Where an inference program is not a package, why, for the swap's log line: another process reads Inductor's
    format with seconds of imports, not a package in milliseconds."""
    if not job.unpackaged:
        return ""
    return f"; kept in Inductor's format, which another process reads in seconds: {job.unpackaged}"


__all__ = ["KernelDecision", "KernelState", "unpackaged_note"]
