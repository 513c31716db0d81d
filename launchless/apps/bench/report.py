"""The one writer of every bench suite's report: ``<files>.json`` (the record: environment, suite, rows, summary),
``<files>.md`` and ``<files>.png`` (and any further charts) in one folder, as the suite's ``SuiteReport`` makes them:
``serving.*`` and ``multigpu.*`` for those suites, ``bench.*`` for the single-process suites (and their merges)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from . import bench_report, multigpu_report, serving_report
from .report_parts import Row, SuiteReport

OWN_REPORTS: dict[str, SuiteReport] = {
    serving_report.SUITE: serving_report.REPORT,
    multigpu_report.SUITE: multigpu_report.REPORT,
}


def suite_report(suite: str) -> SuiteReport:
    """The serving and multigpu suites' own reports; every other suite's (and a merge of them) is the bench report."""
    return OWN_REPORTS.get(suite, bench_report.REPORT)


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
