"""`launchless bench --suite multigpu`: tensor-parallel inference and DDP training at several world sizes, each
process group started by PyTorch's own ``torchrun``.

One group per (world size, mode), in its own fresh compile caches (as the single-GPU suite gives each mode its
own), so that every first call shows that mode's own compilation. A group runs on the first ``world_size`` GPUs
of ``--gpus`` and measures that mode's workloads in turn; a group that dies or hangs costs only the workload it was
on -- ``launchless.apps.workers`` kills it (its ranks die with it), writes an error row and starts a new group for
the rest -- and the suite goes on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from ..environment import describe
from ..torchrun import torchrun_command
from . import multigpu_report, runner
from .multigpu_worker import empty_row
from .multigpu_workloads import modes_of
from .worker import device_type

WORLD_SIZES = (1, 2)
WORKER_MODULE = "launchless.apps.bench.multigpu_worker"


class MultiGpuUnavailable(ValueError):
    """The world sizes asked for need more GPUs than ``--gpus`` gives, or name no process at all."""


def check_world_sizes(world_sizes: Sequence[int], gpus: Sequence[int] | None, device: str) -> None:
    if not world_sizes or min(world_sizes) < 1:
        raise MultiGpuUnavailable(f"--world-sizes {' '.join(map(str, world_sizes))}: each must be 1 or more")
    if device == "cuda" and max(world_sizes) > len(gpus or ()):
        raise MultiGpuUnavailable(
            f"world size {max(world_sizes)} needs {max(world_sizes)} GPUs and --gpus gives {len(gpus or ())}: name "
            "more GPUs or smaller --world-sizes"
        )


def run_group(
    mode: str,
    workloads: list[str],
    *,
    world_size: int,
    device: str,
    iters: int,
    timeout_s: float,
    out: Path,
    gpus: Sequence[int] | None = None,
    advance: Callable[[], None] = lambda: None,
) -> list[dict]:
    """Rows of ``workloads`` under ``mode`` from one ``torchrun`` group of ``world_size`` ranks (a new group for
    the rest when one dies or hangs). On CUDA the group sees the first ``world_size`` of ``gpus``."""
    label = f"-w{world_size}-{mode}"
    visible = ",".join(str(g) for g in (gpus or ())[:world_size]) if device == "cuda" else None

    def command(remaining: list[str], jsonl: Path) -> list[str]:
        options = ("--mode", mode, "--device", device, "--iters", str(iters), "--out", str(jsonl))
        return torchrun_command(
            nproc_per_node=world_size, module=WORKER_MODULE, args=[*options, "--workloads", *remaining]
        )

    return runner.run_group(
        mode,
        workloads,
        command=command,
        label=label,
        failed_row=lambda workload, why: empty_row(workload, mode, world_size, "error", why),
        timeout_s=timeout_s,
        out=out,
        visible_gpus=visible,
        advance=advance,
    )


def environment(device: str, gpus: Sequence[int] | None, world_sizes: Sequence[int]) -> dict:
    """``describe()`` plus what the groups ran on: every GPU's name, the backend, the world sizes."""
    import torch

    env = describe()
    env.update(device=device, backend="nccl" if device == "cuda" else "gloo", world_sizes=list(world_sizes))
    if device == "cuda":
        env["gpus"] = {str(g): torch.cuda.get_device_name(g) for g in gpus or ()}
        env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    return env


def run_multigpu(
    names: Sequence[str],
    modes: Sequence[str],
    *,
    world_sizes: Sequence[int] = WORLD_SIZES,
    out_dir: str | Path,
    iters: int,
    timeout_s: float,
    gpus: Sequence[int] | None = None,
    device: str | None = None,
) -> dict[str, Path]:
    """Every (world size, mode) group in turn, then multigpu.json, .md and .png in ``out_dir``; returns their paths.

    A workload runs only in the modes of its part (DDP training: eager, reduce-overhead, launchless)."""
    device = device or device_type()
    check_world_sizes(world_sizes, gpus, device)
    groups = [(w, m, [n for n in names if m in modes_of(n)]) for w in world_sizes for m in modes]
    groups = [(w, m, part) for w, m, part in groups if part]
    rows: list[dict] = []
    total = sum(len(part) for _, _, part in groups)
    with runner.suite_run(multigpu_report.SUITE, out_dir, environment(device, gpus, world_sizes), total=total) as run:
        for world_size, mode, part in groups:
            run.stage(f"world size {world_size}, {mode}")
            rows += run_group(
                mode,
                part,
                world_size=world_size,
                device=device,
                iters=iters,
                timeout_s=timeout_s,
                out=run.out,
                gpus=gpus,
                advance=run.advance,
            )
    order = {name: i for i, name in enumerate(names)}
    rows = multigpu_report.with_scaling(
        sorted(rows, key=lambda r: (order[r["workload"]], r["world_size"], modes.index(r["mode"])))
    )
    paths = run.write(rows)
    run.show(paths, rows)
    return paths
