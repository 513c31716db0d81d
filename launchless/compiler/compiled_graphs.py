"""The graphs of one compiled FX graph: capture per input signature, verification, variant choice, replay.

Parameters and buffers (inputs Dynamo marks as static addresses) are read in place -- no placeholder,
no copy -- and spot-checked per call (all of them after an event that can move them), as the runtime
does. Per signature the variant (no graph, graph, graph with pointer indirection) is measured once and
cached on disk; a production sample in 1000 re-decides when it drifts. A graph gets one CGCT attempt:
before it is compiled when it holds host tensors (``backend``), else when its capture fails on a host
copy; moved constants are kept current on every call. Everything that keeps a graph from being used is
one log line.
"""

from __future__ import annotations

import logging
import operator
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx

from ..core import capture as _capture
from ..core import relocation
from ..core.churn import ShapeChurn
from ..core.signature import FlatInputs, Signature, UnhashableInput, positional_rebuilder, signature_of_leaves
from ..core.verify import verify
from ..diagnose.blockers import COPY, classify_message, describe_failure
from . import select
from .cgct import CgctResult, ConstantWatch, try_rewrite
from .decisions import Decision, DecisionCache, DecisionKey, DriftMonitor
from .indirection import IndirectGraph, IndirectionUnavailable, unavailable_reason

log = logging.getLogger("launchless")
_ptrs_equal = relocation.ptrs_equal
_MAX_TRACKED = 4096  # shapes counted towards capture_after, and refused ones: oldest forgotten first
Compiler = Callable[[fx.GraphModule, list], Callable[..., Any]]


def capture_device(leaves: Sequence[Any]) -> torch.device | None:
    """The one CUDA device all tensor inputs live on, or None (a CPU input, or several devices)."""
    tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        return None
    (device,) = devices
    return device if device.type == "cuda" else None


class _Entry:
    """What runs for one input signature: the chosen variant, its replay, and the static addresses."""

    def __init__(self, graph: _capture.CapturedGraph, ptrs: list[int], decision: Decision, report: Any) -> None:
        self.graph, self.ptrs, self.decision, self.report = graph, ptrs, decision, report
        self.indirect: IndirectGraph | None = None
        self.pi_reason: str | None = None
        self.device: torch.device | None = None
        self.monitor: DriftMonitor | None = None  # only for measured decisions
        self.epoch = relocation.epoch()  # parameters are compared in full only when this moved
        self.spot_ptrs: list[int] | None = None
        self.always_ptrs: list[int] | None = None

    def replay(self, leaves: list) -> Any:
        if self.decision.variant == "graph+pi" and self.indirect is not None:
            return self.indirect.replay_cloned(leaves)
        return self.graph.replay_cloned(leaves)

    def copied_bytes(self) -> int:
        """Bytes copied into placeholders per replay of the chosen variant."""
        if self.decision.variant == "no-graph":
            return 0
        if self.decision.variant == "graph+pi" and self.indirect is not None:
            return self.indirect.copied_bytes // max(1, self.indirect.replays)
        return sum(self.graph.static_leaves[i].nbytes for i in self.graph.tensor_slots)


