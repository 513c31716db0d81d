"""Run the suite: one worker process per mode, a progress bar, then the table, JSON, markdown and chart."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.progress import Progress

from ..environment import describe
from . import report
from .worker import empty_row

POLL_S = 0.2


def _read_rows(path: Path, seen: int) -> list[dict]:
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    return [json.loads(line) for line in lines[seen:] if line.strip()]


WORKER = [sys.executable, "-m", "launchless.bench.worker"]


def run_mode(
    mode: str,
    names: list[str],
    iters: int,
    timeout_s: float,
    out: Path,
    advance=lambda: None,
    worker: list[str] = WORKER,
) -> list[dict]:
    """Measure ``names`` under ``mode``; a worker that hangs or dies costs only the workload it was on."""
    rows: list[dict] = []
    remaining = list(names)
    while remaining:
        jsonl = out / f"rows-{mode}-{len(rows)}.jsonl"
        jsonl.unlink(missing_ok=True)  # rows left in --out by an earlier run are not this run's
        log = (out / f"worker-{mode}.log").open("a")
        cmd = [*worker, "--mode", mode, "--iters", str(iters), "--out", str(jsonl), "--workloads", *remaining]
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        started, done = time.monotonic(), 0
        while remaining:
            new = _read_rows(jsonl, done)
            for row in new:
                rows.append(row)
                remaining.remove(row["workload"])
                advance()
            done += len(new)
            if new:
                started = time.monotonic()
            elif proc.poll() is not None and not _read_rows(jsonl, done):
                rows.append(empty_row(remaining.pop(0), mode, "error", f"worker exited with code {proc.returncode}"))
                advance()
                break
            elif time.monotonic() - started > timeout_s:
                proc.kill()
                rows.append(empty_row(remaining.pop(0), mode, "error", f"timed out after {timeout_s:.0f} s"))
                advance()
                break
            time.sleep(POLL_S)
        proc.wait()
        log.close()
    return rows


def run_suite(suite: str, names: list[str], modes: list[str], out_dir: str, iters: int, timeout_s: float) -> int:
    console = Console(width=None if sys.stdout.isatty() else 220)  # logs and pipes get the whole table
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    environment = describe()
    rows: list[dict] = []
    started = time.monotonic()
    with Progress(console=console) as progress:
        task = progress.add_task("benchmarking", total=len(names) * len(modes))
        for mode in modes:
            progress.update(task, description=f"mode {mode}")
            rows += run_mode(mode, names, iters, timeout_s, out, lambda: progress.advance(task))
    environment["wall_s"] = round(time.monotonic() - started, 1)
    paths = report.write_all(out, environment, suite, rows)
    console.print(report.rich_table(environment, suite, rows))
    console.print("written: " + ", ".join(str(p) for p in paths.values()))
    return 0


def merge(paths: list[str], out_dir: str) -> int:
    """One report from several partial runs (a standard suite split over device calls by --workloads).

    Rows of a later file replace the same (workload, mode) of an earlier one; the environment is the
    first file's, and the GPU must be the same in all of them.
    """
    runs = [json.loads(Path(p).read_text()) for p in paths]
    gpus = {run["environment"].get("gpu") for run in runs}
    if len(gpus) > 1:
        raise ValueError(f"refusing to merge runs from different GPUs: {sorted(map(str, gpus))}")
    rows: dict[tuple[str, str], dict] = {}
    for run in runs:
        rows.update({(r["workload"], r["mode"]): r for r in run["rows"]})
    walls = [run["environment"].get("wall_s") for run in runs]
    environment = dict(runs[0]["environment"], merged_from=[str(p) for p in paths])
    environment["wall_s"] = sum(walls) if all(w is not None for w in walls) else None
    suite = "+".join(dict.fromkeys(run["suite"] for run in runs))
    paths_out = report.write_all(Path(out_dir), environment, suite, list(rows.values()))
    Console().print("written: " + ", ".join(str(p) for p in paths_out.values()))
    return 0
