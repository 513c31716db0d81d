"""What launchless did with a workload, for the bench report.

A speed figure alone does not say why a mode is slow on a model: graphs refused, graphs the selective step left
without a CUDA graph, Dynamo recompiling, or a forward that runs split. The ``launchless-compile`` mode records,
per workload, a summary of every ``CompiledGraphs`` the backend made and Dynamo's graph-break count; the
``launchless`` mode whether the forward replays whole, runs split (its pieces and their share of the GPU time)
or runs eager, and why.
"""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ..what_ran import Ran, SplitBy, what_ran
from .stats import GRAPH_PATH, LAUNCHLESS, LAUNCHLESS_COMPILE


def summarize(infos: Iterable[Mapping[str, Any]], graph_breaks: int | None) -> dict[str, Any]:
    """One workload's ``CompiledGraphs.graph_info()`` dicts as counts: graphs per variant, refusals by reason."""
    infos = list(infos)
    variants: Counter[str] = Counter()
    refused: Counter[str] = Counter()
    replays = cgct = demoted = over = chains = 0
    per_graph = []
    for info in infos:
        demoted += len(info.get("demoted_inputs", ()))
        for graph in info["graphs"]:
            variants[graph["variant"]] += 1
            replays += graph["replays"]
            chains += bool(graph.get("region_split"))
            per_graph.append(
                {
                    "graph": info["name"],
                    "signature": graph["signature"],
                    "variant": graph["variant"],
                    "times_ms": graph.get("times_ms", {}),  # what the selective step measured
                    "replays": graph["replays"],
                    "bytes_copied_per_replay": graph.get("bytes_copied_per_replay"),
                }
            )
        refused.update(f["reason"] for f in info["fallbacks"])
        cgct += bool(info.get("cgct") and info["cgct"]["in_use"])
        over += info.get("calls_over_max_graphs") is not None
    return {
        "dynamo_graphs": len(infos),  # graphs with CUDA inputs that Dynamo handed to the backend
        "variants": dict(variants),  # per captured input signature: graph, graph+pi or no-graph (chosen)
        "refused": dict(refused),
        "cgct_in_use": cgct,
        "demoted_inputs": demoted,  # module attributes reassigned every call, now copied like inputs
        "over_max_graphs": over,  # graphs with more shapes in use than max_graphs: eviction stopped
        "chains": chains,  # signatures captured as graphs around an operation run eager between them
        "replays": replays,
        "graph_breaks": graph_breaks,
        "per_graph": per_graph,  # each captured signature: variant, measured times (the JSON only)
    }


def recorder() -> Callable[[], dict[str, Any]]:
    """Call before compiling; the returned function summarizes the graphs the backend made since."""
    import torch._dynamo.utils as dynamo_utils

    from ...compiler import backend

    before = weakref.WeakSet(backend._registry)  # not ids: a collected graph's id may be reused by a new one
    breaks_before = sum(dynamo_utils.counters["graph_break"].values())

    def summary() -> dict[str, Any]:
        made = [g for g in list(backend._registry) if g not in before]
        breaks = sum(dynamo_utils.counters["graph_break"].values()) - breaks_before
        return summarize((g.graph_info() for g in made), breaks)

    return summary


def runtime_summary(info: Mapping[str, Any]) -> dict[str, Any]:
    """A wrapped model's ``graph_info()`` as what runs (``what_ran``), in a row's ``graphs``: ``graph``, ``split``
    (by operation: graphs around the operations run eager; by submodule: pieces and share) or ``eager`` (why)."""
    ran = what_ran(info)
    if ran.split_by is SplitBy.OPERATION:
        operations = list(ran.eager_parts)
        return {"runtime": "split", "split_by": "operation", "graphs": ran.graphs, "eager_ops": operations} | {
            "speedup": ran.speedup
        }
    if ran.ran is Ran.GRAPH:
        return {"runtime": "graph", "graphs": ran.graphs}
    if ran.ran is Ran.SPLIT:
        pieces, eager = list(ran.pieces), list(ran.eager_parts)
        return {"runtime": "split", "pieces": pieces, "captured_share": ran.captured_share, "eager": eager} | {
            "reason": ran.reason
        }
    return {"runtime": "eager", "reason": ran.reason}


