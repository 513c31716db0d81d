"""What the report of `launchless bench`'s inference and training suites (quick, standard, training, compiler,
kernels, grace) shows: Markdown (for the README / issues), a rich table (for the terminal) and a PNG chart, all from the
same rows so the numbers can never disagree; ``report.write_all`` writes them beside the JSON record.

A row is one (workload, mode) result from its own worker; its fields: docs/benchmarks.md, "What a row holds".
Columns follow the order modes first appear in the rows; rows follow the order workloads first appear.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text

from . import graphs, kernels_report, stats, workloads
from .charts import BarPanel, bar_panels, chart_title
from .formatting import MISSING, byte_size, factor, md_table, ms, reason_text
from .tables import Row, Target, header_line


def _correctness_mark(row: Row) -> str | None:
    """`=` bit-identical, `≠ 2.1e-06` differs by at most that much, `n/a` not compared; None for the reference."""
    corr = row.get("correctness") or {}
    status = corr.get("status")
    if status == "reference":
        return None
    if status == "bit-identical":
        return "="
    if status == "differs":
        diff = corr.get("max_abs_diff")
        return "≠" if diff is None else f"≠ {diff:.1e}"
    return "n/a"


def _correctness_summary(workload: str, modes: Sequence[str], by_key: Mapping[tuple[str, str], Row]) -> str:
    marks = []
    for mode in modes:
        row = by_key.get((workload, mode))
        if row is None or row.get("status") != "ok":
            continue
        mark = _correctness_mark(row)
        if mark is not None:
            marks.append((mode, mark))
    if not marks:
        return MISSING
    if all(mark == "=" for _, mark in marks):
        return "all ="
    return ", ".join(f"{mode} {mark}" for mode, mark in marks)


def _best_floor(workload: str, modes: Sequence[str], by_key: Mapping[tuple[str, str], Row]) -> tuple[float, str] | None:
    floors = [(f, m) for m in modes if (f := stats.ok_floor(by_key.get((workload, m)))) is not None]
    return min(floors, key=lambda fm: fm[0]) if floors else None


def _status_word(row: Row | None) -> str | None:
    """`skipped` / `error` / `—` (never ran) for rows without a usable median, None for a usable row."""
    if row is None:
        return MISSING
    if row.get("status") in ("skipped", "error"):
        return str(row["status"])
    return MISSING if stats.ok_median(row) is None else None


class _View:
    """The rows digested once: orders, lookup, speed-ups and summary shared by every output."""

    def __init__(self, rows: Sequence[Row], *, beside: Sequence[Row] = ()) -> None:
        """``beside``: rows shown in no mode's column (the races), listed among the problems where they failed."""
        self.rows = list(rows)
        self.failed_beside = [r for r in beside if r.get("status") != "ok"]
        self.modes = stats.ordered_modes(self.rows)
        self.workloads = stats.ordered_workloads(self.rows)
        self.by_key = stats.index(self.rows)
        self.vs_eager = stats.speedups(self.rows, stats.EAGER)
        self.vs_ro = stats.speedups(self.rows, stats.REDUCE_OVERHEAD)
        self.floor_ratios = stats.floor_ratios(self.rows)
        self.summary = stats.summary(self.rows)

    def kind(self, workload: str) -> str:
        for mode in self.modes:
            row = self.by_key.get((workload, mode))
            if row is not None and row.get("kind"):
                return str(row["kind"])
        return MISSING

    def speedup(self, workload: str, mode: str) -> float | None:
        return self.vs_eager.get(mode, {}).get(workload)

    def eager_floor(self, workload: str) -> float | None:
        return stats.ok_floor(self.by_key.get((workload, stats.EAGER)))

    def problems(self) -> list[Row]:
        return [r for r in self.by_key.values() if r.get("status") != "ok"] + self.failed_beside

    def summary_items(self) -> list[tuple[str, str]]:
        """(mode, "1.52× vs eager (3), ...") per mode, counts = workloads the mean covers."""
        items = []
        for mode in self.modes:
            parts = []
            for key, table, baseline in (
                ("geomean_vs_eager", self.vs_eager, stats.EAGER),
                ("geomean_vs_reduce_overhead", self.vs_ro, stats.REDUCE_OVERHEAD),
            ):
                if mode != baseline and mode in self.summary[key]:
                    parts.append(f"{factor(self.summary[key][mode])} vs {baseline} ({len(table[mode])})")
            if mode in self.summary["floor_ratio"]:
                n = len(self.floor_ratios[mode])
                parts.append(f"at {factor(self.summary['floor_ratio'][mode])} its kernel floor ({n})")
            if mode in self.summary["worst_vs_best_pytorch"]:
                worst = self.summary["worst_vs_best_pytorch"][mode]
                parts.append(f"worst workload {factor(worst)} the faster of compile and reduce-overhead")
            if mode in self.summary["geomean_first_call_vs_reduce_overhead"]:
                ratio = self.summary["geomean_first_call_vs_reduce_overhead"][mode]
                parts.append(f"first call {factor(ratio)} reduce-overhead's")
            if latency := self._latency_summary(mode):
                parts.append(latency)
            if parts:
                items.append((mode, ", ".join(parts)))
        return items

    def _latency_summary(self, mode: str) -> str | None:
        """ "latency 1.3× vs reduce-overhead (19), worst …": the same comparisons for one waited-for call."""
        parts = []
        for key, baseline in (
            ("latency_geomean_vs_eager", stats.EAGER),
            ("latency_geomean_vs_reduce_overhead", stats.REDUCE_OVERHEAD),
        ):
            if mode != baseline and mode in self.summary.get(key, {}):
                n = len(stats.speedups(self.rows, baseline, stats.LATENCY)[mode])
                parts.append(f"{factor(self.summary[key][mode])} vs {baseline} ({n})")
        worst = self.summary.get("latency_worst_vs_best_pytorch", {}).get(mode)
        if worst is not None:
            parts.append(f"worst {factor(worst)} the faster of compile and reduce-overhead")
        return "latency " + ", ".join(parts) if parts else None

    def has_latency(self) -> bool:
        return any(stats.ok_median(r, stats.LATENCY) is not None for r in self.rows)


