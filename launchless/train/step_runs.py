"""How one training step runs: eager on the capture stream, or a step graph replayed.

An eager step is a real step on the capture stream (``launchless.capture_stream()``, under which DDP is built): before
a capture it is also the warm-up, so no step is spent on warming up alone. A replay leaves ``.grad`` pointing at the
gradient tensors its graph wrote, as an eager step leaves its own; a graph that reads the gradients it found (a
gradient-accumulation micro-step) gets them copied into the tensors it was captured with when other code replaced
them, so a micro-step and a full step -- two graphs -- accumulate like eager. After the replay come the calls the
graph could not hold: the eager all-reduce and optimizer of a lower level, the learning-rate schedulers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, cast

import torch
from torch.optim.lr_scheduler import LRScheduler

from ..core import capture as _capture
from ..core.signature import FlatInputs
from ..core.streams import side_stream
from .compiled_kernels import ModelCall
from .ddp import DdpSteps


class StepGraph:
    """One batch signature's captured step: its graph, its capture level and what runs eager after each replay."""

    def __init__(
        self,
        graph: _capture.CapturedGraph,
        schedulers: list[LRScheduler],
        level: str,
        deferred: list[Callable[[], Any]],
    ) -> None:
        self.graph, self.schedulers, self.level, self.deferred = graph, schedulers, level, deferred
        self.grads_in: list[torch.Tensor | None] = []  # .grad when captured: what the graph reads and writes
        self.grads_out: list[torch.Tensor | None] = []  # .grad after the step: what a replay leaves behind
        self.reads: list[int] = []  # parameters whose incoming gradient the graph reads (accumulation)
        self.spot: list[int] = []  # parameters checked to tell whether .grad was changed since the last replay
        self.whole_step_refused = ""  # why the whole step was not captured, when this graph is a lower level
        self.before_optimizer: list[Callable[[], Any]] = []  # eager work between the replay and the deferred calls
        self.model_call: ModelCall | None = None  # how the step called the model (kernels="compiled")


class StepRunner:
    """The user's step function run eager or replayed, and the gradient tensors each run leaves behind.

    ``eager_reason``: why the whole run trains eager (None while it captures); ``ddp``: a DistributedDataParallel
    model's ranks, whose warm-up steps are watched for gradient accumulators on another stream."""

    def __init__(self, fn: Callable[..., Any], model: torch.nn.Module) -> None:
        self.fn, self.model = fn, model
        self.eager_reason: str | None = None
        self.ddp: DdpSteps | None = None
        self.stream: torch.cuda.Stream | None = None
        self.params: list[torch.Tensor] = []  # the trained parameters, read again at the capture after a change
        self.grads_owner: StepGraph | None = None  # the graph whose gradient tensors .grad points at

    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def forget_graph_tensors(self) -> None:
        """The graphs were dropped: the parameters and gradients are read again at the next capture."""
        self.params = []
        self.grads_owner = None

    def eager(self, flat: FlatInputs) -> Any:
        """A real step on the capture stream: before capture it is also the warm-up."""
        device = self.device()
        if self.stream is None:
            self.stream = side_stream(device)  # launchless.capture_stream(): DDP is built under it
        caller = torch.cuda.current_stream(device)
        self.stream.wait_stream(caller)
        args, kwargs = flat.rebuild(flat.leaves)
        self.grads_owner = None  # an eager step leaves its own gradients
        try:
            with torch.cuda.stream(self.stream), self.watching_accumulator_streams():
                return self.fn(*args, **kwargs)
        finally:  # also when the step raises: the caller's next tensors may take memory its kernels still write
            caller.wait_stream(self.stream)

    def watching_accumulator_streams(self) -> contextlib.AbstractContextManager[None]:
        """Under DDP, until the run trains eager: PyTorch's warning about the gradient accumulators' stream noted."""
        if self.ddp is None or self.eager_reason is not None:
            return contextlib.nullcontext()
        return self.ddp.watching_accumulator_streams()

    def _grads_are(self, grads: list[torch.Tensor | None], entry: StepGraph) -> bool:
        """Cheap check that ``.grad`` still points at ``grads`` (as after the last replay of ``entry``)."""
        if self.grads_owner is not entry:
            return False
        return all(self.params[i].grad is grads[i] for i in entry.spot)

    def replay(self, entry: StepGraph, flat: FlatInputs) -> Any:
        if entry.reads and not self._grads_are(entry.grads_in, entry):
            with torch.no_grad():
                for i in entry.reads:  # the graph accumulates into the tensors it was captured with
                    p, g = self.params[i], cast(torch.Tensor, entry.grads_in[i])  # read: captured with a .grad
                    if p.grad is not g:
                        g.zero_() if p.grad is None else g.copy_(p.grad)
                        p.grad = g
        out = entry.graph.replay_cloned(flat.leaves)
        if not self._grads_are(entry.grads_out, entry):
            for p, grad in zip(self.params, entry.grads_out, strict=True):
                p.grad = grad
            self.grads_owner = entry
        for call in entry.before_optimizer:
            call()
        for call in entry.deferred:
            call()
        for scheduler in entry.schedulers:
            scheduler.step()
        return out
