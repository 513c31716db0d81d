"""Worker processes that take a list of names in turn and write one JSON row per name, restarted past a name that
killed or hung them, and names dealt over several GPUs with a part per GPU run at once: what the bench suites and
the conformance matrix both run on."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
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


def deal(names: list[str], parts: int, weights: Mapping[str, float] | None = None) -> list[list[str]]:
    """Workloads dealt round-robin, so that each part gets a share of the slow-to-compile ones; with ``weights``
    (seconds each took in an earlier run) longest first to the least-loaded part, so that the parts finish
    together. A workload without a weight counts as the mean of the others. Each part keeps suite order."""
    if not weights:
        return [names[i::parts] for i in range(parts) if names[i::parts]]
    known = [weights[n] for n in names if n in weights]
    default = sum(known) / len(known) if known else 1.0
    cost = {n: weights.get(n, default) for n in names}
    loads, members = [0.0] * parts, [set() for _ in range(parts)]
    for name in sorted(names, key=lambda n: (-cost[n], names.index(n))):
        i = loads.index(min(loads))
        loads[i] += cost[name]
        members[i].add(name)
    return [[n for n in names if n in part] for part in members if part]


def split_cores(parts: int) -> list[set[int] | None]:
    """This process's CPU cores in ``parts`` contiguous, disjoint sets (None where there are too few)."""
    if not hasattr(os, "sched_getaffinity"):
        return [None] * parts
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < parts:
        return [None] * parts
    size = len(cores) // parts
    return [set(cores[i * size : (i + 1) * size]) for i in range(parts)]


def run_dealt(
    names: list[str],
    gpus: list[int] | None,
    run_part: Callable[[list[str], int | None, set[int] | None], list[Row]],
    weights: Mapping[str, float] | None = None,
) -> list[Row]:
    """Every name once: as one part on the one GPU named (or the current one), or dealt over ``gpus`` (``deal``) and
    the parts run at once, each from a thread of its own and pinned to CPU cores of its own (``split_cores``), so
    that one part's compilation does not steal the CPU another part times launches on. ``run_part(part, gpu,
    cores)`` runs one part; a part that raises ends the run with its error. Rows part after part: the caller orders
    them."""
    if not gpus or len(gpus) == 1:
        return run_part(names, gpus[0] if gpus else None, None)
    parts = deal(names, len(gpus), weights)
    cores = split_cores(len(parts))
    results: list[list[Row]] = [[] for _ in parts]
    errors: list[BaseException] = []

    def one_part(i: int, part: list[str], gpu: int) -> None:
        try:
            results[i] = run_part(part, gpu, cores[i])
        except BaseException as exc:  # re-raised in the caller's thread
            errors.append(exc)

    threads = [
        threading.Thread(target=one_part, args=(i, part, gpu), daemon=True)
        for i, (part, gpu) in enumerate(zip(parts, gpus, strict=False))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return [row for rows in results for row in rows]


class GpusUnavailable(ValueError):
    """``--gpus`` named a GPU that is not there, or GPUs of different models."""


def check_gpus(gpus: list[int]) -> None:
    """``--gpus`` checked before any worker starts: each there and named once, all of one model (parts timed on
    different GPUs would not compare); ``GpusUnavailable`` says which and what to name."""
    import torch

    count = torch.cuda.device_count()
    missing = [g for g in gpus if not 0 <= g < count]
    if missing or len(set(gpus)) != len(gpus):
        raise GpusUnavailable(
            f"--gpus {' '.join(map(str, gpus))}: this machine has {count} GPU(s) (0..{count - 1}); "
            "name each at most once"
        )
    names = {torch.cuda.get_device_name(g) for g in gpus}
    if len(names) > 1:
        raise GpusUnavailable(
            f"--gpus mixes GPU models ({', '.join(sorted(names))}); results would not compare: name GPUs of one model"
        )