# --- Markdown -------------------------------------------------------------------------------------------------


def _latency_cell(view: _View, workload: str, mode: str) -> str:
    row = view.by_key.get((workload, mode))
    word = _status_word(row)
    if word is not None:
        return word
    text = ms(stats.ok_median(row))
    speedup = view.speedup(workload, mode)
    return text if speedup is None else f"{text} ({factor(speedup)})"


def _row_cell(render: Callable[[Row], str]) -> Callable[[_View, str, str], str]:
    """A per-mode cell that shows ``render(row)`` where the pair ran, and the status word where it did not."""

    def cell(view: _View, workload: str, mode: str) -> str:
        row = view.by_key.get((workload, mode))
        word = _status_word(row)
        if row is None or word is not None:
            return word or MISSING
        return render(row)

    return cell


@_row_cell
def _waited_cell(row: Row) -> str:
    latency, throughput = stats.ok_median(row, stats.LATENCY), stats.ok_median(row)
    if latency is None or throughput is None:
        return MISSING
    extra = latency - throughput
    return f"{ms(latency)} ({'+' if extra >= 0 else '−'}{ms(abs(extra))})"


@_row_cell
def _first_call_cell(row: Row) -> str:
    mem = row.get("peak_mem_mb")
    mem_text = MISSING if mem is None else f"{mem:.0f}"
    return f"{ms(row.get('first_call_ms'))} ms / {mem_text} MB"


@_row_cell
def _inside_graphs_cell(row: Row) -> str:
    coverage = row.get("graph_coverage")
    return f"{MISSING if coverage is None else f'{coverage:.0%}'} / {byte_size(row.get('copy_bytes'))}"


