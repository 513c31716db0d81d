"""Pure numbers for `launchless bench`: speed-ups and their geometric means, computed one way for every output.

Rows are the per-(workload, mode) dicts the bench subprocesses produce (see ``report``). Nothing here imports
torch, so the report can be rebuilt from a saved ``bench.json`` on any machine.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence

Row = Mapping[str, object]

EAGER = "eager"
COMPILE = "compile"
REDUCE_OVERHEAD = "reduce-overhead"
PYTORCH_MODES = (EAGER, COMPILE, REDUCE_OVERHEAD)
LAUNCHLESS_COMPILE = "launchless-compile"
LAUNCHLESS = "launchless"
# each workload on launchless's graph path: the compiler backend's rows for inference, graphed_step's for training
GRAPH_PATH = "launchless-graph-path"
COMPILING_MODES = (COMPILE, LAUNCHLESS_COMPILE, GRAPH_PATH)  # their first call compiles, like reduce-overhead's
# compile, reduce-overhead and the graph path timed in one process in rotating rounds (``raced_ms``): where two modes
# are within a few percent, separate processes (each its own host and GPU state) cannot tell them apart
RACED = "raced"


def geomean(values: Iterable[float | None]) -> float | None:
    """Geometric mean of the positive, finite values; None when there are none.

    Speed-ups are ratios, so they average geometrically (2x and 0.5x cancel). A missing (None) or
    non-positive value is a workload that did not run, not a zero, so it is left out rather than
    dragging the mean to 0.
    """
    logs = [math.log(v) for v in values if v is not None and math.isfinite(v) and v > 0]
    if not logs:
        return None
    return math.exp(math.fsum(logs) / len(logs))


def median_and_min(times_ms: Sequence[float]) -> tuple[float, float]:
    """Median and minimum of per-call times: the median is the headline, the min shows the noise floor.

    One helper so every mode reports the same statistic (for an even count, the mean of the two middle calls).
    """
    if not times_ms:
        raise ValueError("median_and_min needs at least one time")
    return float(statistics.median(times_ms)), float(min(times_ms))


def ordered_modes(rows: Iterable[Row]) -> list[str]:
    """Modes in the order they first appear in ``rows``: a stable column order for every table."""
    return list(dict.fromkeys(str(r["mode"]) for r in rows))


def ordered_workloads(rows: Iterable[Row]) -> list[str]:
    """Workloads in the order they first appear in ``rows``."""
    return list(dict.fromkeys(str(r["workload"]) for r in rows))


def index(rows: Iterable[Row]) -> dict[tuple[str, str], Row]:
    """Rows by (workload, mode); a repeated pair keeps its last row (a re-run replaces the earlier one)."""
    return {(str(r["workload"]), str(r["mode"])): r for r in rows}


THROUGHPUT = "median_ms"  # back-to-back calls (``timing.cuda_time``): the headline
LATENCY = "latency_ms"  # one call from an idle GPU, waited for (``timing.cuda_latency``)


def ok_median(row: Row | None, key: str = THROUGHPUT) -> float | None:
    """The row's ``key`` time in ms if it ran and produced a usable (positive, finite) one, else None."""
    if row is None or row.get("status") != "ok":
        return None
    median = row.get(key)
    if not isinstance(median, (int, float)) or not math.isfinite(median) or median <= 0:
        return None
    return float(median)


def ok_floor(row: Row | None) -> float | None:
    """The row's kernel floor in ms if it ran and the profiler measured one (positive, finite), else None."""
    if ok_median(row) is None:
        return None
    assert row is not None
    floor = row.get("kernel_floor_ms")
    if not isinstance(floor, (int, float)) or not math.isfinite(floor) or floor <= 0:
        return None
    return float(floor)


