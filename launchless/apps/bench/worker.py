"""One mode, in its own process: measures the given workloads in turn and writes a JSON line per workload.

Every single-process suite runs on this worker: the inference, training, compiler and compiled-kernels suites (the
workloads of ``workloads``) and the serving suite (its ``buckets:`` and ``decode:`` workloads). A workload's kind
chooses how it is measured and which fields its row has, so that a row that failed or was never reached has the same
fields as one that ran. The runner starts one worker per mode, so compile caches and allocator state never leak across
modes; if a worker dies, the runner starts another for the workloads it had not reached. A workload that fails is an
error row and the worker goes on.
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from ...errors import one_line
from ..workers import append_row
from . import serving_workloads, workloads
from .measure import measure
from .modes import ModeUnavailable
from .serving_workloads import BUCKETS, DECODE

INFERENCE = "inference"
TRAINING = "training"
SERVING_KINDS = (BUCKETS, DECODE)  # the serving suite's parts: rows that name their kind ``part``
STANDARD_FIELDS = (
    *("median_ms", "min_ms", "latency_ms", "calls", "first_call_ms", "peak_mem_mb", "kernel_floor_ms", "floor_ratio"),
    *("graph_coverage", "copy_bytes", "compile_s", "timeline"),
)
SERVING_FIELDS = ("median_ms", "identical", "compile_s", "graphs")
FIELDS = {  # each kind's measured fields, None in a row where nothing was measured
    INFERENCE: STANDARD_FIELDS,
    TRAINING: STANDARD_FIELDS,
    BUCKETS: (
        *(*SERVING_FIELDS, "total_ms", "calls", "distinct_sizes", "first_pass_s", "graph_mem_bytes"),
        *("device_mem_bytes", "max_abs_diff", "batch_buckets"),
    ),
    DECODE: (
        *(*SERVING_FIELDS, "batch", "prompt_tokens", "new_tokens", "tokens_per_s", "ttft_ms", "generate_ms"),
        *("first_call_s", "runs", "first_divergence", "interleaved_ms", "interleaved_rounds", "interleaved_error"),
    ),
}
NOT_COMPARED = {"status": "n/a", "max_abs_diff": None}


def device_type() -> str:
    """``cuda`` where a GPU is visible, else ``cpu``: the serving and multigpu suites run there too (timed on the host
    clock; the multigpu groups on gloo), so that they can be checked anywhere."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def kind_of(workload: str) -> str:
    """``buckets`` or ``decode`` for the serving suite's prefixed workloads, else the named workload's own kind
    (``inference`` or ``training``); UnknownWorkload names the choices."""
    try:
        return serving_workloads.part_of(workload)
    except workloads.UnknownWorkload:
        return workloads.get(workload).kind


def runs_in(workload: str, mode: str) -> bool:
    """Whether a suite runs ``workload`` in ``mode``: a serving workload only in the modes of its part, every other
    in every mode (a mode that cannot run it says why in a skipped row)."""
    return kind_of(workload) not in SERVING_KINDS or mode in serving_workloads.modes_of(workload)


def blank_row(identity: dict[str, Any], fields: Sequence[str], **known: Any) -> dict:
    """A row that names what it is (``identity``: its workload, mode, status and reason), with every one of its
    ``fields`` unmeasured (None) and what is ``known`` whether or not it ran: the one shape, in every suite, of a row
    whose workload failed, was never reached or killed its worker."""
    return {**identity, **dict.fromkeys(fields), **known}