def describe_runtime(summary: Mapping[str, Any]) -> str:
    """One line: ``whole graph``, ``split: 4 pieces replay (49 % of GPU time: backbone, ...); eager: ...``."""
    if summary["runtime"] == "graph":
        return "whole graph"
    if summary.get("split_by") == "operation":
        return (
            f"split around {', '.join(summary['eager_ops'])}: {summary['graphs']} graphs replay, the operation run "
            f"eager between them ({summary['speedup']:.2f}x over eager when captured)"
        )
    if summary["runtime"] == "split":
        share = summary.get("captured_share")
        share_text = f"{100 * share:.0f} % of eager GPU time: " if share is not None else ""
        return (
            f"split ({summary['reason']}): {len(summary['pieces'])} pieces replay ({share_text}"
            f"{', '.join(summary['pieces'])}); eager: {', '.join(summary['eager'])}"
        )
    return f"eager: {summary.get('reason')}"


def describe(summary: Mapping[str, Any]) -> str:
    """One line: ``12 Dynamo graphs (3 breaks): 10 graph, 1 graph+pi, 1 no-graph; refused 1: why; CGCT in 2``
    (for the backend), or what the runtime wrapper ran (``describe_runtime``)."""
    if "runtime" in summary:
        return describe_runtime(summary)
    variants = ", ".join(f"{n} {v}" for v, n in sorted(summary["variants"].items())) or "none captured"
    text = f"{summary['dynamo_graphs']} Dynamo graphs ({summary['graph_breaks']} breaks): {variants}"
    if summary["refused"]:
        reasons = "; ".join(f"{n}× {why}" for why, n in summary["refused"].items())
        text += f"; refused {sum(summary['refused'].values())}: {reasons}"
    if summary["cgct_in_use"]:
        text += f"; CGCT in {summary['cgct_in_use']}"
    if summary.get("chains"):  # absent from summaries written before chains were captured
        text += f"; {summary['chains']} as graphs around an operation run eager"
    if summary.get("demoted_inputs"):  # absent from summaries written before it was counted
        text += f"; {summary['demoted_inputs']} attribute(s) reassigned every call, copied like inputs"
    if summary.get("over_max_graphs"):
        text += f"; {summary['over_max_graphs']} with more shapes in use than max_graphs (the rest run compiled)"
    return text


def markdown_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The report's section on the backend's graphs; empty when no row carries a summary. A row of another mode than
    its section's (compiled kernels under ``wrap``, the backend without one of its mechanisms) says its mode; the grace
    report's graph path, a copy of one of these rows, adds none."""
    shown = [r for r in rows if r.get("graphs") and r.get("mode") != GRAPH_PATH]
    backend = [r for r in shown if "runtime" not in r["graphs"]]
    runtime = [r for r in shown if "runtime" in r["graphs"]]

    def named(row: Mapping[str, Any], section: str) -> str:
        mode = row.get("mode", section)
        return f"`{row['workload']}`" + ("" if mode == section else f" ({mode})")

    lines: list[str] = []
    if runtime:
        lines += ["", "## What `launchless` ran", "", 'Per workload under `launchless` (`wrap`, `"auto"`).', ""]
        lines += [f"- {named(r, LAUNCHLESS)}: {describe_runtime(r['graphs'])}" for r in runtime]
    if backend:
        lines += ["", "## The launchless backend's graphs", "", "Per workload under `launchless-compile`.", ""]
        lines += [f"- {named(r, LAUNCHLESS_COMPILE)}: {describe(r['graphs'])}" for r in backend]
    return lines
