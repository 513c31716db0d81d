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

import contextlib
import logging
import weakref
from collections.abc import Callable, Mapping
from typing import Any, cast

import torch
from torch.optim.lr_scheduler import LRScheduler

from ..core import capture as _capture
from ..core.cache import GraphCache, Refusal
from ..core.collectives import distributed
from ..core.relocation import spread
from ..core.signature import FlatInputs, Signature, UnhashableInput, flatten_inputs, signature_of
from ..core.status import Admission, Stage, VerifyStatus
from ..core.streams import side_stream
from ..diagnose.blockers import describe_failure
from ..errors import ConfigError
from ..options import KERNELS, KernelsMode, VerifyMode, check_choice, check_instance, check_int, check_verify
from ..timing import SpeedVerdict, judge_speed
from . import hooks
from .compiled_kernels import ModelCall, StepKernels, recorded_call
from .ddp import DDP_STREAM_REASON, DDP_WARMUP_STEPS, DdpSteps, ddp_refusal
from .optim import CapturableOptimizer, OptimizerNotCapturable
from .snapshot import Snapshot, state_labels, state_tensors
from .validity import TrainingState
from .verification import verified_step

log = logging.getLogger("launchless")


_DDP = torch.nn.parallel.DistributedDataParallel

WHOLE_STEP = "whole-step graph"
FORWARD_BACKWARD = "forward+backward graph, eager optimizer"
LOCAL_BACKWARD = "forward+backward graph, eager all-reduce and optimizer"  # DistributedDataParallel only
LEVELS = (WHOLE_STEP, FORWARD_BACKWARD)  # tried in this order
DDP_LEVELS = (*LEVELS, LOCAL_BACKWARD)


