"""graphed_step: capture a whole training step -- forward, loss, backward, optimizer -- and replay it.

The user's own step function runs eager (as a real step, on the capture stream, so it doubles as
warm-up) until its batch signature has been seen ``capture_after`` times; then it is captured and,
from then on, replayed. Capturing executes nothing, so the capturing call replays once to apply
its batch: no batch is applied twice or skipped.

Training fails soft: anything that stops capture or verification -- a host sync (``loss.item()``),
a data-dependent shape, an optimizer that cannot run in a graph, DDP -- makes that signature (or
the whole step) run eager from then on, with one log line naming the reason and the source line.

Learning-rate schedulers called inside the step are deferred during capture and called after each
replay, so they keep stepping; the learning rate lives in a device tensor they update in place.
"""

from __future__ import annotations

import contextlib
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.optim.lr_scheduler import LRScheduler

from .. import capture as _capture
from ..blockers import classify_message, locate_exception
from ..signature import FlatInputs, Signature, UnhashableInput, flatten_inputs, signature_of
from ..verify import difference, identical
from .optim import CapturableOptimizer, OptimizerNotCapturable
from .snapshot import Snapshot, state_tensors

log = logging.getLogger("launchless")


@contextlib.contextmanager
def _deferred_schedulers(calls: list[LRScheduler]) -> Iterator[None]:
    """While capturing, scheduler.step() is recorded instead of run (a graph would freeze its result)."""
    original = LRScheduler.step

    def record(self: LRScheduler, *args: Any, **kwargs: Any) -> None:
        if args or kwargs:
            raise _capture.CaptureFailed("capture", None, "scheduler.step() with arguments cannot be replayed")
        calls.append(self)

    LRScheduler.step = record  # type: ignore[method-assign]
    try:
        yield
    finally:
        LRScheduler.step = original  # type: ignore[method-assign]


@contextlib.contextmanager
def _refuse_scaler_sync() -> Iterator[None]:
    """GradScaler's unscale_ leads to a host sync (skip-on-inf) and changes the scaler's Python state on
    the way; refuse it before it touches anything, so the eager retry of this batch starts clean.
    (Fused optimizers take the scaler's device-side path, which never calls unscale_ from step.)"""
    original = torch.amp.GradScaler.unscale_

    def refuse(self: torch.amp.GradScaler, optimizer: torch.optim.Optimizer) -> None:
        if not self.is_enabled():
            return original(self, optimizer)
        raise _capture.CaptureFailed(
            "capture",
            None,
            "GradScaler.unscale_ needs a host sync to skip steps with inf/NaN gradients (use bf16, or a fused "
            "optimizer, to capture the whole step)",
        )

    torch.amp.GradScaler.unscale_ = refuse  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.amp.GradScaler.unscale_ = original  # type: ignore[method-assign]


class _Graph:
    def __init__(self, graph: _capture.CapturedGraph, schedulers: list[LRScheduler]) -> None:
        self.graph = graph
        self.schedulers = schedulers


