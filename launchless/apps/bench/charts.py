"""Every bench suite's chart: drawn off screen, bars on a log axis labelled at 1, 2 and 5 of each decade, a panel per
part, the title with the GPU and the date."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .formatting import ms


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
    height, None for a mode that did not run, which leaves a gap in its slot, never a shifted bar).

    ``baseline``: a ratio's 1x, which the bars grow up or down from (a slowdown points down), drawn dashed; else they
    stand on the axis. ``limit(group)``: a black tick across the group where it has one, labelled ``limit_label``
    once (the speed-up a mode would reach if launches cost nothing). ``label``: each bar's number."""

    title: str
    ylabel: str
    groups: list[str]
    modes: list[str]
    value: Callable[[int, str], float | None]
    baseline: float | None = None
    limit: Callable[[int], float | None] | None = None
    limit_label: str = ""
    label: Callable[[float], str] = ms
    unit: str = ""  # after each number of the axis


def bar_panels(path: str | Path, panels: Sequence[BarPanel], *, title: str, group_width: float) -> Any:
    """Every suite's chart: a panel per part, stacked, bars on the log axis every bench chart shares, labelled with
    their value; ``title`` above (a second line: the GPU and date). Returns the figure."""
    width = max(7.0, 3.0 + group_width * max((len(p.groups) for p in panels), default=1))
    fig = new_figure(width, 4.2 * max(1, len(panels)))
    fig.suptitle(title, fontsize=10)
    if not panels:
        fig.text(0.5, 0.5, "no rows", ha="center", va="center")
    for i, panel in enumerate(panels):
        ax = fig.add_subplot(len(panels), 1, i + 1)
        bar = 0.8 / max(1, len(panel.modes))
        bottom = panel.baseline or 0.0
        for j, mode in enumerate(panel.modes):
            xs, heights = [], []
            for g in range(len(panel.groups)):
                value = panel.value(g, mode)
                if value is not None:
                    xs.append(g - 0.4 + (j + 0.5) * bar)
                    heights.append(value)
            bars = ax.bar(xs, [h - bottom for h in heights], width=bar, bottom=bottom, color=f"C{j % 10}", label=mode)
            ax.bar_label(bars, labels=[panel.label(h) for h in heights], fontsize=6)
        label = panel.limit_label
        for g in range(len(panel.groups)):
            limit = panel.limit(g) if panel.limit is not None else None
            if limit is not None:
                ax.hlines(limit, g - 0.4, g + 0.4, colors="black", linewidth=2, label=label or "_nolegend_")
                label = "_nolegend_"
        if panel.baseline is not None:
            ax.axhline(panel.baseline, color="grey", linewidth=0.8, linestyle="--")
        log_axis(ax, unit=panel.unit)
        ax.set_ylabel(panel.ylabel)
        ax.set_title(panel.title, fontsize=9)
        ax.set_xticks(range(len(panel.groups)))
        crowded = len(panel.groups) > 4
        ax.set_xticklabels(panel.groups, fontsize=7, rotation=20 if crowded else 0, ha="right" if crowded else "center")
        ax.set_xlim(-0.6, len(panel.groups) - 0.4)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, format="png")
    return fig


def chart_title(suite_title: str, environment: Mapping[str, Any]) -> str:
    """A suite chart's title, with the GPU and the date on a second line where the environment has them."""
    where = " · ".join(str(environment[k]) for k in ("gpu", "date") if environment.get(k))
    return suite_title + (f"\n{where}" if where else "")
