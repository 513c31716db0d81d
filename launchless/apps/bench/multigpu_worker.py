"""One rank of a multi-GPU bench group, started by ``torchrun``: measures workloads under one mode, in lockstep with
the other ranks, and rank 0 writes a JSON line per workload.

Its workloads, of two kinds (tensor-parallel inference, DDP training): ``multigpu_workloads``. Every rank runs the
same workloads in the same order, so the collectives inside each call pair up; a rank that fails outside a collective
still takes part in the gather that ends the workload, so the others carry on. Timing is rank 0's: CUDA events on a
GPU, the host clock on the CPU (``gloo``), after a barrier so that all ranks start together. Correctness is every
rank's own output (inference) or parameters (training) against eager at the same world size, gathered to rank 0.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils._pytree import tree_map

from ...core.collectives import wait_outputs
from ...core.streams import capture_stream
from ...timing import Timing, cuda_latency, cuda_time
from ..workers import append_row
from . import modes
from .measure import compare_outputs, synchronize_device
from .multigpu_report import TP_INFERENCE
from .multigpu_workloads import DDP_MODES, TP_MODES, ddp_builder, part_of, tp_builder
from .stats import median_and_min
from .training import TrainingSetup, classify_loss, train_step
from .worker import blank_row, device_type, measure_each

# calls before the checkpoint and the timing: past the 11 eager DDP steps PyTorch's notes on CUDA graphs ask for
# before a capture, the capture itself and its verification
WARMUP_CALLS = 20
BATCH_PER_RANK = 1
ROW_KEYS = (
    *("median_ms", "min_ms", "waited_ms", "calls", "first_call_s", "warmup_s", "graphs", "scaling_efficiency"),
    "wall_s",
)


# --- rows -----------------------------------------------------------------------------------------------------


def empty_row(workload: str, mode: str, world_size: int, status: str, reason: str | None) -> dict:
    """A row with every report field and nothing measured: a workload that failed, on some rank or in its group."""
    identity = {"workload": workload, "part": part_of(workload), "mode": mode, "world_size": world_size}
    not_compared: dict[str, Any] = {"status": "n/a", "max_abs_diff": None, "ranks": []}
    return blank_row(identity | {"status": status, "reason": reason}, ROW_KEYS, correctness=not_compared)


def gathered_row(workload: str, mode: str, world_size: int, results: list[tuple[dict | None, str | None]]) -> dict:
    """Rank 0's row from every rank's ``(measured, error)``: rank 0's times, every rank's correctness."""
    failed = [(rank, error) for rank, (_, error) in enumerate(results) if error is not None]
    if failed:
        reason = "; ".join(f"rank {rank}: {error}" for rank, error in failed)
        return empty_row(workload, mode, world_size, "error", reason)
    measured = [m for m, _ in results if m is not None]
    row = empty_row(workload, mode, world_size, "ok", None)
    row.update({k: v for k, v in measured[0].items() if k != "correctness"})
    per_rank = [m["correctness"] for m in measured]
    if mode == "eager":  # the reference the other modes are compared with
        row["correctness"] = {"status": "reference", "max_abs_diff": 0.0, "ranks": [0.0] * len(per_rank)}
        return row
    diffs = [c["max_abs_diff"] for c in per_rank]
    identical = all(c["status"] == "bit-identical" for c in per_rank)
    row["correctness"] = {
        "status": "bit-identical" if identical else "differs",
        "max_abs_diff": max(diffs),
        "ranks": diffs,
    }
    return row


# --- one rank -------------------------------------------------------------------------------------------------


def die_with_launcher() -> None:
    """Have the kernel end this rank when its launcher dies. The runner kills a ``torchrun`` that hangs, and
    ``torchrun`` passes nothing on when killed: its ranks would stay blocked in a collective, holding their GPUs."""
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def join_group(on: str) -> torch.device:
    """Join torchrun's process group: NCCL on this rank's GPU, gloo on the CPU."""
    if on == "cuda":
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl")
        return torch.device("cuda", local_rank)
    dist.init_process_group("gloo")
    return torch.device("cpu")


def _lockstep(device: torch.device) -> None:
    """Every rank here, with no work queued: what a timing loop starts from."""
    synchronize_device(device)
    dist.barrier(device_ids=[device.index] if device.type == "cuda" else None)
    synchronize_device(device)


def host_time(fn: Callable[[], object], *, warmup: int, iters: int) -> Timing:
    """Per-call host time of ``fn``: on the CPU a call has finished when it returns, so this is also waited-for."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        began = time.perf_counter()
        fn()
        times.append((time.perf_counter() - began) * 1e3)
    return Timing(*median_and_min(times), iters)


def _timed(
    call: Callable[[], Any], *, device: torch.device, iters: int, checkpoint: Callable[[Any], Any]
) -> tuple[dict, Any]:
    """Times of ``call`` and ``checkpoint`` of its result after ``1 + WARMUP_CALLS`` calls (training: the
    parameters after that many steps, which eager's are compared with). ``warmup_s`` covers those calls: a mode
    that captures after some eager calls (graphed_step) spends its capture there, not in the first call."""
    _lockstep(device)
    began = time.perf_counter()
    out = call()
    synchronize_device(device)
    first_call_s = time.perf_counter() - began
    for _ in range(WARMUP_CALLS):
        out = call()
    synchronize_device(device)
    warmup_s = time.perf_counter() - began
    checked = checkpoint(out)
    back_to_back, waited = (cuda_time, cuda_latency) if device.type == "cuda" else (host_time, host_time)
    _lockstep(device)
    timing = back_to_back(call, warmup=0, iters=iters)
    _lockstep(device)
    latency = waited(call, warmup=0, iters=iters)
    measured = {
        "median_ms": timing.median_ms,
        "min_ms": timing.min_ms,
        "waited_ms": latency.median_ms,
        "calls": iters,
        "first_call_s": first_call_s,
        "warmup_s": warmup_s,
    }
    return measured, checked


