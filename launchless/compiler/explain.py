"""``launchless.explain(model, *inputs)``: what the compiler path does with each graph of a model, and why.

Per FX graph Dynamo produced: its size, the capture blockers found in it (with the user's source
line), whether it was captured, the variant the selective-graph step chose with the times that chose
it, pointer indirection's verdict, bytes copied per replay, and its kernel count. Over the model:
coverage, the share of one call's kernels that run inside graphs, and the library functions its compiled code
called rewritten to wait for the GPU once (``core.library_rewrites``), with where each stands.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import fx

from ..core import library_rewrites
from ..errors import one_line
from . import backend as _backend
from .compiled_graphs import CompiledGraphs
from .diagnose import diagnose


@dataclass
class GraphReport:
    name: str
    nodes: int
    blockers: list[str]
    info: dict | None  # CompiledGraphs.graph_info(); None when the graph was not graph-eligible
    kernels: int | None = None  # kernel nodes in its captured CUDA graph(s)
    note: str = ""


@dataclass
class Explanation:
    graphs: list[GraphReport] = field(default_factory=list)
    kernels_per_call: int | None = None  # all kernels of one call (inside and outside graphs)
    library_rewrites: dict[str, Any] = field(default_factory=dict)  # ``library_rewrites.info`` of those it called

    @property
    def coverage(self) -> float | None:
        """Share of one call's kernels that run inside CUDA graphs."""
        if not self.kernels_per_call or any(g.kernels is None and g.info and g.info["graphs"] for g in self.graphs):
            return None  # a captured graph whose kernels could not be counted (needs cuda-bindings)
        inside = sum(g.kernels or 0 for g in self.graphs)
        return min(1.0, inside / self.kernels_per_call)

    def table(self) -> Any:
        from rich.table import Table

        cov = self.coverage
        lines = (
            [f"coverage: {cov:.0%} of {self.kernels_per_call} kernels per call in graphs"] if cov is not None else []
        )
        lines += [
            f"{name} rewritten: " + ", ".join(f"{on} {state}" for on, state in info["states"].items())
            for name, info in self.library_rewrites.items()
        ]
        caption = "\n".join(lines)
        table = Table(title="launchless explain", caption=caption)
        for column in ("graph", "nodes", "kernels", "variant (ms)", "copied/replay", "blockers / notes"):
            table.add_column(column)
        for g in self.graphs:
            variants, copied = _variants(g.info)
            notes = "\n".join([*g.blockers, *([g.note] if g.note else [])]) or "none"
            table.add_row(g.name, str(g.nodes), str(g.kernels or "—"), variants, copied, notes)
        return table

    def __str__(self) -> str:
        from rich.console import Console

        console = Console(width=140, record=True)
        with console.capture() as captured:
            console.print(self.table())
        return captured.get()


def _variants(info: dict | None) -> tuple[str, str]:
    if not info or not info["graphs"]:
        reasons = [f["reason"] for f in (info or {}).get("fallbacks", [])]
        return ("no graph" + (f": {reasons[0]}" if reasons else ""), "—")
    lines, copied = [], []
    for g in info["graphs"]:
        times = ", ".join(f"{k} {v:.3f}" for k, v in g["times_ms"].items())
        lines.append(f"{g['variant']}" + (f" ({times})" if times else ""))
        if region := g.get("region_split"):  # a chain: no pointer indirection, by construction
            ops = ", ".join(dict.fromkeys(op["op"] for op in region["eager_ops"]))
            lines.append(f"{region['graphs']} graphs, {ops} run eager between them")
        elif g["indirection"] not in (None, "verified"):
            lines.append(f"PI: {g['indirection']}")
        copied.append(f"{g['bytes_copied_per_replay']:,} B")
    if info.get("calls_over_max_graphs") is not None:
        lines.append(f"more shapes than max_graphs: {info['calls_over_max_graphs']} calls without a graph")
    return "\n".join(lines), "\n".join(copied)


