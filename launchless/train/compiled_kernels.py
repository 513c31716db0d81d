"""Compiled kernels for a training step: Inductor's forward and backward of the model, compiled beside the steps and
swapped into the whole-step graph once proven.

With ``graphed_step(..., kernels="compiled")`` the steps capture and replay eager-kernel graphs exactly as without
it. When a batch signature's step graph is kept, the model's forward as the step calls it -- recorded while
capturing -- starts compiling in a child process as a training program (``core.compiled_programs``: Inductor's
forward and backward, differentiated by autograd, the batch norm statistics updated in the model's own buffers).
At the first step of that signature after the program is ready, between two steps:

- the program must be as accurate as eager: its outputs and the parameters' gradients against the same forward and
  backward run in float64 (``core.accuracy``), on the batch the step last saw;
- the step is captured again with the model's forward replaced by the program, and that graph is proven against an
  eager step that calls the program (``verification``, bit for bit as every step graph): the optimizer, the loss and
  everything else of the step are as they were;
- it must be faster than the eager-kernel step graph (interleaved replays, the training state put back after).

Then it replaces that graph, with one log line; otherwise the eager-kernel graph stays and ``graph_info()`` says why.
A program whose forward draws random numbers (dropout in training) is not used: Inductor draws them otherwise than
eager, so nothing can prove it. A step that calls the model more than once, or under autocast, keeps eager's
kernels (the program is one call of the model, in its own precision), as does one that writes state outside the
model and optimizer (an EMA: the replays that time the program would change it). Whatever drops the step graphs (a
checkpoint resumed, parameters moved) cancels a compile in flight.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils import _pytree as pytree

from ..core.accuracy import (
    AccuracyReport,
    allowed_float32_precision,
    as_accurate_as_eager,
    channels_last_copy,
    float64_copy,
    widened,
)
from ..core.compiled_programs import CompiledProgram, JobState, SpareCompiler, compile_in_background
from ..core.kernel_swaps import KernelDecision, KernelState
from ..core.signature import Signature
from ..errors import one_line
from ..timing import SpeedVerdict

log = logging.getLogger("launchless")


@dataclasses.dataclass
class ModelCall:
    """How the step called the model while it was captured: its arguments (the capture's own tensors: the batch
    the step last saw, read between steps), how often, and whether autocast was on."""

    args: tuple = ()
    kwargs: dict = dataclasses.field(default_factory=dict)
    calls: int = 0
    autocast: bool = False

    def refusal(self) -> str | None:
        """Why the program cannot stand for the model's forward in this step (None: it can)."""
        if self.calls != 1:
            return f"the step calls the model {self.calls} times; a compiled program stands for one call"
        if self.autocast:
            return "the step calls the model under autocast; the compiled program computes in its own precision"
        return None


