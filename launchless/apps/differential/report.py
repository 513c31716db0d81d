"""Merge shards into one report: the rows as JSON, a markdown summary judged against the targets, a chart.

The targets are the promise stated as numbers: no crash where eager works, no wrong value, nothing slower than
eager by more than 3 %, and at least 95 % of the rows of models that build accelerated with a verified result.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..workers import read_rows
from .generate import WAITING
from .rows import BROKEN, SEVERITY, VERIFIED, Entry, GradMode, Result, Status

SLOWER_LIMIT = 0.97  # a speed-up below this is slower than eager by more than 3 %
ACCELERATED_SHARE = 0.95
ACCELERATED = (Status.GRAPH.value, Status.SPLIT.value)
TIMED_ENTRIES = (Entry.WRAP_AUTO.value, Entry.GENERATE_GREEDY_B1.value)  # the rows the timing pass times
UNBUILT = (Result.NOT_IN_LIBRARY.value, Result.HARNESS.value, Result.EAGER_FAILS.value)
JUDGED = [r.value for r in SEVERITY]  # the results of a row that ran, least to most severe
BROKEN_RESULTS = [r.value for r in BROKEN]


@dataclass(frozen=True)
class Target:
    name: str
    value: str
    met: bool


def load(directories: list[str | Path]) -> list[dict[str, Any]]:
    """The rows of every shard in ``directories`` (the worker files ``rows*.jsonl``), per model as its lines left
    them in the order they finished: a line of a whole run replaces the model's rows (a model run again -- alone,
    with a longer timeout -- replaces what its earlier worker left); a line of a run of some entry points only
    (``entries``: run again after a change to those) replaces the rows of those entry points."""
    per_model: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for line in _row_lines(directories):
        per_model.setdefault((line["rows"][0]["library"], line["key"]), []).append(line)
    out = []
    for lines in per_model.values():
        rows: dict[tuple[str, str], dict[str, Any]] = {}
        for line in sorted(lines, key=lambda line: line.get("finished_at", 0.0)):
            fresh = {(r["entry"], r["grad_mode"]) for r in line["rows"]}
            if line.get("entries") is None:
                rows = {}
            else:
                for key in [k for k in rows if k[0] in line["entries"] and k not in fresh]:
                    del rows[key]
            ran = {"gpu": line.get("gpu"), "finished_at": line.get("finished_at")}
            rows.update({(r["entry"], r["grad_mode"]): {**r, **ran} for r in line["rows"]})
        out.extend(rows.values())
    return out


def _row_lines(directories: list[str | Path]) -> list[dict[str, Any]]:
    """The correctness lines (a model's rows) of every ``rows*.jsonl`` in ``directories``."""
    return [
        line
        for directory in directories
        for path in sorted(Path(directory).glob("rows*.jsonl"))
        for line in read_rows(path)
        if line.get("rows")
    ]


def load_timings(directories: list[str | Path]) -> dict[tuple[str, str], dict[str, Any]]:
    """The timing pass's lines (``timing.timing_line``) in ``directories``, one per model: its timings per entry
    point and grad mode from the line finished last that has one (a pass of some entry points only replaces just
    those), and the last line's error."""
    per_model: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for directory in directories:
        for path in sorted(Path(directory).glob("rows*.jsonl")):
            for line in read_rows(path):
                if "timings" in line:
                    per_model.setdefault((line["library"], line["key"]), []).append(line)
    merged = {}
    for key, lines in per_model.items():
        lines.sort(key=lambda line: line.get("finished_at", 0.0))
        timings = {
            (t["entry"], t["grad_mode"]): {**t, "timed_at": line.get("finished_at")}
            for line in lines
            for t in line["timings"]
        }
        merged[key] = {**lines[-1], "timings": list(timings.values())}
    return merged


# A timing line with no timing whose error says the worker's environment lacked a package: nothing was learnt of the
# model, so ``--resume`` tries it again (a time-out or a crash on the model stays: running it again costs as much)
_ENVIRONMENT_ERROR = ("ModuleNotFoundError", "ImportError")


def timed_models(directories: list[str | Path], *, entries: list[str] | None = None) -> set[tuple[str, str]]:
    """``(library, model)`` of every model the timing pass has a line for (with ``entries``: timings of each of
    those entry points), but a line that failed for want of a package before timing anything."""
    timings = load_timings(directories)
    if entries is None:
        return {
            key
            for key, line in timings.items()
            if line["timings"] or not str(line.get("error") or "").startswith(_ENVIRONMENT_ERROR)
        }
    return {key for key, line in timings.items() if set(entries) <= set(line.get("entries") or ()) | _covered(line)}


def _covered(line: dict[str, Any]) -> set[str]:
    """The entry points a model's timings cover: a forward entry timed at all, greedy decoding under every grad mode
    (a line of a pass that timed it under one grad mode only is timed again)."""
    modes: dict[str, set[str]] = {}
    for t in line["timings"]:
        modes.setdefault(t["entry"], set()).add(t["grad_mode"])
    everywhere = {mode.value for mode in GradMode}
    return {entry for entry, seen in modes.items() if entry != Entry.GENERATE_GREEDY_B1.value or seen >= everywhere}


def apply_timings(rows: list[dict[str, Any]], timings: dict[tuple[str, str], dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` with what the timing pass saw of each laid over them: its speed figures (``timed_alone`` True; a row
    the pass did not time keeps the figures of its correctness run, taken beside other workers), and where the pass
    ran the row again with its calls compared (``result`` in its timing), the row's verdict alone
    (``verdict_alone``) -- unless eager itself failed on the pass's inputs, which judges nothing of launchless.
    A timing taken before its row was run again (after a change) is of the code before: the row stands untimed
    until the pass times it again."""
    by_row = {
        (library, model, t["entry"], t["grad_mode"]): {**t, "gpu": line.get("gpu")}
        for (library, model), line in timings.items()
        for t in line["timings"]
        if t.get("speedup") is not None or t.get("status") is not None
    }
    out = []
    for row in rows:
        timed = by_row.get((row["library"], row["model"], row["entry"], row["grad_mode"]))
        if timed is not None and _older(timed.get("timed_at"), row.get("finished_at")):
            timed = None  # the row ran again since
        row = {**row, "timed_alone": timed is not None and timed.get("speedup") is not None}
        if timed is not None and timed.get("speedup") is not None:
            row.update({k: timed[k] for k in ("eager_ms", "accelerated_ms", "speedup")})
            row["timed_status"] = timed.get("status")  # what "auto" ran alone; its judgements there are its own
            row["eager_spread"] = timed.get("eager_spread")  # eager against itself in the same rounds
            row["repeated"] = bool(timed.get("repeated"))  # a close call measured again, in three times the rounds
            row["timed_on"] = timed.get("gpu")
        if timed is not None and timed.get("status") and _judged(timed) and _judged(row):
            row = verdict_alone(row, timed)
        out.append(row)
    return out


def _older(timed_at: float | None, ran_at: float | None) -> bool:
    """Whether a timing was taken before its row ran (a line without the time is taken as current)."""
    return timed_at is not None and ran_at is not None and timed_at < ran_at


def verdict_alone(row: dict[str, Any], timed: dict[str, Any]) -> dict[str, Any]:
    """The row as a user alone on the GPU meets it: the status the timing pass saw -- the speed judgements of "auto"
    and of ``cuda_graph=True``'s split taken beside other workers are not judgements (``status_beside_others`` keeps
    the other where they differ) -- and the worse result of the two runs, each on its own fresh inputs: a difference
    or a crash in either stands, and the calls of both count. A refusal alone (``cuda_graph=True`` raised: no
    result) keeps only a broken result of the other run."""
    out = {**row, "status": timed["status"]}
    if out["status"] != row["status"]:
        out.update(status_beside_others=row["status"], reason=timed.get("reason"), source=timed.get("source"))
    fields = ("result", "max_abs_diff", "bound", "bound_class", "reason", "source")
    if timed["status"] == Status.REFUSED.value:
        if row["result"] not in BROKEN_RESULTS:
            out.update({k: timed.get(k) for k in fields})
    elif _severity(timed["result"]) > _severity(row["result"]):
        out.update({k: timed.get(k) for k in fields})
    out["calls"] = (row.get("calls") or 0) + (timed.get("calls") or 0)
    out["identical_calls"] = (row.get("identical_calls") or 0) + (timed.get("identical_calls") or 0)
    return out


def _judged(row: dict[str, Any]) -> bool:
    """A row that says something of launchless: a result of its calls, or ``cuda_graph=True``'s refusal."""
    return row.get("result") in JUDGED or (row.get("status") == Status.REFUSED.value and row.get("result") is None)


def _severity(result: str | None) -> int:
    """``JUDGED``'s order, a refusal's missing result first."""
    return -1 if result is None else JUDGED.index(result)


def done_models(directories: list[str | Path], *, entries: list[str] | None = None) -> set[tuple[str, str]]:
    """``(library, model)`` of every model with rows in ``directories`` (with ``entries``: with a line of a run of
    just those entry points)."""
    if entries is None:
        return {(row["library"], row["model"]) for row in load(directories)}
    return {
        (line["rows"][0]["library"], line["key"])
        for line in _row_lines(directories)
        if sorted(line.get("entries") or ()) == sorted(entries)
    }


def unbuilt_models(directories: list[str | Path]) -> set[tuple[str, str]]:
    """``(library, model)`` of every model whose rows in ``directories`` are all of a model that does not build or
    on which eager fails (``UNBUILT``): the timing pass leaves them out."""
    rows = load(directories)
    built = {(r["library"], r["model"]) for r in built_rows(rows)}
    return {(r["library"], r["model"]) for r in rows} - built


def is_slower(row: dict[str, Any]) -> bool:
    """Slower than eager by more than 3 %, and by more than eager differed from itself in the same rounds (a reading
    inside that spread says nothing either way; the report lists those rows apart)."""
    return row["speedup"] < SLOWER_LIMIT and 1 - row["speedup"] > (row.get("eager_spread") or 0.0)


def built_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows of models that build and run eager: the ones the promise is about."""
    return [r for r in rows if r["result"] not in UNBUILT]


def targets(rows: list[dict[str, Any]]) -> list[Target]:
    """The four targets, each with its measured value."""
    built = built_rows(rows)
    crashes = sum(r["result"] == Result.CRASH.value for r in built)
    differs = sum(r["result"] == Result.DIFFERS.value for r in built)
    timed = [r for r in built if r.get("timed_alone") and r["speedup"] is not None]
    slower = [r for r in timed if is_slower(r)]
    untimed = untimed_rows(rows)
    good = sum(accelerated_and_verified(r) for r in built)
    share = good / len(built) if built else 0.0
    return [
        Target("0 crashes where eager works", str(crashes), crashes == 0),
        Target("0 wrong values (differs)", str(differs), differs == 0),
        Target(
            "none slower than eager by > 3 % (timed alone)",
            f"{len(slower)} of {len(timed)} rows timed alone; {len(untimed)} accelerated auto rows not timed",
            not slower and not untimed,
        ),
        Target(
            f">= {ACCELERATED_SHARE:.0%} of rows of built models accelerated and verified",
            f"{share:.1%} ({good}/{len(built)})",
            share >= ACCELERATED_SHARE,
        ),
    ]


def untimed_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The accelerated rows of the entry points the timing pass times that it has not timed (or timed before the
    row ran again): their speed against eager is not known."""
    return [
        r
        for r in built_rows(rows)
        if r["entry"] in TIMED_ENTRIES
        and r["status"] in ACCELERATED
        and not (r.get("timed_alone") and r["speedup"] is not None)
    ]


def _untimed(rows: list[dict[str, Any]]) -> list[str]:
    """The models whose accelerated rows the timing pass is still to time, as ``differential-timing-again`` takes
    them (``AGAIN="library:model,model ..."``)."""
    per_model: dict[tuple[str, str], list[str]] = {}
    for r in untimed_rows(rows):
        per_model.setdefault((r["library"], r["model"]), []).append(f"{r['entry']} / {r['grad_mode']}")
    if not per_model:
        return []
    libraries = sorted({library for library, _ in per_model})
    again = " ".join(f"{lib}:" + ",".join(m for library, m in sorted(per_model) if library == lib) for lib in libraries)
    out = ["", f"## Accelerated rows not yet timed alone ({sum(map(len, per_model.values()))})", ""]
    out += [f'To time them: `AGAIN="{again}" bash benchmarks/device_run.sh OUT differential-timing-again`.', ""]
    return out + _table(
        ["library", "model", "rows"], [[lib, model, ", ".join(e)] for (lib, model), e in sorted(per_model.items())]
    )


def _table(header: list[str], body: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + [
        "| " + " | ".join("" if v is None else str(v).replace("|", "/") for v in row) + " |" for row in body
    ]


def load_populations(directories: list[str | Path]) -> dict[str, dict[str, Any]]:
    """The ``population-<library>.json`` records the runs wrote (``shard.write_population``), one per library."""
    found: dict[str, dict[str, Any]] = {}
    for directory in directories:
        for path in sorted(Path(directory).glob("population-*.json")):
            record = json.loads(path.read_text())
            found[record["library"]] = record
    return found


def markdown(rows: list[dict[str, Any]], populations: dict[str, dict[str, Any]] | None = None) -> str:
    """Counts per library and status/result, the targets, every row that is not ``identical`` with its reason; with
    ``populations``, how much of each library's list the rows cover and what it was run on."""
    populations = populations or {}
    libraries = sorted({r["library"] for r in rows} | set(populations))
    models = Counter(r["library"] for r in {(r["library"], r["model"]): r for r in rows}.values())
    kinds = sorted({f"{r['status']}/{r['result']}" for r in rows})
    counts = Counter((r["library"], f"{r['status']}/{r['result']}") for r in rows)
    out = ["# Differential run", "", f"{len(rows)} rows of {sum(models.values())} models.", ""]
    if populations:
        out += _coverage(rows, populations)
    out += ["## Targets", ""]
    out += _table(
        ["target", "measured", "met"], [[t.name, t.value, "yes" if t.met else "**no**"] for t in targets(rows)]
    )
    out += ["", "## Rows per library (status/result)", ""]
    out += _table(
        ["library", "models", *kinds], [[lib, models[lib], *(counts[(lib, k)] for k in kinds)] for lib in libraries]
    )
    out += _untimed(rows)
    out += _per_entry(rows)
    out += _not_accelerated(rows)
    out += _lost_by_cause(rows)
    out += _grad_modes_apart(rows)
    speedups = sorted(r["speedup"] for r in built_rows(rows) if r.get("timed_alone") and r["speedup"] is not None)
    if speedups:
        out += [
            "",
            f"Median speed-up over eager: {speedups[len(speedups) // 2]:.2f}x over {len(speedups)} rows timed alone "
            "(the other rows' figures were taken beside other workers on the same GPU and are not timings).",
        ]
    timed = [r for r in built_rows(rows) if r.get("timed_alone") and r["speedup"] is not None]
    slow = sorted((r for r in timed if r["speedup"] < SLOWER_LIMIT), key=lambda r: r["speedup"])
    if slow:
        out += ["", f"## Rows timed alone below 0.97x eager ({len(slow)})", ""]
        out += [
            "Slower counts a row whose speed-up is also below eager against itself in the same rounds (`eager "
            "spread`); a reading inside that spread is noise, not a verdict. A first reading under 0.97x is measured "
            "again in three times the rounds (`repeated`), and the repeat is the row's figure.",
            "",
        ]
        out += _table(
            ["library", "model", "entry", "grad mode", "status alone", "speed-up", "eager spread", "repeated",
             "slower", "eager ms", "launchless ms"],
            [
                [r["library"], r["model"], r["entry"], r["grad_mode"], r.get("timed_status"), r["speedup"],
                 r.get("eager_spread"), "yes" if r.get("repeated") else "no",
                 "yes" if is_slower(r) else "within spread", r["eager_ms"], r["accelerated_ms"]]
                for r in slow
            ],
        )  # fmt: skip
    out += _status_alone(rows)
    odd = [r for r in rows if r["result"] != Result.IDENTICAL.value]
    out += ["", f"## Rows not identical ({len(odd)})", ""]
    out += _table(
        ["library", "model", "entry", "grad mode", "status", "result", "speed-up", "reason", "source"],
        [
            [r["library"], r["model"], r["entry"], r["grad_mode"], r["status"], r["result"], r["speedup"],
             _bounded(r) if r["result"] == Result.BOUNDED.value else _differs(r), r["source"]]
            for r in sorted(odd, key=lambda r: (str(r["result"]), r["library"], r["model"]))
        ],
    )  # fmt: skip
    return "\n".join(out) + "\n"


def _status_alone(rows: list[dict[str, Any]]) -> list[str]:
    """The rows whose status alone (the timing pass's) differs from the correctness run's beside other workers."""
    moved = [r for r in rows if r.get("status_beside_others")]
    if not moved:
        return []
    out = ["", f"## Rows that ran otherwise alone than beside other workers ({len(moved)})", ""]
    out += [
        'The status is what the row ran alone on the GPU, in the timing pass: the speed judgements of "auto" '
        "taken while other workers' kernels ran between the calls' are not judgements.",
        "",
    ]
    return out + _table(
        ["library", "model", "entry", "grad mode", "beside others", "alone", "reason alone"],
        [
            [r["library"], r["model"], r["entry"], r["grad_mode"], r["status_beside_others"], r["status"], r["reason"]]
            for r in sorted(moved, key=lambda r: (r["library"], r["model"], r["entry"], r["grad_mode"]))
        ],
    )


def _coverage(rows: list[dict[str, Any]], populations: dict[str, dict[str, Any]]) -> list[str]:
    """The share of each library's list the rows cover, and the environment each list was enumerated in."""
    run = {(r["library"], r["model"]) for r in rows}
    body = []
    for library, record in sorted(populations.items()):
        listed = record["models"]
        done = sum((library, name) in run for name in listed)
        ran = Counter(r.get("gpu") or record.get("gpu") for r in rows if r["library"] == library)
        timed = Counter(
            r.get("timed_on") or record.get("gpu") for r in rows if r["library"] == library and r["timed_alone"]
        )
        body.append(
            [library, record.get("version"), f"{done} of {len(listed)}", _gpus(ran), _gpus(timed), record.get("torch")]
        )
    return [*_table(["library", "version", "models run", "rows run on", "rows timed alone on", "torch"], body), ""]


def _gpus(counts: Counter) -> str:
    """The GPUs rows ran on, with how many each where there are several (lines written before rows named their GPU
    count as the GPU their library's list was enumerated on)."""
    if len(counts) <= 1:
        return str(next(iter(counts), None) or "-")
    return ", ".join(f"{gpu} ({n})" for gpu, n in sorted(counts.items(), key=lambda item: (-item[1], str(item[0]))))


def accelerated_and_verified(row: dict[str, Any]) -> bool:
    return row["status"] in ACCELERATED and row["result"] in [v.value for v in VERIFIED]


def _per_entry(rows: list[dict[str, Any]]) -> list[str]:
    """The share target per entry point: the default (``wrap-auto``) apart from ``cuda_graph=True``, which raises by
    contract where no verified graph or faster split serves the forward, and from decoding, where a cache no graph
    follows goes through ``generate()`` as called."""
    built = built_rows(rows)
    body = []
    for entry in sorted({r["entry"] for r in built}):
        of_entry = [r for r in built if r["entry"] == entry]
        good = sum(accelerated_and_verified(r) for r in of_entry)
        body.append([entry, good, len(of_entry), f"{good / len(of_entry):.1%}"])
    return ["", "## Accelerated and verified, per entry point", "", *_table(
        ["entry", "accelerated and verified", "rows of built models", "share"], body
    )]  # fmt: skip


CAUSES: tuple[tuple[str, str], ...] = (  # (what a reason says, the cause it is counted under), first match wins
    ("does not support a static KV cache", "decoding: the model's class tells transformers it has no static cache"),
    ("static cache raised", "decoding: a static cache the class does not vouch for raised; generate() as called"),
    (
        "does not tell transformers it runs on a static cache",
        "decoding: a static cache the class does not vouch for parted from its own generate()",
    ),
    ("no decode step replays as a graph", "decoding: no decode step can be a graph; generate() as called"),
    ("static-cache reference dropped", "decoding: transformers' own static-cache generate() raises for the model"),
    ("whose update a decode graph cannot replay", "decoding: cache layers a decode graph cannot follow"),
    ("decoding through graphs raised", "decoding: decoding through graphs raised; generate() as called"),
    ("operation not permitted when stream is capturing", "decoding: a decode step syncs with the host"),
    ("Cannot copy between CPU and CUDA tensors", "decoding: a decode step copies between CPU and GPU"),
    ("eager-noise", "eager differs from itself beyond the rounding bound"),
    ("not faster than eager", "a forward that cannot be one graph, and no split of it faster than eager"),
    ("host sync", "decoding: a decode step syncs with the host"),
    ("no verified graph", "the compiler backend kept no verified graph"),
)


def cause_of(row: dict[str, Any]) -> str:
    """The cause a row not accelerated is counted under (``CAUSES``; a ``cuda_graph=True`` refusal as such; else the
    start of its reason, or ``other``)."""
    if row["entry"] == Entry.WRAP_TRUE.value and row["status"] == Status.REFUSED.value:
        return "cuda_graph=True raised: no verified graph, and no verified split faster than eager"
    reason = row.get("reason") or ""
    for says, cause in CAUSES:
        if says in reason:
            return cause
    causes = [part for part in reason.split("; ") if not part.startswith(WAITING)] or [reason]
    return causes[0].split(":", 1)[0][:80] or "other"


def _lost_by_cause(rows: list[dict[str, Any]]) -> list[str]:
    """The rows of built models not accelerated with a verified result, counted by cause: what the share target would
    need changed, in the library or in the models."""
    lost = Counter(cause_of(r) for r in built_rows(rows) if not accelerated_and_verified(r))
    if not lost:
        return []
    body = [[cause, n] for cause, n in sorted(lost.items(), key=lambda kv: (-kv[1], kv[0]))]
    return ["", "## Rows not accelerated with a verified result, by cause", "", *_table(["cause", "rows"], body)]


def _not_accelerated(rows: list[dict[str, Any]]) -> list[str]:
    """The rows of built models that are not accelerated with a verified result, counted by entry and status: where
    the share target loses its rows (``refused`` is ``cuda_graph=True`` raising where no graph or split serves)."""
    lost = Counter(
        (r["entry"], r["status"], str(r["result"])) for r in built_rows(rows) if not accelerated_and_verified(r)
    )
    if not lost:
        return []
    body = [[entry, status, result, n] for (entry, status, result), n in sorted(lost.items(), key=lambda kv: -kv[1])]
    return ["", "## Rows not accelerated with a verified result, by entry and status", "", *_table(
        ["entry", "status", "result", "rows"], body
    )]  # fmt: skip


_FOR_INPUT = re.compile(r" for input \(.*?\)(?:: | )")


def _verdict(row: dict[str, Any]) -> tuple[str, str]:
    """What a row ran as, for comparing grad modes: its status, and for a row not accelerated its cause."""
    return row["status"], "" if accelerated_and_verified(row) else cause_of(row)


def _grad_modes_apart(rows: list[dict[str, Any]]) -> list[str]:
    """The model and entry points whose ``no_grad`` and ``inference_mode`` rows ran otherwise: a capture, a blocker
    or a verification that depends on the grad mode shows here (as does a speed judgement near 1x)."""
    by_key: dict[tuple[str, str, str], dict[str, dict[str, Any]]] = {}
    for r in built_rows(rows):
        by_key.setdefault((r["library"], r["model"], r["entry"]), {})[r["grad_mode"]] = r
    apart = [
        (key, modes[GradMode.NO_GRAD.value], modes[GradMode.INFERENCE_MODE.value])
        for key, modes in sorted(by_key.items())
        if len(modes) == 2 and _verdict(modes[GradMode.NO_GRAD.value]) != _verdict(modes[GradMode.INFERENCE_MODE.value])
    ]
    if not apart:
        return []

    def ran(row: dict[str, Any]) -> str:
        reason = row.get("reason") or ""
        said = _FOR_INPUT.split(reason, maxsplit=1)  # the error's own words, after its "... for input (...)"
        what = f"{reason.split(':', 1)[0]}: {said[-1]}" if len(said) > 1 else reason
        return f"{row['status']}: {what[:120]}" if what else row["status"]

    return [
        "",
        f"## Rows whose grad modes ran otherwise ({len(apart)})",
        "",
        "The same model and entry point under `no_grad` and `inference_mode` with another status, or not accelerated "
        "for another cause.",
        "",
        *_table(
            ["library", "model", "entry", "no_grad", "inference_mode"],
            [[library, model, entry, ran(a), ran(b)] for (library, model, entry), a, b in apart],
        ),
    ]


def _differs(row: dict[str, Any]) -> str:
    """A row's reason, and where its outputs first differed (rows written before that was recorded have none)."""
    where = row.get("differing_leaf")
    return f"{row['reason']}; first difference at {where}" if where else str(row["reason"])


def _bounded(row: dict[str, Any]) -> str:
    text = f"{row['bound_class']}: max diff {row['max_abs_diff']:.3g} within bound {row['bound']:.3g}"
    if row["bound_class"] == "capture-path" and row.get("capture_path_max_abs"):
        text += (
            f"; named by the capture branch alone: eager forced onto the capture path is "
            f"{row['capture_path_max_abs']:.3g} from the graph"
        )
    return text


def chart(rows: list[dict[str, Any]], path: Path) -> None:
    """Rows per library by result (stacked bars) and the speed-ups of the built rows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    libraries = sorted({r["library"] for r in rows})
    results = sorted({str(r["result"]) for r in rows})
    fig, (bars, hist) = plt.subplots(1, 2, figsize=(13, 4.5))
    bottom = [0] * len(libraries)
    for result in results:
        heights = [sum(r["library"] == lib and str(r["result"]) == result for r in rows) for lib in libraries]
        bars.bar(libraries, heights, bottom=bottom, label=result)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    bars.set_ylabel("rows")
    bars.set_title("result per library")
    bars.legend(fontsize=8)
    bars.tick_params(axis="x", labelrotation=20)
    speedups = [r["speedup"] for r in built_rows(rows) if r.get("timed_alone") and r["speedup"]]
    if speedups:
        hist.hist(speedups, bins=40)
        hist.axvline(SLOWER_LIMIT, color="red", linestyle="--", label="3 % slower than eager")
        hist.set_xscale("log")
        hist.legend(fontsize=8)
    hist.set_xlabel("speed-up over eager")
    hist.set_title("speed-ups")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_all(
    rows: list[dict[str, Any]], out_dir: str | Path, populations: dict[str, dict[str, Any]] | None = None
) -> dict[str, Path]:
    """differential.json, differential.md and differential.png in ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "differential.json", "md": out / "differential.md", "png": out / "differential.png"}
    paths["json"].write_text(json.dumps(rows, indent=1) + "\n")
    paths["md"].write_text(markdown(rows, populations))
    chart(rows, paths["png"])
    return paths
