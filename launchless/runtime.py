"""GraphedModule: per-signature capture, replay, invalidation, info and release for inference.

Modes: ``False`` runs eager; ``True`` captures at the first sight of a signature and fails loud
(a forward that cannot be captured raises: a wrong capture would silently return wrong values);
``"auto"`` captures once a signature has been seen ``auto_after`` times and otherwise runs eager
with one log line per reason. Calls in grad mode or with the model in training mode run eager:
graphs here are for inference (training capture is ``graphed_step``).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import Any

import torch

from . import state_keys
from .core import capture as _capture
from .core.capture_path import record_capture_branches
from .core.churn import ShapeChurn
from .core.relocation import RelocationWatch
from .core.signature import FlatInputs, Signature, UnhashableInput, flatten_inputs, signature_of
from .core.verify import BIT_IDENTICAL, SKIPPED, VerifyReport, verify
from .diagnose.messages import capture_error, verification_error
from .errors import ConfigError, NoCudaError

log = logging.getLogger("launchless")

_MODES = (False, True, "auto")
_VERIFY = ("on", "strict", "off")
_OUTPUTS = ("clone", "static")
_ADDRESS_CHECKS = ("events", "full")
_MAX_TRACKED = 4096
_RUNTIME_STATE = frozenset(
    {
        "_graphs",
        "_reports",
        "_seen",
        "_refused",
        "_logged",
        "_eager_reasons",
        "_watch",
        "_pool",
        "_pools",
        "_lock",
        "_last_stream",
        "_evictions",
        "_churn",
        "_invalidations",
    }
)  # signatures remembered for "auto" counting and refusals


def _check_options(
    cuda_graph: Any,
    auto_after: int,
    max_graphs: int,
    warmup: int,
    verify_mode: str,
    outputs: str,
    tolerance_ulps: float,
    address_check: str,
) -> None:
    if not any(cuda_graph is m or (isinstance(m, str) and cuda_graph == m) for m in _MODES):
        raise ConfigError(
            f"cuda_graph={cuda_graph!r} is not accepted; use False (eager), True (capture at "
            "the first call of each input signature) or 'auto' (capture once it repeats)"
        )
    for name, value, low in (
        ("auto_after", auto_after, 1),
        ("max_graphs", max_graphs, 1),
        ("warmup", warmup, 1),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ConfigError(f"{name}={value!r} is not accepted; pass an integer >= {low}")
    if verify_mode not in _VERIFY:
        raise ConfigError(
            f"verify={verify_mode!r} is not accepted; use 'on' (bit-identical, or a named "
            "eager-noise/capture-path class within the rounding bound), 'strict' or 'off'"
        )
    if outputs not in _OUTPUTS:
        raise ConfigError(
            f"outputs={outputs!r} is not accepted; use 'clone' (safe) or 'static' (the graph's "
            "own buffers, overwritten by the next replay)"
        )
    if isinstance(tolerance_ulps, bool) or not isinstance(tolerance_ulps, (int, float)) or not tolerance_ulps >= 0:
        raise ConfigError(f"tolerance_ulps={tolerance_ulps!r} is not accepted; pass a number >= 0")
    if address_check not in _ADDRESS_CHECKS:
        raise ConfigError(
            f"address_check={address_check!r} is not accepted; use 'events' (relocation events plus a spot check "
            "of 8 tensors per call) or 'full' (every parameter and buffer on every call)"
        )


class GraphedModule(torch.nn.Module):
    """A model that replays a verified CUDA graph per input signature and keeps the model's API."""

    def __init__(
        self,
        model: torch.nn.Module,
        cuda_graph: bool | str = "auto",
        *,
        auto_after: int = 3,
        max_graphs: int = 8,
        warmup: int = 3,
        verify: str = "on",
        tolerance_ulps: float = 64.0,
        outputs: str = "clone",
        address_check: str = "events",
    ) -> None:
        _check_options(cuda_graph, auto_after, max_graphs, warmup, verify, outputs, tolerance_ulps, address_check)
        super().__init__()
        self.model = model
        self.cuda_graph = cuda_graph
        self.auto_after, self.max_graphs, self.warmup = auto_after, max_graphs, warmup
        self.verify_mode, self.tolerance_ulps, self.outputs = verify, tolerance_ulps, outputs
        self.address_check = address_check
        state_keys.install(self)
        self._init_runtime()

    def _init_runtime(self) -> None:
        """Graphs, counters and locks: process state that is never copied or pickled."""
        self._graphs: OrderedDict[Signature, _capture.CapturedGraph] = OrderedDict()
        self._reports: dict[Signature, VerifyReport] = {}
        self._seen: OrderedDict[Signature, int] = OrderedDict()
        self._refused: OrderedDict[Signature, tuple[dict, Exception]] = OrderedDict()
        self._logged: set[str] = set()
        self._eager_reasons: dict[str, int] = {}
        self._watch = RelocationWatch(self.model, full=self.address_check == "full")
        self._pool: Any = None
        self._pools: list[Any] = []  # every pool holding this model's graphs (a failed capture retires one)
        self._lock = threading.RLock()
        self._last_stream: tuple[int, torch.cuda.Stream] | None = None
        self._evictions = 0
        self._churn = ShapeChurn()  # "auto": more shapes in use than max_graphs stops eviction
        self._invalidations = 0

    def __getstate__(self) -> dict:
        """Copies and pickles carry the model and the options, never graphs, pools or locks."""
        return {k: v for k, v in self.__dict__.items() if k not in _RUNTIME_STATE}

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self._init_runtime()

    # ---- pass-through -------------------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["model"], name)

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        """Straight to the model, so missing/unexpected keys are reported with the model's own names."""
        return self.model.load_state_dict(state_dict, strict=strict, assign=assign)

    def named_modules(self, memo: set | None = None, prefix: str = "", remove_duplicate: bool = True):
        """The model's modules under the wrapper's own name: parameter names match state_dict keys."""
        memo = set() if memo is None else memo
        if self not in memo:
            if remove_duplicate:
                memo.add(self)
            yield prefix, self
        yield from self.model.named_modules(memo, prefix, remove_duplicate)

    def extra_repr(self) -> str:
        return f"cuda_graph={self.cuda_graph!r}, graphs={len(self._graphs)}, max_graphs={self.max_graphs}"

    # ---- the call -----------------------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        model = self._modules["model"]  # not self.model: nn.Module.__getattr__ is slow on the replay path
        if self.cuda_graph is False:
            return model(*args, **kwargs)
        if model.training:
            return self._eager(
                "model is in training mode; call .eval() to replay graphs (wrap() captures inference only)",
                args,
                kwargs,
            )
        if self._watch.moved():
            self._invalidate()
        flat = flatten_inputs(args, kwargs)
        if torch.is_grad_enabled() and (self._watch.requires_grad() or _any_requires_grad(flat.leaves)):
            return self._eager(
                "grad mode is on and autograd would record this call; graphs replay under "
                "torch.no_grad() or torch.inference_mode()",
                args,
                kwargs,
            )
        try:
            sig = signature_of(flat)
        except UnhashableInput as exc:
            return self._eager(str(exc), args, kwargs)
        graph = self._graphs.get(sig)
        if graph is not None:
            return self._replay(sig, graph, flat.leaves)
        refused = self._refused.get(sig)
        if refused is not None:
            if self.cuda_graph is True:
                raise refused[1]
            return model(*args, **kwargs)
        if self.cuda_graph == "auto":
            if self._count(sig) < self.auto_after:
                return model(*args, **kwargs)
            if not self._churn.admits(sig, len(self._graphs), self.max_graphs):
                self._log_once("churn", logging.INFO, self._churn.message(self._name(), self.max_graphs, "max_graphs"))
                return model(*args, **kwargs)
        return self._capture_and_run(sig, flat, explicit=False)

    def _replay(self, sig: Signature, graph: _capture.CapturedGraph, leaves: list) -> Any:
        with self._lock:
            self._graphs.move_to_end(sig)
            self._order_streams(graph)
            if self.outputs == "clone":
                return graph.replay_cloned(leaves)
            return graph.replay(leaves)

    def _order_streams(self, graph: _capture.CapturedGraph) -> None:
        """Static buffers are shared: a replay on another stream must wait for the previous one."""
        raw = torch._C._cuda_getCurrentRawStream(graph.device_index)
        if self._last_stream is None or self._last_stream[0] != raw:
            current = torch.cuda.current_stream(graph.device_index)
            if self._last_stream is not None:
                current.wait_stream(self._last_stream[1])
            self._last_stream = (raw, current)

    def _count(self, sig: Signature) -> int:
        count = self._seen.pop(sig, 0) + 1
        self._seen[sig] = count
        if len(self._seen) > _MAX_TRACKED:
            self._seen.popitem(last=False)
        return count

    # ---- capture, verification, refusal ---------------------------------------------------------
    def _capture_and_run(self, sig: Signature, flat: FlatInputs, *, explicit: bool) -> Any:
        device = self._watch.cuda_device or next(
            (x.device for x in flat.leaves if isinstance(x, torch.Tensor) and x.is_cuda), None
        )
        if device is None:
            return self._refuse(
                sig,
                flat,
                NoCudaError(
                    f"launchless: {self._name()} has no parameters, buffers or inputs on a CUDA device, so there "
                    "is nothing to capture; move the model to the GPU (model.cuda()) or use cuda_graph=False"
                ),
                "no CUDA device",
                explicit,
            )
        with self._lock, _capture.CAPTURE_LOCK:
            if self._pool is None:
                self._pool = _capture.new_pool()
                self._pools.append(self._pool)
            branches: list[str] = []
            try:
                with record_capture_branches(branches):
                    graph = _capture.capture(
                        self.model,
                        flat,
                        device=device,
                        pool=self._pool,
                        warmup=self.warmup,
                        trace_indices=self.verify_mode != "off",
                    )
            except _capture.CaptureFailed as fail:
                if fail.stage == "capture":
                    self._pool = None  # a failed capture leaves its pool unusable for new captures
                if fail.stage == "warm-up" and fail.cause is not None:
                    raise fail.cause from None  # the forward itself is broken: eager would raise the same
                error = capture_error(self.model, self._name(), sig, flat, fail, device)
                return self._refuse(sig, flat, error, fail.stage, explicit)
            report = (
                verify(
                    graph,
                    self.model,
                    flat,
                    mode=self.verify_mode,
                    tolerance_ulps=self.tolerance_ulps,
                    branches=branches,
                    from_call=graph.index_inputs,
                )
                if self.verify_mode != "off"
                else VerifyReport(SKIPPED, True)
            )
            self._reports[sig] = report
            if not report.passed:
                del graph
                if not self._graphs:  # its pool has no graph left: PyTorch refuses to capture into it again
                    self._pool = None
                return self._refuse(sig, flat, verification_error(self._name(), sig, report), "verification", explicit)
            if report.status not in (BIT_IDENTICAL, SKIPPED):
                self._log_once(
                    f"class:{report.status}",
                    logging.INFO,
                    f"launchless: {self._name()} {sig.describe()} replays within the rounding bound, "
                    f"not bit-identically ({report.status}: {report.detail}; max abs diff "
                    f"{report.max_abs:.3g}, rel {report.max_rel:.3g}, bound {report.bound:.3g})",
                )
            self._seen.pop(sig, None)
            self._graphs[sig] = graph
            self._evict()
            return self._replay(sig, graph, flat.leaves)

    def _refuse(self, sig: Signature, flat: FlatInputs, error: Exception, reason: str, explicit: bool) -> Any:
        entry = {
            "signature": sig.describe(),
            "reason": getattr(error, "reason", reason),
            "message": str(error),
            "operation": getattr(error, "operation", None),
            "source": getattr(error, "source", None),
        }
        self._refused[sig] = (entry, error)
        if len(self._refused) > _MAX_TRACKED:
            self._refused.popitem(last=False)
        if self.cuda_graph is True or explicit:
            raise error
        self._log_once(
            f"refuse:{reason}:{entry['source']}",
            logging.INFO,
            f"{error}. Running eager for this input signature.",
        )
        args, kwargs = flat.rebuild(flat.leaves)
        return self.model(*args, **kwargs)

    def _eager(self, reason: str, args: tuple, kwargs: dict) -> Any:
        self._eager_reasons[reason] = self._eager_reasons.get(reason, 0) + 1
        self._log_once(
            f"eager:{reason}",
            logging.WARNING if self.cuda_graph is True else logging.INFO,
            f"launchless: {self._name()} runs eager: {reason}",
        )
        return self.model(*args, **kwargs)

    def _log_once(self, key: str, level: int, message: str) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.log(level, message)

    def _name(self) -> str:
        return f"{type(self.model).__name__}.forward"

    # ---- eviction, invalidation, release -----------------------------------------------------------
    def _evict(self) -> None:
        while len(self._graphs) > self.max_graphs:
            sig, _ = self._graphs.popitem(last=False)
            self._reports.pop(sig, None)
            self._evictions += 1
            self._churn.evicted(sig)
            self._log_once(
                "evict",
                logging.WARNING,
                f"launchless: {self._name()} has more than max_graphs={self.max_graphs} input "
                "signatures; evicting the least recently used graph (raise max_graphs, or pad inputs "
                "to fewer shapes). Shown once.",
            )

    def _invalidate(self) -> None:
        dropped = len(self._graphs)
        self._drop_all()
        self._invalidations += 1
        if dropped:
            log.info(
                f"launchless: {self._name()}: parameters or buffers were relocated (.to(), .half(), "
                f"load_state_dict(assign=True), a swapped submodule or parameter); dropped {dropped} graph(s), "
                "they are captured again as needed"
            )

    def _drop_all(self) -> None:
        with self._lock:
            self._graphs.clear()
            self._reports.clear()
            self._seen.clear()
            self._refused.clear()
            self._churn.reset()
            self._pool = None
            self._pools = []
            self._last_stream = None

    def release_graphs(self) -> None:
        """Free every graph, its static buffers and the memory pool; later calls capture again."""
        self._drop_all()
        if torch.cuda.is_initialized():
            torch.cuda.empty_cache()

    def capture_graph(self, *args: Any, **kwargs: Any) -> dict:
        """Capture (and verify) the graph for this input signature now, so no request pays for it.

        Raises CaptureError / VerificationError in every mode: the capture was asked for explicitly.
        """
        if self.cuda_graph is False:
            raise ConfigError("capture_graph() needs graphs on: wrap with cuda_graph=True or 'auto'")
        if self.model.training:
            raise ConfigError("capture_graph() captures inference graphs: call .eval() on the model first")
        if self._watch.moved():
            self._invalidate()
        flat = flatten_inputs(args, kwargs)
        sig = signature_of(flat)
        if sig not in self._graphs:
            self._refused.pop(sig, None)
            with torch.no_grad():
                self._capture_and_run(sig, flat, explicit=True)
        return self._info(sig)

    # ---- reporting ------------------------------------------------------------------------------
    def _info(self, sig: Signature) -> dict:
        graph = self._graphs[sig]
        report = self._reports.get(sig)
        return {
            "signature": sig.describe(),
            "replays": graph.replays,
            "capture_ms": round(graph.capture_ms, 3),
            "pool_growth_bytes": graph.pool_growth,
            "verification": report.as_dict() if report else None,
        }

    def graph_info(self) -> dict:
        """Captured signatures with replay count, capture time, memory and verification; eager fallbacks."""
        pool = sum(map(_capture.pool_bytes, self._pools))
        return {
            "mode": self.cuda_graph,
            "max_graphs": self.max_graphs,
            "graphs": [self._info(sig) for sig in self._graphs],
            "pool_bytes": pool,
            "fallbacks": [entry for entry, _ in self._refused.values()],
            "eager_calls": dict(self._eager_reasons),
            "evictions": self._evictions,
            # "auto" with more shapes in use than max_graphs: eviction stopped, this many calls ran eager
            "calls_over_max_graphs": self._churn.calls_without_graph if self._churn.stop_evicting else None,
            "invalidations": self._invalidations,
        }


