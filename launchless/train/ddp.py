"""How a ``DistributedDataParallel`` training step is captured: what ``graphed_step`` adds for it.

The backward's gradient all-reduce is recorded in the graph (NCCL 2.9.6 or later, no ``find_unused_parameters``;
otherwise the run trains eager with the fix named), after at least ``DDP_WARMUP_STEPS`` eager steps. The steps run on
``launchless.capture_stream()``, under which DDP must have been constructed: a DDP built on another stream makes
PyTorch warn during the warm-up that its gradient accumulators' stream differs, and the run trains eager with one
WARNING naming the fix. Every rank captures and verifies alike: the ranks agree after each capture and each
verification (when one rank refuses a level, all go to the next); a capture that failed inside the backward leaves
DDP's reducer mid-iteration, which every rank resets, and the next level is tried once DDP has rebuilt its gradient
buckets. The lowest level replays the local backward and averages the gradients eager after it.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from ..core.cache import GraphCache
from ..core.collectives import agree

DDP_WARMUP_STEPS = 11  # DDP's reducer collects runtime statistics (host syncs) in its first 10 iterations
MIN_NCCL = (2, 9, 6)  # the first NCCL whose collectives a CUDA graph may record
# PyTorch's warning when a backward meets gradient accumulators made on another stream (DDP makes its own when it is
# constructed, and keeps them)
ACCUMULATOR_STREAM_WARNING = "AccumulateGrad node's stream does not match"
DDP_STREAM_REASON = (
    "DistributedDataParallel was constructed on another CUDA stream than the one launchless trains and captures on, "
    "so every backward synchronises its gradient accumulators across the two streams, which PyTorch warns can break "
    "a captured backward: construct it under `with torch.cuda.stream(launchless.capture_stream()):`"
)


def ddp_refusal(ddp: torch.nn.parallel.DistributedDataParallel) -> str | None:
    """Why a DDP step cannot be captured whole (PyTorch's conditions for a backward with its all-reduce in a graph),
    with the fix; None when it can."""
    backend = str(torch.distributed.get_backend(ddp.process_group)).lower()
    if backend != "nccl":
        return f"DistributedDataParallel over {backend} cannot be captured: use the NCCL backend"
    nccl = tuple(torch.cuda.nccl.version())
    if nccl < MIN_NCCL:
        return (
            f"NCCL {'.'.join(map(str, nccl))} cannot record collectives in a CUDA graph (2.9.6 or later can): "
            "update NCCL"
        )
    if getattr(ddp, "find_unused_parameters", False):
        return (
            "DistributedDataParallel(find_unused_parameters=True) reads on the host which parameters were used "
            "after every backward, which a graph cannot replay: construct it with find_unused_parameters=False "
            "(or static_graph=True when the same parameters are unused every step)"
        )
    return None


def split_accumulator_stream_warnings(
    caught: list[warnings.WarningMessage],
) -> tuple[bool, list[warnings.WarningMessage]]:
    """(whether PyTorch warned that gradient accumulators live on another stream, the other warnings)."""
    mismatched = [w for w in caught if ACCUMULATOR_STREAM_WARNING in str(w.message)]
    return bool(mismatched), [w for w in caught if not any(w is m for m in mismatched)]


class DdpSteps:
    """The ranks of one DDP model's steps: their agreement, the gradient accumulators' stream, DDP's reducer and the
    eager all-reduce of the lowest level."""

    def __init__(self, ddp: torch.nn.parallel.DistributedDataParallel) -> None:
        self.ddp = ddp
        self.groups: list[Any] = [ddp.process_group]  # the ranks that capture and verify alike
        self.accumulators_elsewhere = False  # a warm-up step's gradient accumulators waited on another stream

    def capture_after_warmup(self, cache: GraphCache[Any]) -> None:
        """The ranks capture a batch signature after at least ``DDP_WARMUP_STEPS`` eager steps of it (the reducer's
        runtime statistics are behind): ``cache.capture_after`` raised where it is lower, with one log line."""
        if cache.capture_after <= DDP_WARMUP_STEPS:  # the capture is the call after the eager steps
            cache.capture_after = DDP_WARMUP_STEPS + 1
            message = (
                f"launchless: DistributedDataParallel steps are captured after {DDP_WARMUP_STEPS} eager steps of a "
                "batch signature (its reducer logs runtime statistics, syncing with the host, in its first 10)"
            )
            cache.log_once(message, logging.INFO, message)

    @contextlib.contextmanager
    def watching_accumulator_streams(self) -> Iterator[None]:
        """Notes PyTorch's warning that the gradient accumulators DDP made live on another stream than the step's (the
        ranks agree on it before the capture); every other warning is shown as it would have been, also when the step
        raises. The warning is let through a user's filter and PyTorch's switch for it here, but PyTorch gives it
        once per process: one given before graphed_step's first steps is not seen again, and verification against
        eager DDP is then what stands between a mismatch and a graph."""
        caught: list[warnings.WarningMessage] = []
        switch = getattr(torch._C, "_warn_on_accumulate_grad_stream_mismatch", None)
        was_on = switch() if switch is not None else None
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.filterwarnings("always", message=f"The {ACCUMULATOR_STREAM_WARNING}")
                if was_on is False:
                    torch.autograd.graph.set_warn_on_accumulate_grad_stream_mismatch(True)
                yield
        finally:
            if was_on is False:
                torch.autograd.graph.set_warn_on_accumulate_grad_stream_mismatch(False)
            mismatched, others = split_accumulator_stream_warnings(caught)
            for w in others:
                warnings.showwarning(w.message, w.category, w.filename, w.lineno, w.file, w.line)
            self.accumulators_elsewhere = self.accumulators_elsewhere or mismatched

    def accumulator_streams_agreed(self) -> bool:
        """Before a capture: whether every rank's warm-up ran its gradient accumulators on the step's stream."""
        return agree(
            self.groups, ok=not self.accumulators_elsewhere, reason=DDP_STREAM_REASON, what="gradient accumulators"
        ).all_agree

    def reducer_interrupted(self) -> bool:
        """Whether a failed capture stopped DDP's reducer mid-iteration on some rank (a failure inside the backward;
        one after it, at the optimizer, leaves it finished). Every rank gets the same answer."""
        reducer = getattr(self.ddp, "reducer", None)
        try:
            if reducer is not None:
                reducer._check_reducer_finalized()
            finished = True
        except RuntimeError:
            finished = False
        return not agree(self.groups, ok=finished, reason="", what="reducer check").all_agree

    def reset_reducer(self) -> None:
        """A step whose capture failed inside the backward (on any rank: all agreed) left DDP's reducer mid-iteration,
        and its next forward would raise "Expected to have finished reduction in the prior iteration". Every rank
        resets it -- which makes DDP rebuild its gradient buckets within the next two eager steps, all ranks
        together, freeing the buckets every graph captured so far reads: the caller drops those graphs."""
        reducer = getattr(self.ddp, "reducer", None)
        if reducer is not None and hasattr(reducer, "_reset_state"):
            reducer._reset_state()

    def average_gradients(self, params: list[torch.Tensor]) -> None:
        """DDP's all-reduce, eager after a replay of the local backward: every gradient divided by the world size,
        then summed over the ranks (what DDP's default communication hook does), in one flat buffer. A step whose DDP
        reduces otherwise (another hook, clipping before the optimizer) differs from eager DDP and fails
        verification."""
        grads = [p.grad for p in params if p.grad is not None]
        if not grads:
            return
        group = self.ddp.process_group
        flat = torch._utils._flatten_dense_tensors(grads)
        flat.div_(torch.distributed.get_world_size(group))
        torch.distributed.all_reduce(flat, group=group)
        for grad, reduced in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads), strict=True):
            grad.copy_(reduced)

    def agree_failed(self, reason: str, what: str) -> None:
        """This rank's ``what`` failed: the others are told (they must not verify: its collectives would wait)."""
        agree(self.groups, ok=False, reason=reason, what=what)

    def others_refused(self, *, ok: bool, reason: str, what: str) -> dict | None:
        """The ranks agree on this rank's ``what``; the outcome to return when another rank refused (every rank then
        tries the next level, or trains eager)."""
        agreement = agree(self.groups, ok=ok, reason=reason, what=what)
        me = torch.distributed.get_rank()
        others = {rank: why for rank, why in agreement.refusals.items() if rank != me}
        if not others:
            return None
        said = "; ".join(f"rank {rank}: {why}" for rank, why in sorted(others.items()))
        return {"reason": f"another rank's {what} failed ({said})", "transient": agreement.transient}