class GraphedStep:
    """A training step that replays a verified whole-step CUDA graph per batch signature."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        capture_after: int = 3,
        max_graphs: int = 8,
        verify: bool = True,
        tolerance_ulps: float = 64.0,
    ) -> None:
        if capture_after < 2:
            raise ValueError(
                f"capture_after={capture_after} is not accepted; pass >= 2: the eager steps before capture create "
                "the optimizer state and warm up the capture stream"
            )
        self.fn, self.model, self.optimizer = fn, model, optimizer
        self.capture_after, self.max_graphs = capture_after, max_graphs
        self.verify, self.tolerance_ulps = verify, tolerance_ulps
        self._graphs: OrderedDict[Signature, _Graph] = OrderedDict()
        self._seen: dict[Signature, int] = {}
        self._refused: dict[Signature, str] = {}
        self._eager_reason: str | None = None
        self._checked = False
        self._logged: set[str] = set()
        self._optim: CapturableOptimizer | None = None
        self._stream: torch.cuda.Stream | None = None
        self._pool: Any = None
        self._reports: dict[Signature, dict] = {}
        self._params: list[torch.Tensor] = []
        self._static_grads: list[torch.Tensor | None] = []

    # ---- the call --------------------------------------------------------------------------------
    def __call__(self, *batch: Any, **kwargs: Any) -> Any:
        if not self._checked:  # at the first call: the model may be moved to the GPU after wrapping
            self._checked = True
            self._eager_reason = self._whole_run_reason()
            if self._eager_reason:
                self._log_once(f"launchless: training runs eager: {self._eager_reason}")
        if self._eager_reason is not None:
            return self.fn(*batch, **kwargs)
        flat = flatten_inputs(batch, kwargs)
        try:
            sig = signature_of(flat)
        except UnhashableInput as exc:
            self._log_once(f"launchless: training step runs eager: {exc}")
            return self.fn(*batch, **kwargs)
        if not self.model.training:  # train/eval changes what the step computes: its own graph
            sig = sig._replace(context=(*sig.context, "eval"))
        entry = self._graphs.get(sig)
        if entry is not None:
            changed = self._optim.sync() if self._optim else None
            if changed is None:
                self._graphs.move_to_end(sig)
                return self._replay(entry, flat)
            self._graphs.clear()
            self._eager_reason = changed
            self._log_once(f"launchless: training runs eager from now on: {changed}")
            return self._eager(flat)
        if sig in self._refused:
            return self._eager(flat)
        self._seen[sig] = count = self._seen.get(sig, 0) + 1
        if count < self.capture_after:
            return self._eager(flat)
        return self._capture(sig, flat)

    def _whole_run_reason(self) -> str | None:
        if isinstance(self.model, torch.nn.parallel.DistributedDataParallel):
            return "DistributedDataParallel steps are not captured yet (multi-GPU capture is a later issue)"
        devices = {p.device for p in self.model.parameters()}
        if not devices or any(d.type != "cuda" for d in devices):
            return "the model's parameters are not all on a CUDA device, so there is nothing to capture"
        return None

    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _eager(self, flat: FlatInputs) -> Any:
        """A real step on the capture stream: before capture it is also the warm-up."""
        device = self._device()
        if self._stream is None:
            self._stream = torch.cuda.Stream(device)
        caller = torch.cuda.current_stream(device)
        self._stream.wait_stream(caller)
        args, kwargs = flat.rebuild(flat.leaves)
        with torch.cuda.stream(self._stream):
            out = self.fn(*args, **kwargs)
        caller.wait_stream(self._stream)
        return out

    def _replay(self, entry: _Graph, flat: FlatInputs) -> Any:
        out = entry.graph.replay_cloned(flat.leaves)
        for p, g in zip(self._params, self._static_grads, strict=True):
            if p.grad is not g:  # user code set grads to None between steps: the graph still owns them
                p.grad = g
        for scheduler in entry.schedulers:
            scheduler.step()
        return out

    # ---- capture and verification --------------------------------------------------------------------
    def _capture(self, sig: Signature, flat: FlatInputs) -> Any:
        device = self._device()
        try:
            self._optim = self._optim or CapturableOptimizer(self.optimizer, device)
        except OptimizerNotCapturable as exc:
            self._eager_reason = str(exc)
            self._log_once(f"launchless: training runs eager: {exc}")
            return self._eager(flat)
        schedulers: list[LRScheduler] = []
        with _capture.CAPTURE_LOCK:
            before = Snapshot(state_tensors(self.model, self.optimizer), device=device)
            if self._pool is None:
                self._pool = _capture.new_pool()
            try:
                with _deferred_schedulers(schedulers), _refuse_scaler_sync():
                    graph = _capture.capture(
                        self.fn, flat, device=device, pool=self._pool, warmup=0, stream=self._stream
                    )
            except _capture.CaptureFailed as fail:
                if fail.stage == "capture":
                    self._pool = None
                before.restore()
                return self._refuse(sig, flat, fail)
            self._params = [p for p in self.model.parameters() if p.requires_grad]
            self._static_grads = [p.grad for p in self._params]
            entry = _Graph(graph, list(dict.fromkeys(schedulers)))
            before.add_schedulers(entry.schedulers)  # not stepped yet: capture only recorded the calls
            if self.verify:
                report, out = self._verify(entry, flat, before)
            else:
                report, out = {"status": "skipped", "passed": True}, self._replay(entry, flat)
            self._reports[sig] = report
            if not report["passed"]:
                before.restore()
                return self._refuse(sig, flat, None, f"verification failed ({report['detail']})")
            self._graphs[sig] = entry
            while len(self._graphs) > self.max_graphs:
                self._graphs.popitem(last=False)
                self._log_once(f"launchless: more than max_graphs={self.max_graphs} step signatures; evicting")
            return out

    def _verify(self, entry: _Graph, flat: FlatInputs, before: Snapshot) -> tuple[dict, Any]:
        """Graph step and eager step from the same state on the same batch must agree."""
        eager_out = self._eager(flat)
        eager_state = before.current()
        before.restore()
        graph_out = self._replay(entry, flat)
        graph_state = before.current()
        same = identical(eager_out, graph_out) and identical(eager_state, graph_state)
        report = {"status": "bit-identical", "passed": True, "max_abs_diff": 0.0}
        if same:
            return report, graph_out
        diff = max(difference(eager_state, graph_state, 0.0)[0], difference(eager_out, graph_out, 0.0)[0])
        after_graph = before.current()
        before.restore()
        again_out, again_state = self._eager(flat), before.current()
        noise = max(difference(eager_state, again_state, 0.0)[0], difference(eager_out, again_out, 0.0)[0])
        for t, v in zip(before.tensors, after_graph, strict=True):  # keep the graph's step applied
            t.detach().copy_(v)
        report.update(max_abs_diff=diff, eager_noise=noise)
        if noise > 0 and diff <= 2 * noise:
            report.update(status="eager-noise", detail=f"eager run twice differs by {noise:.3g}")
        else:
            report.update(
                passed=False,
                status="failed",
                detail=f"replay differs from eager by {diff:.3g}, eager from eager by {noise:.3g}",
            )
        return report, graph_out

    def _refuse(self, sig: Signature, flat: FlatInputs, fail: _capture.CaptureFailed | None, why: str = "") -> Any:
        if fail is not None:
            cause = fail.cause
            where = locate_exception(cause) if cause is not None else None
            kind = classify_message(str(cause)) if cause is not None else "capture error"
            first = str(cause or fail).strip().splitlines()[0] if str(cause or fail).strip() else kind
            why = f"{kind}: {first}" + (f" at {where}" if where else "")
        self._refused[sig] = why
        self._log_once(f"launchless: training step {sig.describe()} runs eager: {why}")
        return self._eager(flat)

    def _log_once(self, message: str) -> None:
        if message not in self._logged:
            self._logged.add(message)
            log.info(message)

    def graph_info(self) -> dict:
        """Which level runs: captured signatures with replays and verification, eager fallbacks and why."""
        level = "eager" if self._eager_reason else ("whole-step graph" if self._graphs else "eager (warming up)")
        return {
            "level": level,
            "eager_reason": self._eager_reason,
            "graphs": [
                {
                    "signature": s.describe(),
                    "replays": e.graph.replays,
                    "verification": {k: v for k, v in self._reports.get(s, {}).items() if not k.startswith("_")},
                }
                for s, e in self._graphs.items()
            ],
            "fallbacks": [{"signature": s.describe(), "reason": r} for s, r in self._refused.items()],
        }


def graphed_step(
    fn: Callable[..., Any] | None = None, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer, **options: Any
) -> GraphedStep | Callable[[Callable[..., Any]], GraphedStep]:
    """Capture the whole training step ``fn(*batch)``; also usable as ``@graphed_step(model=..., optimizer=...)``."""
    if fn is None:
        return lambda f: GraphedStep(f, model=model, optimizer=optimizer, **options)
    return GraphedStep(fn, model=model, optimizer=optimizer, **options)