class _Graph:
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
        self._cache: GraphCache[_Graph] = GraphCache(
            name="training step",
            capture_after=capture_after,
            max_graphs=max_graphs,
            max_graphs_hint="graphed_step(max_graphs=...)",
            guards=[self._state],
            on_invalidate=_state_changed_of(weakref.ref(self)),  # weakly: a cycle would keep graphs until collected
        )
        self._eager_reason: str | None = None
        self._checked = False
        self._optim: CapturableOptimizer | None = None
        self._stream: torch.cuda.Stream | None = None
        self._params: list[torch.Tensor] = []
        self._grads_owner: _Graph | None = None  # the graph whose gradient tensors .grad points at
        self._extra_state = 0  # tensors the step writes outside the model and optimizer (found while capturing)
        self._extra_detail = ""  # which, and the operations that wrote them
        self._ddp: DdpSteps | None = None  # DistributedDataParallel: its ranks capture and verify alike
        self._next_level: dict[Signature, int] = {}  # DDP: the level a signature's next capture starts at
        self._whole_step_refused: dict[Signature, str] = {}  # DDP: why the whole step failed, for that next capture
        self.kernels = kernels
        self._kernels: StepKernels | None = (  # Inductor's forward and backward compiled beside the steps
            StepKernels(model) if kernels == "compiled" and not isinstance(model, _DDP) else None
        )

    def _state_changed(self, why: str) -> None:
        """A validity check dropped the graphs: the optimizer is prepared again for the state now in use (a loaded
        checkpoint brings ``capturable=False``, host step counters, number learning rates), and the parameters
        and gradients are read again at the next capture. A compile in flight is cancelled."""
        self._params = []
        self._grads_owner = None
        if self._kernels is not None:
            self._kernels.cancel(why)
        if self._optim is not None:
            try:
                self._optim = CapturableOptimizer(self.optimizer, self._device())
            except OptimizerNotCapturable as exc:
                self._eager_reason = str(exc)
                self._log_once(f"launchless: training runs eager from now on: {exc}")

    def _capture_again(self, why: str) -> None:
        """Drop every graph (the next calls capture again, after ``capture_after``) with one log line."""
        self._cache.drop_all()
        self._params = []
        self._grads_owner = None
        if self._kernels is not None:
            self._kernels.cancel(why)
        self._log_once(f"launchless: {why}")

    # ---- the call --------------------------------------------------------------------------------
    def __call__(self, *batch: Any, **kwargs: Any) -> Any:
        if not self._checked:  # at the first call: the model may be moved to the GPU after wrapping
            self._checked = True
            self._eager_reason = self._whole_run_reason()
            if self._eager_reason is None:  # before the first step, so that every step has the same numerics
                try:
                    self._optim = CapturableOptimizer(self.optimizer, self._device())
                except OptimizerNotCapturable as exc:
                    self._eager_reason = str(exc)
            if self._eager_reason:
                self._log_once(f"launchless: training runs eager: {self._eager_reason}")
        if self._eager_reason is not None:
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
        if self._eager_reason is not None:  # the optimizer prepared again could not be captured
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
                    applied, out = self._swap_kernels(kernels, sig, flat, entry)
                    if applied:
                        return out
                return self._replay(entry, flat)
            cache.drop_all()
            self._eager_reason = changed
            self._log_once(f"launchless: training runs eager from now on: {changed}")
            return self._eager(flat)
        if cache.admit(sig) is not Admission.CAPTURE:
            return self._eager(flat)
        return self._capture(sig, flat)

    def _swap_kernels(self, kernels: StepKernels, sig: Signature, flat: FlatInputs, entry: _Graph) -> tuple[bool, Any]:
        """``sig``'s compiled program, ready: proven, captured into a step graph that applies this step's batch,
        timed against ``entry`` (the training state put back after) and kept if faster (``StepKernels.decide``).
        Returns whether this step was applied, and its output."""
        cache = self._cache
        if (
            self._extra_state
        ):  # an EMA of the weights, say: the timing replays would change it, and no snapshot knows it
            kernels.refuse(
                sig,
                "the step writes state outside the model and optimizer, which the replays that time the compiled "
                f"kernels would change ({self._extra_detail})",
            )
            return False, None

        def capture() -> tuple[_Graph | None, dict]:
            with cache.capturing(sig):
                return self._try_level(entry.level, flat)

        def time_both(new: _Graph) -> SpeedVerdict:
            scaler = hooks.scaler_tensors(self.scaler) if self.scaler is not None else []
            state = Snapshot(
                [*state_tensors(self.model, self.optimizer), *scaler], device=self._device(), params=self._params
            )
            try:  # raw replays: no scheduler steps, no deferred calls; the state they trained goes back after
                return judge_speed(
                    lambda: entry.graph.replay_cloned(flat.leaves), lambda: new.graph.replay_cloned(flat.leaves)
                )
            finally:
                state.restore()
                entry.graph.replays = new.graph.replays = 0

        def keep(new: _Graph, outcome: dict) -> None:
            cache.keep(sig, new, outcome, flat.leaves)

        def drop(new: _Graph) -> None:
            self._grads_owner = None  # .grad points at the dropped graph's tensors until the next replay
            cache.discard()

        return kernels.decide(sig, capture=capture, time_both=time_both, keep=keep, drop=drop)

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
        self._ddp = DdpSteps(ddp)
        if self._cache.capture_after <= DDP_WARMUP_STEPS:  # the capture is the call after the eager steps
            self._cache.capture_after = DDP_WARMUP_STEPS + 1
            self._log_once(
                f"launchless: DistributedDataParallel steps are captured after {DDP_WARMUP_STEPS} eager steps of a "
                "batch signature (its reducer logs runtime statistics, syncing with the host, in its first 10)"
            )
        return None

    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _eager(self, flat: FlatInputs) -> Any:
        """A real step on the capture stream: before capture it is also the warm-up."""
        device = self._device()
        if self._stream is None:
            self._stream = side_stream(device)  # launchless.capture_stream(): DDP is built under it
        caller = torch.cuda.current_stream(device)
        self._stream.wait_stream(caller)
        args, kwargs = flat.rebuild(flat.leaves)
        self._grads_owner = None  # an eager step leaves its own gradients
        with torch.cuda.stream(self._stream), self._watching_accumulator_streams():
            out = self.fn(*args, **kwargs)
        caller.wait_stream(self._stream)
        return out

    def _watching_accumulator_streams(self) -> contextlib.AbstractContextManager[None]:
        """Under DDP, until the run trains eager: PyTorch's warning about the gradient accumulators' stream noted."""
        if self._ddp is None or self._eager_reason is not None:
            return contextlib.nullcontext()
        return self._ddp.watching_accumulator_streams()

    def _accumulator_streams_agreed(self) -> bool:
        """Before a DDP capture: where any rank's warm-up ran its gradient accumulators on another stream than the
        step's, every rank trains eager from now on, with the fix named."""
        if self._ddp is None or self._ddp.accumulator_streams_agreed():
            return True
        self._eager_reason = DDP_STREAM_REASON
        self._cache.drop_all()
        self._cache.log_once("ddp-stream", logging.WARNING, f"launchless: training runs eager: {DDP_STREAM_REASON}")
        return False

    def _grads_are(self, grads: list[torch.Tensor | None], entry: _Graph) -> bool:
        """Cheap check that ``.grad`` still points at ``grads`` (as after the last replay of ``entry``)."""
        if self._grads_owner is not entry:
            return False
        return all(self._params[i].grad is grads[i] for i in entry.spot)

    def _replay(self, entry: _Graph, flat: FlatInputs) -> Any:
        if entry.reads and not self._grads_are(entry.grads_in, entry):
            with torch.no_grad():
                for i in entry.reads:  # the graph accumulates into the tensors it was captured with
                    p, g = self._params[i], cast(torch.Tensor, entry.grads_in[i])  # read: captured with a .grad
                    if p.grad is not g:
                        g.zero_() if p.grad is None else g.copy_(p.grad)
                        p.grad = g
        out = entry.graph.replay_cloned(flat.leaves)
        if not self._grads_are(entry.grads_out, entry):
            for p, grad in zip(self._params, entry.grads_out, strict=True):
                p.grad = grad
            self._grads_owner = entry
        for call in entry.before_optimizer:
            call()
        for call in entry.deferred:
            call()
        for scheduler in entry.schedulers:
            scheduler.step()
        return out

    def _reset_reducer(self) -> None:
        """DDP's reducer reset on every rank (``DdpSteps.reset_reducer``): the buckets every graph captured so far
        reads are rebuilt, so those graphs go too."""
        cast(DdpSteps, self._ddp).reset_reducer()
        self._cache.drop_all()
        self._params, self._grads_owner = [], None

    def _defer_next_level(
        self, sig: Signature, flat: FlatInputs, next_level: str, whole_reason: str, outcome: dict
    ) -> Any:
        """The next level is tried once DDP's bucket rebuild is behind (after the wait of a passing refusal), not in
        this call: a graph captured before it would read buckets the rebuild frees."""
        self._next_level[sig] = DDP_LEVELS.index(next_level)
        self._whole_step_refused[sig] = whole_reason
        why = f"{outcome['reason']}; the {next_level} is tried after DDP has rebuilt its gradient buckets"
        self._cache.refuse(
            sig,
            Refusal(
                Stage.CAPTURE,
                why,
                f"launchless: training step {sig.describe()} runs eager for now: {why}",
                transient=True,
            ),
        )
        return self._eager(flat)

    # ---- capture and verification --------------------------------------------------------------------
    def _capture(self, sig: Signature, flat: FlatInputs) -> Any:
        if not self._accumulator_streams_agreed():
            return self._eager(flat)
        cache = self._cache
        with cache.capturing(sig):
            if not self._params:
                self._params = [p for p in self.model.parameters() if p.requires_grad]
            whole_reason = self._whole_step_refused.pop(sig, "")
            levels = DDP_LEVELS if self._ddp is not None else LEVELS
            start = self._next_level.pop(sig, 0)
            for index, level in enumerate(levels[start:], start):
                entry, outcome = self._try_level(level, flat)
                if entry is not None:
                    out = outcome.pop("_out")
                    cache.keep(sig, entry, outcome, flat.leaves)
                    if self._kernels is not None and entry.model_call is not None and level != LOCAL_BACKWARD:
                        self._kernels.start(sig, entry.model_call)
                    if level != WHOLE_STEP:
                        entry.whole_step_refused = whole_reason
                        self._log_once(
                            f"launchless: training step {sig.describe()} runs {level} "
                            f"(whole step not captured: {whole_reason})"
                        )
                    return out
                whole_reason = whole_reason or outcome["reason"]
                if self._eager_reason:  # nothing of this run is captured (e.g. distillation)
                    self._log_once(f"launchless: training runs eager: {self._eager_reason}")
                    return self._eager(flat)
                if outcome.get("capture_failed") and self._ddp is not None and self._ddp.reducer_interrupted():
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
        return self._eager(flat)

    def _try_level(self, level: str, flat: FlatInputs) -> tuple[_Graph | None, dict]:
        """Capture and verify at one level; on failure the state is as before and the reason is returned."""
        device = self._device()
        before = Snapshot(state_tensors(self.model, self.optimizer), device=device, params=self._params)
        pool = self._cache.pool
        schedulers: list[LRScheduler] = []
        deferred: list[Callable[[], Any]] = []
        scalers: set[torch.amp.GradScaler] = set()
        grads_in = [p.grad for p in self._params]
        writes = hooks.MutationLog(watch=[g for g in grads_in if g is not None])
        model_call = ModelCall()
        try:
            with contextlib.ExitStack() as patches:
                if self._kernels is not None:
                    patches.enter_context(recorded_call(self.model, model_call))
                patches.enter_context(hooks.deferred_schedulers(schedulers))
                patches.enter_context(hooks.watch_scalers(scalers))
                if level == WHOLE_STEP:
                    patches.enter_context(hooks.refuse_scaler_sync())
                else:
                    patches.enter_context(hooks.deferred_optimizer(self.optimizer, deferred))
                if level == LOCAL_BACKWARD:  # the gradients stay local in the graph; averaged eager after it
                    patches.enter_context(cast(_DDP, self.model).no_sync())
                graph = _capture.capture(
                    writes.logging(self.fn), flat, device=device, pool=pool.handle(), warmup=0, stream=self._stream
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
            if self._ddp is not None:  # the other ranks must not verify (its collectives would wait for this one)
                self._ddp.agree_failed(failed["reason"], f"capture of the {level}")
                failed["capture_failed"] = True
            return None, failed
        if self._ddp is not None:
            others = self._ddp.others_refused(ok=True, reason="", what=f"capture of the {level}")
            if others is not None:
                before.restore()
                del graph
                self._cache.discard()
                return None, {**others, "capture_failed": True}
        foreign = writes.foreign_parameters(self.model)
        if foreign:  # checked at the first capture: the whole run then trains eager
            before.restore()
            self._eager_reason = (
                f"the step reads {len(foreign)} parameter tensor(s) outside `model` that it does not train (a "
                "distillation teacher?); distillation runs train eager. If they belong to the trained model, pass "
                "the module that holds them as model="
            )
            del graph
            self._cache.discard()
            return None, {"reason": self._eager_reason}
        entry = _Graph(graph, list(dict.fromkeys(schedulers)), level, deferred)
        entry.model_call = model_call if self._kernels is not None else None
        if level == LOCAL_BACKWARD:
            ddp = cast(DdpSteps, self._ddp)
            entry.before_optimizer = [lambda: ddp.average_gradients(self._params)]
        entry.grads_in, entry.grads_out = grads_in, [p.grad for p in self._params]
        entry.reads = [i for i, g in enumerate(grads_in) if g is not None and writes.was_read(g)]
        entry.spot = spread(len(self._params))
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
        if len(extra) > self._extra_state:
            self._extra_state, self._extra_detail = len(extra), writes.describe(extra)
        if self.verify != "off":
            try:
                report, out = self._verify(entry, flat, before, writers=writes.writers)
            except torch.cuda.OutOfMemoryError as exc:
                before.restore()
                del entry, graph
                self._cache.discard()
                return None, {"reason": describe_failure(exc, str(exc)), "transient": True}
        else:
            report, out = {"status": VerifyStatus.SKIPPED, "passed": True}, self._replay(entry, flat)
        if self._ddp is not None:
            others = self._ddp.others_refused(
                ok=report["passed"], reason=report.get("detail", ""), what=f"verification of the {level}"
            )
            if others is not None and report["passed"]:  # the step it applied is taken back, as the others do
                before.restore()
                del entry, graph
                self._cache.discard()
                return None, others
        if not report["passed"]:
            before.restore()
            del entry, graph
            self._cache.discard()
            return None, {"reason": f"verification failed ({report['detail']})"}
        return entry, {**report, "_out": out}

    def _verify(
        self, entry: _Graph, flat: FlatInputs, before: Snapshot, *, writers: Mapping[int, str] | None = None
    ) -> tuple[dict, Any]:
        """The graph step against eager steps from the same state on the same batch (``verification``);
        ``writers``: the operation that wrote each tensor the capture saw written, by ``id``, to name it."""
        return verified_step(
            lambda: self._eager(flat),
            lambda: self._replay(entry, flat),
            before,
            mode=self.verify,
            lockstep=self._ddp is not None,
            labels=state_labels(self.model, self.optimizer, before, writers=writers),
        )

    def _log_once(self, message: str) -> None:
        self._cache.log_once(message, logging.INFO, message)

    def _row(self, sig: Signature, e: _Graph) -> dict[str, Any]:
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
        if self._eager_reason:
            level = "eager"
        elif not cache.graphs:
            level = "eager (warming up)" if not fallbacks else "eager"
        else:
            level = " + ".join(sorted({e.level for e in cache.graphs.values()}))
        return {
            "level": level,
            "eager_reason": self._eager_reason,
            **cache.summary(),
            "graphs": cache.rows(self._row),
            "fallbacks": fallbacks,
            "extra_state_tensors": self._extra_state,
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


def _key(t: torch.Tensor) -> tuple:
    return (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype)