def _local(tree: Any) -> Any:
    """Detached copies of this rank's tensors (a DTensor's local shard): what is compared with eager."""
    from torch.distributed.tensor import DTensor

    def copy(value: Any) -> Any:
        if isinstance(value, DTensor):
            value = value.to_local()
        return value.detach().clone() if isinstance(value, torch.Tensor) else value

    return tree_map(copy, tree)


def tp_inference(workload: str, mode: str, *, device: torch.device, iters: int) -> dict:
    world_size = dist.get_world_size()
    mesh = None
    if world_size > 1:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(device.type, (world_size,))
    model, args, kwargs = tp_builder(workload)(mesh=mesh, device=device)
    with torch.no_grad():
        reference = _local(model(*args, **kwargs))
        prepared = modes.inference(mode, model, args, kwargs)
        # a sharded forward may return before its last all-reduce has landed: a call ends when its output is usable
        measured, output = _timed(lambda: wait_outputs(prepared.call()), device=device, iters=iters, checkpoint=_local)
    measured["graphs"] = prepared.details() if prepared.details is not None else None
    measured["correctness"] = None if mode == "eager" else compare_outputs(reference, output)
    return measured


def _ddp(model: torch.nn.Module, device: torch.device) -> DistributedDataParallel:
    """DDP built on ``launchless.capture_stream()``, the side stream graphed steps capture on, as PyTorch's notes on
    CUDA graphs with DDP ask (for every mode alike)."""
    if device.type != "cuda":
        return DistributedDataParallel(model)
    stream = capture_stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        ddp = DistributedDataParallel(model, device_ids=[device.index])
    torch.cuda.current_stream(device).wait_stream(stream)
    return ddp


def ddp_setup(workload: str, device: torch.device) -> TrainingSetup:
    """The same start on every call: seeded model and batch, DDP, SGD with momentum."""
    model, batch = ddp_builder(workload)(device=device, batch=BATCH_PER_RANK, seed=dist.get_rank())
    ddp = _ddp(model.train(), device)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    return TrainingSetup(ddp, optimizer, batch, classify_loss)


def _parameters(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def ddp_training(workload: str, mode: str, *, device: torch.device, iters: int) -> dict:
    setup = ddp_setup(workload, device)
    graphed = None
    if mode == "eager":
        step = train_step(setup, setup.model)
    elif mode == "reduce-overhead":
        step = train_step(setup, modes.compiled_model(setup.model, mode), mark=True)
    elif mode == "launchless":
        import launchless

        step = graphed = launchless.graphed_step(
            train_step(setup, setup.model), model=setup.model, optimizer=setup.optimizer
        )
    else:
        raise ValueError(f"mode {mode!r} does not train; DDP modes: {', '.join(DDP_MODES)}")
    measured, parameters = _timed(
        lambda: step(*setup.batch), device=device, iters=iters, checkpoint=lambda _: _parameters(setup.model)
    )
    if graphed is not None:
        info = graphed.graph_info()
        measured["graphs"] = {"level": info["level"], "eager_reason": info["eager_reason"]}
    if mode != "eager":
        measured["correctness"] = compare_outputs(eager_parameters(workload, device), parameters)
    else:
        measured["correctness"] = None
    return measured


def eager_parameters(workload: str, device: torch.device) -> list[torch.Tensor]:
    """The parameters eager DDP reaches from the same start after as many steps as ``_timed`` checks."""
    setup = ddp_setup(workload, device)
    step = train_step(setup, setup.model)
    for _ in range(1 + WARMUP_CALLS):
        step(*setup.batch)
    return _parameters(setup.model)


def run(mode: str, workloads: list[str], *, iters: int, device: torch.device, out: str) -> None:
    """Each workload in turn on every rank; rank 0 appends its row to ``out`` once every rank is done with it."""
    rank, world_size = dist.get_rank(), dist.get_world_size()

    def measure_one(workload: str) -> dict:
        measure = tp_inference if part_of(workload) == TP_INFERENCE else ddp_training
        return measure(workload, mode, device=device, iters=iters)

    def gather(workload: str, measured: dict) -> None:
        """Every rank's result to rank 0, which writes the row: a rank that failed takes part too, so the others
        carry on."""
        error = measured["reason"] if "status" in measured else None  # a failed row; a measured one has none
        results: list[Any] = [None] * world_size
        dist.all_gather_object(results, (None if error else measured, error))
        if rank == 0:
            append_row(out, gathered_row(workload, mode, world_size, results) | {"wall_s": measured["wall_s"]})

    measure_each(
        workloads,
        measure_one=measure_one,
        failed_row=lambda workload, status, reason: empty_row(workload, mode, world_size, status, reason),
        write=gather,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", required=True, choices=sorted({*TP_MODES, *DDP_MODES}))
    parser.add_argument("--workloads", nargs="+", required=True)
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--device", choices=("cuda", "cpu"), default=device_type())
    parser.add_argument("--out", required=True, help="JSON-lines file rank 0 appends its rows to")
    a = parser.parse_args()
    die_with_launcher()
    device = join_group(a.device)
    try:
        run(a.mode, a.workloads, iters=a.iters, device=device, out=a.out)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
