"""Outputs of `launchless bench --suite multigpu`: multigpu.json (the record), multigpu.md and multigpu.png, all
from the same rows so the numbers can never disagree. Nothing here needs a GPU: the report can be rebuilt from a
saved multigpu.json anywhere.

A row is one (workload, mode, world size), written by rank 0 of its group; its fields (``scaling_efficiency``
read for DDP and for tensor parallelism): docs/benchmarks.md, "What a row holds".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from . import graphs, stats
from .charts import BarPanel, bar_panels, chart_title
from .formatting import MISSING, factor, ms, reason_text
from .tables import MODE, WORKLOAD, Column, Row, column_table, field, header_line, headline

SUITE = "multigpu"
TP_INFERENCE = "tp-inference"
DDP_TRAINING = "ddp-training"
PART_TITLES = {TP_INFERENCE: "Tensor-parallel inference", DDP_TRAINING: "DDP training"}
LAUNCHLESS_MODES = ("launchless", "launchless-compile")


def _key(row: Row) -> tuple[str, str, int]:
    return str(row["workload"]), str(row["mode"]), int(row["world_size"])


def with_scaling(rows: Sequence[Row]) -> list[dict]:
    """Copies of ``rows`` with ``scaling_efficiency``: the same workload and mode's median at world size 1 over this
    row's (None at world size 1 itself, and where either did not run)."""
    by_key = {_key(r): r for r in rows}
    scaled = []
    for row in rows:
        workload, mode, world_size = _key(row)
        base, this = stats.ok_median(by_key.get((workload, mode, 1))), stats.ok_median(row)
        ratio = base / this if world_size != 1 and base is not None and this is not None else None
        scaled.append({**row, "scaling_efficiency": ratio})
    return scaled


class _View:
    """The rows digested once: lookup, orders and ratios shared by the Markdown, the JSON summary and the chart."""

    def __init__(self, rows: Sequence[Row]) -> None:
        self.rows = list(rows)
        self.by_key = {_key(r): r for r in self.rows}

    def part_rows(self, part: str) -> list[Row]:
        return [r for r in self.rows if r.get("part") == part]

    def speedup(self, row: Row, baseline: str) -> float | None:
        """How much faster ``row`` is than ``baseline`` at the same world size (above 1 is faster)."""
        workload, _, world_size = _key(row)
        base, this = stats.ok_median(self.by_key.get((workload, baseline, world_size))), stats.ok_median(row)
        return base / this if base is not None and this is not None else None

    def median(self, workload: str, mode: str, world_size: int) -> float | None:
        return stats.ok_median(self.by_key.get((workload, mode, world_size)))

    def largest_world(self, part: str) -> int | None:
        sizes = [int(r["world_size"]) for r in self.part_rows(part)]
        return max(sizes) if sizes else None

    def summary(self) -> dict[str, Any]:
        """At the largest world size: tensor parallelism's best launchless mode over reduce-overhead (per workload
        and their geometric mean); DDP's launchless over reduce-overhead and its step against its world-1 step."""
        result: dict[str, Any] = {}
        world = self.largest_world(TP_INFERENCE)
        if world is not None:
            per_workload = {}
            for workload in stats.ordered_workloads(self.part_rows(TP_INFERENCE)):
                reduce_overhead = self.median(workload, stats.REDUCE_OVERHEAD, world)
                best = [t for m in LAUNCHLESS_MODES if (t := self.median(workload, m, world)) is not None]
                if reduce_overhead is not None and best:
                    per_workload[workload] = reduce_overhead / min(best)
            result[TP_INFERENCE] = {
                "world_size": world,
                "best_launchless_vs_reduce_overhead": per_workload,
                "geomean_best_launchless_vs_reduce_overhead": stats.geomean(per_workload.values()),
            }
        world = self.largest_world(DDP_TRAINING)
        if world is not None:
            per_workload = {}
            for workload in stats.ordered_workloads(self.part_rows(DDP_TRAINING)):
                launchless = self.median(workload, "launchless", world)
                reduce_overhead = self.median(workload, stats.REDUCE_OVERHEAD, world)
                alone = self.median(workload, "launchless", 1)
                per_workload[workload] = {
                    "launchless_vs_reduce_overhead": (
                        reduce_overhead / launchless if launchless is not None and reduce_overhead is not None else None
                    ),
                    "launchless_step_vs_world_1": launchless / alone if launchless is not None and alone else None,
                }
            result[DDP_TRAINING] = {"world_size": world, "per_workload": per_workload}
        return result