def _aten_blockers(gm: fx.GraphModule, example_inputs: list) -> list[str]:
    """Diagnosis on the aten graph (traced with fake tensors, node metadata kept for source lines)."""
    from .cgct import traced

    try:
        aten = traced(gm, example_inputs, "fake")
    except Exception as exc:  # diagnosis is best effort; the capture itself still decides
        return [f"(not diagnosed: {one_line(exc)})"]
    return [b.describe() for b in diagnose(aten)]


def _kernel_nodes(entry: Any) -> int | None:
    """Kernel nodes in the entry's CUDA graph (its template is kept when pointer indirection is available)."""
    try:
        from cuda.bindings import driver

        ok = driver.CUresult.CUDA_SUCCESS
        raw = entry.graph.graph.raw_cuda_graph()
        err, _, count = driver.cuGraphGetNodes(raw, 0)
        err2, nodes, _ = driver.cuGraphGetNodes(raw, count)
        if err != ok or err2 != ok:
            return None
        kernel = driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL
        return sum(1 for n in nodes if driver.cuGraphNodeGetType(n)[1] == kernel)
    except Exception:  # no cuda-bindings, or no template kept
        return None


def kernels_in_graphs(entries: Iterable[Any]) -> int | None:
    """Kernel nodes of a graph's CUDA graphs that replays run (a signature left without a graph by the
    selective step runs its kernels outside); None where a replayed graph's kernels could not be counted."""
    replayed = [e for e in entries if e.decision.variant != "no-graph"]
    counts = [_kernel_nodes(e) for e in replayed]
    if any(c is None for c in counts):
        return None
    return max(cast(list[int], counts), default=0)  # none is None past the check above


def _kernels_per_call(call: Callable[[], Any]) -> int | None:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA and "memcpy" not in e.name.lower()]
    return len(kernels) or None


def explain(
    model: Callable[..., Any],
    *inputs: Any,
    calls: int = 4,
    backend_options: dict[str, Any] | None = None,
    **kwargs: Any,
) -> Explanation:
    """Compile ``model`` with the launchless backend (``backend_options`` go to ``make_backend``, e.g.
    ``cgct=False``), run it ``calls`` times, and report per graph."""
    recorded: list[tuple[fx.GraphModule, list, Any]] = []
    rewrites_before = {r.name: (r.calls, dict(r.states)) for r in library_rewrites.REWRITES}
    inner_backend = _backend.make_backend(**(backend_options or {}))

    def recording(gm: fx.GraphModule, example_inputs: list) -> Any:
        compiled = inner_backend(gm, example_inputs)
        recorded.append((gm, list(example_inputs), compiled))
        return compiled

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=recording)
    with torch.no_grad():
        for _ in range(calls):
            compiled(*inputs, **kwargs)
        explanation = Explanation()
        for i, (gm, example_inputs, runner) in enumerate(recorded, 1):
            nodes = sum(1 for n in gm.graph.nodes if n.op == "call_function" or n.op == "call_method")
            report = GraphReport(f"graph {i}", nodes, _aten_blockers(gm, example_inputs), None)
            if isinstance(runner, CompiledGraphs):
                report.info = runner.graph_info()
                cgct = report.info.get("cgct")
                notes = [f"copied like an input (reassigned every call): {n}" for n in report.info["demoted_inputs"]]
                if index_inputs := ", ".join(report.info["index_inputs"]):
                    notes.append(f"verified on the call's own values (read as addresses): {index_inputs}")
                if cgct:
                    notes.insert(0, "; ".join(cgct["applied"]) or f"CGCT not applied: {cgct['why_not']}")
                report.note = "\n".join(notes)
                report.kernels = kernels_in_graphs(runner._graphs.graphs.values())
            else:
                report.note = "runs compiled without a CUDA graph (no CUDA input, or autograd)"
            explanation.graphs.append(report)
        if torch.cuda.is_available():
            explanation.kernels_per_call = _kernels_per_call(lambda: compiled(*inputs, **kwargs))
    explanation.library_rewrites = library_rewrites.info(  # those its calls ran, or proved or dropped
        [r for r in library_rewrites.REWRITES if (r.calls, r.states) != rewrites_before[r.name]]
    )
    return explanation
