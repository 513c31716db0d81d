"""The tables of every bench suite's report, one way: the line that says where the numbers were measured, Markdown
tables declared as their columns, and targets (a measured ratio, its bound, met or not). Nothing here needs torch or
a GPU: a report renders again from a saved record anywhere."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .formatting import factor, md_table

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
