"""How the bench's reports write numbers and tables: the one format every suite's report uses (milliseconds to about
three significant digits, factors, Markdown tables whose cells cannot break the table)."""

from __future__ import annotations

import math
from collections.abc import Sequence

MISSING = "—"  # a cell with nothing measured


def ms(value: float | None) -> str:
    """Milliseconds with about three significant digits, never in exponent form."""
    if value is None or not math.isfinite(value):
        return MISSING
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    if value >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def byte_size(value: float | None) -> str:
    """Bytes in B, kB, MB or GB (powers of 1000) with about three significant digits."""
    if value is None:
        return MISSING
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if value >= scale:
            return f"{ms(value / scale)} {unit}"
    return f"{value:.0f} B"


def figure(value: float | None, unit: str = "") -> str:
    """A figure other than milliseconds (seconds, a ratio) with three significant digits, ``unit`` after it."""
    return MISSING if value is None else f"{value:.3g}{unit}"


def factor(value: float | None) -> str:
    """A ratio as ``2.00×``."""
    return MISSING if value is None else f"{value:.2f}×"


def reason_text(text: object) -> str:
    """A reason on one line (``no reason given`` for none)."""
    return " ".join(str(text).split()) if text is not None else "no reason given"


def cell(text: str) -> str:
    """Markdown table cells cannot hold a pipe or a newline."""
    return reason_text(text).replace("|", "\\|")


def md_table(header: Sequence[str], body: Sequence[Sequence[str]]) -> list[str]:
    """A Markdown table: the header, its rule, one line per row."""
    lines = ["| " + " | ".join(cell(h) for h in header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in body]
    return lines
