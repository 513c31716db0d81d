"""Outputs of `launchless bench --suite serving`: serving.json (the record), serving.md and serving.png, all from the
same rows so that the numbers can never disagree. Nothing here needs torch or a GPU: the report can be rebuilt from a
saved serving.json anywhere.

A row is one (workload, mode), written by that mode's worker; its fields: docs/benchmarks.md, "What a row holds".

The targets, judged from the rows: a bucket mode serves the trace at 0.9x the speed of graph-per-size or better
while its graphs hold at most a quarter of graph-per-size's memory; launchless decodes at batch 1 at least as many
tokens per second as static-compile with at most a fifth of its start-up time (``compile_s``); where the launchless
worker raced ``kernels="compiled"``, that mode decodes at every batch at least 1.2x static-compile's tokens per second,
starts in at most a twentieth of static-compile's start-up time, and its tokens are eager's in every call before its
compiled step is decided. Tokens per second are set against each other from ``interleaved_ms`` where the launchless
row has it (the modes raced in one process), from the separate rows where it does not.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .charts import BarPanel, bar_panels, chart_title
from .formatting import MISSING, factor, figure, md_table, ms, reason_text
from .kernels_report import phases_text
from .serving_workloads import (
    BUCKETS,
    BUCKETS_AUTO,
    BUCKETS_FIXED,
    COMPILED_KERNELS,
    DECODE,
    GRAPH_PER_SIZE,
    LAUNCHLESS,
    PART_TITLES,
    STATIC_COMPILE,
    modes_of,
)
from .stats import ordered_modes
from .tables import MODE, WORKLOAD, Column, Row, Target, column_table, field, header_line, headline, judged, ratio

SUITE = "serving"
BUCKET_SPEED_AT_LEAST = 0.9  # of graph-per-size's speed over the trace
BUCKET_MEMORY_AT_MOST = 0.25  # of graph-per-size's graph memory
BUCKET_JUDGED = (BUCKETS_FIXED, BUCKETS_AUTO)
DECODE_TOKENS_AT_LEAST = 1.0  # of static-compile's tokens per second
DECODE_COMPILE_AT_MOST = 0.2  # of static-compile's start-up time
DECODE_JUDGED_BATCH = 1
COMPILED_TOKENS_AT_LEAST = 1.2  # kernels="compiled": of static-compile's tokens per second, at every batch
COMPILED_START_UP_AT_MOST = 1 / 20  # kernels="compiled": of static-compile's start-up time
BUCKET_TARGETS = (
    Target("the speed of graph-per-size", BUCKET_SPEED_AT_LEAST, at_least=True),
    Target("its graph memory", BUCKET_MEMORY_AT_MOST, at_least=False),
)
DECODE_TARGETS = (
    Target("the tokens per second of static-compile", DECODE_TOKENS_AT_LEAST, at_least=True),
    Target("its start-up time", DECODE_COMPILE_AT_MOST, at_least=False),
)
COMPILED_KERNELS_TARGETS = (
    Target("the tokens per second of static-compile", COMPILED_TOKENS_AT_LEAST, at_least=True),
    Target("its start-up time", COMPILED_START_UP_AT_MOST, at_least=False),
)


def _measured(value: Any) -> float | None:
    """A measured amount: a finite number, zero or more (no graph memory, no start-up time); else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        return None
    return float(value)


def _positive(value: Any) -> float | None:
    """A measured amount that can be divided by (and drawn on a log scale): above zero; else None."""
    amount = _measured(value)
    return amount if amount else None


def _ratio(numerator: Any, denominator: Any) -> float | None:
    top, bottom = _measured(numerator), _positive(denominator)
    return top / bottom if top is not None and bottom is not None else None


