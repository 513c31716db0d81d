"""The one writer of every bench suite's report: ``<files>.json`` (the record: environment, suite, rows, summary),
``<files>.md`` and ``<files>.png`` (and any further charts) in one folder, as the suite's ``SuiteReport`` makes them:
``serving.*`` and ``multigpu.*`` for those suites, ``bench.*`` for the single-process suites (and their merges)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from . import multigpu_report, serving_report, stats
from .bench_report import chart, markdown, more_charts, rich_table
from .tables import Row


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


BENCH = SuiteReport(
    "bench", summary=stats.summary, markdown=markdown, chart=chart, more_charts=more_charts, terminal=rich_table
)


def _own_report(own: Any) -> SuiteReport:
    """The report of a suite with a report module of its own (``serving_report``, ``multigpu_report``): its files
    named after the suite, its Markdown the same for every run of it."""

    def suite_markdown(environment: Mapping[str, Any], suite: str, rows: Sequence[Row]) -> str:
        return own.markdown(environment, rows)

    return SuiteReport(own.SUITE, summary=own.summary, markdown=suite_markdown, chart=own.chart)


OWN_REPORTS = {own.SUITE: _own_report(own) for own in (serving_report, multigpu_report)}


def suite_report(suite: str) -> SuiteReport:
    """The serving and multigpu suites' own reports; every other suite's (and a merge of them) is the bench report."""
    return OWN_REPORTS.get(suite, BENCH)


def write_all(out_dir: str | Path, environment: Mapping[str, Any], suite: str, rows: Sequence[Row]) -> dict[str, Path]:
    """The suite's JSON, Markdown and PNG (and further charts) in ``out_dir``, created if needed; returns
    {"json", "md", "png", ...}: path."""
    own = suite_report(suite)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {kind: out / f"{own.files}.{kind}" for kind in ("json", "md", "png")}
    document = {"environment": dict(environment), "suite": suite, "rows": [dict(r) for r in rows]}
    document["summary"] = own.summary(rows)
    paths["json"].write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    paths["md"].write_text(own.markdown(environment, suite, rows), encoding="utf-8")
    own.chart(paths["png"], rows, environment)
    return paths | own.more_charts(out, environment, suite, rows)