def speedups(rows: Sequence[Row], baseline_mode: str, key: str = THROUGHPUT) -> dict[str, dict[str, float]]:
    """{mode: {workload: baseline_median / mode_median}} over workloads where both rows are ``ok``.

    A workload whose baseline did not run has no speed-ups at all (there is nothing to divide by); the
    baseline mode itself is included (1.0) so a missing baseline is visible as a missing entry.
    """
    by_key = index(rows)
    out: dict[str, dict[str, float]] = {}
    for mode in ordered_modes(rows):
        per_workload: dict[str, float] = {}
        for workload in ordered_workloads(rows):
            base = ok_median(by_key.get((workload, baseline_mode)), key)
            this = ok_median(by_key.get((workload, mode)), key)
            if base is not None and this is not None:
                per_workload[workload] = base / this
        if per_workload:
            out[mode] = per_workload
    return out


def floor_ratios(rows: Sequence[Row]) -> dict[str, dict[str, float]]:
    """{mode: {workload: median / kernel_floor}}: how far each mode is above its own launch-free time.

    Each row is divided by its own floor (compile fuses kernels, so its floor differs from eager's);
    1.0 means the GPU never waited on the host.
    """
    out: dict[str, dict[str, float]] = {}
    for row in index(rows).values():
        median, floor = ok_median(row), ok_floor(row)
        if median is not None and floor is not None:
            out.setdefault(str(row["mode"]), {})[str(row["workload"])] = median / floor
    return {mode: out[mode] for mode in ordered_modes(rows) if mode in out}


def vs_best_pytorch(rows: Sequence[Row], key: str = THROUGHPUT) -> dict[str, dict[str, float]]:
    """{mode: {workload: faster of compile and reduce-overhead / mode}} for the non-PyTorch modes.

    Where both PyTorch compile modes ran; below 1.0 means slower than what a PyTorch user would pick."""
    by_key = index(rows)
    out: dict[str, dict[str, float]] = {}
    for mode in ordered_modes(rows):
        if mode in PYTORCH_MODES:
            continue
        for workload in ordered_workloads(rows):
            best = [ok_median(by_key.get((workload, m)), key) for m in (COMPILE, REDUCE_OVERHEAD)]
            this = ok_median(by_key.get((workload, mode)), key)
            if this is not None and None not in best:
                out.setdefault(mode, {})[workload] = min(best) / this  # type: ignore[type-var]
    return out


def first_call_vs_reduce_overhead(rows: Sequence[Row]) -> dict[str, dict[str, float]]:
    """{mode: {workload: first-call ms / reduce-overhead's first-call ms}} for the other compiling modes."""
    by_key = index(rows)
    out: dict[str, dict[str, float]] = {}
    for workload in ordered_workloads(rows):
        base = by_key.get((workload, REDUCE_OVERHEAD))
        base_ms = base.get("first_call_ms") if ok_median(base) is not None else None
        if not isinstance(base_ms, (int, float)) or base_ms <= 0:
            continue
        for mode in ordered_modes(rows):
            row = by_key.get((workload, mode))
            ms = row.get("first_call_ms") if ok_median(row) is not None else None
            if mode in COMPILING_MODES and isinstance(ms, (int, float)) and ms > 0:
                out.setdefault(mode, {})[workload] = ms / base_ms
    return {mode: out[mode] for mode in ordered_modes(rows) if mode in out}


def graph_path_mode(kind: object) -> str:
    """The mode of launchless's graph path for a workload of ``kind``: the compiler backend for inference,
    ``graphed_step`` (the ``launchless`` mode) for a training step."""
    return LAUNCHLESS_COMPILE if kind == "inference" else LAUNCHLESS


def measured_rows(rows: Sequence[Row]) -> list[Row]:
    """The rows of one (workload, mode) each: all but the races, whose figures belong to the modes they raced."""
    return [r for r in rows if r["mode"] != RACED]


def race_rows(rows: Sequence[Row]) -> list[Row]:
    """The races' rows (``RACED``), whatever their status."""
    return [r for r in rows if r["mode"] == RACED]


