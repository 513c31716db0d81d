"""Run the matrix: workers check the models in turn (a worker that dies or hangs costs only the model it was
on), dealt over several GPUs when given; then the JSON, markdown and chart."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ..bench.runner import deal, split_cores
from ..environment import describe
from . import report
from .check import empty_row
from .worker import task_of

WORKER = [sys.executable, "-m", "launchless.apps.conformance.worker"]
POLL_S = 0.2


def _rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_part(
    names: list[str], out: Path, *, iters: int, timeout_s: float, gpu: int | None = None, cores: set[int] | None = None
) -> list[dict[str, Any]]:
    """Check ``names`` on one GPU, restarting the worker past a model that killed or hung it."""
    rows: list[dict[str, Any]] = []
    remaining = list(names)
    env = dict(os.environ)
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    part = ("" if gpu is None else f"-gpu{gpu}") + time.strftime("-%Y%m%dT%H%M%S")
    while remaining:
        jsonl = out / f"rows{part}-{len(rows)}.jsonl"
        jsonl.unlink(missing_ok=True)
        cmd = [*WORKER, "--iters", str(iters), "--out", str(jsonl), "--models", *remaining]
        with (out / f"worker{part}.log").open("a") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
            if cores and hasattr(os, "sched_setaffinity"):
                os.sched_setaffinity(proc.pid, cores)
            done, started = 0, time.monotonic()
            while remaining:
                new = _rows(jsonl)[done:]
                for row in new:
                    rows.append(row)
                    remaining.remove(row["model"])
                    print(f"{row['model']}: {row['status']}", flush=True)
                done += len(new)
                if new:
                    started = time.monotonic()
                elif proc.poll() is not None and not _rows(jsonl)[done:]:
                    name = remaining.pop(0)
                    row = empty_row(name, task_of(name))
                    row["reason"] = f"the worker exited with code {proc.returncode} on this model"
                    rows.append(row)
                    break
                elif time.monotonic() - started > timeout_s:
                    proc.kill()
                    name = remaining.pop(0)
                    row = empty_row(name, task_of(name))
                    row["reason"] = f"timed out after {timeout_s:.0f} s"
                    rows.append(row)
                    break
                time.sleep(POLL_S)
            proc.wait()
    return rows


def done_rows(out: Path) -> list[dict[str, Any]]:
    """The rows earlier runs left in ``out`` (the last one per model)."""
    rows: dict[str, dict[str, Any]] = {}
    for path in sorted(out.glob("rows*.jsonl")):
        for row in _rows(path):
            rows[row["model"]] = row
    return list(rows.values())


def run_matrix(
    names: list[str],
    out_dir: str,
    *,
    iters: int = 50,
    timeout_s: float = 300,
    gpus: list[int] | None = None,
    resume: bool = False,
) -> dict[str, Path]:
    """Check every model of ``names``; write conformance.json / .md / .png into ``out_dir``. ``resume``: keep the
    rows an earlier (interrupted) run left there and check only the others."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    earlier = [r for r in done_rows(out) if r["model"] in names] if resume else []
    names_done = {r["model"] for r in earlier}
    todo = [n for n in names if n not in names_done]
    rows = _check(todo, out, iters=iters, timeout_s=timeout_s, gpus=gpus)
    ordered = sorted(earlier + rows, key=lambda r: names.index(r["model"]))
    return report.write_all(out, report.environment_of(ordered) if ordered else describe(), ordered)


def _check(
    names: list[str], out: Path, *, iters: int, timeout_s: float, gpus: list[int] | None
) -> list[dict[str, Any]]:
    if not names:
        return []
    if not gpus or len(gpus) == 1:
        rows = run_part(names, out, iters=iters, timeout_s=timeout_s, gpu=gpus[0] if gpus else None)
    else:
        parts = deal(names, len(gpus))
        results: list[list[dict[str, Any]]] = [[] for _ in parts]
        cores = split_cores(len(parts))

        def one(i: int, part: list[str], gpu: int) -> None:
            results[i] = run_part(part, out, iters=iters, timeout_s=timeout_s, gpu=gpu, cores=cores[i])

        threads = [
            threading.Thread(target=one, args=(i, p, g)) for i, (p, g) in enumerate(zip(parts, gpus, strict=False))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        rows = sorted((r for part in results for r in part), key=lambda r: names.index(r["model"]))
    return rows
