"""A shard of a population on the GPU: worker processes side by side, each restarted past a model that killed it.

A model that ends its worker (a hard CUDA error, an abort) or runs past the per-model timeout becomes one
``crash`` row with the reason; the shard goes on with the next model in a new worker.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from enum import Enum
from pathlib import Path
from typing import Any

from ..workers import append_row, run_workers
from .candidate import Candidate, Library
from .population import candidates, pick, shard
from .report import done_models, timed_models, unbuilt_models
from .rows import Entry, GradMode, Result, new_row
from .worker import RUNNING

WORKER = [sys.executable, "-m", "launchless.apps.differential.worker"]
# Workers side by side share the host's cores: each one's CPU work (drawing inputs, Inductor's compiles) on one
# thread, or a dozen workers' thread pools fight over the cores and every call waits on them.
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TORCHINDUCTOR_COMPILE_THREADS": "1"}


def killed_at(log: Path, name: str) -> tuple[str, str, str] | None:
    """(entry, grad mode, error) of the row a worker's log shows for ``name`` when the process ended: its last
    announced row (``worker.announce``) and the last error line after it (a device-side assert prints its own
    line; "" when none); None when the log announced no row of ``name``."""
    if not log.exists():
        return None
    lines = log.read_text(errors="replace").splitlines()
    marks = [i for i, line in enumerate(lines) if line.startswith(f"{RUNNING} {name} ")]
    if not marks:
        return None
    _, entry, mode = lines[marks[-1]].rsplit(" ", 2)
    return entry, mode, _last_error(lines[marks[-1] + 1 :])


def killed_reason(log: Path, name: str) -> str:
    """ " during ENTRY / MODE: error" for a model that ended its worker (``killed_at``), "" when unknown."""
    at = killed_at(log, name)
    if at is None:
        return ""
    entry, mode, error = at
    return f" during {entry} / {mode}" + (f": {error}" if error else "")


_ERROR_WORDS = ("Error", "error:", "Assertion", "Aborted", "Segmentation")
EXITED = "the worker exited"  # how ``workers.run_workers`` names a worker that ended (not one that timed out)


def _last_error(lines: list[str]) -> str:
    errors = [line.strip() for line in lines if any(w in line for w in _ERROR_WORDS)]
    return errors[-1][:300] if errors else ""


class Alone(str, Enum):
    """What running a killed row's references alone showed (``eager_alone``)."""

    RAN_THROUGH = "ran-through"  # eager alone survives: the crash was launchless's
    ENDED = "ended"  # eager alone ends its process too: eager-fails
    UNDECIDED = "undecided"  # it could not be built or ran past the timeout: the crash stands, unexplained


def eager_alone(
    library: Library, name: str, entry: str, mode: str, out: Path, *, timeout_s: float
) -> tuple[Alone, str]:
    """Run only the references of the row ``name`` died on, nothing accelerated, in a fresh process, and say what it
    showed, with the error that ended it. A hard CUDA error ends the process that made it, so that process cannot tell
    whether eager or launchless caused it; eager alone on the same inputs and draws can. Its log stays in ``out``
    (``eager-alone-<name>.log``)."""
    log = out / f"eager-alone-{name}.log"
    with tempfile.TemporaryDirectory() as scratch, log.open("w") as sink:
        marks = Path(scratch) / "marks.jsonl"
        command = [*WORKER, "--library", library.value, "--models", name, "--eager-alone", f"{entry}/{mode}"]
        try:
            code = subprocess.run(
                [*command, "--out", str(marks)], stdout=sink, stderr=subprocess.STDOUT, timeout=timeout_s, check=False
            ).returncode
        except subprocess.TimeoutExpired:
            return Alone.UNDECIDED, f"eager alone ran past {timeout_s:.0f} s"
        seen = marks.read_text() if marks.exists() else ""
    error = _last_error(log.read_text(errors="replace").splitlines()) or f"exit code {code}"
    if code == 0 and '"survived"' in seen:
        return Alone.RAN_THROUGH, ""
    if '"built"' not in seen:
        return Alone.UNDECIDED, f"eager alone could not build it ({error})"
    return Alone.ENDED, error