@contextlib.contextmanager
def recorded_call(model: torch.nn.Module, call: ModelCall) -> Iterator[None]:
    """Record the model's calls inside the block (a forward pre-hook, removed after)."""

    def record(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        call.calls += 1
        if call.calls == 1:
            call.args, call.kwargs = args, dict(kwargs)
            call.autocast = any(torch.is_autocast_enabled(device) for device in ("cuda", "cpu"))

    handle = model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


@contextlib.contextmanager
def forward_replaced(model: torch.nn.Module, program: CompiledProgram) -> Iterator[None]:
    """The model's forward is the compiled program inside the block (its hooks still run around it)."""
    model.forward = program
    try:
        yield
    finally:
        del model.forward


@dataclasses.dataclass
class _Entry(KernelDecision):
    call: ModelCall = dataclasses.field(default_factory=ModelCall)  # the model's call the program stands for


class StepKernels:
    """The compiled training programs of one graphed step, per batch signature: started when its step graph is
    kept, proven and swapped in at a step once ready. ``pending`` counts the undecided ones: while it is 0 the
    steps' path reads nothing else of this."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self._entries: dict[Signature, _Entry] = {}
        self.pending = 0
        self._swapping = threading.Lock()
        self._spare: SpareCompiler | None = SpareCompiler(model)  # loads while the steps warm up

    def start(self, sig: Signature, call: ModelCall) -> None:
        """Compile the model's training program for ``sig``'s step, as ``call`` called it (a program on disk is
        ready at once). A signature decided before is left as decided."""
        if sig in self._entries:
            return
        why = call.refusal()
        if why is not None:
            self._entries[sig] = _Entry(None, time.perf_counter(), KernelState.KEPT_EAGER, why, call=call)
            return
        job = compile_in_background(
            self.model,
            call.args,
            call.kwargs,
            signature=f"{sig.describe()} {_call_signature(call)}",
            training=True,
            spare=self._spare,
        )
        self._spare = None
        self._entries[sig] = _Entry(job, started=time.perf_counter(), call=call)
        self.pending += 1

    def ready(self, sig: Signature) -> bool:
        """Whether ``sig``'s program has finished compiling and is not decided yet: a flag read, per step."""
        entry = self._entries.get(sig)
        return entry is not None and entry.state is KernelState.COMPILING and entry.job is not None and entry.job.done

    def decide(
        self,
        sig: Signature,
        *,
        capture: Callable[[], tuple[Any | None, dict]],
        time_both: Callable[[Any], SpeedVerdict],
        keep: Callable[[Any, dict], None],
        drop: Callable[[Any], None],
    ) -> tuple[bool, Any]:
        """Prove ``sig``'s program and swap it in. ``capture()`` captures the step with the model's forward replaced
        (it applies this step's batch, as a capturing step does) and returns the graph entry (None where it failed,
        the step not applied) and the outcome (its ``reason`` where it failed);
        ``time_both(new)`` times it against the eager-kernel graph, the training state put back after; ``keep`` and
        ``drop`` keep or free the new graph. Returns (whether this step was applied, its output)."""
        entry = self._entries[sig]
        job = entry.job
        if job is None or not self._swapping.acquire(blocking=False):
            return False, None
        try:
            self.pending -= 1
            if job.state is not JobState.READY:
                self._keep_eager(entry, f"the compile {job.state}: {job.reason}")
                return False, None
            try:
                with entry.timed("read"):
                    program = job.load(self.model)
                with entry.timed("accuracy"):
                    why = self._unusable(entry, program)
            except Exception as exc:  # loading or proving failed: the steps never see it
                self._keep_eager(entry, one_line(exc))
                return False, None
            if why is not None:
                self._keep_eager(entry, why)
                return False, None
            with entry.timed("capture"), forward_replaced(self.model, program):
                new, outcome = capture()
            if new is None:
                self._keep_eager(entry, f"the step over the compiled program: {outcome.get('reason', 'not captured')}")
                return False, None
            out = outcome.pop("_out")
            with entry.timed("speed"):
                entry.speed = time_both(new)
            if not entry.speed.faster:
                drop(new)
                self._keep_eager(
                    entry, f"the compiled kernels' step is {entry.speed.detail.replace('eager', 'eager kernels')}"
                )
                return True, out
            keep(new, outcome)
            entry.state, entry.swap_s = KernelState.SWAPPED, time.perf_counter() - entry.started
            log.info(
                "launchless: training step %s replays Inductor's compiled forward and backward from now on (%.3f ms "
                "against %.3f ms a step with eager's kernels; compiled in %.1f s beside the steps; as accurate as "
                "eager against float64)",
                sig.describe(),
                entry.speed.candidate_ms,
                entry.speed.eager_ms,
                job.seconds,
            )
            return True, out
        finally:
            self._swapping.release()

    def refuse(self, sig: Signature, why: str) -> None:
        """``sig``'s program is not tried: the step keeps eager's kernels, saying why."""
        entry = self._entries[sig]
        if entry.state is KernelState.COMPILING:
            self.pending -= 1
            if entry.job is not None:
                entry.job.cancel(why)  # its compile, if still running, is not wanted
        self._keep_eager(entry, why)

    def _unusable(self, entry: _Entry, program: CompiledProgram) -> str | None:
        """Why ``program`` may not stand for the model's forward in the step (None: it may)."""
        if not program.training:
            return "the program on disk is an inference program"
        if program.random_operations:
            return (
                f"the forward draws random numbers in training ({', '.join(program.random_operations)}), which "
                "Inductor's kernels draw otherwise than eager's: nothing can prove the program equal"
            )
        entry.accuracy = training_accuracy(self.model, program, entry.call)
        if not entry.accuracy.passed:
            return f"the compiled program is not as accurate as eager: {entry.accuracy.detail}"
        return None

    def _keep_eager(self, entry: _Entry, why: str) -> None:
        entry.state, entry.reason = KernelState.KEPT_EAGER, why
        log.info("launchless: the training step keeps eager's kernels: %s", why)

    def cancel(self, why: str) -> None:
        """The step graphs were dropped: every compile in flight is ended; the next captures start again."""
        for entry in self._entries.values():
            if entry.state is KernelState.COMPILING and entry.job is not None:
                entry.job.cancel(why)
        self._entries.clear()
        self.pending = 0

    def info(self) -> list[dict[str, Any]]:
        return [entry.row(sig.describe()) for sig, entry in self._entries.items()]


def training_accuracy(model: torch.nn.Module, program: CompiledProgram, call: ModelCall) -> AccuracyReport:
    """The program's outputs and parameter gradients against eager's, both against the same forward and backward in
    float64, on the call's inputs and one cotangent, and the running statistics each forward left (eager also laid
    out channels-last where its convolutions may use TF32: ``core.accuracy``). The model's
    buffers are put back after each run and no ``.grad`` is touched (gradients taken with
    ``torch.autograd.grad``)."""
    buffers = [b for b in model.buffers()]
    saved = [b.detach().clone() for b in buffers]

    def put_back() -> None:
        with torch.no_grad():
            for b, s in zip(buffers, saved, strict=True):
                b.copy_(s)

    def run(forward: Callable[..., Any], owner: torch.nn.Module, args: tuple, kwargs: dict) -> Any:
        weights = [p for p in owner.parameters() if p.requires_grad]
        with torch.enable_grad():
            out = forward(*args, **kwargs)
            leaves = [x for x in pytree.tree_leaves(out) if isinstance(x, torch.Tensor) and x.requires_grad]
            cotangents = [_cotangent(x, i) for i, x in enumerate(leaves)]
            grads = torch.autograd.grad(leaves, weights, cotangents, allow_unused=True) if leaves else ()
        statistics = [b.detach().clone() for b in owner.buffers()]  # as the forward left them
        put_back()
        return pytree.tree_map_only(torch.Tensor, torch.Tensor.detach, (out, list(grads), statistics))

    eager = run(model, model, call.args, call.kwargs)
    compiled = run(program, model, call.args, call.kwargs)
    laid_out = channels_last_copy(model)  # eager's other layout, where its convolutions may round otherwise
    other_layout = run(laid_out, laid_out, call.args, call.kwargs) if laid_out is not None else None
    del laid_out
    wide = float64_copy(model)
    reference = run(wide, wide, *widened((call.args, call.kwargs)))
    return as_accurate_as_eager(
        eager,
        compiled,
        reference,
        float32_precision=allowed_float32_precision(model),
        eager_other_layout=other_layout,
    )


def _cotangent(output: torch.Tensor, index: int) -> torch.Tensor:
    """A fixed pseudo-random cotangent for one output (the same for eager, the program and float64)."""
    generator = torch.Generator(device="cpu").manual_seed(1234 + index)
    values = torch.randn(output.shape, generator=generator, dtype=torch.float64)
    return values.to(device=output.device, dtype=output.dtype)


def _call_signature(call: ModelCall) -> str:
    """The model call's own input signature (the step's batch signature does not fix it: a step may crop or cast)."""
    leaves = pytree.tree_leaves((call.args, call.kwargs))
    return (
        "("
        + ", ".join(
            f"{str(x.dtype).removeprefix('torch.')}{list(x.shape)}@{x.device}"
            if isinstance(x, torch.Tensor)
            else repr(x)
            for x in leaves
        )
        + ")"
    )


__all__ = ["ModelCall", "StepKernels", "forward_replaced", "recorded_call", "training_accuracy"]
