"""Run the matrix: workers check the models in turn (a worker that dies or hangs costs only the model it was
on), dealt over several GPUs when given; then the JSON, markdown and chart."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from ..environment import describe
from ..workers import read_rows, run_dealt, run_workers
from . import report
from .check import empty_row
from .worker import task_of

WORKER = [sys.executable, "-m", "launchless.apps.conformance.worker"]


def run_part(
    names: list[str], out: Path, *, iters: int, timeout_s: float, gpu: int | None = None, cores: set[int] | None = None
) -> list[dict[str, Any]]:
    """Check ``names`` on one GPU, restarting the worker past a model that killed or hung it."""
    env = dict(os.environ)
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)

    def failed(name: str, why: str) -> dict[str, Any]:
        row = empty_row(name, task_of(name))
        row["reason"] = f"{why} on this model"
        return row

    return run_workers(
        names,
        command=lambda remaining, jsonl: [*WORKER, "--iters", str(iters), "--out", str(jsonl), "--models", *remaining],
        out=out,
        label=("" if gpu is None else f"-gpu{gpu}") + time.strftime("-%Y%m%dT%H%M%S"),
        key="model",
        failed_row=failed,
        timeout_s=timeout_s,
        env=env,
        cores=cores,
        on_row=lambda row: print(f"{row['model']}: {row['status']}", flush=True),
    )


def done_rows(out: Path) -> list[dict[str, Any]]:
    """The rows earlier runs left in ``out`` (the last one per model)."""
    rows: dict[str, dict[str, Any]] = {}
    for path in sorted(out.glob("rows*.jsonl")):
        for row in read_rows(path):
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

    def one_part(part: list[str], gpu: int | None, cores: set[int] | None) -> list[dict[str, Any]]:
        return run_part(part, out, iters=iters, timeout_s=timeout_s, gpu=gpu, cores=cores)

    rows = sorted(run_dealt(names, gpus, one_part), key=lambda r: names.index(r["model"]))
    return rows
