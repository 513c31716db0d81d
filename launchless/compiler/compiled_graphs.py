"""The graphs of one compiled FX graph: capture per input signature, verification, variant choice, replay.

Parameters and buffers (inputs Dynamo marks as static addresses) are read in place -- no placeholder,
no copy -- and spot-checked per call (all of them after an event that can move them), as the runtime
does. Per signature the variant (no graph, graph, graph with pointer indirection) is measured once and
cached on disk, a production sample in 1000 re-deciding when it drifts (``variants``). A graph gets one CGCT attempt:
before it is compiled when it holds host tensors (``backend``), else when its capture fails on a host
copy; moved constants are kept current on every call. Everything that keeps a graph from being used is
one log line. A graph that fails to capture inside an operation that can run eager between two graphs (a custom
operation that reads its group sizes on the host and returns device tensors of fixed shape: a mixture of experts'
grouped matmul in float32) is captured as a chain of graphs around it, as the runtime does (``core.junctions``),
verified and timed like any graph.

``without_graphs()`` runs the compiled programs as they are, counting nothing: the reference that the graphs are
held to from outside (the differential harness), on the very kernels they replay.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from typing import Any, cast

import torch
from torch import fx

from ..core import capture as _capture
from ..core.cache import GraphCache, Refusal
from ..core.capture import CapturedGraph
from ..core.collectives import Agreement, agree
from ..core.junctions import JunctionChanged, SegmentedGraph, guard_note, op_names
from ..core.relocation import InputAddresses, picker
from ..core.signature import (
    FlatInputs,
    Signature,
    UnhashableInput,
    autocast_context,
    positional_rebuilder,
    signature_of_leaves,
)
from ..core.snapshot import RngState
from ..core.status import Admission, Stage
from ..core.verify import verify
from ..diagnose.blockers import COPY, classify_message, describe_failure
from .cgct import CgctResult, ConstantWatch, try_rewrite
from .decisions import Decision, DecisionCache, DriftMonitor
from .indirection import unavailable_reason
from .variants import GraphEntry, VariantChoice

log = logging.getLogger("launchless")
Compiler = Callable[[fx.GraphModule, list], Callable[..., Any]]
_WITHOUT_GRAPHS: ContextVar[bool] = ContextVar("launchless_without_graphs", default=False)


@contextlib.contextmanager
def without_graphs() -> Iterator[None]:
    """Inside the block, code compiled by the launchless backend runs its compiled programs as they are -- no CUDA
    graph captured or replayed, the calls counted toward nothing -- on the same kernels its graphs replay. That is the
    reference a graph is held to from outside: a second compilation of the same model is not, since Inductor
    benchmarks kernel configurations on the device at a program's first call, and configurations that sum in
    another order round otherwise."""
    token = _WITHOUT_GRAPHS.set(True)
    try:
        yield
    finally:
        _WITHOUT_GRAPHS.reset(token)


def capture_device(leaves: Sequence[Any]) -> torch.device | None:
    """The one CUDA device all tensor inputs live on, or None (a CPU input, or several devices)."""
    tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        return None
    (device,) = devices
    return device if device.type == "cuda" else None


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
        verify: str = "on",
        selective: bool = True,
        indirection: bool = True,
        cache: DecisionCache | None = None,
        graph_key: str = "",
        attributes: frozenset[int] = frozenset(),
        input_names: Sequence[str] = (),
        index_inputs: frozenset[int] = frozenset(),
        fixed_signature: bool = False,
    ) -> None:
        self.compiled, self.static, self.name = compiled, static, name
        # Dynamo's guards pin every input's shape, strides, dtype, device and requires_grad (``fixed_signature``):
        # once the one signature is decided to run without a graph, a call checks the autocast context alone
        self.fixed_signature = fixed_signature
        self._without_graph: tuple[Signature, GraphEntry] | None = None
        self.index_inputs = index_inputs  # float inputs read as addresses: verified on the call's own values
        # static inputs that are plain module attributes: no event announces their replacement, so their
        # addresses are compared on every call; one that moves again is demoted to a copied input
        self.attributes, self.input_names = attributes, list(input_names)
        self._moves: dict[int, int] = {}
        self.indirection = indirection and unavailable_reason() is None
        self.verify = verify
        self._variants = VariantChoice(
            name=name,
            selective=selective,
            cache=cache,
            graph_key=graph_key,
            verify_mode=verify,
            log_once=self._log_once,
        )
        self._addresses = InputAddresses((), describe=self._names)
        self._graphs: GraphCache[GraphEntry] = GraphCache(
            name=name,
            capture_after=capture_after,
            max_graphs=max_graphs,
            max_graphs_hint="max_graphs (make_backend(max_graphs=...) or options={'max_graphs': ...})",
            guards=[self._addresses],
        )
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

    def _watch_addresses(self, indices: frozenset[int]) -> None:
        """The static inputs whose addresses the graphs read: spot-checked per call, all after a relocation,
        module attributes every call (``core.relocation.InputAddresses``, the cache's validity check)."""
        guard = InputAddresses(indices, always=self.attributes, describe=self._names)
        self._graphs.guards = [guard if g is self._addresses else g for g in self._graphs.guards]
        self._addresses = guard

    def _key(self, args: tuple) -> Signature:
        """The signature of the inputs that change: Dynamo guards parameters' shapes and dtypes itself."""
        if len(args) != self._arity:
            self._arity = len(args)
            self._pick_dynamic = picker([i for i in range(len(args)) if i not in self.static])
            self._rebuild = positional_rebuilder(len(args))
        return signature_of_leaves(("compiled", self._arity), self._pick_dynamic(args))

    def __call__(self, *args: Any) -> Any:
        if self._watch is not None and (stale := self._watch.check(args)) is not None:
            self._undo_cgct(stale)
        if (decided := self._without_graph) is not None:  # the selective choice, for the only signature there is
            sig, entry = decided
            if sig.context == autocast_context() and self._graphs.graphs.get(sig) is entry:
                return self.compiled(*args)
            self._without_graph = None  # autocast or TF32 switched, or the decision dropped: the full path
        if _WITHOUT_GRAPHS.get():
            return self.compiled(*args)
        try:
            sig = self._key(args)
        except UnhashableInput as exc:
            self._graphs.log_once(
                f"unhashable:{exc}", logging.INFO, f"launchless: {self.name} runs without a CUDA graph: {exc}"
            )
            return self.compiled(*args)
        graphs = self._graphs
        entry = graphs.lookup(sig, args)
        if entry is not None and entry.decision.variant == "no-graph":  # the selective choice: Inductor's alone
            if self.fixed_signature:
                self._without_graph = (sig, entry)
            return self.compiled(*args)
        flat = FlatInputs(list(args), ("fast", len(args), ()), self._rebuild)
        if entry is not None:
            try:
                if entry.monitor is not None and entry.monitor.should_sample():
                    return self._variants.sampled(sig, entry, flat, args, self.compiled)
                return entry.replay(flat.leaves)
            except JunctionChanged as exc:
                return self._junction_changed(sig, args, exc)
        if self._addresses.moved and self._demote(self._addresses.moved):  # .to(), an attribute reassigned
            sig = self._key(args)  # an attribute became an input: it is part of the signature now
        admission = graphs.admit(sig)
        if admission is Admission.CAPTURE:
            return self._capture(sig, flat, args, RngState())
        return self.compiled(*args)  # refused, over capacity, or the first call (it compiles and autotunes)

    def _demote(self, moved: list[int]) -> bool:
        """Static inputs moved and every graph went (the cache's validity check). A module attribute that moves
        a second time is reassigned by the model on every call (e.g. ``self.anchors = anchors.to(x)``): from then
        on it is an input like the batch -- copied in, or pointed at -- instead of a capture per call. True if so."""
        self._addresses.moved = []
        for i in moved:
            self._moves[i] = self._moves.get(i, 0) + 1
        demote = frozenset(i for i in moved if i in self.attributes and self._moves[i] >= 2)
        if not demote:
            return False
        self.static = self.static - demote
        self._arity = -1  # the signature now includes them
        self._watch_addresses(self.static - self._unread)
        self._graphs.log_once(
            f"demote:{sorted(demote)}",
            logging.INFO,
            f"launchless: {self.name}: {self._names(demote)} gets a new tensor on every call (a module "
            "attribute assigned in forward); it is copied into the graph like an input from now on. "
            "Update it in place (copy_) to let the graph read it where it is",
        )
        return True

    def _names(self, indices: Sequence[int] | frozenset[int], most: int = 3) -> str:
        """Dynamo's names of some inputs, e.g. ``L_self_modules_fc_parameters_weight_``."""
        names = [self.input_names[i] if i < len(self.input_names) else f"input {i}" for i in sorted(indices)]
        return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")

    def _capture(self, sig: Signature, flat: Any, args: Sequence[Any], start: RngState) -> Any:
        """Capture, verify and time ``sig``'s graph, then the call's result: warm-ups, probes and timings draw random
        numbers too, so the generators go back to ``start`` (the call's own state) before the result is made."""
        device = capture_device([x for i, x in enumerate(flat.leaves) if i not in self._unread])
        if device is None:
            why = "its inputs are not all on one CUDA device (nothing to capture)"
            if self._host_inputs_are_static(flat.leaves):  # module attributes on the host: CGCT's case
                if self.source is not None and self._apply_cgct():
                    return self._capture(sig, flat, args, start)
                if self.cgct is not None and self.cgct.compiled is None:
                    why = f"a static input (a module attribute) is on the host; CGCT: {self.cgct.why_not}"
            start.rewind()
            return self._refuse(sig, args, Stage.NO_DEVICE, why)
        graphs = self._graphs
        try:
            with graphs.capturing(sig) as pool:
                graph = _capture.capture(
                    self.compiled,
                    flat,
                    device=device,
                    pool=pool,
                    warmup=1,
                    static=self.static,
                    keep_graph=self.indirection,
                    junction_pool=graphs.pool.replace,
                )
                groups = graph.collective_groups
                if groups:  # every rank captured? (verification runs collectives: all ranks or none)
                    agreement = agree(groups, ok=True, reason="", what="capture")
                    if not agreement.all_agree:
                        del graph
                        graphs.discard()
                        start.rewind()
                        return self._refuse_with_ranks(sig, args, Stage.CAPTURE, agreement, transient=False)
                report = verify(
                    graph,
                    self.compiled,
                    flat,
                    mode=self.verify,
                    keep=self.static,
                    from_call=self.index_inputs,
                    lockstep=bool(groups),
                )
                if groups:
                    agreement = agree(groups, ok=report.passed, reason=report.detail, what="verification")
                    if report.passed and not agreement.all_agree:
                        del graph
                        graphs.discard()
                        start.rewind()
                        return self._refuse_with_ranks(sig, args, Stage.VERIFICATION, agreement, transient=False)
        except _capture.CaptureFailed as fail:
            why = describe_failure(fail.cause, str(fail))
            if fail.no_junction:  # why no chain of graphs around the operation it failed in was kept
                why += f"; no graphs around it: {fail.no_junction}"
            transient = _capture.out_of_memory(fail.cause)
            if fail.collective_groups:  # the other ranks learn that this one refused; no CGCT retry alone
                agree(fail.collective_groups, ok=False, reason=why, what="capture", transient=transient)
                start.rewind()
                return self._refuse(sig, args, fail.stage, why, transient=transient)
            if classify_message(str(fail.cause or fail)) == COPY:
                if self.source is not None and self._apply_cgct():
                    return self._capture(sig, flat, args, start)  # once more, with the rewritten graph
                if self.cgct is not None and self.cgct.compiled is None:
                    why += f"; CGCT: {self.cgct.why_not}"
            start.rewind()
            return self._refuse(sig, args, fail.stage, why, transient=_capture.out_of_memory(fail.cause))
        if not report.passed:
            del graph
            graphs.discard()
            start.rewind()
            return self._refuse(
                sig, args, Stage.VERIFICATION, f"verification failed ({report.status}: {report.detail})"
            )
        entry = GraphEntry(graph, Decision("graph", {}), report)
        entry.device = device
        with graphs.capturing(sig):
            variants = self._variants
            if graph.junctions:  # pointer indirection rebinds one graph's inputs; a chain's are copied in
                entry.pi_reason = "a chain of graphs around operations run eager"
            elif self.indirection and not groups:
                variants.add_indirection(entry, flat, self.compiled, keep=self.static, from_call=self.index_inputs)
            if not groups:  # with collectives every rank replays the graph: a timing could differ between ranks
                entry.decision = variants.decide(sig, variants.runners(entry, flat, args, self.compiled), device)
        if entry.decision.variant in entry.decision.times_ms:
            entry.monitor = DriftMonitor(entry.decision)
        if entry.indirect is not None and entry.decision.variant != "graph+pi":
            entry.indirect.reset()
        graphs.keep(sig, entry, report, args)
        if graph.junctions:
            self._log_chain(sig, entry)
        start.rewind()
        if entry.decision.variant == "no-graph":
            return self.compiled(*args)
        try:
            return entry.replay(flat.leaves)
        except JunctionChanged as exc:
            return self._junction_changed(sig, args, exc)

    def _log_chain(self, sig: Signature, entry: GraphEntry) -> None:
        """One line for a chain kept: what runs eager between how many graphs, and the variant chosen."""
        graph = entry.graph
        ops = op_names(graph.junctions)
        site = graph.split_from.site if graph.split_from is not None else None
        where = f" at {site.source}" if site is not None and site.source else ""
        self._log_once(
            f"launchless: {self.name} {sig.describe()} cannot be captured as one graph ({ops}{where}); it replays "
            f"{len(cast(SegmentedGraph, graph.graph).graphs)} graphs with {len(graph.junctions)} call(s) of {ops} "
            f"run eager between them{guard_note(graph.junctions)}, verified against eager; variant chosen: "
            f"{entry.decision.variant}"
        )

    def _junction_changed(self, sig: Signature, args: Sequence[Any], exc: JunctionChanged) -> Any:
        """An operation run eager between graphs returned another shape, or a host read another value, than at the
        capture (nothing was handed out): the chain goes and the signature runs compiled, without a graph, from now
        on. ``exc`` names which."""
        self._graphs.forget(sig)
        return self._refuse(sig, args, Stage.CAPTURE, f"graphs around an operation run eager dropped: {exc}")

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
        self._graphs.drop_all()  # (none yet, unless another signature captured the graph as it was)
        self.compiled = result.compiled
        applied = "; ".join(a.describe() for a in result.report.applied)
        self._log_once(f"launchless: {self.name}: CGCT rewrote host copies, proven bit-identical: {applied}")

    def _undo_cgct(self, why: str) -> None:
        """A moved constant's source changed beyond an in-place refresh: back to the graph as compiled."""
        with self._graphs.lock:
            self.compiled, self._before_cgct, self._watch = self._before_cgct(), None, None
            self._watch_addresses(self.static)
            self._graphs.drop_all()
            self._log_once(f"launchless: {self.name}: CGCT undone ({why}); it runs as compiled, without the rewrite")

    def _refuse(self, sig: Signature, args: Sequence[Any], stage: Stage, why: str, *, transient: bool = False) -> Any:
        """``sig`` runs compiled without a graph, one log line per reason; out of GPU memory (``transient``) is
        a WARNING and the signature is tried again later."""
        message = f"launchless: {self.name} {sig.describe()} runs without a CUDA graph: {why}"
        self._graphs.refuse(
            sig,
            Refusal(stage, why, message + ("; trying again later" if transient else ""), transient=transient),
            level=logging.WARNING if transient else logging.INFO,
        )
        return self.compiled(*args)

    def _refuse_with_ranks(
        self, sig: Signature, args: Sequence[Any], stage: Stage, agreement: Agreement, *, transient: bool
    ) -> Any:
        """Another rank refused this graph (a forward with collectives): every rank runs it without one."""
        me = torch.distributed.get_rank()
        others = {rank: why for rank, why in agreement.refusals.items() if rank != me}
        if not others:
            return self.compiled(*args)  # only this rank refused: its own refusal is recorded already
        why = "; ".join(f"rank {rank}: {text}" for rank, text in sorted(others.items()))
        return self._refuse(
            sig, args, stage, f"another rank's {stage} failed ({why})", transient=transient or agreement.transient
        )

    def _log_once(self, message: str) -> None:
        self._graphs.log_once(message, logging.INFO, message)

    def _row(self, sig: Signature, e: GraphEntry) -> dict[str, Any]:
        return {
            "signature": sig.describe(),
            "variant": e.decision.variant,
            "times_ms": dict(e.decision.times_ms),
            "replays": e.graph.replays + (e.indirect.replays if e.indirect else 0),
            "verification": e.report.as_dict(),
            "indirection": "verified" if e.indirect is not None else e.pi_reason,
            "bytes_copied_per_replay": e.copied_bytes(),
            "bytes_copied_per_replay_with_pi": None  # the PI variant's, chosen or not
            if e.indirect is None
            else e.indirect.copied_bytes // max(1, e.indirect.replays),
            **self._region_row(e.graph),
        }

    @staticmethod
    def _region_row(graph: CapturedGraph) -> dict[str, Any]:
        """For a chain: its graphs and the operations run eager between them (the runtime's ``region_split``)."""
        if not graph.junctions:
            return {}
        site = graph.split_from.site if graph.split_from is not None else None
        return {
            "region_split": {
                "graphs": len(cast(SegmentedGraph, graph.graph).graphs),
                "eager_ops": [j.row() for j in graph.junctions],
                "reason": site.name if site is not None else None,
                "source": site.source if site is not None else None,
            }
        }

    def graph_info(self) -> dict:
        """Per signature: the variant chosen and the times that chose it, verification, bytes copied."""
        graphs = self._graphs
        return {
            "name": self.name,
            **graphs.summary(),
            "static_inputs": len(self.static),
            # attributes reassigned every call (only a demotion takes an input out of the static ones)
            "demoted_inputs": [self._names([i], 1) for i in sorted(self.attributes - self.static)],
            # floats read as addresses (a box's batch index): verified on the call's own values, not random ones
            "index_inputs": [self._names([i], 1) for i in sorted(self.index_inputs)],
            "graphs": graphs.rows(self._row),
            "fallbacks": graphs.fallbacks(lambda sig: sig.describe()),
            "cgct": None
            if self.cgct is None
            else {
                "applied": [a.describe() for a in (self.cgct.report.applied if self.cgct.report else [])],
                "why_not": self.cgct.why_not,
                "in_use": self._before_cgct is not None,  # applied and not undone
                "constants_refreshed": self._watch.refreshed if self._watch is not None else 0,
            },
        }
