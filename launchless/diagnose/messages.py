"""Turn a failed capture or verification into an error that names the operation, the line and the fixes."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from ..core import capture as _capture
from ..core.pool import new_pool
from ..core.signature import FlatInputs, Signature
from ..core.snapshot import RngState
from ..core.verify import VerifyReport
from ..errors import CaptureError, VerificationError
from .blockers import Blocker, FailureRecorder, classify_message
from .source import locate_exception

FALLBACKS = (
    "or run this model eager (cuda_graph=False); or use cuda_graph='auto', which runs eager with one log line "
    "for input signatures that cannot be captured; or split the model so this part runs eager"
)


def find_blocker(model: Callable[..., Any], flat: FlatInputs, device: torch.device) -> Blocker | None:
    """Capture again, into a throwaway pool, under a recorder that names the aten op that raised. The generators
    go back to where they were: the capture's warm-up draws, and the call whose capture failed still makes its own
    result from where it began (a random forward draws what eager draws)."""
    recorder = FailureRecorder()
    rng = RngState()

    def recorded(*args: Any, **kwargs: Any) -> Any:
        with recorder:
            return model(*args, **kwargs)

    try:
        with contextlib.suppress(_capture.CaptureFailed):
            _capture.capture(recorded, flat, device=device, pool=new_pool(), warmup=1, write_back=True)
    finally:
        rng.rewind()
    return recorder.blocker


def capture_error(
    model: Callable[..., Any],
    name: str,
    sig: Signature,
    flat: FlatInputs,
    fail: _capture.CaptureFailed,
    device: torch.device,
    *,
    find: bool = True,
) -> CaptureError:
    """PyTorch says "operation not permitted when stream is capturing"; we say which, where and what to do.
    ``find``: capture the forward again to name the blocking operation (not for a forward with collectives: the
    other ranks would not run it with this one)."""
    if fail.cause is None:  # refused before or after capture (outputs, input mutation): the message says why
        return CaptureError(
            f"launchless cannot capture {name} for input {sig.describe()}: {fail}; {FALLBACKS}", reason=str(fail)
        )
    blocker = find_blocker(model, flat, device) if find else None
    kind = blocker.kind if blocker else classify_message(str(fail.cause))
    location = (blocker.location if blocker else None) or locate_exception(fail.cause)
    operation = blocker.operation if blocker else None
    what = f"{kind} `{operation}`" if operation else kind
    where = f" at {location}" if location else " (source line not found)"
    said = str(fail.cause).strip()
    first_line = said.splitlines()[0].rstrip(".") if said else type(fail.cause).__name__
    around = f" No graphs around it: {fail.no_junction}." if fail.no_junction else ""
    return CaptureError(
        f"launchless cannot capture {name} for input {sig.describe()}: {what}{where}. PyTorch said: {first_line}. "
        f"A graph records kernels and addresses, not values or host work, so this cannot be replayed.{around} "
        f"Fixes: {Blocker(kind, operation or '', location).fix}; {FALLBACKS}",
        reason=kind,
        operation=operation,
        source=str(location) if location else None,
    )


def out_of_memory_error(name: str, sig: Signature, fail: _capture.CaptureFailed) -> CaptureError:
    """The GPU ran out of memory while warming up, capturing or verifying: nothing is wrong with the forward."""
    said = str(fail.cause or fail).strip()
    first_line = said.splitlines()[0].rstrip(".") if said else "out of memory"
    return CaptureError(
        f"launchless: out of GPU memory during the {fail.stage} of {name} for input {sig.describe()} "
        f"(PyTorch said: {first_line}). A graph holds its inputs, outputs and intermediates for as long as it is "
        "kept. Fixes: free GPU memory (release_graphs() on wrapped models you no longer call, fewer max_graphs, "
        "smaller batches); 'auto' runs this signature eager and tries to capture it again later",
        reason="out of GPU memory",
    )


def verification_error(name: str, sig: Signature, report: VerifyReport) -> VerificationError:
    size = f"max abs diff {report.max_abs:.3g}, rel {report.max_rel:.3g}, bound {report.bound:.3g}"
    branches = f"; capture-dependent branches: {'; '.join(report.branches)}" if report.branches else ""
    return VerificationError(
        f"launchless: the graph of {name} for input {sig.describe()} failed verification "
        f"({report.status}: {report.detail}; {size}{branches}), so it will never be replayed. Fixes: run eager "
        "(cuda_graph=False); use cuda_graph='auto' to fall back with a log line; raise tolerance_ulps if the "
        "difference is rounding you accept; verify='off' skips the proof (unsafe)",
        report=report.as_dict(),
    )
