"""The decode steps of one wrapped model as graphs: one verified graph per (static cache, step signature).

``step_routing`` sends the model's forward here while ``generate()`` runs. The prompt's forward runs eager; a decode
step (one token per sequence, on a static cache) is captured once it repeats (``capture_after``), verified against
eager from the same cache state (the logits and the cache each leaves behind, bit for bit; two different tokens must
give different logits), then replayed. The cache's tensors are read and written in place, never copied; before each
replay the cache must still hold the tensors the graph was captured on. A step that changes the cache's state on the
host is refused by name, but for the lengths a sliding-window layer counts (``cache_layers.HostCounters``): those
are proven not to reach the outputs, and advanced after each replay as the step would have. The lengths a plain
static layer holds on the device, where the step reads them in Python, are answered without reading the device while
it is captured (``cache_lengths``); the graph is verified against the step run as written.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..core.cache import GraphCache, Refusal
from ..core.capture import CapturedGraph, CaptureFailed, capture, out_of_memory
from ..core.compiled_programs import SpareCompiler
from ..core.relocation import RelocationWatch
from ..core.signature import FlatInputs, Signature, UnhashableInput, flatten_inputs, signature_of
from ..core.status import Admission, Stage, VerifyStatus
from ..core.verify import VerifyReport, identical, verify_step
from ..diagnose.blockers import classify_message
from ..diagnose.messages import capture_error
from ..diagnose.source import locate_exception
from ..errors import CaptureError, one_line
from ..options import KernelsMode
from .cache_layers import CacheState, DevicePositions, HostCounters
from .cache_lengths import CacheLengths
from .decode_kernels import DecodeKernels, other_tokens_probe
from .static_cache import cache_slots, cache_tensors, host_state, off_cache


@dataclasses.dataclass
class _Output:
    """How a decode step's output is rebuilt around the graph's tensors: its class and the fields holding the cache."""

    kind: type | None = None
    cache_fields: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class _Held:
    """What replaying a decode graph needs besides the graph: the cache it was captured on, where that cache held
    which tensor (a cache re-allocated since is captured again), how the step's output is rebuilt around the
    replayed tensors, and the lengths the cache counts on the host (advanced after each replay)."""

    cache: Any
    slots: list[tuple[dict, Any, torch.Tensor]]
    output: _Output
    counters: HostCounters


@dataclasses.dataclass(frozen=True)
class Blocking:
    """Why a decode step's capture failed: the one-line reason, and the operation and source line where found."""

    why: str
    operation: str | None = None
    source: str | None = None