# --- Markdown -------------------------------------------------------------------------------------------------


def _correctness_cell(row: Row) -> str:
    """``reference`` (eager), ``= on 2 ranks`` bit-identical on each, ``≠ 3.1e-06 (2 ranks)`` the largest
    difference on any rank, ``n/a`` not compared."""
    corr = row.get("correctness") or {}
    ranks = len(corr.get("ranks") or ())
    if corr.get("status") == "reference":
        return "reference"
    if corr.get("status") == "bit-identical":
        return f"= on {ranks} rank{'s' if ranks != 1 else ''}"
    if corr.get("status") == "differs" and corr.get("max_abs_diff") is not None:
        return f"≠ {corr['max_abs_diff']:.1e} ({ranks} rank{'s' if ranks != 1 else ''})"
    return "n/a"


def _graphs_cell(row: Row) -> str:
    summary = row.get("graphs")
    if not summary:
        return MISSING
    if "level" in summary:  # graphed_step
        reason = summary.get("eager_reason")
        return f"{summary['level']}: {reason}" if reason else str(summary["level"])
    return graphs.describe(summary)


def _part_table(view: _View, part: str) -> list[str]:
    def against(baseline: str) -> Callable[[Row], str]:
        return lambda row: MISSING if row["mode"] == baseline else factor(view.speedup(row, baseline))

    def warm_up(row: Row) -> str:
        first, warmup = row.get("first_call_s"), row.get("warmup_s")
        return MISSING if first is None or warmup is None else f"{first:.3g} / {warmup:.3g}"

    columns: list[Column] = [
        WORKLOAD,
        field("world size", "world_size", str),
        MODE,
        headline("ms / call", "median_ms", ms),
        field("waited ms", "waited_ms", ms),
        ("× eager", against(stats.EAGER)),
        ("× reduce-overhead", against(stats.REDUCE_OVERHEAD)),
        field("scaling", "scaling_efficiency", lambda ratio: MISSING if ratio is None else f"{ratio:.2f}"),
        ("first call / warm-up s", warm_up),
        ("correctness", lambda row: _correctness_cell(row) if row.get("status") == "ok" else MISSING),
        ("launchless ran", _graphs_cell),
    ]
    return column_table(columns, view.part_rows(part))


_NOTES = {
    TP_INFERENCE: "World size 1 runs the unsharded model; above 1 the model is split over that many GPUs (the TP "
    "degree). Scaling: world size 1's ms over this one's -- the speed-up of splitting, the world size at best.",
    DDP_TRAINING: "A whole step (zero_grad, forward, loss, backward, optimizer) of DistributedDataParallel, the same "
    "batch per GPU. Scaling: world size 1's step time over this one's -- the weak-scaling efficiency, 1.00 at best.",
}


