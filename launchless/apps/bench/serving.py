"""`launchless bench --suite serving`: what serving traffic costs in each mode -- a trace of batch sizes served with a
graph per size against a few padded batch buckets, and token-by-token decoding of causal LMs against transformers'
static-cache compile recipe.

One worker process per mode, in fresh compile caches (as the other suites run them), serving that mode's workloads in
turn: a mode never finds another mode's compiled kernels, graphs or cached memory, so its first call shows its own
start-up. A worker that dies or hangs costs only the workload it was on -- ``launchless.apps.workers`` writes an error
row and starts another worker for the rest. With several GPUs (``--gpus 0 1``) the workloads are dealt over them as the
standard suite deals its own, each part's workers pinned to their own CPU cores.
"""

from __future__ import annotations

import importlib.metadata
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from rich.console import Console
from rich.markdown import Markdown
from rich.progress import Progress

from ..environment import describe
from ..workers import run_workers
from . import serving_report
from .multigpu import device_type
from .runner import fresh_cache_env, run_parts
from .serving_worker import empty_row
from .serving_workloads import TRACE_CALLS, check_workload, describe_trace, modes_of

WORKER_MODULE = "launchless.apps.bench.serving_worker"


def check_workloads(names: Sequence[str]) -> None:
    """Raises ``UnknownWorkload`` for the first name no worker could build, before any worker is started."""
    for name in names:
        check_workload(name)


def run_mode(
    mode: str,
    workloads: list[str],
    *,
    calls: int,
    device: str,
    timeout_s: float,
    out: Path,
    gpu: int | None = None,
    cores: set[int] | None = None,
    advance: Callable[[], None] = lambda: None,
) -> list[dict]:
    """Rows of ``workloads`` under ``mode`` from one worker (a new one for the rest when one dies or hangs); ``gpu``
    makes the worker see only that GPU, ``cores`` pins it to those CPU cores."""
    label = f"-{mode}" + ("" if gpu is None else f"-gpu{gpu}")

    def command(remaining: list[str], jsonl: Path) -> list[str]:
        options = ("--mode", mode, "--calls", str(calls), "--device", device, "--out", str(jsonl))
        return [sys.executable, "-m", WORKER_MODULE, *options, "--workloads", *remaining]

    def failed_row(workload: str, why: str) -> dict:
        return empty_row(workload, mode, "error", f"{why} (see worker{label}.log)")

    with fresh_cache_env(f"launchless-serving{label}-", visible_gpus=None if gpu is None else str(gpu)) as env:
        return run_workers(
            workloads,
            command=command,
            out=out,
            label=label,
            key="workload",
            failed_row=failed_row,
            timeout_s=timeout_s,
            env=env,
            cores=cores,
            on_row=lambda row: advance(),
        )


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment(device: str, calls: int, gpus: Sequence[int] | None) -> dict:
    """``describe()`` plus the device, the model libraries' versions and the trace."""
    env = describe()
    env.update(device=device, transformers=_version("transformers"), timm=_version("timm"))
    env["trace"] = describe_trace(calls)
    if gpus and len(gpus) > 1:
        env["gpus_at_once"] = len(gpus)
    return env


def write_report(
    out: Path, env: dict, rows: list[dict], *, names: Sequence[str], modes: Sequence[str], started: float
) -> dict[str, Path]:
    """serving.json, .md and .png from the rows so far, in the order of the workloads and modes asked for."""
    env["wall_s"] = round(time.monotonic() - started, 1)
    order = {name: i for i, name in enumerate(names)}
    rows = sorted(rows, key=lambda r: (order[r["workload"]], list(modes).index(r["mode"])))
    return serving_report.write_all(out, env, rows)


def run_serving(
    names: Sequence[str],
    modes: Sequence[str],
    *,
    out_dir: str | Path,
    calls: int = TRACE_CALLS,
    timeout_s: float,
    gpus: Sequence[int] | None = None,
    device: str | None = None,
) -> dict[str, Path]:
    """Every mode's worker in turn (or the workloads dealt over ``gpus``, run at once), then serving.json, .md and
    .png in ``out_dir``; returns their paths. A workload runs only in the modes of its part."""
    device = device or device_type()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    console = Console(width=None if sys.stdout.isatty() else 160)
    env = environment(device, calls, gpus) | {"modes": list(modes)}
    started = time.monotonic()
    lock = threading.Lock()  # parts on several GPUs finish modes at once
    with Progress(console=console) as progress:
        task = progress.add_task("serving", total=sum(mode in modes_of(n) for n in names for mode in modes))

        finished: list[dict] = []

        def run(mode: str, part: list[str], gpu: int | None, cores: set[int] | None) -> list[dict]:
            members = [n for n in part if mode in modes_of(n)]
            if not members:
                return []
            progress.update(task, description=f"mode {mode}")
            rows = run_mode(
                mode,
                members,
                calls=calls,
                device=device,
                timeout_s=timeout_s,
                out=out,
                gpu=gpu,
                cores=cores,
                advance=lambda: progress.advance(task),
            )
            with lock:  # the report so far: a run cut short keeps every mode that finished
                finished.extend(rows)
                write_report(out, env, finished, names=names, modes=modes, started=started)
            return rows

        rows = run_parts(list(names), list(modes), list(gpus) if gpus else None, run)
    paths = write_report(out, env, rows, names=names, modes=modes, started=started)
    console.print(Markdown(paths["md"].read_text()))
    console.print("written: " + ", ".join(str(p) for p in paths.values()))
    return paths
