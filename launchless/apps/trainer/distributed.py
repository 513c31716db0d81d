"""Data-parallel training for ``launchless train --gpus N``: the command starts itself again under PyTorch's own
``torchrun``, one process per GPU, and each process joins the group and trains its replica of the model in
``DistributedDataParallel`` on its share of every epoch.

One process per GPU, as DDP recommends and as CUDA graphs need: each rank captures its own step on its own device.
The group is NCCL on CUDA and gloo on a machine without a GPU, where the same command runs on CPU processes.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ...core.streams import capture_stream
from ...errors import ConfigError
from ..torchrun import torchrun_command

COMMAND_MODULE = "launchless.apps.cli"


@dataclass(frozen=True)
class DataParallel:
    """This process's place in the group that ``torchrun`` started, and the device it trains on."""

    rank: int
    local_rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that prints progress, evaluates, and writes the checkpoint and the metrics."""
        return self.rank == 0

    def barrier(self) -> None:
        """Every rank waits here until all have arrived."""
        dist.barrier(device_ids=[self.device.index] if self.device.type == "cuda" else None)

    def all_ranks(self, value: Any) -> list[Any]:
        """``value`` of every rank, in rank order (a picklable object)."""
        values: list[Any] = [None] * self.world_size
        dist.all_gather_object(values, value)
        return values


def launched_by_torchrun() -> bool:
    """Whether this process is a rank of a group ``torchrun`` started (it sets these variables in every rank)."""
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def processes_per_host() -> int:
    """How many ranks ``torchrun`` started on this host (``--nproc-per-node``)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))


def relaunch(*, nproc_per_node: int, argv: Sequence[str]) -> NoReturn:
    """Replace this process with ``torchrun`` running ``launchless <argv>`` in ``nproc_per_node`` processes.

    Replaced, not run as a child: the command's exit code is then the group's, and a signal sent to the command
    (Ctrl-C, a job scheduler's SIGTERM) reaches ``torchrun`` itself, which stops its ranks, so that no rank outlives
    the command holding a GPU."""
    sys.stdout.flush()
    sys.stderr.flush()
    command = torchrun_command(nproc_per_node=nproc_per_node, module=COMMAND_MODULE, args=argv)
    os.execv(command[0], command)


@contextlib.contextmanager
def joined_group() -> Iterator[DataParallel]:
    """Join the group ``torchrun`` started -- NCCL on the GPU of this local rank, gloo where no GPU is visible -- and
    leave it (destroy the process group) at the end."""
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        visible = torch.cuda.device_count()
        if local_rank >= visible:
            raise ConfigError(
                f"local rank {local_rank} has no GPU of its own: {visible} GPU(s) are visible to "
                f"{processes_per_host()} processes on this host; start at most {visible} (--gpus or torchrun's "
                "--nproc-per-node)"
            )
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        dist.init_process_group("nccl")
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    try:
        parallel = DataParallel(
            rank=dist.get_rank(), local_rank=local_rank, world_size=dist.get_world_size(), device=device
        )
        yield parallel
        # every rank arrives before any tears its end of the group down: a rank that leaves while rank 0 still writes
        # the checkpoint or reads the last gather closes gloo's connections under it (an abort at exit)
        parallel.barrier()
    finally:
        # a DDP model that only a reference cycle still holds is freed now, while its group exists: freed at
        # interpreter exit instead, after the group, gloo aborts the process (SIGABRT)
        gc.collect()
        dist.destroy_process_group()


def replicate(model: torch.nn.Module, parallel: DataParallel) -> DistributedDataParallel:
    """``model`` in ``DistributedDataParallel``. On CUDA it is constructed on ``launchless.capture_stream()``, the
    stream graphed steps run and capture on, as PyTorch asks of a DDP model whose backward is captured in a CUDA
    graph; it is built that way with and without ``--cuda-graph``, so that the graph is the only difference between
    the two."""
    if parallel.device.type != "cuda":
        return DistributedDataParallel(model)
    caller = torch.cuda.current_stream(parallel.device)
    side = capture_stream(parallel.device)
    side.wait_stream(caller)  # the parameters were moved to the GPU on the caller's stream
    with torch.cuda.stream(side):
        ddp = DistributedDataParallel(model, device_ids=[parallel.local_rank])
    caller.wait_stream(side)
    return ddp