class _View:
    """The rows digested once: lookup and the ratios shared by the Markdown, the JSON summary and the chart."""

    def __init__(self, rows: Sequence[Row]) -> None:
        self.rows = list(rows)
        self.by_key = {(str(r["workload"]), str(r["mode"])): r for r in self.rows}

    def part_rows(self, part: str) -> list[Row]:
        return [r for r in self.rows if r.get("part") == part]

    def ok(self, workload: str, mode: str) -> Row | None:
        row = self.by_key.get((workload, mode))
        return row if row is not None and row.get("status") == "ok" else None

    def _against(self, row: Row, baseline: str, key: str, *, baseline_over_row: bool) -> float | None:
        base = self.ok(str(row["workload"]), baseline)
        if base is None or row.get("status") != "ok":
            return None
        return _ratio(base.get(key), row.get(key)) if baseline_over_row else _ratio(row.get(key), base.get(key))

    def speed_vs_graph_per_size(self, row: Row) -> float | None:
        """Graph-per-size's time over the trace over this mode's (above 1 is faster)."""
        return self._against(row, GRAPH_PER_SIZE, "total_ms", baseline_over_row=True)

    def memory_vs_graph_per_size(self, row: Row) -> float | None:
        """This mode's graph memory over graph-per-size's."""
        return self._against(row, GRAPH_PER_SIZE, "graph_mem_bytes", baseline_over_row=False)

    def tokens_vs_static_compile(self, row: Row) -> float | None:
        """This mode's tokens per second over static-compile's (above 1 is faster): from the modes' interleaved
        decode steps where the workload's launchless row has them, else from the separate rows."""
        interleaved = self.interleaved(str(row["workload"]))
        if row.get("status") == "ok" and str(row["mode"]) in interleaved and STATIC_COMPILE in interleaved:
            return _ratio(interleaved[STATIC_COMPILE], interleaved[str(row["mode"])])
        return self._against(row, STATIC_COMPILE, "tokens_per_s", baseline_over_row=False)

    def interleaved(self, workload: str) -> dict[str, float]:
        """{mode: median ms per decode step} of the modes raced in one process (the launchless row's); empty where
        that did not run."""
        row = self.ok(workload, LAUNCHLESS)
        steps = (row or {}).get("interleaved_ms") or {}
        return {str(mode): float(ms) for mode, ms in steps.items() if _positive(ms) is not None}

    def compile_vs_static_compile(self, row: Row) -> float | None:
        """This mode's start-up time (``compile_s``) over static-compile's."""
        return self._against(row, STATIC_COMPILE, "compile_s", baseline_over_row=False)

    def ratios(self) -> dict[str, dict[str, dict[str, dict[str, float | None]]]]:
        """{part: {workload: {mode: {ratio name: value}}}} for every row."""
        result: dict[str, dict[str, dict[str, dict[str, float | None]]]] = {BUCKETS: {}, DECODE: {}}
        for row in self.rows:
            workload, mode, part = str(row["workload"]), str(row["mode"]), str(row["part"])
            if part == BUCKETS:
                ratios = {
                    "speed_vs_graph_per_size": self.speed_vs_graph_per_size(row),
                    "memory_vs_graph_per_size": self.memory_vs_graph_per_size(row),
                }
            else:
                ratios = {
                    "tokens_per_s_vs_static_compile": self.tokens_vs_static_compile(row),
                    "compile_s_vs_static_compile": self.compile_vs_static_compile(row),
                }
            result[part].setdefault(workload, {})[mode] = ratios
        return {part: per for part, per in result.items() if per}

    def verdicts(self) -> list[dict[str, Any]]:
        """Each judged row against its target: ``met`` True or False, or None where the rows cannot tell (a row
        missing or failed, memory not measured); ``detail`` says what was measured, or why it cannot be judged."""
        judged = [r for r in self.part_rows(BUCKETS) if r["mode"] in BUCKET_JUDGED]
        judged += [
            r for r in self.part_rows(DECODE) if r["mode"] == LAUNCHLESS and r.get("batch") == DECODE_JUDGED_BATCH
        ]
        verdicts = [self._bucket_verdict(r) if r["part"] == BUCKETS else self._decode_verdict(r) for r in judged]
        raced = [r for r in self.part_rows(DECODE) if r["mode"] == LAUNCHLESS and r.get("compiled_timeline")]
        return verdicts + [self._compiled_kernels_verdict(r) for r in raced]

    def _bucket_verdict(self, row: Row) -> dict[str, Any]:
        speed, memory = self.speed_vs_graph_per_size(row), self.memory_vs_graph_per_size(row)
        why = self._unjudged(row, GRAPH_PER_SIZE)
        if why is None and speed is None:
            why = "no time over the trace to compare"
        if why is None and memory is None:
            baseline = self.ok(str(row["workload"]), GRAPH_PER_SIZE) or {}
            unmeasured = row.get("graph_mem_bytes") is None or baseline.get("graph_mem_bytes") is None
            why = "graph memory not measured (no CUDA graphs on a CPU)" if unmeasured else "graph-per-size holds none"
        if why is not None:
            return _verdict(row, None, f"not judged: {why}")
        assert speed is not None and memory is not None
        return _verdict(row, *judged(BUCKET_TARGETS, (speed, memory)))

    def _decode_verdict(self, row: Row) -> dict[str, Any]:
        tokens, start_up = self.tokens_vs_static_compile(row), self.compile_vs_static_compile(row)
        why = self._unjudged(row, STATIC_COMPILE)
        if why is None and (tokens is None or start_up is None):
            why = "no tokens per second or start-up time to compare"
        if why is not None:
            return _verdict(row, None, f"not judged: {why}")
        assert tokens is not None and start_up is not None
        return _verdict(row, *judged(DECODE_TARGETS, (tokens, start_up)))

    def _compiled_kernels_verdict(self, row: Row) -> dict[str, Any]:
        """``kernels="compiled"`` as the launchless worker raced it: its decode steps against static-compile's (the
        interleaved rounds), its start-up time against static-compile's, and eager's tokens in every call before the
        decision (the eager-kernel graphs', the proof done in parts inside them)."""
        workload = str(row["workload"])
        interleaved, static = self.interleaved(workload), self.ok(workload, STATIC_COMPILE)
        tokens = _ratio(interleaved.get(STATIC_COMPILE), interleaved.get(COMPILED_KERNELS))
        start_up = _compiled_start_up_s(row)
        start_up_ratio = None if start_up is None else _ratio(start_up, (static or {}).get("compile_s"))
        labelled = {**row, "mode": COMPILED_KERNELS}
        if static is None or tokens is None or start_up_ratio is None:
            return _verdict(labelled, None, "not judged: static-compile or its race did not run")
        met, detail = judged(COMPILED_KERNELS_TARGETS, (tokens, start_up_ratio))
        before = row.get("compiled_divergence_before")
        if "compiled_divergence_before" not in row:
            return _verdict(labelled, None, f"not judged: the calls' tokens were not compared by phase ({detail})")
        tokens_text = "eager's tokens before the decision" if before is None else f"tokens ≠ from token {before}"
        return _verdict(labelled, met and before is None, f"{detail}, {tokens_text}")

    def _unjudged(self, row: Row, baseline: str) -> str | None:
        """Why ``row`` cannot be set against ``baseline``, or None when both ran."""
        if row.get("status") != "ok":
            return "it did not run"
        if self.ok(str(row["workload"]), baseline) is None:
            return f"{baseline} did not run"
        return None

    def summary(self) -> dict[str, Any]:
        return {
            "targets": {
                BUCKETS: {
                    "modes": list(BUCKET_JUDGED),
                    "speed_vs_graph_per_size_at_least": BUCKET_SPEED_AT_LEAST,
                    "memory_vs_graph_per_size_at_most": BUCKET_MEMORY_AT_MOST,
                },
                DECODE: {
                    "mode": LAUNCHLESS,
                    "batch": DECODE_JUDGED_BATCH,
                    "tokens_per_s_vs_static_compile_at_least": DECODE_TOKENS_AT_LEAST,
                    "compile_s_vs_static_compile_at_most": DECODE_COMPILE_AT_MOST,
                },
                COMPILED_KERNELS: {
                    "tokens_per_s_vs_static_compile_at_least": COMPILED_TOKENS_AT_LEAST,
                    "compile_s_vs_static_compile_at_most": COMPILED_START_UP_AT_MOST,
                    "tokens_before_the_decision": "eager's",
                },
            },
            "verdicts": self.verdicts(),
            "ratios": self.ratios(),
        }