def _summary_lines(view: _View) -> list[str]:
    summary = view.summary()
    lines = []
    if TP_INFERENCE in summary:
        tp = summary[TP_INFERENCE]
        per = tp["best_launchless_vs_reduce_overhead"]
        mean = tp["geomean_best_launchless_vs_reduce_overhead"]
        head = f"- Tensor parallelism at world size {tp['world_size']}: the faster of launchless and launchless-compile"
        if per:
            detail = ", ".join(f"`{w}` {factor(v)}" for w, v in per.items())
            lines.append(f"{head} over reduce-overhead, {factor(mean)} (geometric mean over {len(per)}: {detail})")
        else:
            lines.append(f"{head}: no workload ran both that and reduce-overhead")
    if DDP_TRAINING in summary:
        ddp = summary[DDP_TRAINING]
        for workload, ratios in ddp["per_workload"].items():
            vs_world_1 = ratios["launchless_step_vs_world_1"]
            efficiency = MISSING if not vs_world_1 else f"{1 / vs_world_1:.2f}"
            lines.append(
                f"- `{workload}` at world size {ddp['world_size']}: launchless "
                f"{factor(ratios['launchless_vs_reduce_overhead'])} over reduce-overhead; its step takes "
                f"{factor(vs_world_1)} its world-size-1 step (scaling efficiency {efficiency})"
            )
    return lines or ["- nothing to compare: no part ran"]


def _environment_line(environment: Mapping[str, Any]) -> str:
    parts = [f"device {environment.get('device', 'n/a')} ({environment.get('backend', 'n/a')})"]
    if environment.get("gpus"):
        parts.append("GPUs " + ", ".join(f"{i}: {name}" for i, name in environment["gpus"].items()))
    if environment.get("nccl"):
        parts.append(f"NCCL {environment['nccl']}")
    if environment.get("world_sizes"):
        parts.append("world sizes " + ", ".join(map(str, environment["world_sizes"])))
    return " · ".join(parts)


def markdown(environment: Mapping[str, Any], rows: Sequence[Row]) -> str:
    """A table per part (ratios over eager and reduce-overhead at the same world size), the summary, failures."""
    view = _View(rows)
    lines = [f"# launchless bench: {SUITE}", "", header_line(environment), "", _environment_line(environment)]
    for part, title in PART_TITLES.items():
        if view.part_rows(part):
            lines += ["", f"## {title}", "", _NOTES[part], ""]
            lines += _part_table(view, part)
    lines += [
        "",
        "ms / call: median of calls back to back on rank 0, every rank in lockstep (CUDA events; the host clock on "
        "the CPU). Waited: one call started idle and synchronized. × eager, × reduce-overhead: their ms over this "
        "one's at the same world size (above 1 is faster). Correctness: every rank's output (inference) or "
        "parameters after the warm-up steps (training) against eager at the same world size.",
        "",
        "## Summary",
        "",
        *_summary_lines(view),
        "",
        "## Failed",
        "",
    ]
    failed = [r for r in view.rows if r.get("status") != "ok"]
    lines += [
        f"- `{r['workload']}` · {r['mode']} · world size {r['world_size']}: {reason_text(r.get('reason'))}"
        for r in failed
    ] or ["- none: every workload ran in every mode at every world size"]
    return "\n".join(lines) + "\n"


# --- chart ----------------------------------------------------------------------------------------------------


def chart(path: str | Path, rows: Sequence[Row], environment: Mapping[str, Any]) -> Any:
    """Bars of ms per call (log scale): a panel per part, a group per (workload, world size), a bar per mode. A
    mode that did not run leaves a gap in its slot. Returns the figure."""
    view = _View(rows)
    panels = []
    for part in (p for p in PART_TITLES if view.part_rows(p)):
        groups = list(dict.fromkeys((str(r["workload"]), int(r["world_size"])) for r in view.part_rows(part)))
        panels.append(
            BarPanel(
                title=PART_TITLES[part],
                ylabel="ms per call (log scale)",
                groups=[f"{w}\nworld size {n}" for w, n in groups],
                modes=stats.ordered_modes(view.part_rows(part)),
                value=lambda g, mode, groups=groups: view.median(groups[g][0], mode, groups[g][1]),
            )
        )
    title = chart_title(f"launchless bench: {SUITE}, ms per call", environment)
    return bar_panels(path, panels, title=title, group_width=1.2)


def summary(rows: Sequence[Row]) -> dict[str, Any]:
    """What the suite's JSON records beside its rows."""
    return _View(rows).summary()