def _per_mode_section(
    view: _View, title: str, note: str, unit: str, cell: Callable[[_View, str, str], str]
) -> list[str]:
    """A titled table with a row per workload and a column per mode."""
    lines = ["", f"## {title}", "", note, ""]
    return lines + md_table(
        ["workload", *(f"{m} {unit}" for m in view.modes)],
        [[f"`{w}`", *(cell(view, w, m) for m in view.modes)] for w in view.workloads],
    )


def _latency_rows(view: _View, *, name: Callable[[str], str], latency: Callable[[_View, str, str], Any]) -> list[list]:
    """The latency table's rows, in Markdown or on the terminal: the workload, its kind, each mode's time (speed-up),
    the kernel floors and the correctness summary."""
    rows = []
    for w in view.workloads:
        best = _best_floor(w, view.modes, view.by_key)
        floors = [ms(view.eager_floor(w)), MISSING if best is None else f"{ms(best[0])} ({best[1]})"]
        modes = [latency(view, w, m) for m in view.modes]
        rows.append([name(w), view.kind(w), *modes, *floors, _correctness_summary(w, view.modes, view.by_key)])
    return rows


def _with_graph_path(suite: str, rows: Sequence[Row]) -> list[Row]:
    """The rows of one mode each (a race's figures have their own section) and, in the grace suite, launchless's
    graph path per workload beside them (``stats.graph_path_rows``)."""
    measured = stats.measured_rows(rows)
    return [*measured, *stats.graph_path_rows(measured)] if suite == workloads.GRACE else measured


GRACE_TARGETS = {  # GraCE's headline figures, held against launchless's graph path
    "population": Target("reduce-overhead's speed, geomean over GraCE's population", 1.29, at_least=True),
    "detectors": Target("reduce-overhead's speed, geomean over the torchvision detectors", 1.5, at_least=True),
    "worst": Target("the speed of the faster of compile and reduce-overhead, worst workload", 0.97, at_least=True),
    "first_call": Target("reduce-overhead's first call (its compile), geomean", 2.21, at_least=False),
}


def _raced_lines(races: Mapping[str, Mapping[str, float]]) -> list[str]:
    """The races' table: per workload raced, each mode's median and the graph path against PyTorch's modes."""
    if not races:
        return []
    path, compiled, ro = stats.GRAPH_PATH, stats.COMPILE, stats.REDUCE_OVERHEAD
    cells = [
        [
            f"`{w}`",
            *(ms(times[m]) for m in (compiled, ro, path)),
            factor(times[ro] / times[path]),
            factor(min(times[compiled], times[ro]) / times[path]),
        ]
        for w, times in races.items()
    ]
    header = ["workload", "compile ms", "reduce-overhead ms", f"{path} ms", "× reduce-overhead", "× the faster"]
    return [
        "",
        "## Raced in one process",
        "",
        f"Compile, reduce-overhead and launchless's graph path prepared in one process (`{stats.RACED}`), then timed "
        "in rotating rounds of back-to-back calls: the median of each mode's round medians. Where a workload was "
        "raced, the targets below read these.",
        "",
        *md_table(header, cells),
    ]


def _targets_lines(view: _View, races: Mapping[str, Mapping[str, float]]) -> list[str]:
    """GraCE's targets, each measured on the graph path where the rows allow it -- its speed from the race where the
    workload was raced: the population's over the grace suite's workloads (the other torchvision detectors, run
    beside them by name, count toward the detectors' target only)."""
    path = stats.GRAPH_PATH
    on_path, best = stats.graph_path_ratios(view.rows, races)
    detectors = [on_path.get(w) for w in workloads.DETECTORS if w in view.workloads]
    population = [on_path.get(w) for w in view.workloads if w in {x.name for x in workloads.suite(workloads.GRACE)}]
    values = {
        "population": stats.geomean(population),
        "detectors": stats.geomean(detectors),
        "worst": min(best.values()) if best else None,
        "first_call": view.summary["geomean_first_call_vs_reduce_overhead"].get(path),
    }
    lines = ["", f"## Targets ({path}: launchless-compile for inference, launchless for training)", ""]
    cells = []
    for key, target in GRACE_TARGETS.items():
        value = values[key]
        met = MISSING if value is None else ("yes" if target.met(value) else "**no**")
        cells.append([target.text(value) if value is not None else f"{target.measured}: not measured", met])
    note = (
        f"Detectors measured: {sum(d is not None for d in detectors)} of {len(workloads.DETECTORS)}. GraCE's "
        f"population measured: {sum(p is not None for p in population)} of {len(workloads.suite(workloads.GRACE))}. "
        f"Raced in one process: {sum(w in races for w in view.workloads)} of {len(view.workloads)} workloads."
    )
    return [*lines, *md_table(["target", "met"], cells), "", note]