def _compiled_start_up_s(row: Row) -> float | None:
    """``kernels="compiled"``'s start-up time, as ``compile_s`` is each mode's: its first call's seconds beyond a
    median call of the launchless row (the same eager-kernel decode graphs, before the compiled step is decided)."""
    first, median_ms = _measured(row.get("compiled_first_call_s")), _measured(row.get("generate_ms"))
    return None if first is None or median_ms is None else max(first - median_ms / 1e3, 0.0)


def _verdict(row: Row, met: bool | None, detail: str) -> dict[str, Any]:
    return {"workload": row["workload"], "part": row["part"], "mode": row["mode"], "met": met, "detail": detail}


# --- Markdown -------------------------------------------------------------------------------------------------


def _mib(size: Any) -> str:
    return MISSING if size is None else f"{size / 2**20:.1f}"


def _count(value: Any) -> str:
    return MISSING if value is None else str(value)


def _identical_cell(row: Row) -> str:
    """``=`` bit-identical to eager; buckets ``≠ 2.4e-07`` (the largest difference), decode ``≠ from token 5``."""
    if row.get("status") != "ok" or row.get("identical") is None:
        return MISSING
    if row["identical"]:
        return "="
    if row["part"] == DECODE:
        return f"≠ from token {row.get('first_divergence')}"
    diff = row.get("max_abs_diff")
    return "≠" if diff is None else f"≠ {diff:.1e}"


