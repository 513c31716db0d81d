"""A batch signature's training step captured at the highest level that captures, verifies and the ranks agree on.

The levels, tried in this order: the whole step; forward+backward with the optimizer and scaler calls eager after
each replay; under ``DistributedDataParallel`` also the local backward with DDP's all-reduce eager after it. A level
that fails leaves the training state as before it (a snapshot put back) and names its reason; when every level
fails the signature runs eager, refused with the reason and the source line. A capture that failed inside a DDP
backward leaves DDP's reducer mid-iteration: every rank resets it, and the next level is tried once DDP has rebuilt
its gradient buckets, not in the same call. With ``kernels="compiled"`` a signature's step is captured again, at its
level, over Inductor's program once that is ready, and timed against the graph it would replace.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Any, cast

import torch
from torch.optim.lr_scheduler import LRScheduler

from ..core import capture as _capture
from ..core.cache import GraphCache, Refusal
from ..core.relocation import spread
from ..core.signature import FlatInputs, Signature
from ..core.status import Stage, VerifyStatus
from ..diagnose.blockers import describe_failure
from ..options import VerifyMode
from ..timing import SpeedVerdict, judge_speed
from . import hooks
from .compiled_kernels import ModelCall, StepKernels, recorded_call
from .ddp import DdpSteps
from .snapshot import Snapshot, state_labels, state_tensors
from .step_runs import StepGraph, StepRunner
from .verification import verified_step

_DDP = torch.nn.parallel.DistributedDataParallel

WHOLE_STEP = "whole-step graph"
FORWARD_BACKWARD = "forward+backward graph, eager optimizer"
LOCAL_BACKWARD = "forward+backward graph, eager all-reduce and optimizer"  # DistributedDataParallel only
LEVELS = (WHOLE_STEP, FORWARD_BACKWARD)  # tried in this order
DDP_LEVELS = (*LEVELS, LOCAL_BACKWARD)


class StepCapture:
    """The step graphs of one graphed step: each batch signature's captured at its highest level and proven against
    eager steps, or refused; captured again over compiled kernels once they are ready (``swap_kernels``).

    ``extra_state``: tensors the step writes outside the model and optimizer (an EMA of the weights, say), found
    while capturing; ``extra_detail`` names them and the operations that wrote them."""

    def __init__(
        self,
        *,
        runs: StepRunner,
        cache: GraphCache[StepGraph],
        optimizer: torch.optim.Optimizer,
        scaler: torch.amp.GradScaler | None,
        verify: VerifyMode,
        kernels: StepKernels | None,
    ) -> None:
        self.runs, self.cache, self.optimizer, self.scaler = runs, cache, optimizer, scaler
        self.verify_mode, self.kernels = verify, kernels
        self.extra_state = 0
        self.extra_detail = ""
        self._next_level: dict[Signature, int] = {}  # DDP: the level a signature's next capture starts at
        self._whole_step_refused: dict[Signature, str] = {}  # DDP: why the whole step failed, for that next capture

    def _log_once(self, message: str) -> None:
        self.cache.log_once(message, logging.INFO, message)

    def capture(self, sig: Signature, flat: FlatInputs) -> Any:
        """Capture ``sig``'s step at the highest level that holds; returns the step's output (the capturing step
        applied once, by a replay or by an eager step)."""
        cache, runs = self.cache, self.runs
        with cache.capturing(sig):
            if not runs.params:
                runs.params = [p for p in runs.model.parameters() if p.requires_grad]
            whole_reason = self._whole_step_refused.pop(sig, "")
            levels = DDP_LEVELS if runs.ddp is not None else LEVELS
            start = self._next_level.pop(sig, 0)
            for index, level in enumerate(levels[start:], start):
                entry, outcome = self.try_level(level, flat)
                if entry is not None:
                    out = outcome.pop("_out")
                    cache.keep(sig, entry, outcome, flat.leaves)
                    if self.kernels is not None and entry.model_call is not None and level != LOCAL_BACKWARD:
                        self.kernels.start(sig, entry.model_call)
                    if level != WHOLE_STEP:
                        entry.whole_step_refused = whole_reason
                        self._log_once(
                            f"launchless: training step {sig.describe()} runs {level} "
                            f"(whole step not captured: {whole_reason})"
                        )
                    return out
                whole_reason = whole_reason or outcome["reason"]
                if runs.eager_reason:  # nothing of this run is captured (e.g. distillation)
                    self._log_once(f"launchless: training runs eager: {runs.eager_reason}")
                    return runs.eager(flat)
                if outcome.get("capture_failed") and runs.ddp is not None and runs.ddp.reducer_interrupted():
                    self._reset_reducer()
                    if index + 1 < len(levels):
                        return self._defer_next_level(sig, flat, levels[index + 1], whole_reason, outcome)
        why = (
            outcome["reason"]
            if outcome["reason"] == whole_reason
            else f"{outcome['reason']} (whole step: {whole_reason})"
        )
        stage = Stage.VERIFICATION if outcome["reason"].startswith("verification") else Stage.CAPTURE
        transient = bool(outcome.get("transient"))  # out of GPU memory: tried again later
        message = f"launchless: training step {sig.describe()} runs eager: {why}"
        cache.refuse(
            sig,
            Refusal(stage, why, message + ("; trying again later" if transient else ""), transient=transient),
            level=logging.WARNING if transient else logging.INFO,
        )
        return runs.eager(flat)

    def try_level(self, level: str, flat: FlatInputs) -> tuple[StepGraph | None, dict]:
        """Capture and verify at one level; on failure the state is as before and the reason is returned."""
        runs = self.runs
        model, device = runs.model, runs.device()
        before = Snapshot(state_tensors(model, self.optimizer), device=device, params=runs.params)
        pool = self.cache.pool
        schedulers: list[LRScheduler] = []
        deferred: list[Callable[[], Any]] = []
        scalers: set[torch.amp.GradScaler] = set()
        grads_in = [p.grad for p in runs.params]
        writes = hooks.MutationLog(watch=[g for g in grads_in if g is not None])
        model_call = ModelCall()
        try:
            with contextlib.ExitStack() as patches:
                if self.kernels is not None:
                    patches.enter_context(recorded_call(model, model_call))
                patches.enter_context(hooks.deferred_schedulers(schedulers))
                patches.enter_context(hooks.watch_scalers(scalers))
                if level == WHOLE_STEP:
                    patches.enter_context(hooks.refuse_scaler_sync())
                else:
                    patches.enter_context(hooks.deferred_optimizer(self.optimizer, deferred))
                if level == LOCAL_BACKWARD:  # the gradients stay local in the graph; averaged eager after it
                    patches.enter_context(cast(_DDP, model).no_sync())
                graph = _capture.capture(
                    writes.logging(runs.fn), flat, device=device, pool=pool.handle(), warmup=0, stream=runs.stream
                )
        except _capture.CaptureFailed as fail:
            if fail.stage == Stage.CAPTURE:
                pool.retire()  # a capture that failed midway leaves its pool unusable
            for scaler in scalers:
                hooks.reset_scaler(scaler)
            before.restore()
            failed: dict[str, Any] = {
                "reason": describe_failure(fail.cause, str(fail)),
                "transient": _capture.out_of_memory(fail.cause),
            }
            if runs.ddp is not None:  # the other ranks must not verify (its collectives would wait for this one)
                runs.ddp.agree_failed(failed["reason"], f"capture of the {level}")
                failed["capture_failed"] = True
            return None, failed
        if runs.ddp is not None:
            others = runs.ddp.others_refused(ok=True, reason="", what=f"capture of the {level}")
            if others is not None:
                before.restore()
                del graph
                self.cache.discard()
                return None, {**others, "capture_failed": True}
        foreign = writes.foreign_parameters(model)
        if foreign:  # checked at the first capture: the whole run then trains eager
            before.restore()
            runs.eager_reason = (
                f"the step reads {len(foreign)} parameter tensor(s) outside `model` that it does not train (a "
                "distillation teacher?); distillation runs train eager. If they belong to the trained model, pass "
                "the module that holds them as model="
            )
            del graph
            self.cache.discard()
            return None, {"reason": runs.eager_reason}
        entry = StepGraph(graph, list(dict.fromkeys(schedulers)), level, deferred)
        entry.model_call = model_call if self.kernels is not None else None
        if level == LOCAL_BACKWARD:
            ddp = cast(DdpSteps, runs.ddp)
            entry.before_optimizer = [lambda: ddp.average_gradients(runs.params)]
        entry.grads_in, entry.grads_out = grads_in, [p.grad for p in runs.params]
        entry.reads = [i for i, g in enumerate(grads_in) if g is not None and writes.was_read(g)]
        entry.spot = spread(len(runs.params))
        before.add_schedulers(entry.schedulers)  # not stepped yet: capture only recorded the calls
        scaled = [t for s in {*scalers, *([self.scaler] if self.scaler else [])} for t in hooks.scaler_tensors(s)]
        known = {_key(t) for t in [*before.tensors, *(g for g in grads_in if g is not None)]}
        # written beyond the model, the optimizer, the schedulers, the gradients and the scalers (an EMA of the
        # weights, say): what the replays that time compiled kernels would change, with nothing to put it back
        owned = known | {_key(t) for t in [*scaled, *(g for g in entry.grads_out if g is not None)]}
        extra = [t for t in writes.state() if _key(t) not in owned]
        for t in [
            *writes.state(),
            *scaled,
        ]:  # e.g. an EMA of the weights: saved too, or verification would update it twice
            if _key(t) not in known:
                known.add(_key(t))
                before.add_tensors([t])
        if len(extra) > self.extra_state:
            self.extra_state, self.extra_detail = len(extra), writes.describe(extra)
        if self.verify_mode != "off":
            try:
                report, out = self.verify(entry, flat, before, writers=writes.writers)
            except torch.cuda.OutOfMemoryError as exc:
                before.restore()
                del entry, graph
                self.cache.discard()
                return None, {"reason": describe_failure(exc, str(exc)), "transient": True}
        else:
            report, out = {"status": VerifyStatus.SKIPPED, "passed": True}, runs.replay(entry, flat)
        if runs.ddp is not None:
            others = runs.ddp.others_refused(
                ok=report["passed"], reason=report.get("detail", ""), what=f"verification of the {level}"
            )
            if others is not None and report["passed"]:  # the step it applied is taken back, as the others do
                before.restore()
                del entry, graph
                self.cache.discard()
                return None, others
        if not report["passed"]:
            before.restore()
            del entry, graph
            self.cache.discard()
            return None, {"reason": f"verification failed ({report['detail']})"}
        return entry, {**report, "_out": out}

    def verify(
        self, entry: StepGraph, flat: FlatInputs, before: Snapshot, *, writers: Mapping[int, str] | None = None
    ) -> tuple[dict, Any]:
        """The graph step against eager steps from the same state on the same batch (``verification``);
        ``writers``: the operation that wrote each tensor the capture saw written, by ``id``, to name it."""
        runs = self.runs
        return verified_step(
            lambda: runs.eager(flat),
            lambda: runs.replay(entry, flat),
            before,
            mode=self.verify_mode,
            lockstep=runs.ddp is not None,
            labels=state_labels(runs.model, self.optimizer, before, writers=writers),
        )

    def swap_kernels(
        self, kernels: StepKernels, sig: Signature, flat: FlatInputs, entry: StepGraph
    ) -> tuple[bool, Any]:
        """``sig``'s compiled program, ready: proven, captured into a step graph that applies this step's batch,
        timed against ``entry`` (the training state put back after) and kept if faster (``StepKernels.decide``).
        Returns whether this step was applied, and its output."""
        cache, runs = self.cache, self.runs
        if self.extra_state:  # an EMA of the weights, say: the timing replays would change it, and no snapshot knows it
            kernels.refuse(
                sig,
                "the step writes state outside the model and optimizer, which the replays that time the compiled "
                f"kernels would change ({self.extra_detail})",
            )
            return False, None

        def capture() -> tuple[StepGraph | None, dict]:
            with cache.capturing(sig):
                return self.try_level(entry.level, flat)

        def time_both(new: StepGraph) -> SpeedVerdict:
            scaler = hooks.scaler_tensors(self.scaler) if self.scaler is not None else []
            state = Snapshot(
                [*state_tensors(runs.model, self.optimizer), *scaler], device=runs.device(), params=runs.params
            )
            try:  # raw replays: no scheduler steps, no deferred calls; the state they trained goes back after
                return judge_speed(
                    lambda: entry.graph.replay_cloned(flat.leaves), lambda: new.graph.replay_cloned(flat.leaves)
                )
            finally:
                state.restore()
                entry.graph.replays = new.graph.replays = 0

        def keep(new: StepGraph, outcome: dict) -> None:
            cache.keep(sig, new, outcome, flat.leaves)

        def drop(new: StepGraph) -> None:
            runs.grads_owner = None  # .grad points at the dropped graph's tensors until the next replay
            cache.discard()

        return kernels.decide(sig, capture=capture, time_both=time_both, keep=keep, drop=drop)

    def _reset_reducer(self) -> None:
        """DDP's reducer reset on every rank (``DdpSteps.reset_reducer``): the buckets every graph captured so far
        reads are rebuilt, so those graphs go too."""
        cast(DdpSteps, self.runs.ddp).reset_reducer()
        self.cache.drop_all()
        self.runs.forget_graph_tensors()

    def _defer_next_level(
        self, sig: Signature, flat: FlatInputs, next_level: str, whole_reason: str, outcome: dict
    ) -> Any:
        """The next level is tried once DDP's bucket rebuild is behind (after the wait of a passing refusal), not in
        this call: a graph captured before it would read buckets the rebuild frees."""
        self._next_level[sig] = DDP_LEVELS.index(next_level)
        self._whole_step_refused[sig] = whole_reason
        why = f"{outcome['reason']}; the {next_level} is tried after DDP has rebuilt its gradient buckets"
        self.cache.refuse(
            sig,
            Refusal(
                Stage.CAPTURE,
                why,
                f"launchless: training step {sig.describe()} runs eager for now: {why}",
                transient=True,
            ),
        )
        return self.runs.eager(flat)


def _key(t: torch.Tensor) -> tuple:
    return (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype)