def markdown(environment: Mapping[str, Any], suite: str, rows: Sequence[Row]) -> str:
    """The report as Markdown: latency table, first-call/memory table, geomean summary, skips and errors."""
    races = stats.raced_times(rows) if suite == workloads.GRACE else {}
    view = _View(_with_graph_path(suite, rows), beside=stats.race_rows(rows))
    rows = view.rows
    lines = [f"# launchless bench: {suite}", "", header_line(environment), ""]

    header = ["workload", "kind", *(f"{m} ms (× eager)" for m in view.modes)]
    header += ["eager floor ms", "best floor ms", "correctness"]
    lines += md_table(header, _latency_rows(view, name=lambda w: f"`{w}`", latency=_latency_cell))
    lines += [
        "",
        "Median ms per call (speed-up over eager, above 1 is faster). Floor: summed GPU kernel time per call "
        "(torch.profiler), the launch-free limit. Correctness against the reference: `=` bit-identical, "
        "`≠ d` differs by at most d, `n/a` not compared.",
    ]
    if view.has_latency():
        lines += _per_mode_section(
            view,
            "One call waited for",
            "Median ms of a call started on an idle GPU and synchronized (what one batch-1 request sees; in "
            "parentheses what it adds to the back-to-back median above: host work the GPU waited for).",
            "ms",
            _waited_cell,
        )
    lines += _per_mode_section(
        view,
        "First call and peak memory",
        "First call includes capture or compilation.",
        "first ms / peak MB",
        _first_call_cell,
    )
    if any(row.get("graph_coverage") is not None for row in rows):
        lines += _per_mode_section(
            view,
            "Kernels inside graphs and bytes copied",
            "Share of a call's GPU kernels that ran inside CUDA graphs (launched by a graph launch, not one by one "
            "by the host), and the bytes its memory copies moved per call (a replay's input copies), from "
            "torch.profiler.",
            "inside / copied",
            _inside_graphs_cell,
        )
    lines += [
        "",
        "## Summary",
        "",
        "Geometric means over the workloads where both modes ran (how many in parentheses).",
        "",
    ]
    items = view.summary_items()
    lines += [f"- **{mode}**: {text}" for mode, text in items] or ["- no mode has a baseline to compare with"]
    if suite == workloads.GRACE:
        lines += _raced_lines(races)
        lines += _targets_lines(view, races)

    lines += kernels_report.markdown_lines(rows)
    lines += graphs.markdown_lines(rows)
    lines += _origin_lines(view.workloads)
    lines += ["", "## Skipped and failed", ""]
    problems = view.problems()
    lines += [
        f"- `{r['workload']}` · {r['mode']} · {r.get('status')}: {reason_text(r.get('reason'))}" for r in problems
    ] or ["- none: every listed workload ran in every listed mode"]
    return "\n".join(lines) + "\n"


def _origin_lines(names: Sequence[str]) -> list[str]:
    """Where each workload comes from, for the workloads that say (GraCE's own, or a stand-in and why)."""
    known = [(name, workloads.WORKLOADS[name].origin) for name in names if name in workloads.WORKLOADS]
    said = [(name, origin) for name, origin in known if origin]
    if not said:
        return []
    return ["", "## Where the workloads come from", "", *(f"- `{name}`: {origin}" for name, origin in said)]