_GRAPHS = field("graphs", "graphs", _count)
_COMPILE_S = field("compile s", "compile_s", figure)
_IDENTICAL = ("identical", _identical_cell)


def _buckets_table(view: _View) -> list[str]:
    columns: list[Column] = [
        *(WORKLOAD, MODE, headline("trace ms", "total_ms", ms), field("median ms", "median_ms", ms)),
        ratio("× graph-per-size speed", view.speed_vs_graph_per_size),
        field("graph MiB", "graph_mem_bytes", _mib),
        ratio("× graph-per-size memory", view.memory_vs_graph_per_size),
        *(field("device MiB", "device_mem_bytes", _mib), _GRAPHS, _COMPILE_S, _IDENTICAL),
    ]
    return column_table(columns, view.part_rows(BUCKETS))


def _decode_table(view: _View) -> list[str]:
    columns: list[Column] = [
        *(WORKLOAD, field("batch", "batch", _count), MODE),
        headline("tokens/s", "tokens_per_s", lambda tokens: MISSING if tokens is None else f"{tokens:.1f}"),
        *(field("ms / step", "median_ms", ms), field("TTFT ms", "ttft_ms", ms)),
        ratio("× static-compile tokens/s", view.tokens_vs_static_compile),
        _COMPILE_S,
        ratio("× static-compile compile", view.compile_vs_static_compile),
        *(_GRAPHS, _IDENTICAL, ("dynamic cache's tokens", _dynamic_cell)),
    ]
    return column_table(columns, view.part_rows(DECODE))


def _interleaved_table(view: _View) -> list[str]:
    """Per decode workload whose launchless row raced the modes in one process: each mode's decode step."""
    workloads = [str(r["workload"]) for r in view.part_rows(DECODE) if r["mode"] == LAUNCHLESS]
    raced = {w: view.interleaved(w) for w in workloads if view.interleaved(w)}
    if not raced:
        return []
    rounds = {(view.ok(w, LAUNCHLESS) or {}).get("interleaved_rounds") for w in raced}
    contestants = [*modes_of(workloads[0]), COMPILED_KERNELS]
    modes = [m for m in contestants if any(m in steps for steps in raced.values())]
    ratios = [m for m in (LAUNCHLESS, COMPILED_KERNELS) if m in modes]
    header = ["workload", *(f"{m} ms / step" for m in modes), *(f"{m} × static-compile tokens/s" for m in ratios)]
    body = []
    for workload, steps in raced.items():
        times = [ms(steps.get(m)) for m in modes]
        body.append(
            [f"`{workload}`", *times, *(factor(_ratio(steps.get(STATIC_COMPILE), steps.get(m))) for m in ratios)]
        )
    return [
        "",
        f"Raced in one process (the launchless worker, once its row was measured): {_rounds(rounds)} of one "
        "generate() per mode, the modes in a rotating order, static-compile compiled before the rounds; the median "
        "decode step per mode. The × static-compile tokens/s above and the targets below are from these.",
        "",
        *md_table(header, body),
    ]


