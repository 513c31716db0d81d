"""Run a suite: one worker process per mode (``worker``; the multigpu suite's ``torchrun`` groups through the same
``run_group``), a progress bar, then the report (``report.write_all``) and its table on the terminal. Every
single-process suite runs through ``measure_suite``, the serving suite's included: its workloads are a kind of workload
that runs only in the modes of its part.

Each mode's workers get their own, new compile caches (Inductor, Triton, launchless's decisions): on disk
they would otherwise outlive the process, so a mode would find kernels another mode compiled and its
first call would not show its own compile time. The one exception measures exactly that: the
compiled-kernels mode's second process (``launchless-compiled-kernels-on-disk``) runs on the caches its
first process left, as a user's next process would find them.

With several GPUs (``--gpus 0 1``) the workloads are dealt out over them and the parts run at once:
each workload still runs every mode on one GPU, and each part's workers are pinned to their own CPU
cores so that one part's compilation does not steal the CPU another part is timing launches on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from rich.console import Console
from rich.markdown import Markdown
from rich.progress import Progress, TaskID

from ..environment import describe
from ..workers import run_dealt, run_workers
from . import report
from .modes import CACHES_OF, CACHES_SHARED
from .serving_report import SUITE as SERVING
from .serving_workloads import serving_environment
from .worker import empty_row, runs_in

WORKER = [sys.executable, "-m", "launchless.apps.bench.worker"]


def run_mode(
    mode: str,
    names: list[str],
    iters: int,
    timeout_s: float,
    out: Path,
    advance=lambda: None,
    worker: list[str] = WORKER,
    gpu: int | None = None,
    cores: set[int] | None = None,
    caches: CacheRoots | None = None,
) -> list[dict]:
    """Measure ``names`` under ``mode`` with ``worker`` (the one worker; a serving run's names ``--device`` after
    it); a worker that hangs or dies costs only the workload it was on.

    ``gpu`` makes the worker see only that GPU; ``cores`` pins it to those CPU cores; ``caches``: the suite's
    compile caches (``CacheRoots``; without, this mode's own, removed after it)."""

    def command(remaining: list[str], jsonl: Path) -> list[str]:
        return [*worker, "--mode", mode, "--iters", str(iters), "--out", str(jsonl), "--workloads", *remaining]

    return run_group(
        mode,
        names,
        command=command,
        label=f"-{mode}" + ("" if gpu is None else f"-gpu{gpu}"),
        failed_row=lambda name, why: empty_row(name, mode, "error", why),
        timeout_s=timeout_s,
        out=out,
        visible_gpus=None if gpu is None else str(gpu),
        cores=cores,
        caches=caches,
        advance=advance,
    )


def run_group(
    mode: str,
    names: list[str],
    *,
    command: Callable[[list[str], Path], list[str]],
    label: str,
    failed_row: Callable[[str, str], dict],
    timeout_s: float,
    out: Path,
    visible_gpus: str | None = None,
    cores: set[int] | None = None,
    caches: CacheRoots | None = None,
    advance: Callable[[], None] = lambda: None,
) -> list[dict]:
    """Rows of ``names`` under ``mode`` from the workers ``command(remaining, jsonl)`` starts (a new one for the rest
    when one dies or hangs: ``failed_row(name, why)`` stands for the name it was on, pointing at its log), in the
    mode's own compile caches, seeing only ``visible_gpus`` where given; ``label`` names its rows and log files.
    Every suite's workers run through here: one process, or a ``torchrun`` group."""
    roots = caches or CacheRoots()
    try:
        with roots.env(mode, visible_gpus) as env:
            return run_workers(
                names,
                command=command,
                out=out,
                label=label,
                key="workload",
                failed_row=lambda name, why: failed_row(name, f"{why} (see worker{label}.log)"),
                timeout_s=timeout_s,
                env=env,
                cores=cores,
                on_row=lambda row: advance(),
            )
    finally:
        if caches is None:
            roots.close()


class CacheRoots:
    """The compile caches (Inductor's, Triton's, launchless's programs) of a suite's modes, each in a temporary
    folder of its own: on disk they outlive a process, and one mode must not find another's kernels. A mode that
    measures a second process (``CACHES_OF``) runs on the caches its first process left instead, and the race on the
    compiler backend's (``CACHES_SHARED``): it times, and need not compile again. A folder is removed
    once no mode still to run needs it, and all that are left when the suite ends."""

    def __init__(self) -> None:
        self._roots: dict[tuple[str, str | None], Path] = {}
        self._lock = threading.Lock()  # parts on several GPUs run their modes from threads of their own

    @contextlib.contextmanager
    def env(self, mode: str, visible_gpus: str | None) -> Iterator[dict[str, str]]:
        """The environment of ``mode``'s workers, seeing only ``visible_gpus`` (``CUDA_VISIBLE_DEVICES``) where
        given."""
        owner = (CACHES_OF.get(mode) or CACHES_SHARED.get(mode) or mode, visible_gpus)
        with self._lock:
            root = self._roots.get(owner)
            if root is None:
                part = "" if visible_gpus is None else f"-gpu{visible_gpus.replace(',', '_')}"
                root = self._roots[owner] = Path(tempfile.mkdtemp(prefix=f"launchless-bench-{owner[0]}{part}-"))
        env = {
            **os.environ,
            "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"),
            "TRITON_CACHE_DIR": str(root / "triton"),
            "LAUNCHLESS_CACHE_DIR": str(root / "decisions"),
        }
        if visible_gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible_gpus
        try:
            yield env
        finally:
            if mode not in {*CACHES_OF.values(), *CACHES_SHARED.values()}:  # no later mode comes for these caches
                with self._lock:
                    self._roots.pop(owner, None)
                shutil.rmtree(root, ignore_errors=True)

    def close(self) -> None:
        """Remove the folders still kept (a first process whose second was not run)."""
        with self._lock:
            roots, self._roots = list(self._roots.values()), {}
        for root in roots:
            shutil.rmtree(root, ignore_errors=True)