def raced_times(rows: Sequence[Row]) -> dict[str, dict[str, float]]:
    """{workload: {mode: median ms}} of the races that ran: compile, reduce-overhead and the graph path (named
    ``GRAPH_PATH``) timed in one process."""
    out: dict[str, dict[str, float]] = {}
    for row in rows:
        times = row.get("raced_ms")
        if row["mode"] != RACED or row.get("status") != "ok" or not isinstance(times, Mapping):
            continue
        path = graph_path_mode(row.get("kind"))
        named = {GRAPH_PATH if m == path else str(m): float(ms) for m, ms in times.items()}
        if all(named.get(m, 0) > 0 for m in (COMPILE, REDUCE_OVERHEAD, GRAPH_PATH)):
            out[str(row["workload"])] = named
    return out


def graph_path_ratios(
    rows: Sequence[Row], races: Mapping[str, Mapping[str, float]]
) -> tuple[dict[str, float], dict[str, float]]:
    """The graph path per workload: (reduce-overhead's ms over its ms, the faster of compile's and reduce-overhead's
    over its ms) -- from ``races`` (``raced_times``) where the workload was raced, else from the modes' own ``rows``
    (with the graph path's, ``graph_path_rows``)."""
    on_path = dict(speedups(rows, REDUCE_OVERHEAD).get(GRAPH_PATH, {}))
    best = dict(vs_best_pytorch(rows).get(GRAPH_PATH, {}))
    for workload, times in races.items():
        path = times[GRAPH_PATH]
        on_path[workload] = times[REDUCE_OVERHEAD] / path
        best[workload] = min(times[COMPILE], times[REDUCE_OVERHEAD]) / path
    return on_path, best


def graph_path_rows(rows: Sequence[Row]) -> list[Row]:
    """The rows of ``GRAPH_PATH``: per workload, launchless-compile's row where it is inference and launchless's
    (graphed_step) where it is training -- the one path launchless offers each, as GraCE sets its system against
    PyTorch's graphs workload by workload. Derived for the report; never written to the record."""
    by_key, out = index(rows), []
    for workload in ordered_workloads(rows):
        training = any(r.get("kind") == "training" for r in rows if r["workload"] == workload)
        row = by_key.get((workload, graph_path_mode("training" if training else "inference")))
        if row is not None:
            out.append({**row, "mode": GRAPH_PATH})
    return out


def _geomeans(table: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    means = {mode: geomean(per_workload.values()) for mode, per_workload in table.items()}
    return {mode: mean for mode, mean in means.items() if mean is not None}


def summary(rows: Sequence[Row]) -> dict[str, dict[str, float]]:
    """Headline numbers: per mode, geomean speed-up vs eager and vs reduce-overhead, geomean median/floor, the
    worst ratio to the faster PyTorch compile mode, and geomean first-call time relative to reduce-overhead;
    the speed-ups and the worst ratio again for a call waited for (``latency_*``) where the rows have it.

    Each mode's mean covers only the workloads where it and the baseline both ran, so a mode that fails
    on a workload is not punished (or flattered) by a made-up number there; the report prints the counts.
    """
    best = vs_best_pytorch(rows)
    latency_best = vs_best_pytorch(rows, LATENCY)
    return {
        "geomean_vs_eager": _geomeans(speedups(rows, EAGER)),
        "geomean_vs_reduce_overhead": _geomeans(speedups(rows, REDUCE_OVERHEAD)),
        "floor_ratio": _geomeans(floor_ratios(rows)),
        "worst_vs_best_pytorch": {mode: min(per.values()) for mode, per in best.items()},
        "geomean_first_call_vs_reduce_overhead": _geomeans(first_call_vs_reduce_overhead(rows)),
        "latency_geomean_vs_eager": _geomeans(speedups(rows, EAGER, LATENCY)),
        "latency_geomean_vs_reduce_overhead": _geomeans(speedups(rows, REDUCE_OVERHEAD, LATENCY)),
        "latency_worst_vs_best_pytorch": {mode: min(per.values()) for mode, per in latency_best.items()},
    }
