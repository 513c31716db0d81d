"""`launchless bench --suite serving`: what serving traffic costs in each mode -- a trace of batch sizes served with a
graph per size against a few padded batch buckets, and token-by-token decoding of causal LMs against transformers'
static-cache compile recipe.

The suite runs as every single-process suite does (``runner.measure_suite``, the one worker): one worker process per
mode, in fresh compile caches, serving that mode's workloads in turn, so that a mode never finds another mode's
compiled kernels, graphs or cached memory and its first call shows its own start-up. What is its own: its workloads
(``serving_workloads``) run only in the modes of their part, its report states the device and the trace, and it runs
on a CPU too (host-clock times), so that it can be checked anywhere.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from . import runner
from .serving_report import SUITE
from .serving_workloads import TRACE_CALLS, serving_environment
from .worker import device_type


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
    """Rows of ``workloads`` under ``mode`` from one worker (a new one for the rest when one dies or hangs), in the
    mode's own fresh compile caches; ``gpu`` makes the worker see only that GPU, ``cores`` pins it to those CPU
    cores."""
    worker = [*runner.WORKER, "--device", device]
    return runner.run_mode(mode, workloads, calls, timeout_s, out, advance, worker=worker, gpu=gpu, cores=cores)


def run_serving(
    names: Sequence[str],
    modes: Sequence[str],
    *,
    out_dir: str | Path,
    calls: int = TRACE_CALLS,
    timeout_s: float,
    gpus: Sequence[int] | None = None,
    device: str | None = None,
    profile: bool = False,
) -> dict[str, Path]:
    """Every mode's worker in turn (or the workloads dealt over ``gpus``, run at once), then serving.json, .md and
    .png in ``out_dir``; returns their paths. A workload runs only in the modes of its part. ``profile``: each decode
    row's profile in ``out_dir/profiles`` too."""
    device = device or device_type()
    return runner.measure_suite(
        SUITE,
        list(names),
        list(modes),
        out_dir=out_dir,
        iters=calls,
        timeout_s=timeout_s,
        gpus=list(gpus) if gpus else None,
        device=device,
        environment=serving_environment(device, calls) | {"modes": list(modes)},
        profile_dir=Path(out_dir) / "profiles" if profile else None,
    )