# --- rich -----------------------------------------------------------------------------------------------------


def _rich_latency(view: _View, workload: str, mode: str) -> Text:
    row = view.by_key.get((workload, mode))
    word = _status_word(row)
    if word is not None:
        return Text(word, style={"error": "bold red", "skipped": "yellow"}.get(word, "dim"))
    text = Text(ms(stats.ok_median(row)))
    speedup = view.speedup(workload, mode)
    if speedup is not None:
        text.append(f" ({factor(speedup)})", style="green" if speedup >= 1.0 else "red")
    return text


def rich_table(environment: Mapping[str, Any], suite: str, rows: Sequence[Row]) -> Table:
    """The latency table for the terminal; speed-ups green at or above eager, red below."""
    view = _View(_with_graph_path(suite, rows), beside=stats.race_rows(rows))
    caption = [header_line(environment)]
    caption += [f"{mode}: {text}" for mode, text in view.summary_items()]
    caption += [
        f"{r['workload']} · {r['mode']} · {r.get('status')}: {reason_text(r.get('reason'))}" for r in view.problems()
    ]
    table = Table(title=f"launchless bench: {suite}", caption="\n".join(caption), caption_justify="left")
    table.add_column("workload", no_wrap=True)
    table.add_column("kind")
    for mode in view.modes:
        table.add_column(f"{mode}\nms (× eager)", justify="right")
    table.add_column("eager floor ms", justify="right")
    table.add_column("best floor ms", justify="right")
    table.add_column("correctness")
    for cells in _latency_rows(view, name=str, latency=_rich_latency):
        table.add_row(*cells)
    return table


# --- chart ----------------------------------------------------------------------------------------------------


def chart(path: str | Path, rows: Sequence[Row], environment: Mapping[str, Any]) -> Any:
    """Grouped bars of speed-up over eager (log scale), one group per workload, with the launch-free limit: the
    baseline's median over its kernel floor, the speed-up a mode would reach if launches cost nothing. Without
    eager rows (the compiler suite) the baseline is reduce-overhead, the mode that suite compares against. Returns
    the figure."""
    view = _View(stats.measured_rows(rows))
    baseline, speedups = stats.EAGER, view.vs_eager
    if not any(stats.ok_median(view.by_key.get((w, stats.EAGER))) for w in view.workloads) and view.vs_ro:
        baseline, speedups = stats.REDUCE_OVERHEAD, view.vs_ro

    def limit(workload: str) -> float | None:
        row = view.by_key.get((workload, baseline))
        floor, median = stats.ok_floor(row), stats.ok_median(row)
        return median / floor if floor is not None and median is not None else None

    modes = [m for m in view.modes if m != baseline and m in speedups]
    workloads = [w for w in view.workloads if any(w in speedups[m] for m in modes) or limit(w)]
    panel = BarPanel(
        f"speed-up over {baseline}",
        f"speed-up over {baseline} (×, log scale)",
        workloads,
        modes,
        value=lambda g, mode: speedups[mode].get(workloads[g]),
        baseline=1.0,
        limit=lambda g: limit(workloads[g]),
        limit_label=f"launch-free limit ({baseline} / its kernel floor)",
        label=lambda h: f"{h:.2f}",
        unit="×",
    )
    title = chart_title(f"launchless bench: speed-up over {baseline}", environment)
    return bar_panels(path, [panel] if workloads else [], title=title, group_width=0.35 * max(1, len(modes)))


def more_charts(out: Path, environment: Mapping[str, Any], suite: str, rows: Sequence[Row]) -> dict[str, Path]:
    """bench-timeline.png where the rows have the compiled-kernels suite's timelines."""
    if suite != workloads.KERNELS or not kernels_report.has_timelines(rows):
        return {}
    path = out / "bench-timeline.png"
    title = chart_title("launchless bench: each call's latency from the first call on", environment)
    kernels_report.timeline_chart(path, rows, title)
    return {"timeline": path}