def _compiled_kernels_lines(view: _View) -> list[str]:
    """Per decode workload whose launchless worker raced ``kernels="compiled"``: what was decided for its decode
    steps, its first call against static-compile's, when the swap came, whether its tokens were the reference's."""
    rows = [r for r in view.part_rows(DECODE) if r["mode"] == LAUNCHLESS and r.get("compiled_timeline")]
    if not rows:
        return []
    header = ["workload", "decided", "first call s", "static-compile first call s", "swapped at s"]
    header += ["compiler's phases s", "tokens before the decision", "tokens after it", "static-compile's tokens"]
    body = []
    for row in rows:
        decisions = row.get("compiled_kernels") or []
        decided = "; ".join(
            f"{d['kernels']}" + (f" ({reason_text(d['reason'])})" if d.get("reason") else "") for d in decisions
        )
        # where the time to the swap went: a process started for it, imports, export, compile
        phases = "; ".join(phases_text(d["compile_phases"]) for d in decisions if d.get("compile_phases"))
        static = view.ok(str(row["workload"]), STATIC_COMPILE) or {}
        body.append(
            [
                f"`{row['workload']}`",
                decided or "nothing compiled",
                _seconds_or_dash(row.get("compiled_first_call_s")),
                _seconds_or_dash(static.get("first_call_s")),
                _seconds_or_dash(row.get("compiled_swap_s")),
                phases or "—",
                _tokens_text(row, "compiled_divergence_before", wrong_if_differ=True),
                _tokens_text(row, "compiled_divergence_after", wrong_if_differ=False),
                _tokens_text(static, "first_divergence", wrong_if_differ=False),
            ]
        )
    return [
        "",
        f'`{COMPILED_KERNELS}`: `launchless.wrap(model, kernels="compiled")`, generating from its first call '
        "(eager-kernel decode graphs) until its decode step's compiled program was decided (swapped in at the start "
        "of a call once proven), then raced above. Swapped at: seconds from its first call's start. The compiler's "
        "phases: `start` (a process to begin in; in parentheses what of a spare's boot the job waited for), "
        "`build` (the model's modules "
        "imported, its tensors made), `export`, `compile`, `save`. Tokens: `=` every call's tokens those of eager "
        "generate(), else the first new token that differed. Before the decision the calls replay eager-kernel "
        "graphs (the compiled program's proof done in parts inside them) and must be identical; after it Inductor's "
        "kernels, proven as accurate as eager's, may let a near tie between two tokens fall the other way, as "
        "static-compile's do.",
        "",
        *md_table(header, body),
    ]


def _tokens_text(row: Mapping[str, Any], field: str, *, wrong_if_differ: bool) -> str:
    """``=`` where the row's tokens were eager's, else from which new token they differed (bold where that breaks the
    promise); ``—`` where the row has no such field."""
    if field not in row:
        return "—"
    if row[field] is None:
        return "="
    text = f"≠ from token {row[field]}"
    return f"**{text}**" if wrong_if_differ else text


def _seconds_or_dash(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, (int, float)) else "—"


def _through_generate_lines(view: _View) -> list[str]:
    """A line per launchless decode row some of whose generations went through generate()'s own loop (which waits
    for the GPU at every token) instead of the host-ahead loop, with why."""
    lines = []
    for row in view.part_rows(DECODE):
        reasons = row.get("through_generate") or {}
        if row["mode"] == LAUNCHLESS and reasons:
            why = "; ".join(f"{reason} ({calls} calls)" for reason, calls in reasons.items())
            lines.append(f"- `{row['workload']}`: launchless decoded through generate()'s own loop: {why}")
    return ["", *lines] if lines else []


