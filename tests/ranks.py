"""Run a test body on several ranks of one process group (spawned processes), the way ``torchrun`` would.

``run_ranks(body, world_size=2, backend="gloo")`` starts ``world_size`` processes, initialises the default
process group in each (``MASTER_ADDR``/``MASTER_PORT`` on a free local port), calls ``body(rank, world_size,
*args)`` and returns what each rank returned, in rank order. A rank that raises makes ``run_ranks`` raise
``RankFailed`` with that rank's traceback; a rank that hangs past ``timeout_s`` is killed and reported. ``body``
must be a module-level function (it is pickled into the new processes).
"""

from __future__ import annotations

import os
import socket
import traceback
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp


class RankFailed(AssertionError):
    """A rank raised (its traceback is the message) or did not finish in time."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(
    rank: int, world_size: int, backend: str, port: int, body: Callable[..., Any], args: tuple, results: Any
) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
    )
    try:
        if backend == "nccl":
            import torch

            torch.cuda.set_device(rank)
        dist.init_process_group(backend, rank=rank, world_size=world_size)
        try:
            results.put((rank, True, body(rank, world_size, *args)))
        finally:
            dist.destroy_process_group()
    except BaseException:
        results.put((rank, False, traceback.format_exc()))


def run_ranks(
    body: Callable[..., Any], *args: Any, world_size: int = 2, backend: str = "gloo", timeout_s: float = 120
) -> list[Any]:
    """``body(rank, world_size, *args)`` on each rank of a fresh process group; the results in rank order."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_rank_main, args=(rank, world_size, backend, port, body, args, results))
        for rank in range(world_size)
    ]
    for proc in procs:
        proc.start()
    got: dict[int, tuple[bool, Any]] = {}
    try:
        for _ in range(world_size):
            rank, ok, value = results.get(timeout=timeout_s)
            got[rank] = (ok, value)
    except Exception as exc:  # queue.Empty: some rank hangs
        missing = sorted(set(range(world_size)) - set(got))
        raise RankFailed(f"rank(s) {missing} did not finish within {timeout_s:.0f} s") from exc
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
    failures = [f"rank {rank}:\n{value}" for rank, (ok, value) in sorted(got.items()) if not ok]
    if failures:
        raise RankFailed("\n".join(failures))
    return [got[rank][1] for rank in range(world_size)]
