"""The one report model of every bench suite: the line that says where the numbers were measured, Markdown tables
built from columns, the charts' look (bars on a log axis, panel by panel, the title with the GPU and the date), and
``SuiteReport``: what a suite's report is made of, so that one writer (``report.write_all``) writes every suite's
JSON, Markdown and PNG from the same rows and the numbers can never disagree. Nothing here needs torch or a GPU."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .formatting import factor, md_table, ms

Row = Mapping[str, Any]
Column = tuple[str, Callable[[Row], str]]  # a table's header and the cell it shows for a row

_ENV_FIELDS = (("date", None), ("gpu", "GPU"), ("driver", "driver"), ("torch", "torch"), ("triton", "triton"))


def _env(environment: Mapping[str, Any], key: str) -> str:
    value = environment.get(key)
    return "n/a" if value in (None, "") else str(value)


def header_line(environment: Mapping[str, Any]) -> str:
    """Date, GPU, driver and versions on one line: every number is meaningless without them."""
    parts = [_env(environment, "date")]
    parts += [f"{label} {_env(environment, key)}" for key, label in _ENV_FIELDS[1:]]
    parts.append(f"CUDA {_env(environment, 'cuda')}")
    if environment.get("wall_s") is not None:  # the whole run (summed over merged runs)
        parts.append(f"run took {float(environment['wall_s']):.0f} s")
    if environment.get("gpus_at_once"):
        parts.append(f"workloads dealt over {environment['gpus_at_once']} GPUs run at once (CPU cores split)")
    merged = environment.get("merged_from") or []
    if len(merged) > 1:  # each workload's modes ran side by side in one of these runs; the date is the first's
        parts.append(f"merged from {len(merged)} runs ({', '.join(Path(str(m)).stem for m in merged)})")
    return " · ".join(parts)


def column_table(columns: Sequence[Column], rows: Sequence[Row]) -> list[str]:
    """A Markdown table with a line per row and a cell per column: a suite's table declared as its columns."""
    return md_table([header for header, _ in columns], [[cell(row) for _, cell in columns] for row in rows])


WORKLOAD: Column = ("workload", lambda row: f"`{row['workload']}`")
MODE: Column = ("mode", lambda row: str(row["mode"]))


def field(header: str, key: str, show: Callable[[Any], str]) -> Column:
    """A column showing one field of each row."""
    return header, lambda row: show(row.get(key))


def headline(header: str, key: str, show: Callable[[Any], str]) -> Column:
    """A column showing a row's headline figure, or where it did not run its status (``error``) instead."""
    return header, lambda row: show(row.get(key)) if row.get("status") == "ok" else str(row.get("status"))


def ratio(header: str, of: Callable[[Row], float | None]) -> Column:
    """A column showing a ratio the report derives from each row (``2.00×``)."""
    return header, lambda row: factor(of(row))


@dataclasses.dataclass(frozen=True)
class Target:
    """A measured ratio held to a bound: at least ``bound`` (a speed) or at most (memory, start-up time)."""

    measured: str  # what the ratio is of, as the report says it: "the speed of graph-per-size"
    bound: float
    at_least: bool

    def met(self, value: float) -> bool:
        return value >= self.bound if self.at_least else value <= self.bound

    def text(self, value: float) -> str:
        """``1.20× the speed of graph-per-size (target ≥ 0.90×)``."""
        return f"{factor(value)} {self.measured} (target {'≥' if self.at_least else '≤'} {factor(self.bound)})"


def judged(targets: Sequence[Target], values: Sequence[float]) -> tuple[bool, str]:
    """Whether every target is met by its value, and what was measured against each."""
    met = all(target.met(value) for target, value in zip(targets, values, strict=True))
    return met, ", ".join(target.text(value) for target, value in zip(targets, values, strict=True))


def new_figure(width: float, height: float) -> Any:
    """A matplotlib figure drawn off screen (no display needed), at the one resolution of every bench chart."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: only `bench` needs matplotlib
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=120)
    FigureCanvasAgg(fig)
    return fig


def log_axis(ax: Any, *, unit: str = "") -> None:
    """A log-scale y axis labelled at 1, 2 and 5 of each decade (``unit`` after each number), no minor labels: the
    one look of every bench chart."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}{unit}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


@dataclasses.dataclass(frozen=True)
class BarPanel:
    """One panel of a suite's chart: a group of bars per x label, a bar per mode (``value(group, mode)``: the bar's
    height, None for a mode that did not run, which leaves a gap in its slot)."""

    title: str
    ylabel: str
    groups: list[str]
    modes: list[str]
    value: Callable[[int, str], float | None]


def bar_panels(path: str | Path, panels: Sequence[BarPanel], *, title: str, group_width: float) -> Any:
    """The chart of the multigpu and serving suites: a panel per part, stacked, bars on the log axis every bench chart
    shares, labelled with their value; ``title`` above (a second line: the GPU and date). Returns the figure."""
    width = max(7.0, 3.0 + group_width * max((len(p.groups) for p in panels), default=1))
    fig = new_figure(width, 4.2 * max(1, len(panels)))
    fig.suptitle(title, fontsize=10)
    if not panels:
        fig.text(0.5, 0.5, "no rows", ha="center", va="center")
    for i, panel in enumerate(panels):
        ax = fig.add_subplot(len(panels), 1, i + 1)
        bar = 0.8 / len(panel.modes)
        for j, mode in enumerate(panel.modes):
            xs, heights = [], []
            for g in range(len(panel.groups)):
                value = panel.value(g, mode)
                if value is not None:
                    xs.append(g - 0.4 + (j + 0.5) * bar)
                    heights.append(value)
            bars = ax.bar(xs, heights, width=bar, color=f"C{j % 10}", label=mode)
            ax.bar_label(bars, labels=[ms(h) for h in heights], fontsize=6)
        log_axis(ax)
        ax.set_ylabel(panel.ylabel)
        ax.set_title(panel.title, fontsize=9)
        ax.set_xticks(range(len(panel.groups)))
        ax.set_xticklabels(panel.groups, fontsize=7)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, format="png")
    return fig


def chart_title(suite_title: str, environment: Mapping[str, Any]) -> str:
    """A suite chart's title, with the GPU and the date on a second line where the environment has them."""
    where = " · ".join(str(environment[k]) for k in ("gpu", "date") if environment.get(k))
    return suite_title + (f"\n{where}" if where else "")


@dataclasses.dataclass(frozen=True)
class SuiteReport:
    """What one suite's report is made of, each from the rows alone (a saved record renders again anywhere): the
    name its files take, the summary its JSON records, its Markdown, its chart and any further charts."""

    files: str  # <files>.json, <files>.md, <files>.png
    summary: Callable[[Sequence[Row]], Any]
    markdown: Callable[[Mapping[str, Any], str, Sequence[Row]], str]  # (environment, suite, rows)
    chart: Callable[[Path, Sequence[Row], Mapping[str, Any]], Any]  # draws <files>.png
    # (folder, environment, suite, rows) -> {name: path} of the charts drawn beside it
    more_charts: Callable[[Path, Mapping[str, Any], str, Sequence[Row]], dict[str, Path]] = lambda *_: {}
    # (environment, suite, rows) -> what the terminal shows at the end of a run; None: the Markdown
    terminal: Callable[[Mapping[str, Any], str, Sequence[Row]], Any] | None = None
