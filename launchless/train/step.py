"""graphed_step: capture a whole training step -- forward, loss, backward, optimizer -- and replay it.

The user's own step function runs eager (as a real step, on the capture stream, so it doubles as
warm-up) until its batch signature has been seen ``capture_after`` times; then it is captured and,
from then on, replayed. Capturing executes nothing, so the capturing call replays once to apply
its batch: no batch is applied twice or skipped.

Training fails soft, in levels: when the whole step cannot be captured or verified (an optimizer
that needs a host sync, GradScaler's skip-on-inf with a non-fused optimizer), forward+backward is
captured and the optimizer and scaler calls run eager after each replay; when that fails too (a
host sync such as ``loss.item()``, a data-dependent shape), that signature runs eager; distillation
(parameters read outside ``model``) and distributed runs other than ``DistributedDataParallel`` train eager
throughout -- each with one log line naming the reason and the source line. Freezing or unfreezing parameters
captures again.

``DistributedDataParallel``: the backward's gradient all-reduce is recorded in the graph, every rank capturing and
verifying alike (``ddp.DdpSteps``); verification makes the same eager steps on every rank (``core.collectives``).

Gradients: each graph leaves ``.grad`` pointing at the tensors it wrote (a step that starts with
``zero_grad(set_to_none=True)`` gets fresh ones from the pool, as eager does: no zeroing, no extra
accumulation kernels). A graph that reads the gradients it found (a gradient-accumulation micro-step)
gets them copied into the tensors it was captured with when other code replaced them, so a
micro-step and a full step -- two signatures -- accumulate like eager.

Learning-rate schedulers called inside the step are deferred during capture and called after each
replay, so they keep stepping; a scheduled learning rate lives in a device tensor they update in place
(an unscheduled one stays a number until it changes: ``optim.CapturableOptimizer``).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Any, cast

import torch

from ..core.cache import GraphCache
from ..core.collectives import distributed
from ..core.signature import Signature, UnhashableInput, flatten_inputs, signature_of
from ..core.status import Admission
from ..errors import ConfigError
from ..options import KERNELS, KernelsMode, VerifyMode, check_choice, check_instance, check_int, check_verify
from .capture_levels import StepCapture
from .compiled_kernels import StepKernels
from .ddp import DDP_STREAM_REASON, DdpSteps, ddp_refusal
from .optim import CapturableOptimizer, OptimizerNotCapturable
from .step_runs import StepGraph, StepRunner
from .validity import TrainingState

_DDP = torch.nn.parallel.DistributedDataParallel


class GraphedStep:
    """A training step that replays a verified whole-step CUDA graph per batch signature."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scaler: torch.amp.GradScaler | None = None,
        capture_after: int = 3,
        max_graphs: int = 8,
        verify: VerifyMode = "on",
        kernels: KernelsMode = "eager",
    ) -> None:
        _check_arguments(fn, model, optimizer, scaler)
        check_choice("kernels", kernels, KERNELS)
        check_int(
            "capture_after",
            capture_after,
            minimum=2,
            why=": the eager steps before capture create the optimizer state and warm up the capture stream",
        )
        check_int("max_graphs", max_graphs, minimum=1)
        check_verify(verify)
        self.fn, self.model, self.optimizer, self.scaler = fn, model, optimizer, scaler
        self.capture_after, self.max_graphs, self.verify = capture_after, max_graphs, verify
        self._state = TrainingState(model, optimizer, scaler)
        self._cache: GraphCache[StepGraph] = GraphCache(
            name="training step",
            capture_after=capture_after,
            max_graphs=max_graphs,
            max_graphs_hint="graphed_step(max_graphs=...)",
            guards=[self._state],
            on_invalidate=_state_changed_of(weakref.ref(self)),  # weakly: a cycle would keep graphs until collected
        )
        self._checked = False
        self._optim: CapturableOptimizer | None = None
        self.kernels = kernels
        self._kernels: StepKernels | None = (  # Inductor's forward and backward compiled beside the steps
            StepKernels(model) if kernels == "compiled" and not isinstance(model, _DDP) else None
        )
        self._runs = StepRunner(fn, model)  # the steps run eager or replayed; why the whole run trains eager
        self._capture = StepCapture(
            runs=self._runs, cache=self._cache, optimizer=optimizer, scaler=scaler, verify=verify, kernels=self._kernels
        )

    def _graphs_dropped(self, why: str) -> None:
        """The parameters and gradients are read again at the next capture; a compile in flight is cancelled."""
        self._runs.forget_graph_tensors()
        if self._kernels is not None:
            self._kernels.cancel(why)

    def _state_changed(self, why: str) -> None:
        """A validity check dropped the graphs: the optimizer is prepared again for the state now in use (a loaded
        checkpoint brings ``capturable=False``, host step counters, number learning rates), and the parameters
        and gradients are read again at the next capture. A compile in flight is cancelled."""
        self._graphs_dropped(why)
        if self._optim is not None:
            try:
                self._optim = CapturableOptimizer(self.optimizer, self._runs.device())
            except OptimizerNotCapturable as exc:
                self._runs.eager_reason = str(exc)
                self._log_once(f"launchless: training runs eager from now on: {exc}")

    def _capture_again(self, why: str) -> None:
        """Drop every graph (the next calls capture again, after ``capture_after``) with one log line."""
        self._cache.drop_all()
        self._graphs_dropped(why)
        self._log_once(f"launchless: {why}")

    # ---- the call --------------------------------------------------------------------------------
    def __call__(self, *batch: Any, **kwargs: Any) -> Any:
        runs = self._runs
        if not self._checked:  # at the first call: the model may be moved to the GPU after wrapping
            self._checked = True
            runs.eager_reason = self._whole_run_reason()
            if runs.eager_reason is None:  # before the first step, so that every step has the same numerics
                try:
                    self._optim = CapturableOptimizer(self.optimizer, runs.device())
                except OptimizerNotCapturable as exc:
                    runs.eager_reason = str(exc)
            if runs.eager_reason:
                self._log_once(f"launchless: training runs eager: {runs.eager_reason}")
        if runs.eager_reason is not None:
            return self.fn(*batch, **kwargs)
        flat = flatten_inputs(batch, kwargs)
        try:
            sig = signature_of(flat)
        except UnhashableInput as exc:
            self._cache.log_once(f"unhashable:{exc}", logging.WARNING, f"launchless: training step runs eager: {exc}")
            return self.fn(*batch, **kwargs)
        if not self.model.training:  # train/eval changes what the step computes: its own graph
            sig = sig._replace(context=(*sig.context, "eval"))
        cache = self._cache
        # the training state is checked on every call, not only before a replay: a checkpoint resumed and then a new
        # batch shape must drop the old graphs (and prepare the optimizer again) before anything is captured
        cache.validate(flat.leaves)
        entry = cache.get(sig)
        if runs.eager_reason is not None:  # the optimizer prepared again could not be captured
            return self.fn(*batch, **kwargs)
        if self._optim is not None and self._optim.float_lr_changed():
            if cache.graphs:  # they froze the old number
                self._optim.move_lr_to_device()
                entry = None
                self._capture_again(
                    "the learning rate changed; it now lives on the GPU (a tensor updated in place, so later "
                    "changes reach the graph) and the training step is captured again"
                )
            else:
                self._optim.remember_lr()
        if entry is not None:
            changed = self._optim.sync() if self._optim else None
            if changed is None:
                kernels = self._kernels
                if kernels is not None and kernels.pending and kernels.ready(sig):  # between two steps
                    applied, out = self._capture.swap_kernels(kernels, sig, flat, entry)
                    if applied:
                        return out
                return runs.replay(entry, flat)
            cache.drop_all()
            runs.eager_reason = changed
            self._log_once(f"launchless: training runs eager from now on: {changed}")
            return runs.eager(flat)
        if cache.admit(sig) is not Admission.CAPTURE or not self._accumulator_streams_agreed():
            return runs.eager(flat)
        return self._capture.capture(sig, flat)

    def _whole_run_reason(self) -> str | None:
        ddp = isinstance(self.model, torch.nn.parallel.DistributedDataParallel)
        reason = self._ddp_reason(cast(_DDP, self.model)) if ddp else None
        if reason:
            return reason
        devices = {p.device for p in self.model.parameters()}
        if not devices or any(d.type != "cuda" for d in devices):
            return "the model's parameters are not all on a CUDA device, so there is nothing to capture"
        if distributed() and not ddp:
            return (
                f"distributed training (world size {torch.distributed.get_world_size()}) is captured for models "
                "wrapped in torch.nn.parallel.DistributedDataParallel; other data-parallel schemes (FSDP, collectives "
                "called by hand) train eager"
            )
        return None

    def _ddp_reason(self, ddp: torch.nn.parallel.DistributedDataParallel) -> str | None:
        """Whether a DDP step can be captured (``ddp.ddp_refusal``); when it can, the ranks capture alike after at
        least ``DDP_WARMUP_STEPS`` eager steps."""
        reason = ddp_refusal(ddp)
        if reason:
            return reason
        self._runs.ddp = DdpSteps(ddp)
        self._runs.ddp.capture_after_warmup(self._cache)
        return None

    def _accumulator_streams_agreed(self) -> bool:
        """Before a DDP capture: where any rank's warm-up ran its gradient accumulators on another stream than the
        step's, every rank trains eager from now on, with the fix named."""
        ddp = self._runs.ddp
        if ddp is None or ddp.accumulator_streams_agreed():
            return True
        self._runs.eager_reason = DDP_STREAM_REASON
        self._cache.drop_all()
        self._cache.log_once("ddp-stream", logging.WARNING, f"launchless: training runs eager: {DDP_STREAM_REASON}")
        return False

    def _log_once(self, message: str) -> None:
        self._cache.log_once(message, logging.INFO, message)

    def _row(self, sig: Signature, e: StepGraph) -> dict[str, Any]:
        report = self._cache.reports.get(sig, {})
        return {
            "signature": sig.describe(),
            "level": e.level,
            "whole_step_refused": e.whole_step_refused or None,
            "replays": e.graph.replays,
            "verification": {k: (str(v) if k == "status" else v) for k, v in report.items() if not k.startswith("_")},
        }

    def graph_info(self) -> dict:
        """Which level runs: captured signatures with replays and verification, eager fallbacks and why."""
        cache = self._cache
        fallbacks = cache.fallbacks(lambda sig: sig.describe())
        eager_reason = self._runs.eager_reason
        if eager_reason:
            level = "eager"
        elif not cache.graphs:
            level = "eager (warming up)" if not fallbacks else "eager"
        else:
            level = " + ".join(sorted({e.level for e in cache.graphs.values()}))
        return {
            "level": level,
            "eager_reason": eager_reason,
            **cache.summary(),
            "graphs": cache.rows(self._row),
            "fallbacks": fallbacks,
            "extra_state_tensors": self._capture.extra_state,
            # kernels="compiled": per batch signature, Inductor's program compiling, swapped in, or why eager's stay
            "compiled_kernels": None if self._kernels is None else self._kernels.info(),
        }