def empty_row(workload: str, mode: str, status: str, reason: str | None) -> dict:
    """A row with every field of its kind and nothing measured. The serving suite's rows name their kind ``part``,
    the others ``kind``."""
    kind = kind_of(workload)
    if kind not in SERVING_KINDS:
        identity = {"workload": workload, "mode": mode, "kind": kind, "status": status, "reason": reason}
        return blank_row(identity, FIELDS[kind], correctness=dict(NOT_COMPARED))
    identity = {"workload": workload, "part": kind, "mode": mode, "status": status, "reason": reason}
    if kind == BUCKETS:
        return blank_row(identity, (*FIELDS[kind], "wall_s"))
    decode = serving_workloads.decode_workload(workload)  # what was asked for, known whether or not it ran
    asked = {"batch": decode.batch, "prompt_tokens": decode.decoder.prompt_tokens}
    return blank_row(identity, (*FIELDS[kind], "wall_s"), **asked, new_tokens=decode.decoder.new_tokens)


def measured_row(
    workload: str, mode: str, *, iters: int, device: torch.device, profile_dir: Path | None = None
) -> dict:
    """The workload's row in this mode, measured as its kind is; a serving part's module is imported only when a
    workload needs it (decode needs transformers). ``iters``: timed calls, or the trace's length (batch buckets).
    ``profile_dir``: where the pair's profile goes too (not a batch-bucket trace's: its calls differ in size)."""
    kind = kind_of(workload)
    if kind not in SERVING_KINDS:
        return measure(workloads.get(workload), mode, iters, profile_dir=profile_dir)
    row = empty_row(workload, mode, "ok", None)
    if kind == BUCKETS:
        from .serving_buckets import measure_buckets

        return row | measure_buckets(workload, mode, calls=iters, device=device)
    from .serving_decode import measure_decode

    return row | measure_decode(workload, mode, device=device, profile_dir=profile_dir)


def measure_each(
    names: list[str],
    *,
    measure_one: Callable[[str], dict],
    failed_row: Callable[[str, str, str], dict],
    write: Callable[[str, dict], None],
) -> None:
    """Each workload in turn: its row (``failed_row(workload, status, reason)`` where it could not run), the seconds
    it took, ``write(workload, row)`` at once; what it left freed before the next. The multigpu worker's ranks run
    this too, their ``write`` the gather that pairs them up (outside the ``try``: a rank lost there ends the group)."""
    for workload in names:
        started = time.perf_counter()
        try:
            row = measure_one(workload)
        except ModeUnavailable as exc:
            row = failed_row(workload, "skipped", str(exc))
        except Exception as exc:  # one workload failing must not stop the suite
            row = failed_row(workload, "error", one_line(exc))
        row["wall_s"] = time.perf_counter() - started
        write(workload, row)
        release()


def run(
    mode: str,
    names: list[str],
    iters: int,
    out: str,
    *,
    device: torch.device | None = None,
    profile_dir: Path | None = None,
) -> None:
    """Measures ``names`` under ``mode``, appending each row to the JSON-lines file ``out``."""
    where = device or torch.device(device_type())
    measure_each(
        names,
        measure_one=lambda name: measured_row(name, mode, iters=iters, device=where, profile_dir=profile_dir),
        failed_row=lambda name, status, reason: empty_row(name, mode, status, reason),
        write=lambda _, row: append_row(out, row),
    )


def release() -> None:
    """Free what the last workload left before the next is measured: Dynamo's caches hold its compiled code and
    graphs (reset drops them), the reference cycles among them need a collection, and then the allocator can give
    their memory back. Otherwise the next row's peak memory and garbage collections count the last one's."""
    torch._dynamo.reset()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", required=True)
    parser.add_argument("--workloads", nargs="+", required=True)
    parser.add_argument(
        "--iters", type=int, default=100, help="timed calls; batch-bucket workloads: the trace's length"
    )
    parser.add_argument("--device", choices=("cuda", "cpu"), default=device_type())
    parser.add_argument("--out", required=True, help="JSON-lines file the rows are appended to")
    parser.add_argument("--profile-dir", type=Path, help="write each pair's profile here too (not batch buckets')")
    a = parser.parse_args()
    run(a.mode, a.workloads, a.iters, a.out, device=torch.device(a.device), profile_dir=a.profile_dir)


if __name__ == "__main__":
    main()