def _any_requires_grad(leaves: list) -> bool:
    return any(isinstance(x, torch.Tensor) and x.requires_grad for x in leaves)


def wrap(model: torch.nn.Module, cuda_graph: bool | str = "auto", **options: Any) -> GraphedModule:
    """Wrap ``model`` so inference replays verified CUDA graphs, one per input signature.

    cuda_graph: False (eager), True (capture at first sight; raise if the forward cannot be captured)
        or "auto" (capture once a signature repeats; otherwise eager with one log line).
    auto_after=3: calls of one signature before "auto" captures it.
    max_graphs=8: graphs kept; least recently used evicted (one warning line). Under "auto", once an evicted
        signature comes back (more in use than max_graphs), nothing more is evicted and the others run eager.
    warmup=3: eager runs on the capture stream before capturing.
    verify="on" | "strict" | "off": prove each graph against eager on two probes before use.
    tolerance_ulps=64: rounding bound for named eager-noise / capture-path differences.
    outputs="clone" | "static": copies, or the graph's own buffers (overwritten by the next replay).
    address_check="events" | "full": how parameter relocation is noticed (see launchless.core.relocation).
    """
    if isinstance(model, GraphedModule):
        raise ConfigError("this model is already wrapped by launchless; use its .model to wrap again")
    if not isinstance(model, torch.nn.Module):
        raise ConfigError(f"wrap() takes a torch.nn.Module, got {type(model).__name__}; wrap the module itself")
    return GraphedModule(model, cuda_graph, **options)