def _state_changed_of(step: weakref.ref) -> Callable[[str], None]:
    """The cache's invalidation callback, holding the step weakly: the step, its graphs and the model they hold go
    with the step's last reference, not at the next garbage collection (after the process group is gone, under
    DistributedDataParallel)."""

    def state_changed(why: str) -> None:
        owner = step()
        if owner is not None:
            owner._state_changed(why)

    return state_changed


def _check_arguments(fn: Any, model: Any, optimizer: Any, scaler: Any) -> None:
    """The step, model, optimizer and scaler are what they claim to be -- a swapped pair names the fix."""
    if isinstance(model, torch.optim.Optimizer) and isinstance(optimizer, torch.nn.Module):
        raise ConfigError(
            "graphed_step got the optimizer as model= and the model as optimizer=; pass model=<your nn.Module>, "
            "optimizer=<its torch.optim.Optimizer>"
        )
    if not callable(fn):
        raise ConfigError(f"graphed_step takes the training step function first, got {type(fn).__name__}")
    check_instance("model", model, torch.nn.Module, "pass the module whose parameters the step trains")
    check_instance("optimizer", optimizer, torch.optim.Optimizer, "pass the torch.optim optimizer the step calls")
    if scaler is not None:
        check_instance("scaler", scaler, torch.amp.GradScaler, "pass the torch.amp.GradScaler the step uses, or None")