class BalanceFileUnreadable(ValueError):
    """``--balance-from`` named a file that is not an earlier run's bench.json."""


def balance_weights(path: str, modes: list[str]) -> dict[str, float]:
    """Seconds each workload took over ``modes`` (all its modes where none of these ran) in an earlier bench.json."""
    try:
        rows = json.loads(Path(path).read_text())["rows"]
        walls = [(str(r["workload"]), str(r["mode"]), float(r.get("wall_s") or 0.0)) for r in rows]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BalanceFileUnreadable(
            f"--balance-from {path}: not readable as a bench.json with rows ({exc}); name the bench.json an earlier "
            "`launchless bench` wrote, or leave --balance-from out to deal round-robin"
        ) from exc
    every_mode: dict[str, float] = {}
    these_modes: dict[str, float] = {}
    for workload, mode, seconds in walls:
        every_mode[workload] = every_mode.get(workload, 0.0) + seconds
        if mode in modes:
            these_modes[workload] = these_modes.get(workload, 0.0) + seconds
    weights = {w: s for w, s in every_mode.items() if s > 0}
    weights.update({w: s for w, s in these_modes.items() if s > 0})
    return weights


def run_parts(
    names: list[str],
    modes: list[str],
    gpus: list[int] | None,
    run: Callable[..., list[dict]],
    weights: Mapping[str, float] | None = None,
) -> list[dict]:
    """Every (workload, mode) once: serially on the current GPU, or dealt over ``gpus`` and run at once, every mode
    of a workload on one GPU (``workers.run_dealt``). ``run(mode, names, gpu=, cores=)`` measures one mode on one
    part; rows come back in suite order."""

    def every_mode(part: list[str], gpu: int | None, cores: set[int] | None) -> list[dict]:
        return [row for mode in modes for row in run(mode, part, gpu=gpu, cores=cores)]

    order = {(n, m): (names.index(n), modes.index(m)) for n in names for m in modes}
    rows = run_dealt(names, gpus, every_mode, weights)
    return sorted(rows, key=lambda r: order[(r["workload"], r["mode"])])


@dataclasses.dataclass
class SuiteRun:
    """One suite's run as the terminal shows it and its folder keeps it: a progress bar over its (workload, mode)
    pairs, the report written from the rows so far (a run cut short keeps what finished), then shown."""

    suite: str
    out: Path
    environment: dict
    console: Console
    progress: Progress
    task: TaskID
    started: float = dataclasses.field(default_factory=time.monotonic)
    lock: threading.RLock = dataclasses.field(default_factory=threading.RLock)  # parts on several GPUs write at once

    def stage(self, description: str) -> None:
        self.progress.update(self.task, description=description)

    def advance(self) -> None:
        self.progress.advance(self.task)

    def write(self, rows: list[dict]) -> dict[str, Path]:
        """The suite's report from ``rows``, the run's seconds so far in its environment."""
        with self.lock:
            self.environment["wall_s"] = round(time.monotonic() - self.started, 1)
            return report.write_all(self.out, self.environment, self.suite, rows)

    def show(self, paths: dict[str, Path], rows: list[dict]) -> None:
        """The report in the terminal (the suite's own view, else its Markdown) and the files written."""
        terminal = report.suite_report(self.suite).terminal
        shown = terminal(self.environment, self.suite, rows) if terminal else Markdown(paths["md"].read_text())
        self.console.print(shown)
        self.console.print("written: " + ", ".join(str(p) for p in paths.values()))


@contextlib.contextmanager
def suite_run(suite: str, out_dir: str | Path, environment: dict, *, total: int) -> Iterator[SuiteRun]:
    """A ``SuiteRun`` over ``total`` pairs, its folder created; the progress bar ends with the block."""
    console = Console(width=None if sys.stdout.isatty() else 220)  # logs and pipes get the whole table
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with Progress(console=console) as progress:
        yield SuiteRun(suite, out, environment, console, progress, progress.add_task("benchmarking", total=total))