def _killed(
    library: Library,
    tasks: dict[str, str],
    record: Path,
    log: Path,
    *,
    timing: bool = False,
    timeout_s: float = 300,
    entries: list[str] | None = None,
) -> Any:
    """The row standing for a model that ended its worker or timed out, also written to ``record`` (a ``rows*.jsonl``
    file of the shard's folder): the merge reads only the folder, and a crash must not vanish from the report. A
    worker that ended is charged to the row it was on; where eager alone on that row's inputs ends its process too
    (``eager_alone``), the row is ``eager-fails``, not a crash. In the timing pass it is a timing line with the
    error, which leaves the model's correctness rows as they are. In a run of some ``entries`` only, the row is one
    of theirs and replaces only their rows."""

    def row(name: str, why: str) -> dict[str, Any]:
        reason = f"{why} on this model{killed_reason(log, name)}"
        if timing:
            line: dict[str, Any] = {"key": name, "library": library.value, "timings": [], "error": reason}
        else:
            at = killed_at(log, name)  # the row it was on, whether it ended or ran out of time
            first = Entry(entries[0]) if entries else Entry.WRAP_AUTO
            entry, mode = (Entry(at[0]), GradMode(at[1])) if at else (first, GradMode.NO_GRAD)
            crash = new_row(name, library.value, tasks.get(name, ""), entry, mode)
            crash.update(result=Result.CRASH.value, reason=reason)
            if at is not None and why.startswith(EXITED):
                alone, detail = eager_alone(library, name, entry.value, mode.value, record.parent, timeout_s=timeout_s)
                if alone is Alone.ENDED:
                    crash.update(
                        result=Result.EAGER_FAILS.value,
                        reason=f"eager alone ({entry.value} / {mode.value}, nothing accelerated) ends its process "
                        f"too: {detail}",
                    )
                else:
                    ran = "eager alone on the same inputs runs through"
                    crash["reason"] = f"{reason}; {ran if alone is Alone.RAN_THROUGH else detail}"
            line = {"key": name, "rows": [crash]}
            if entries:
                line["entries"] = sorted(entries)
        line["finished_at"] = time.time()
        append_row(record, line)
        return line

    return row


def write_population(out: Path, library: Library, population: list[Candidate]) -> None:
    """``population-<library>.json`` in ``out``: every model of the library's list as enumerated here, and the
    versions it was enumerated with, so the merge can say how much of the population a report covers."""
    from importlib import metadata

    from ..environment import describe

    package = library.value.split("-")[0]
    try:
        version = metadata.version(package)
    except metadata.PackageNotFoundError:
        version = None
    record = {"library": library.value, "version": version, "models": [c.name for c in population], **describe()}
    (out / f"population-{library.value}.json").write_text(json.dumps(record, indent=1) + "\n")


def run_shard(
    library: Library,
    out_dir: str,
    *,
    shard_spec: tuple[int, int] = (1, 1),
    names: list[str] | None = None,
    processes: int = 1,
    timeout_s: float = 300,
    resume: bool = False,
    timing: bool = False,
    entries: list[str] | None = None,
) -> list[dict[str, Any]]:
    """Rows of shard ``shard_spec`` of ``library`` (or of ``names``), ``processes`` workers at once on the GPU.

    With ``resume``, models that already have rows in ``out_dir`` are left out: a shard cut short by a time limit
    goes on where it stopped (a model cut off mid-way wrote nothing and runs again). With ``timing``, the timing pass
    instead (``timing.py``): one worker, one model at a time, timing lines in the same folder. With ``entries``, only
    the rows of those entry points (a run again after a change to them; the merge replaces just those rows)."""
    if timing and processes != 1:
        raise ValueError(f"the timing pass runs one worker (the GPU to itself), not {processes}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    population = candidates(library)
    write_population(out, library, population)
    chosen: list[Candidate] = shard(pick(population, names), *shard_spec)
    if resume:
        done = timed_models([out], entries=entries) if timing else done_models([out], entries=entries)
        chosen = [c for c in chosen if (library.value, c.name) not in done]
    if timing:  # a model whose correctness rows say it does not build (or eager fails on it) has nothing to time
        unbuilt = unbuilt_models([out])
        chosen = [c for c in chosen if (library.value, c.name) not in unbuilt]
    tasks = {c.name: c.task for c in chosen}
    parts = [chosen[i::processes] for i in range(processes)]
    flag = "--timing" if timing else "--side-by-side" if processes > 1 else None
    only = ["--entries", *entries] if entries else []
    command = [*WORKER, "--library", library.value, *([flag] if flag else []), *only]
    results: list[list[dict[str, Any]]] = [[] for _ in parts]
    stamp = time.strftime("%Y%m%dT%H%M%S")

    def one(i: int, part: list[Candidate]) -> None:
        label = f"-{library.value}{'-timing' if timing else ''}-{shard_spec[0]}of{shard_spec[1]}-p{i}-{stamp}"
        results[i] = run_workers(
            [c.name for c in part],
            command=lambda rest, jsonl: [*command, "--out", str(jsonl), "--models", *rest],
            out=out,
            label=label,
            key="key",
            failed_row=_killed(
                library,
                tasks,
                out / f"rows{label}-killed.jsonl",
                out / f"worker{label}.log",
                timing=timing,
                timeout_s=timeout_s,
                entries=entries,
            ),
            timeout_s=timeout_s,
            env={**os.environ, **ONE_THREAD} if processes > 1 else None,
            on_row=lambda line: print(f"{line['key']}: {_summary(line)}", flush=True),
        )

    threads = [threading.Thread(target=one, args=(i, part)) for i, part in enumerate(parts) if part]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [row for part in results for line in part for row in line.get("rows", line.get("timings", []))]


def _summary(line: dict[str, Any]) -> str:
    if "timings" in line:
        return ", ".join(f"{t['entry']}/{t['grad_mode']} {t.get('speedup', t.get('error'))}" for t in line["timings"])
    return str(sorted({str(r["result"]) for r in line["rows"]}))