class CompiledGraphs:
    """One compiled FX graph and its CUDA graphs, one per input signature (LRU, ``max_graphs``).

    With ``selective`` (default) each signature's variant -- no graph, graph, graph with pointer
    indirection -- is measured once and cached on disk; ``cache`` None keeps decisions in memory."""

    def __init__(
        self,
        compiled: Callable[..., Any],
        static: frozenset[int],
        *,
        name: str,
        capture_after: int = 2,
        max_graphs: int = 8,
        verify_mode: str = "on",
        selective: bool = True,
        indirection: bool = True,
        cache: DecisionCache | None = None,
        graph_key: str = "",
        attributes: frozenset[int] = frozenset(),
        input_names: Sequence[str] = (),
        index_inputs: frozenset[int] = frozenset(),
    ) -> None:
        self.compiled, self.static, self.name = compiled, static, name
        self.index_inputs = index_inputs  # float inputs read as addresses: verified on the call's own values
        # static inputs that are plain module attributes: no event announces their replacement, so their
        # addresses are compared on every call; one that moves again is demoted to a copied input
        self.attributes, self.input_names = attributes, list(input_names)
        self._moves: dict[int, int] = {}
        self.selective, self.cache, self.graph_key = selective, cache, graph_key
        self.indirection = indirection and unavailable_reason() is None
        self.capture_after, self.max_graphs, self.verify_mode = capture_after, max_graphs, verify_mode
        self._graphs: OrderedDict[Signature, _Entry] = OrderedDict()
        self._seen: dict[Signature, int] = {}
        self._churn = ShapeChurn()  # more shapes in use than max_graphs: keep the graphs held, capture no more
        self._refused: dict[Signature, str] = {}
        self._logged: set[str] = set()
        self._pool: Any = None
        self._lock = threading.RLock()
        self.source: tuple[fx.GraphModule, list, Compiler] | None = None  # for CGCT; dropped after one try
        self.cgct: CgctResult | None = None
        self._watch: ConstantWatch | None = None  # CGCT's device copies of host constants, kept current
        self._before_cgct: Callable[[], Callable[..., Any]] | None = None  # compiles (or returns) the graph as it was
        self._watch_addresses(static)
        self._arity = -1
        self._pick_dynamic: Callable[[Sequence[Any]], list] = list
        self._rebuild: Callable[[list], tuple[tuple, dict]] = positional_rebuilder(0)

    @property
    def _unread(self) -> frozenset[int]:
        """Static host inputs the graph in use no longer reads (CGCT replaced them by watched device copies)."""
        return self.cgct.unread_inputs if self._before_cgct is not None else frozenset()

    def _drop_graphs(self) -> None:
        """Every graph goes, and their pool with them: PyTorch asserts when capturing into a pool none of whose
        graphs remain. The next calls capture again."""
        self._graphs.clear()
        self._pool = None
        self._seen.clear()
        self._churn.reset()

    def _watch_addresses(self, indices: frozenset[int]) -> None:
        """The static inputs whose addresses the graphs read: spot-checked per call, all after a relocation."""
        order = sorted(indices)
        self._static_order = order
        self._pick_static = _picker(order)
        self._static_index = list(range(len(order)))
        always = [k for k, i in enumerate(order) if i in self.attributes]
        self._always_positions = always  # positions within the static inputs checked on every call, in full
        self._pick_always = _picker([order[k] for k in always])
        self._always_index = list(range(len(always)))
        spot = relocation.spread(len(order))
        self._spot_positions = spot  # positions within the static inputs checked on every call
        self._pick_spot = _picker([order[i] for i in spot])
        self._spot_index = list(range(len(spot)))

    def _key(self, args: tuple) -> Signature:
        """The signature of the inputs that change: Dynamo guards parameters' shapes and dtypes itself."""
        if len(args) != self._arity:
            self._arity = len(args)
            self._pick_dynamic = _picker([i for i in range(len(args)) if i not in self.static])
            self._rebuild = positional_rebuilder(len(args))
        return signature_of_leaves(("compiled", self._arity), self._pick_dynamic(args))

    def __call__(self, *args: Any) -> Any:
        if self._watch is not None and (stale := self._watch.check(args)) is not None:
            self._undo_cgct(stale)
        try:
            sig = self._key(args)
        except UnhashableInput as exc:
            self._log_once(f"launchless: {self.name} runs without a CUDA graph: {exc}")
            return self.compiled(*args)
        flat = FlatInputs(list(args), ("fast", len(args), ()), self._rebuild)
        entry = self._graphs.get(sig)
        if entry is not None:
            if entry.decision.variant == "no-graph":
                return self.compiled(*args)
            if self._static_unmoved(args, entry):
                self._graphs.move_to_end(sig)
                if entry.monitor is not None and entry.monitor.should_sample():
                    return self._sampled(sig, entry, flat, args)
                return entry.replay(flat.leaves)
            if self._static_moved(args, entry):  # .to(), load_state_dict(assign=True), an attribute reassigned
                sig = self._key(args)  # an attribute became an input: it is part of the signature now
        if sig in self._refused:
            return self.compiled(*args)
        self._seen[sig] = count = self._seen.get(sig, 0) + 1
        if len(self._seen) > _MAX_TRACKED:  # shapes seen once and never again (a dynamic length) are forgotten
            del self._seen[next(iter(self._seen))]
        if count < self.capture_after:
            return self.compiled(*args)  # the first call compiles and autotunes; capture comes after
        if not self._churn.admits(sig, len(self._graphs), self.max_graphs):
            self._log_once(self._churn.message(self.name, self.max_graphs, "max_graphs (make_backend(max_graphs=...))"))
            return self.compiled(*args)
        return self._capture(sig, flat, args)

    def _static_leaves(self, args: Sequence[Any]) -> list:
        return self._pick_static(args)

    def _static_unmoved(self, args: Sequence[Any], entry: _Entry) -> bool:
        """Parameters still where the graph reads them: a spot check of 8 per call, all of them after any
        event that can move them (``Module._apply``, parameter/buffer registration) -- as the runtime does."""
        if not entry.ptrs:
            return True
        if self._always_positions:
            if entry.always_ptrs is None:
                entry.always_ptrs = [entry.ptrs[k] for k in self._always_positions]
            if not _ptrs_equal(self._pick_always(args), entry.always_ptrs, self._always_index):
                return False
        if entry.epoch == relocation.epoch():
            spot = [entry.ptrs[i] for i in self._spot_positions] if entry.spot_ptrs is None else entry.spot_ptrs
            entry.spot_ptrs = spot
            return _ptrs_equal(self._pick_spot(args), spot, self._spot_index)
        if _ptrs_equal(self._static_leaves(args), entry.ptrs, self._static_index):
            entry.epoch = relocation.epoch()
            return True
        return False

    def _static_moved(self, args: Sequence[Any], entry: _Entry) -> bool:
        """Static inputs moved: every graph is captured again. A module attribute that moves a second time is
        reassigned by the model on every call (e.g. ``self.anchors = anchors.to(x)``): from then on it is an
        input like the batch -- copied in, or pointed at -- instead of a capture per call. True if so."""
        now = [t.data_ptr() for t in self._static_leaves(args)]
        moved = [i for i, a, b in zip(self._static_order, now, entry.ptrs, strict=True) if a != b]
        for i in moved:
            self._moves[i] = self._moves.get(i, 0) + 1
        demote = frozenset(i for i in moved if i in self.attributes and self._moves[i] >= 2)
        self._drop_graphs()
        if demote:
            self.static = self.static - demote
            self._arity = -1  # the signature now includes them
            self._watch_addresses(self.static - self._unread)
            self._log_once(
                f"launchless: {self.name}: {self._names(demote)} gets a new tensor on every call (a module "
                "attribute assigned in forward); it is copied into the graph like an input from now on. "
                "Update it in place (copy_) to let the graph read it where it is"
            )
            return True
        self._log_once(f"launchless: {self.name}: {self._names(moved)} moved; its graphs are captured again")
        return False

    def _names(self, indices: Sequence[int] | frozenset[int], most: int = 3) -> str:
        """Dynamo's names of some inputs, e.g. ``L_self_modules_fc_parameters_weight_``."""
        names = [self.input_names[i] if i < len(self.input_names) else f"input {i}" for i in sorted(indices)]
        return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")

    def _capture(self, sig: Signature, flat: Any, args: Sequence[Any]) -> Any:
        device = capture_device([x for i, x in enumerate(flat.leaves) if i not in self._unread])
        if device is None:
            why = "its inputs are not all on one CUDA device (nothing to capture)"
            if self._host_inputs_are_static(flat.leaves):  # module attributes on the host: CGCT's case
                if self.source is not None and self._apply_cgct():
                    return self._capture(sig, flat, args)
                if self.cgct is not None and self.cgct.compiled is None:
                    why = f"a static input (a module attribute) is on the host; CGCT: {self.cgct.why_not}"
            return self._refuse(sig, args, why)
        with self._lock, _capture.CAPTURE_LOCK:
            if self._pool is None:
                self._pool = _capture.new_pool()
            try:
                graph = _capture.capture(
                    self.compiled,
                    flat,
                    device=device,
                    pool=self._pool,
                    warmup=1,
                    static=self.static,
                    keep_graph=self.indirection,
                )
            except _capture.CaptureFailed as fail:
                if fail.stage == "capture":
                    self._pool = None
                why = describe_failure(fail.cause, str(fail))
                if classify_message(str(fail.cause or fail)) == COPY:
                    if self.source is not None and self._apply_cgct():
                        return self._capture(sig, flat, args)  # once more, with the rewritten graph
                    if self.cgct is not None and self.cgct.compiled is None:
                        why += f"; CGCT: {self.cgct.why_not}"
                return self._refuse(sig, args, why)
            report = verify(
                graph, self.compiled, flat, mode=self.verify_mode, keep=self.static, from_call=self.index_inputs
            )
            if not report.passed:
                del graph
                if not self._graphs:
                    self._pool = None
                return self._refuse(sig, args, f"verification failed ({report.status}: {report.detail})")
            ptrs = [t.data_ptr() for t in self._static_leaves(args)]
            entry = _Entry(graph, ptrs, Decision("graph", {}), report)
            entry.device = device
            if self.indirection:
                self._add_indirection(entry, flat)
            entry.decision = self._decide(sig, self._runners(entry, flat, args), device)
            if entry.decision.variant in entry.decision.times_ms:
                entry.monitor = DriftMonitor(entry.decision)
            if entry.indirect is not None and entry.decision.variant != "graph+pi":
                entry.indirect.reset()
            self._graphs[sig] = entry
            self._seen.pop(sig, None)
            while len(self._graphs) > self.max_graphs:
                self._churn.evicted(self._graphs.popitem(last=False)[0])
                self._log_once(f"launchless: {self.name}: more than max_graphs={self.max_graphs} shapes; evicting")
            return self.compiled(*args) if entry.decision.variant == "no-graph" else entry.replay(flat.leaves)

    def _host_inputs_are_static(self, leaves: Sequence[Any]) -> bool:
        """Every host tensor input is static, and the others share one CUDA device: a case for CGCT."""
        host = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor) and not x.is_cuda]
        rest = [x for i, x in enumerate(leaves) if i not in host]
        return bool(host) and all(i in self.static for i in host) and capture_device(rest) is not None

    def _apply_cgct(self) -> bool:
        """Rewrite the host copies that stopped capture (once per graph); True when the graph was replaced."""
        gm, example_inputs, inner = self.source
        compiled = self.compiled
        self.adopt_cgct(try_rewrite(gm, example_inputs, self.static, inner), lambda: compiled)
        return self._before_cgct is not None

    def adopt_cgct(self, result: CgctResult, original: Callable[[], Callable[..., Any]]) -> None:
        """CGCT's outcome for this graph (it is tried once); ``original`` gives the graph as it was, should the
        rewrite have to be undone."""
        self.source = None
        self.cgct = result
        if result.compiled is None:
            return
        self._before_cgct = original
        self._watch = ConstantWatch(result.moved) if result.moved else None
        self._watch_addresses(self.static - self._unread)  # an unread input may move: its copy is watched
        self._drop_graphs()  # (none yet, unless another signature captured the graph as it was)
        self.compiled = result.compiled
        applied = "; ".join(a.describe() for a in result.report.applied)
        self._log_once(f"launchless: {self.name}: CGCT rewrote host copies, proven bit-identical: {applied}")

    def _undo_cgct(self, why: str) -> None:
        """A moved constant's source changed beyond an in-place refresh: back to the graph as compiled."""
        with self._lock:
            self.compiled, self._before_cgct, self._watch = self._before_cgct(), None, None
            self._watch_addresses(self.static)
            self._drop_graphs()
            self._refused.clear()
            self._log_once(f"launchless: {self.name}: CGCT undone ({why}); it runs as compiled, without the rewrite")

    def _add_indirection(self, entry: _Entry, flat: Any) -> None:
        """Pointer indirection for this graph, verified like the graph itself; on failure, why not."""
        try:
            entry.indirect = IndirectGraph(entry.graph)
        except IndirectionUnavailable as exc:
            entry.pi_reason = str(exc)
            return
        report = verify(
            entry.indirect, self.compiled, flat, mode=self.verify_mode, keep=self.static, from_call=self.index_inputs
        )
        entry.indirect.reset()
        if not report.passed:
            entry.pi_reason = f"verification failed ({report.status}: {report.detail})"
            entry.indirect = None

    def _runners(self, entry: _Entry, flat: Any, args: Sequence[Any]) -> dict[str, Callable[[], Any]]:
        """The variants to time on this call: compiled, graph, and graph+PI (on inputs that move every call)."""
        runners = {"no-graph": lambda: self.compiled(*args), "graph": lambda: entry.graph.replay_cloned(flat.leaves)}
        if entry.indirect is not None:
            indirect, inputs = entry.indirect, select.alternating(flat.leaves, entry.indirect.slots)
            runners["graph+pi"] = lambda: indirect.replay_cloned(inputs())
        return runners

    def _decide(self, sig: Signature, runners: dict, device: torch.device) -> Decision:
        if not self.selective:
            return Decision("graph", {})
        key = DecisionKey.current(self.graph_key, sig.describe())
        cached = self.cache.get(key) if self.cache is not None else None
        if cached is not None and cached.variant in runners:
            return cached
        decision = select.measure(runners, device)
        if self.cache is not None:
            self.cache.put(key, decision)
        return decision

    def _sampled(self, sig: Signature, entry: _Entry, flat: Any, args: Sequence[Any]) -> Any:
        """A production call timed with CUDA events; a drifted variant is decided again."""
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = entry.replay(flat.leaves)
        end.record()
        end.synchronize()
        entry.monitor.record(start.elapsed_time(end))
        if entry.monitor.drifted():
            old = entry.decision.variant
            if entry.indirect is not None:
                entry.indirect.reset()
            entry.decision = select.measure(self._runners(entry, flat, args), entry.device)
            if self.cache is not None:
                self.cache.put(DecisionKey.current(self.graph_key, sig.describe()), entry.decision)
            entry.monitor.reset(entry.decision)
            if entry.indirect is not None and entry.decision.variant != "graph+pi":
                entry.indirect.reset()
            self._log_once(f"launchless: {self.name} {sig.describe()}: {old} drifted; now {entry.decision.variant}")
        return out

    def _refuse(self, sig: Signature, args: Sequence[Any], why: str) -> Any:
        self._refused[sig] = why
        if len(self._refused) > _MAX_TRACKED:  # one per shape: a dynamic length must not grow it forever
            del self._refused[next(iter(self._refused))]
        self._log_once(f"launchless: {self.name} {sig.describe()} runs without a CUDA graph: {why}")
        return self.compiled(*args)

    def _log_once(self, message: str) -> None:
        if message not in self._logged:
            self._logged.add(message)
            log.info(message)

    def graph_info(self) -> dict:
        """Per signature: the variant chosen and the times that chose it, verification, bytes copied."""
        return {
            "name": self.name,
            "static_inputs": len(self.static),
            # attributes reassigned every call (only a demotion takes an input out of the static ones)
            "demoted_inputs": [self._names([i], 1) for i in sorted(self.attributes - self.static)],
            # floats read as addresses (a box's batch index): verified on the call's own values, not random ones
            "index_inputs": [self._names([i], 1) for i in sorted(self.index_inputs)],
            "graphs": [
                {
                    "signature": s.describe(),
                    "variant": e.decision.variant,
                    "times_ms": dict(e.decision.times_ms),
                    "replays": e.graph.replays + (e.indirect.replays if e.indirect else 0),
                    "verification": e.report.status,
                    "indirection": "verified" if e.indirect is not None else e.pi_reason,
                    "bytes_copied_per_replay": e.copied_bytes(),
                    "bytes_copied_per_replay_with_pi": None  # the PI variant's, chosen or not
                    if e.indirect is None
                    else e.indirect.copied_bytes // max(1, e.indirect.replays),
                }
                for s, e in self._graphs.items()
            ],
            "fallbacks": [{"signature": s.describe(), "reason": r} for s, r in self._refused.items()],
            # more shapes in use than max_graphs: eviction stopped, and this many calls ran without a graph
            "calls_over_max_graphs": self._churn.calls_without_graph if self._churn.stop_evicting else None,
            "cgct": None
            if self.cgct is None
            else {
                "applied": [a.describe() for a in (self.cgct.report.applied if self.cgct.report else [])],
                "why_not": self.cgct.why_not,
                "in_use": self._before_cgct is not None,  # applied and not undone
                "constants_refreshed": self._watch.refreshed if self._watch is not None else 0,
            },
        }


def _picker(indices: list[int]) -> Callable[[Sequence[Any]], list]:
    """A fast ``lambda seq: [seq[i] for i in indices]`` (operator.itemgetter, always returning a list)."""
    if not indices:
        return lambda seq: []
    if len(indices) == 1:
        (i,) = indices
        return lambda seq: [seq[i]]
    get = operator.itemgetter(*indices)
    return lambda seq: list(get(seq))