def measure_suite(
    suite: str,
    names: list[str],
    modes: list[str],
    *,
    out_dir: str | Path,
    iters: int,
    timeout_s: float,
    gpus: list[int] | None = None,
    weights: Mapping[str, float] | None = None,
    device: str = "cuda",
    profile: bool = False,
) -> dict[str, Path]:
    """Every (workload, mode) of a single-process suite through the one worker, a worker per mode (and part, with
    several ``gpus``), all modes sharing the suite's compile-cache folders; then its report, written after each mode
    too, and its table on the terminal. A serving workload runs only in the modes of its part, and the serving
    report states the device, the trace and the modes asked for. ``profile``: each pair's profile in
    ``out_dir/profiles`` too. Returns the report's paths."""
    env = describe()
    if suite == SERVING:
        env |= serving_environment(device, iters) | {"modes": list(modes)}
    if gpus and len(gpus) > 1:
        env["gpus_at_once"] = len(gpus)
    order = {(n, m): (i, j) for i, n in enumerate(names) for j, m in enumerate(modes)}

    def in_order(rows: list[dict]) -> list[dict]:
        return sorted(rows, key=lambda r: order[(r["workload"], r["mode"])])

    finished: list[dict] = []
    caches = CacheRoots()
    worker = [*WORKER, "--device", device, *(["--profile-dir", str(Path(out_dir) / "profiles")] if profile else [])]
    total = sum(runs_in(n, m) for n in names for m in modes)
    with suite_run(suite, out_dir, env, total=total) as run:

        def one_mode(mode: str, part: list[str], gpu: int | None, cores: set[int] | None) -> list[dict]:
            members = [n for n in part if runs_in(n, mode)]
            if not members:
                return []
            run.stage(f"mode {mode}")
            rows = run_mode(
                mode, members, iters, timeout_s, run.out, run.advance, worker, gpu=gpu, cores=cores, caches=caches
            )
            with run.lock:  # the report so far: a run cut short keeps every mode that finished
                finished.extend(rows)
                run.write(in_order(finished))
            return rows

        try:
            rows = in_order(run_parts(names, modes, gpus, one_mode, weights))
        finally:
            caches.close()
    paths = run.write(rows)
    run.show(paths, rows)
    return paths


def _bench_run(path: str) -> dict:
    """A ``bench.json`` as ``launchless bench`` wrote it; a file that is not one raises ValueError naming it."""
    fix = "pass the bench.json files that launchless bench wrote into its --out folder"
    try:
        run = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ValueError(f"--merge {path}: cannot be read ({exc.strerror or exc}); {fix}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"--merge {path}: not JSON ({exc.msg} at line {exc.lineno}); {fix}") from None
    missing = [k for k in ("suite", "environment", "rows") if not isinstance(run, dict) or k not in run]
    if missing:
        raise ValueError(f"--merge {path}: not a bench.json (no {', '.join(missing)}); {fix}")
    return run


def _worker_rows(path: str) -> list[dict]:
    """The rows a worker wrote to its ``rows-<mode>-<n>.jsonl``, one per line: those of a run cut short before its
    report took them in (a line cut short by the end is left out)."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise ValueError(f"--merge {path}: cannot be read ({exc.strerror or exc})") from None
    rows = []
    for line in lines:
        with contextlib.suppress(json.JSONDecodeError):
            row = json.loads(line)
            if isinstance(row, dict) and "workload" in row and "mode" in row:
                rows.append(row)
    return rows


def merge(paths: list[str], out_dir: str) -> int:
    """One report from several partial runs (a suite split over device calls by --workloads or --modes).

    Rows of a later file replace the same (workload, mode) of an earlier one; the environment is the
    first file's, and the GPU must be the same in all of them. The serving and multigpu suites' runs are
    reported as those suites report (their own tables and targets), and only with runs of the same suite.
    A worker's ``.jsonl`` among them adds the rows it wrote (a run cut short before its report took them in),
    in the runs' suite and environment.
    """
    row_files = [p for p in paths if p.endswith(".jsonl")]
    runs = [_bench_run(p) for p in paths if not p.endswith(".jsonl")]
    if not runs:
        raise ValueError("--merge: a worker's .jsonl rows need a bench.json (or serving.json) of the run beside them")
    if row_files:
        runs.append({**runs[-1], "rows": [row for p in row_files for row in _worker_rows(p)]})
        runs[-1]["environment"] = {**runs[-1]["environment"], "wall_s": 0.0}  # counted in its run's report
    gpus = {run["environment"].get("gpu") for run in runs}
    if len(gpus) > 1:
        raise ValueError(f"refusing to merge runs from different GPUs: {sorted(map(str, gpus))}")
    suites = {run["suite"] for run in runs}
    if len(suites) > 1 and suites & set(report.OWN_REPORTS):
        raise ValueError(f"refusing to merge runs of different suites: {sorted(suites)}")
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