def _rounds(counts: set[Any]) -> str:
    known = sorted(c for c in counts if isinstance(c, int))
    return f"{'/'.join(map(str, known))} rounds" if known else "rounds"


def _dynamic_cell(row: Row) -> str:
    """``=`` every token of eager generate() on the default dynamic cache; ``≠ from token 78`` where they parted."""
    if row.get("status") != "ok" or "dynamic_divergence" not in row:
        return MISSING
    divergence = row["dynamic_divergence"]
    return "=" if divergence is None else f"≠ from token {divergence}"


def _notes(environment: Mapping[str, Any]) -> dict[str, str]:
    trace = environment.get("trace") or {}
    trace_line = (
        f"The trace: {trace.get('calls')} calls of batch sizes drawn with {trace.get('law')} (seed "
        f"{trace.get('seed')}; {trace.get('distinct_sizes')} distinct sizes, {trace.get('rows')} rows in all). "
        if trace
        else ""
    )
    return {
        BUCKETS: trace_line + "Each call waited for (CUDA events; the host clock on a CPU), after a first pass over "
        "the trace. × graph-per-size speed: its trace time over this one's (above 1 is faster); × graph-per-size "
        "memory: this mode's graph memory over its. Device MiB: the device memory the mode's passes left in use as the "
        "driver counts it (which also sees what CUDA keeps per instantiated graph). Compile s: the first pass's time "
        "beyond the timed pass's.",
        DECODE: "Greedy generate(); ms / step: a decode step after the first token (median over the runs); tokens/s: "
        "the batch's tokens per second at that step; TTFT: time to the first new token. × static-compile: "
        "tokens per second over static-compile's (above 1 is faster), and start-up time over its. Compile s: the "
        "first call's time beyond the median call's. Identical: every token that of eager generate() on the mode's "
        "own kind of cache (eager: the default dynamic cache; static-compile: a static cache of transformers' length; "
        "launchless: a static cache of its bucket length); dynamic cache's tokens: against eager generate() on the "
        "default dynamic cache, where a static cache's attention over its whole masked length rounds differently.",
    }


def _target_lines(view: _View) -> list[str]:
    lines = [
        f"Buckets: a bucket mode ({', '.join(BUCKET_JUDGED)}) serves the trace at ≥ {factor(BUCKET_SPEED_AT_LEAST)} "
        f"the speed of graph-per-size with ≤ {factor(BUCKET_MEMORY_AT_MOST)} its graph memory. Decode: launchless at "
        f"batch {DECODE_JUDGED_BATCH} decodes ≥ {factor(DECODE_TOKENS_AT_LEAST)} the tokens per second of "
        f"static-compile with ≤ {factor(DECODE_COMPILE_AT_MOST)} its start-up time; {COMPILED_KERNELS} at every "
        f"batch ≥ {factor(COMPILED_TOKENS_AT_LEAST)} its tokens per second, its start-up time ≤ "
        f"{factor(COMPILED_START_UP_AT_MOST)} static-compile's, eager's tokens before its compiled step is decided.",
        "",
    ]
    words = {True: "**met**", False: "**not met**", None: "not judged"}
    verdicts = view.verdicts()
    for verdict in verdicts:
        detail = str(verdict["detail"]).removeprefix("not judged: ")
        lines.append(f"- `{verdict['workload']}` · {verdict['mode']}: {words[verdict['met']]}: {detail}")
    return lines if verdicts else [*lines, "- no row to judge: the judged modes did not run"]


def _environment_line(environment: Mapping[str, Any]) -> str:
    parts = [f"device {environment.get('device', 'n/a')}"]
    parts += [f"{name} {environment[name]}" for name in ("transformers", "timm") if environment.get(name)]
    return " · ".join(parts)


