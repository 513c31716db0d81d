"""Worker processes that take a list of names in turn and write one JSON row per name, restarted past a name that
killed or hung them: what the bench suite and the conformance matrix both run on."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

POLL_S = 0.2
Row = dict[str, Any]
# a worker that exits with this code after its last row asks for a fresh process: its rows are whole and the name
# after them is not charged (a CUDA context that a device-side assert ended serves no later name)
FRESH_PROCESS = 75


def exit_if_gpu_unusable() -> None:
    """End this worker with ``FRESH_PROCESS`` when the GPU's context no longer runs work (a device-side assert or an
    illegal access ends it for the rest of the process): every later name would fail with the same error."""
    import torch

    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return
    try:
        torch.cuda.synchronize()
    except Exception:  # the error of an earlier name, sticky in the context
        os._exit(FRESH_PROCESS)


def append_row(path: str | Path, row: Row) -> None:
    """A worker's row, one JSON line appended as soon as it is measured (``read_rows`` reads them back)."""
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def read_rows(path: Path, seen: int = 0) -> list[Row]:
    """The rows a worker has written to ``path``, past the first ``seen``. A last line without its newline is one
    being written (or cut short by a kill): left for the next read. A complete line that is not JSON raises
    ``ValueError`` naming the file and the line."""
    if not path.exists():
        return []
    text = path.read_text()
    lines = text.splitlines()
    if lines and not text.endswith("\n"):
        lines.pop()
    rows = []
    for number, line in enumerate(lines[seen:], start=seen + 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number}: not a JSON row ({exc.msg})") from None
    return rows


def run_workers(
    names: list[str],
    *,
    command: Callable[[list[str], Path], list[str]],
    out: Path,
    label: str,
    key: str,
    failed_row: Callable[[str, str], Row],
    timeout_s: float,
    env: dict[str, str] | None = None,
    cores: set[int] | None = None,
    on_row: Callable[[Row], None] = lambda row: None,
) -> list[Row]:
    """Rows for ``names``: ``command(remaining, jsonl)`` starts a worker that writes a row per name (``row[key]``
    names it) to ``jsonl``. A worker that exits early or writes nothing for ``timeout_s`` costs only the name it
    was on -- ``failed_row(name, why)`` stands for it -- and a new worker takes the rest. Files go into ``out``:
    ``rows{label}-{n}.jsonl`` and ``worker{label}.log``; ``cores`` pins each worker to those CPU cores."""
    rows: list[Row] = []
    remaining = list(names)
    while remaining:
        jsonl = out / f"rows{label}-{len(rows)}.jsonl"
        jsonl.unlink(missing_ok=True)  # rows left in ``out`` by an earlier run are not this run's
        with (out / f"worker{label}.log").open("a") as log:
            proc = subprocess.Popen(command(remaining, jsonl), stdout=log, stderr=subprocess.STDOUT, env=env)
            if cores and hasattr(os, "sched_setaffinity"):  # not preexec_fn: unsafe when parts run in threads
                os.sched_setaffinity(proc.pid, cores)  # threads the worker starts later inherit it
            rows += _collect(proc, jsonl, key, remaining, timeout_s, failed_row, on_row)
            proc.wait()
    return rows


def _collect(
    proc: subprocess.Popen,
    jsonl: Path,
    key: str,
    remaining: list[str],
    timeout_s: float,
    failed_row: Callable[[str, str], Row],
    on_row: Callable[[Row], None],
) -> list[Row]:
    """The worker's rows as they appear; when it dies or hangs, a failed row for the name it was on."""
    rows: list[Row] = []
    started, done = time.monotonic(), 0
    while remaining:
        new = read_rows(jsonl, done)
        for row in new:
            rows.append(row)
            remaining.remove(row[key])
            on_row(row)
        done += len(new)
        if new:
            started = time.monotonic()
        elif proc.poll() is not None and not read_rows(jsonl, done):
            if proc.returncode == FRESH_PROCESS:  # it asked for a fresh process after a whole row
                break
            rows.append(failed_row(remaining.pop(0), f"the worker exited with code {proc.returncode}"))
            on_row(rows[-1])
            break
        elif time.monotonic() - started > timeout_s:
            proc.kill()
            rows.append(failed_row(remaining.pop(0), f"timed out after {timeout_s:.0f} s"))
            on_row(rows[-1])
            break
        time.sleep(POLL_S)
    return rows
