"""One mode, in its own process: measures the given workloads in turn and writes a JSON line per workload.

The runner starts one worker per mode, so compile caches and allocator state never leak across modes;
if a worker dies, the runner starts another for the workloads it had not reached.
"""

from __future__ import annotations

import argparse
import gc
import time

import torch

from ...errors import one_line
from ..workers import append_row
from . import workloads
from .measure import measure
from .modes import ModeUnavailable

ROW_KEYS = (
    "median_ms",
    "min_ms",
    "latency_ms",
    "calls",
    "first_call_ms",
    "peak_mem_mb",
    "kernel_floor_ms",
    "floor_ratio",
    "graph_coverage",
    "copy_bytes",
    "compile_s",
    "timeline",
)


def empty_row(name: str, mode: str, status: str, reason: str | None) -> dict:
    kind = workloads.get(name).kind
    row = {"workload": name, "mode": mode, "kind": kind, "status": status, "reason": reason}
    row.update(dict.fromkeys(ROW_KEYS))
    row["correctness"] = {"status": "n/a", "max_abs_diff": None}
    return row


def run(mode: str, names: list[str], iters: int, out: str) -> None:
    for name in names:
        start = time.perf_counter()
        try:
            row = measure(workloads.get(name), mode, iters)
        except ModeUnavailable as exc:
            row = empty_row(name, mode, "skipped", str(exc))
        except Exception as exc:  # one workload failing must not stop the suite
            row = empty_row(name, mode, "error", one_line(exc))
        row["wall_s"] = time.perf_counter() - start
        append_row(out, row)
        release()


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
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--out", required=True)
    a = parser.parse_args()
    run(a.mode, a.workloads, a.iters, a.out)


if __name__ == "__main__":
    main()
