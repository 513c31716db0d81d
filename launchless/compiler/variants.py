"""Which variant of a compiled FX graph runs for one input signature: the compiled code without a graph, its CUDA
graph, or the graph with pointer indirection (PI) in place of copying the inputs that move.

A graph is not always faster (GraCE saw 29 of 116 slow down), and PI pays a rebinding where it saves a copy: each
variant is timed once on the signature's own call (``select.measure``) and the fastest kept, the decision cached on
disk (``decisions.DecisionCache``, keyed by graph, shapes, GPU and versions). One production call in a thousand is
timed again; a variant that drifted from its decided time is decided anew.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..core.capture import CapturedGraph
from ..core.signature import FlatInputs, Signature
from ..core.verify import verify
from . import select
from .decisions import Decision, DecisionCache, DecisionKey, DriftMonitor
from .indirection import IndirectGraph, IndirectionUnavailable


class GraphEntry:
    """What runs for one input signature: its graph, the variant chosen and, with PI, the indirect replay."""

    def __init__(self, graph: CapturedGraph, decision: Decision, report: Any) -> None:
        self.graph, self.decision, self.report = graph, decision, report
        self.indirect: IndirectGraph | None = None
        self.pi_reason: str | None = None
        self.device: torch.device | None = None
        self.monitor: DriftMonitor | None = None  # only for measured decisions

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


class VariantChoice:
    """The variants of one compiled FX graph's graphs, verified, timed and decided.

    ``selective`` False keeps the graph without timing it; ``cache`` None keeps decisions in memory only;
    ``graph_key`` names the FX graph in the cache's keys; ``log_once`` says a drift once."""

    def __init__(
        self,
        *,
        name: str,
        selective: bool,
        cache: DecisionCache | None,
        graph_key: str,
        verify_mode: str,
        log_once: Callable[[str], None],
    ) -> None:
        self.name, self.selective, self.cache, self.graph_key = name, selective, cache, graph_key
        self.verify_mode, self._log_once = verify_mode, log_once

    def add_indirection(
        self,
        entry: GraphEntry,
        flat: FlatInputs,
        compiled: Callable[..., Any],
        *,
        keep: frozenset[int],
        from_call: frozenset[int],
    ) -> None:
        """Pointer indirection for ``entry``'s graph, verified like the graph itself; on failure, why not."""
        try:
            entry.indirect = IndirectGraph(entry.graph)
        except IndirectionUnavailable as exc:
            entry.pi_reason = str(exc)
            return
        report = verify(entry.indirect, compiled, flat, mode=self.verify_mode, keep=keep, from_call=from_call)
        entry.indirect.reset()
        if not report.passed:
            entry.pi_reason = f"verification failed ({report.status}: {report.detail})"
            entry.indirect = None

    @staticmethod
    def runners(
        entry: GraphEntry, flat: FlatInputs, args: Sequence[Any], compiled: Callable[..., Any]
    ) -> dict[str, Callable[[], Any]]:
        """The variants to time on this call: compiled, graph, and graph+PI (on inputs that move every call)."""
        runners = {"no-graph": lambda: compiled(*args), "graph": lambda: entry.graph.replay_cloned(flat.leaves)}
        if entry.indirect is not None:
            indirect, inputs = entry.indirect, select.alternating(flat.leaves, entry.indirect.slots)
            runners["graph+pi"] = lambda: indirect.replay_cloned(inputs())
        return runners

    def decide(self, sig: Signature, runners: dict[str, Callable[[], Any]], device: torch.device) -> Decision:
        """The variant for ``sig``: cached, or measured and cached; the graph unless ``selective``."""
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

    def sampled(
        self, sig: Signature, entry: GraphEntry, flat: FlatInputs, args: Sequence[Any], compiled: Callable[..., Any]
    ) -> Any:
        """A production call timed with CUDA events; a drifted variant is decided again."""
        monitor = entry.monitor
        assert monitor is not None and entry.device is not None  # sampled only where a decision was measured
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = entry.replay(flat.leaves)
        end.record()
        end.synchronize()
        monitor.record(start.elapsed_time(end))
        if monitor.drifted():
            old = entry.decision.variant
            if entry.indirect is not None:
                entry.indirect.reset()
            entry.decision = select.measure(self.runners(entry, flat, args, compiled), entry.device)
            if self.cache is not None:
                self.cache.put(DecisionKey.current(self.graph_key, sig.describe()), entry.decision)
            monitor.reset(entry.decision)
            if entry.indirect is not None and entry.decision.variant != "graph+pi":
                entry.indirect.reset()
            self._log_once(f"launchless: {self.name} {sig.describe()}: {old} drifted; now {entry.decision.variant}")
        return out