def graphed_step(
    fn: Callable[..., Any] | None = None,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler | None = None,
    capture_after: int = 3,
    max_graphs: int = 8,
    verify: VerifyMode = "on",
    kernels: KernelsMode = "eager",
) -> GraphedStep | Callable[[Callable[..., Any]], GraphedStep]:
    """Capture the whole training step ``fn(*batch)``; also usable as ``@graphed_step(model=..., optimizer=...)``.

    capture_after=3: steps of one batch signature before it is captured (>= 2: the eager steps create the
        optimizer state); they are real steps.
    max_graphs=8: step graphs kept (one per batch signature and train/eval mode); least recently used evicted.
    verify="on" | "strict" | "off": each graph is proven against an eager step from the same state (bit-identical,
        or within 4x eager's own run-to-run difference where the backward is non-deterministic); "strict" demands
        bit identity; "off" skips the proof (unsafe).
    kernels="eager" | "compiled": the step graphs replay eager's kernels; or (``"compiled"``) they do until
        Inductor's forward and backward of the model, compiled beside the steps in another process, is proven as
        accurate as eager (against float64) and faster, then the step graph over it replays (optimizer and the rest
        of the step as before). Not under DistributedDataParallel.
    """

    def make(f: Callable[..., Any]) -> GraphedStep:
        return GraphedStep(
            f,
            model=model,
            optimizer=optimizer,
            scaler=scaler,
            capture_after=capture_after,
            max_graphs=max_graphs,
            verify=verify,
            kernels=kernels,
        )

    if fn is None:
        return make
    return make(fn)