class DecodeSteps:
    """The decode-step graphs of one model, their caches' bookkeeping and counts (see the module docstring)."""

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        name: str,
        explicit: bool,
        capture_after: int,
        max_graphs: int,
        warmup: int,
        verify: str,
        tolerance_ulps: float,
        kernels: KernelsMode = "eager",
        spare: SpareCompiler | None = None,
    ) -> None:
        self.name, self.explicit = name, explicit
        self.warmup, self.verify, self.tolerance_ulps = warmup, verify, tolerance_ulps
        self.graphs: GraphCache[CapturedGraph] = GraphCache(
            name=f"{name} decode steps",
            capture_after=capture_after,
            max_graphs=max_graphs,
            guards=[RelocationWatch(model)],
            on_invalidate=self._dropped,
        )
        self._state: dict[Signature, _Held] = {}  # per decode graph, what its replays need besides the graph
        # kernels="compiled": per decode graph, Inductor's program of the step compiling, swapped in, or why not
        self.kernels = (
            DecodeKernels(
                name=name, graphs=self.graphs, held=self._state.get, warmup=warmup, verify=verify, spare=spare
            )
            if kernels == "compiled"
            else None
        )
        self._serials: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()  # cache -> key number
        self._next_serial = itertools.count()
        self.prefills = self.replayed = 0
        self.eager_steps: collections.Counter[str] = collections.Counter()
        self.refused = 0  # steps run eager because their graph was refused for good
        self.refusal = ""  # the latest such refusal's reason

    def forget(self, cache: Any) -> None:
        """A cache dropped: the graphs captured on it go too."""
        for key, held in list(self._state.items()):
            if held.cache is cache:
                self._forget(key, "its cache was dropped")

    def _forget(self, key: Signature, why: str) -> None:
        """A decode graph and what its replays and its compile need go (its cache dropped or re-allocated)."""
        self.graphs.forget(key)
        self._state.pop(key, None)
        if self.kernels is not None:
            self.kernels.forget(key, why)

    def _dropped(self, why: str) -> None:
        """A validity check dropped the graphs (the weights replaced, the model moved): the compiles go with them."""
        if self.kernels is not None:
            self.kernels.cancel(why)

    def step(
        self, forward: Callable[..., Any], cache: Any, keyword: str, first: bool, args: tuple, kwargs: dict[str, Any]
    ) -> Any:
        """One forward of the routed model while ``generate()`` runs: the prompt's (``first``) eager; a decode step
        replayed, captured, or eager with its reason counted. A step that does not run on ``cache`` (``off_cache``:
        a model that keeps its decoding state in inputs of its own) can never replay: it is refused with its reason,
        so that ``DecodeGraphs`` sends its class through ``generate()`` as called, saying why."""
        if first:
            self.prefills += 1
            return forward(*args, **kwargs)  # the prompt's forward runs eager
        if args or kwargs.get(keyword) is not cache:  # off the cache: named only then (the replay path stays lean)
            elsewhere = off_cache(forward, cache, keyword, args, kwargs)
            if self.explicit:
                message = f"launchless: {self.name}: a decode step is not replayed as a graph: {elsewhere}"
                raise CaptureError(message, reason=elsewhere)
            return self._refused_step(elsewhere, forward, args, kwargs)
        ids = kwargs.get("input_ids")
        if ids is None or ids.dim() != 2 or ids.shape[1] != 1:
            return self._eager_step("a step of more than one token per sequence", forward, args, kwargs)
        tensors = {k: v for k, v in kwargs.items() if k != keyword}
        flat = flatten_inputs((), tensors)
        try:
            sig = signature_of(flat)
        except UnhashableInput as exc:
            return self._eager_step(str(exc), forward, args, kwargs)
        key = Signature(("decode", self.serial(cache), sig.structure), sig.leaves, sig.context)
        graphs = self.graphs
        graphs.validate(())
        graph = graphs.get(key)
        if graph is not None:
            held = self._state[key]
            if held.cache is cache and all(m.get(name) is t for m, name, t in held.slots):  # no sort per step
                if held.counters and not held.counters.fits(1):  # refused before decoding; kept as a guard
                    return self._eager_step("a sliding window fills at this step", forward, args, kwargs)
                self.replayed += 1
                result = _rebuilt(held.output, graph.replay_cloned(flat.leaves), cache)
                held.counters.advance(1)
                return result
            self._forget(key, "the cache holds other tensors")  # captured again below, on those the cache holds now
            graphs.log_once(
                "cache-tensors",
                logging.INFO,
                f"launchless: {self.name}: a static cache holds other tensors than its decode graph was captured on; "
                "the graph is captured again",
            )
        admission = Admission.CAPTURE if self.explicit else graphs.admit(key)
        if admission is Admission.CAPTURE:
            return self._capture_and_run(key, flat, forward, cache, keyword, kwargs)
        if admission is Admission.REFUSED:
            refusal = graphs.refusal(key)
            return self._refused_step(refusal.reason if refusal else "refused", forward, args, kwargs)
        if admission is Admission.OVER_CAPACITY:
            why = f"more decode shapes in use than max_graphs={graphs.max_graphs}"
            return self._eager_step(why, forward, args, kwargs)
        return self._eager_step(f"captured once seen {graphs.capture_after} times", forward, args, kwargs)

    def serial(self, cache: Any) -> int:
        """The cache's number in the graph keys: given once per cache object and never again -- an ``id()`` comes
        back for a new cache made where a freed one was, which would read as the shape of an evicted graph coming
        back (and stop the cache's eviction, ``core.churn``)."""
        try:
            serial = self._serials.get(cache)
            if serial is None:
                serial = self._serials[cache] = next(self._next_serial)
        except TypeError:  # a cache class that compares by value and cannot be hashed: its id, for want of better
            return -1 - id(cache)
        return serial

    def _eager_step(self, why: str, forward: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> Any:
        self.eager_steps[why] += 1
        return forward(*args, **kwargs)

    def _refused_step(self, why: str, forward: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> Any:
        """A step whose graph was refused for good, run eager: counted, so that ``DecodeGraphs`` can send a class of
        calls none of whose steps replays to ``generate()`` as called."""
        self.refused += 1
        self.refusal = why
        return self._eager_step(why, forward, args, kwargs)

    def _capture_and_run(
        self,
        key: Signature,
        flat: FlatInputs,
        forward: Callable[..., Any],
        cache: Any,
        keyword: str,
        kwargs: dict[str, Any],
    ) -> Any:
        output = _Output()
        lengths = CacheLengths(cache)

        def decode_step(**tensors: Any) -> Any:  # the step as eager runs it: what its graph is verified against
            return _without_cache(forward(**tensors, **{keyword: cache}), cache, output)

        def captured_step(**tensors: Any) -> Any:  # the cache's lengths read on the host answered on the device
            if not lengths:
                return decode_step(**tensors)
            with lengths:
                return decode_step(**tensors)

        held = cache_tensors(cache)
        counters = HostCounters.of(cache)
        if counters and not counters.fits(self.warmup + 2):  # the warm-up steps and the capture's own stay unfull
            return self._eager_step("too near a sliding window's end to capture", forward, (), kwargs)
        if not DevicePositions(cache).fits(self.warmup + 2):  # the warm-up steps write past the cache's end
            return self._eager_step("too near the static cache's end to capture", forward, (), kwargs)
        state = CacheState(held, counters)
        host = host_state(cache)
        # a layer no step writes (Mllama's cross-attention, text only) keeps the CPU tensors it was made with
        tensors = [*held, *(x for x in flat.leaves if isinstance(x, torch.Tensor))]
        device = next((t.device for t in tensors if t.is_cuda), tensors[0].device)
        try:
            with self.graphs.capturing(key) as pool:
                graph = capture(captured_step, flat, device=device, pool=pool, warmup=self.warmup)
                state.restore()  # the warm-up steps wrote the cache
                changed = sorted(k for k, v in host_state(cache).items() if host.get(k) != v)
                if changed:
                    raise CaptureFailed(
                        Stage.UNSUPPORTED,
                        None,
                        f"a decode step changes the cache's host-side state ({', '.join(changed)}), which a graph "
                        "cannot replay: this model's cache cannot be made static",
                    )
                report = self._verify(graph, decode_step, flat, state)
                if report.passed and counters:
                    counted = self._count_free(decode_step, flat, state)
                    if counted:
                        raise CaptureFailed(Stage.UNSUPPORTED, None, counted)
        except CaptureFailed as fail:
            state.restore()
            self.graphs.discard()
            transient = out_of_memory(fail.cause)
            blocker = (
                Blocking(str(fail))
                if fail.cause is None or transient
                else self._blocker(captured_step, key, flat, fail, device)
            )
            state.restore()  # naming the blocker ran the step again
            return self._refuse(key, fail.stage, blocker.why, forward, kwargs, transient=transient, blocker=blocker)
        if not report.passed:
            del graph
            self.graphs.discard()
            why = f"the decode graph differs from eager ({report.status}: {report.detail})"
            return self._refuse(key, Stage.VERIFICATION, why, forward, kwargs)
        self.graphs.keep(key, graph, report, flat.leaves)
        self._state[key] = _Held(cache, cache_slots(cache), output, counters)
        for gone in [k for k in self._state if k not in self.graphs.graphs]:  # evicted: their caches let go
            self._forget(gone, "its decode graph was evicted")
        if self.kernels is not None:
            self.kernels.start(key, forward, cache, keyword, flat)
        self.replayed += 1
        result = _rebuilt(output, graph.replay_cloned(flat.leaves), cache)
        counters.advance(1)
        return result

    def _blocker(
        self, step: Callable[..., Any], key: Signature, flat: FlatInputs, fail: CaptureFailed, device: torch.device
    ) -> Blocking:
        """What stopped a decode step's capture, as the forward's capture errors say it: the operation and its source
        line where a capture run again under a recorder finds them (``diagnose.messages``), and what PyTorch said."""
        said = str(fail.cause).strip().splitlines()[0].rstrip(".") if str(fail.cause).strip() else ""
        try:
            error = capture_error(step, f"{self.name} decode step", key, flat, fail, device)
        except Exception as exc:  # naming it is a courtesy: the refusal stands on what PyTorch said, in one line
            logging.getLogger("launchless").debug(
                "launchless: %s: the decode step's blocker could not be named: %s", self.name, one_line(exc)
            )
            kind = classify_message(str(fail.cause))
            location = locate_exception(fail.cause) if fail.cause is not None else None
            where = f" at {location}" if location else " (source line not found)"
            source = str(location) if location else None
            return Blocking(f"{kind}{where}" + (f"; PyTorch said: {said}" if said else ""), None, source)
        what = f"{error.reason} `{error.operation}`" if error.operation else error.reason
        where = f" at {error.source}" if error.source else " (source line not found)"
        source = str(error.source) if error.source else None
        return Blocking(f"{what}{where}" + (f"; PyTorch said: {said}" if said else ""), error.operation, source)

    @staticmethod
    def _count_free(fn: Callable[..., Any], flat: FlatInputs, state: CacheState) -> str:
        """Why the step reads its cache's host-side lengths for more than the branch and mask sizes a graph keeps
        (``cache_layers``); empty when the step run eager with every count one off leaves the same outputs and cache
        -- then advancing the counts after each replay is all a graph misses."""
        args, kwargs = flat.rebuild(list(flat.leaves))
        runs = []
        for counts in (state.counts, state.counters.shifted()):
            state.restore()
            state.counters.write(counts)
            runs.append((fn(*args, **kwargs), state.current()))
        state.restore()
        if identical(runs[0][0], runs[1][0]) and identical(runs[0][1], runs[1][1]):
            return ""
        return (
            "a decode step reads the length its cache counts on the host (run with that count one off, it leaves "
            "other outputs or cache): a graph would replay the count it was captured at"
        )

    def _verify(
        self, graph: CapturedGraph, fn: Callable[..., Any], flat: FlatInputs, state: CacheState
    ) -> VerifyReport:
        """The call's own step and the same step on other tokens (each id moved by one), from the same state."""
        if self.verify == "off":
            return VerifyReport(VerifyStatus.SKIPPED, True)
        probes = [list(flat.leaves), other_tokens_probe(flat)]
        return verify_step(graph, fn, flat, probes, state, mode=self.verify, tolerance_ulps=self.tolerance_ulps)

    def _refuse(
        self,
        key: Signature,
        stage: Stage,
        why: str,
        forward: Callable[..., Any],
        kwargs: dict[str, Any],
        *,
        transient: bool = False,
        blocker: Blocking | None = None,
    ) -> Any:
        """``blocker``: the operation and source line that stopped the capture, where they were found."""
        message = f"launchless: {self.name}: a decode step is not replayed as a graph: {why}"
        operation, source = (blocker.operation, blocker.source) if blocker else (None, None)
        error = CaptureError(message, reason=why, operation=operation, source=source)
        if self.explicit and not transient:
            raise error
        refusal = Refusal(stage, why, message, operation, source, error=error, transient=transient)
        self.graphs.refuse(key, refusal, level=logging.WARNING)
        if transient:
            return self._eager_step(why, forward, (), kwargs)
        return self._refused_step(why, forward, (), kwargs)

    def rows(self) -> list[dict[str, Any]]:
        """The graphs held, one row each, for ``graph_info()``."""

        def row(key: Signature, graph: CapturedGraph) -> dict[str, Any]:
            report = self.graphs.reports.get(key)
            return {
                "signature": key.describe(),
                "replays": graph.replays,
                "capture_ms": round(graph.capture_ms, 3),
                "pool_growth_bytes": graph.pool_growth,
                "input_bytes": graph.input_bytes,
                "verification": report.as_dict() if report else None,
            }

        return self.graphs.rows(row)


def _without_cache(output: Any, cache: Any, into: _Output) -> Any:
    """The step's output without the cache object (the graph returns tensors; the cache is state, not output)."""
    if not isinstance(output, Mapping):
        return output
    into.kind = type(output)
    into.cache_fields = tuple(k for k, v in output.items() if v is cache)
    return {k: v for k, v in output.items() if v is not cache}


def _rebuilt(output: _Output, tensors: Any, cache: Any) -> Any:
    """The step's output as the model returns it: the replayed tensors, and the cache where the model put it."""
    if output.kind is None:
        return tensors
    return output.kind(**tensors, **dict.fromkeys(output.cache_fields, cache))