def markdown(environment: Mapping[str, Any], rows: Sequence[Row]) -> str:
    """A table per part, the targets judged from the rows, the failures."""
    view = _View(rows)
    notes = _notes(environment)
    lines = [f"# launchless bench: {SUITE}", "", header_line(environment), "", _environment_line(environment)]
    tables = {BUCKETS: _buckets_table, DECODE: _decode_table}
    for part, title in PART_TITLES.items():
        if view.part_rows(part):
            lines += ["", f"## {title}", "", notes[part], "", *tables[part](view)]
            if part == DECODE:
                lines += _interleaved_table(view) + _compiled_kernels_lines(view) + _through_generate_lines(view)
    lines += ["", "## Targets", "", *_target_lines(view), "", "## Failed", ""]
    failed = [r for r in view.rows if r.get("status") != "ok"]
    lines += [f"- `{r['workload']}` · {r['mode']}: {reason_text(r.get('reason'))}" for r in failed]
    lost_races = [r for r in view.rows if r.get("status") == "ok" and r.get("interleaved_error")]
    lines += [f"- `{r['workload']}` · the modes' race: {reason_text(r['interleaved_error'])}" for r in lost_races]
    missing = _missing(view.rows, environment.get("modes"))
    lines += [f"- `{workload}` · {mode}: no row (the run ended first)" for workload, mode in missing]
    if lines[-1] == "":
        lines.append("- none: every workload ran in every mode of its part")
    return "\n".join(lines) + "\n"


def _missing(rows: Sequence[Row], asked: Sequence[str] | None) -> list[tuple[str, str]]:
    """(workload, mode) pairs asked for (``environment["modes"]``; where a report does not say, the modes some row
    has) that have no row: a run cut short."""
    ran = set(asked) if asked else {str(r["mode"]) for r in rows}
    have = {(str(r["workload"]), str(r["mode"])) for r in rows}
    workloads = dict.fromkeys(str(r["workload"]) for r in rows)
    return [(w, m) for w in workloads for m in modes_of(w) if m in ran and (w, m) not in have]


# --- chart ----------------------------------------------------------------------------------------------------

_CHART = {
    BUCKETS: ("total_ms", "trace ms (log scale, lower is faster)"),
    DECODE: ("tokens_per_s", "tokens / s (log scale, higher is faster)"),
}


def chart(path: str | Path, rows: Sequence[Row], environment: Mapping[str, Any]) -> Any:
    """Bars on a log scale: the trace's time per bucket workload and mode, tokens per second per decode workload
    and mode (``kernels="compiled"`` from its raced decode step, where the launchless worker raced it); a mode that
    did not run leaves a gap in its slot. Returns the figure."""
    view = _View(rows)
    panels = []
    for part in (p for p in PART_TITLES if view.part_rows(p)):
        key, label = _CHART[part]
        workloads = list(dict.fromkeys(str(r["workload"]) for r in view.part_rows(part)))

        def value(g: int, mode: str, workloads: list[str] = workloads, key: str = key) -> float | None:
            if mode == COMPILED_KERNELS:  # raced in the launchless worker: tokens per second from its decode step
                row, step_ms = view.ok(workloads[g], LAUNCHLESS), view.interleaved(workloads[g]).get(mode)
                batch = (row or {}).get("batch")
                return batch * 1e3 / step_ms if isinstance(batch, int) and step_ms else None
            row = view.ok(workloads[g], mode)
            return _positive(row.get(key)) if row is not None else None

        modes = ordered_modes(view.part_rows(part))
        if part == DECODE and any(COMPILED_KERNELS in view.interleaved(w) for w in workloads):
            modes = [*modes, COMPILED_KERNELS]
        panels.append(BarPanel(PART_TITLES[part], label, workloads, modes, value))
    return bar_panels(path, panels, title=chart_title(f"launchless bench: {SUITE}", environment), group_width=1.5)


def summary(rows: Sequence[Row]) -> dict[str, Any]:
    """What the suite's JSON records beside its rows."""
    return _View(rows).summary()
