"""One mode of the serving suite, in its own process: serves the given workloads in turn and writes a JSON line per
workload.

The runner starts one worker per mode (with its own fresh compile caches), so neither compiled code nor graphs nor
the allocator's cached memory pass from one mode to the next; if a worker dies, the runner starts another for the
workloads it had not reached. A workload that fails is an error row and the worker goes on.
"""

from __future__ import annotations

import argparse
import time

import torch

from ..workers import append_row
from .serving_workloads import BUCKETS, DECODE, MODES, decode_workload, part_of
from .worker import one_line, release

COMMON_KEYS = ("median_ms", "identical", "compile_s", "graphs")
PART_KEYS = {
    BUCKETS: (
        "total_ms",
        "calls",
        "distinct_sizes",
        "first_pass_s",
        "graph_mem_bytes",
        "device_mem_bytes",
        "max_abs_diff",
        "batch_buckets",
    ),
    DECODE: (
        "batch",
        "prompt_tokens",
        "new_tokens",
        "tokens_per_s",
        "ttft_ms",
        "generate_ms",
        "first_call_s",
        "runs",
        "first_divergence",
        "interleaved_ms",
        "interleaved_rounds",
        "interleaved_error",
    ),
}


def empty_row(workload: str, mode: str, status: str, reason: str | None) -> dict:
    """A row with every field of its part and nothing measured: what a workload that failed, or killed its worker,
    leaves in the report."""
    part = part_of(workload)
    row = {"workload": workload, "part": part, "mode": mode, "status": status, "reason": reason}
    row.update(dict.fromkeys((*COMMON_KEYS, *PART_KEYS[part], "wall_s")))
    if part == DECODE:  # what was asked for, known whether or not it ran
        decode = decode_workload(workload)
        row.update(batch=decode.batch, prompt_tokens=decode.decoder.prompt_tokens, new_tokens=decode.decoder.new_tokens)
    return row


def measure(workload: str, mode: str, *, calls: int, device: torch.device) -> dict:
    """The workload's measured fields in this mode; the part's module is imported only when a workload needs it
    (decode needs transformers)."""
    if part_of(workload) == BUCKETS:
        from .serving_buckets import measure_buckets

        return measure_buckets(workload, mode, calls=calls, device=device)
    from .serving_decode import measure_decode

    return measure_decode(workload, mode, device=device)


def run(mode: str, workloads: list[str], *, calls: int, device: torch.device, out: str) -> None:
    for workload in workloads:
        started = time.perf_counter()
        try:
            row = empty_row(workload, mode, "ok", None)
            row.update(measure(workload, mode, calls=calls, device=device))
        except Exception as exc:  # one workload failing must not stop the mode
            row = empty_row(workload, mode, "error", one_line(exc))
        row["wall_s"] = time.perf_counter() - started
        append_row(out, row)
        release()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", required=True, choices=MODES)
    parser.add_argument("--workloads", nargs="+", required=True)
    parser.add_argument("--calls", type=int, required=True, help="batch-bucket workloads: the trace's length")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", required=True, help="JSON-lines file the rows are appended to")
    a = parser.parse_args()
    run(a.mode, a.workloads, calls=a.calls, device=torch.device(a.device), out=a.out)


if __name__ == "__main__":
    main()
