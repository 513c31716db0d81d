"""The compiled-kernels part of a bench report: when Inductor's kernels swapped in beside the calls, what the calls
cost meanwhile, the steady state against the compiled modes and the kernel floor, and each mode's first calls
against wall time (the timeline chart).

Targets, each read from rows of one run: steady state within 1.05x of ``launchless-compile`` and within 1.10x of
the best kernel floor; first call within 1.2x of ``launchless``'s and at most 1/20 of reduce-overhead's; calls while
compiling at most 10 % slower than ``launchless``'s early calls (waited for and paced alike; its waited-for call in a
row without them); the swap no later than reduce-overhead's
first call ends (its compile); a second process (``launchless-compiled-kernels-on-disk``, on the programs the first
left on disk) replaying compiled kernels within a second of its first call. A training step
(``graphed_step(kernels="compiled")``; no ``launchless-compile`` there) within 1.05x of the kernel floor of
``compile``'s step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from . import stats
from .charts import new_figure
from .formatting import figure, md_table
from .modes import COMPILED_KERNELS, COMPILED_KERNELS_ON_DISK, KERNEL_MODES
from .tables import Row, Target

STEADY = "steady within 1.05x launchless-compile"
STEADY_FLOOR = "steady within 1.10x the best kernel floor"
FIRST_CALL = "first call within 1.2x launchless's"
FIRST_CALL_RO = "first call at most 1/20 reduce-overhead's"
DURING_COMPILE = "calls while compiling at most 10% slower"
SWAP = "swapped before reduce-overhead's compile ends"
SECOND_PROCESS = "a second process replays compiled kernels within 1 s"
TRAINING = "training step within 1.05x compile's kernel floor"
TARGETS = {  # each a ratio held to its bound: a figure of the row over what it is held against
    STEADY: Target("launchless-compile's steady state", 1.05, at_least=False),
    STEADY_FLOOR: Target("the best kernel floor", 1.10, at_least=False),
    FIRST_CALL: Target("launchless's first call", 1.2, at_least=False),
    FIRST_CALL_RO: Target("reduce-overhead's first call", 1 / 20, at_least=False),
    DURING_COMPILE: Target("launchless's early calls", 1.10, at_least=False),
    SWAP: Target("reduce-overhead's first call", 1.0, at_least=False),
    SECOND_PROCESS: Target("seconds from its first call", 1.0, at_least=False),
    TRAINING: Target("compile's kernel floor", 1.05, at_least=False),
}


def _ok(row: Row | None, key: str) -> float | None:
    if row is None or row.get("status") != "ok":
        return None
    value = row.get(key)
    return float(value) if isinstance(value, (int, float)) else None


def figures_of(workload: str, row: Row | None, by_key: Mapping[tuple[str, str], Row]) -> dict[str, Any]:
    """One compiled-kernels row's figures: its steady state against ``launchless-compile`` and the best kernel
    floor of the workload's modes, its first calls, its compile and swap, and what it decided."""
    compiled = by_key.get((workload, "launchless-compile"))
    floors = [
        f
        for m in stats.ordered_modes(list(by_key.values()))
        if (f := _ok(by_key.get((workload, m)), "kernel_floor_ms"))
    ]
    steady, compiled_ms = _ok(row, "median_ms"), _ok(compiled, "median_ms")
    return {
        "steady_ms": steady,
        "vs_launchless_compile": None if steady is None or not compiled_ms else steady / compiled_ms,
        "vs_best_floor": None if steady is None or not floors else steady / min(floors),
        "first_call_ms": _ok(row, "first_call_ms"),
        "during_compile_ms": _ok(row, "during_compile_ms"),
        "swap_s": _ok(row, "swap_s"),
        "compile_s": _ok(row, "compile_s"),
        "kernels": None if row is None else row.get("kernels"),
        "from_disk": row is not None and row.get("program") == "found on disk",
        "reason": None if row is None else row.get("kernels_reason"),
    }


def targets(workload: str, by_key: Mapping[tuple[str, str], Row]) -> dict[str, Any]:
    """The compiled-kernels figures of one workload and each target met or not (None where a figure is missing)."""
    kernels = by_key.get((workload, COMPILED_KERNELS))
    launchless = by_key.get((workload, "launchless"))
    reduce_overhead = by_key.get((workload, stats.REDUCE_OVERHEAD))
    figures = figures_of(workload, kernels, by_key)
    first_ll, first_ro = _ok(launchless, "first_call_ms"), _ok(reduce_overhead, "first_call_ms")
    figures["targets"] = {
        STEADY: _met(STEADY, figures["vs_launchless_compile"]),
        STEADY_FLOOR: _met(STEADY_FLOOR, figures["vs_best_floor"]),
        FIRST_CALL: _met(FIRST_CALL, figures["first_call_ms"], first_ll),
        FIRST_CALL_RO: _met(FIRST_CALL_RO, figures["first_call_ms"], first_ro),
        DURING_COMPILE: _met(DURING_COMPILE, figures["during_compile_ms"], _paced(launchless)),
        SWAP: _met(SWAP, figures["swap_s"], None if first_ro is None else first_ro / 1e3),
    }
    second = by_key.get((workload, COMPILED_KERNELS_ON_DISK))
    if second is not None:  # compiled again (nothing found on disk) misses the target whatever its swap
        figures["second_process"] = later = figures_of(workload, second, by_key)
        swapped = _met(SECOND_PROCESS, later["swap_s"])
        figures["targets"][SECOND_PROCESS] = (
            None if second.get("status") != "ok" else later["from_disk"] and bool(swapped)
        )
    if kernels is not None and kernels.get("kind") == "training":
        compiled_floor = _ok(by_key.get((workload, "compile")), "kernel_floor_ms")
        steady = figures["steady_ms"]
        figures["vs_compiled_floor"] = None if steady is None or not compiled_floor else steady / compiled_floor
        figures["targets"][TRAINING] = _met(TRAINING, figures["vs_compiled_floor"])
    return figures


def _paced(row: Row | None) -> float | None:
    """A mode's call as the calls while compiling are timed: its early calls' median (waited for one by one, a training
    step after the same idle pause), or, in a row that has none, its call waited for (``latency_ms``)."""
    early = _ok(row, "early_ms")
    return early if early is not None else _ok(row, "latency_ms")


def _met(name: str, value: float | None, against: float | None = 1.0) -> bool | None:
    """Whether ``value`` over ``against`` meets the target ``name``; None where either is missing."""
    if value is None or against is None or against <= 0:
        return None
    return TARGETS[name].met(value / against)


def markdown_lines(rows: Sequence[Row]) -> list[str]:
    """The compiled-kernels section, where the rows have the mode."""
    by_key = stats.index(list(rows))
    workloads = [w for w in stats.ordered_workloads(list(rows)) if (w, COMPILED_KERNELS) in by_key]
    if not workloads:
        return []
    lines = [
        "",
        "## Compiled kernels without the compile wait",
        "",
        f'`{COMPILED_KERNELS}`: `wrap(model, kernels="compiled")` (a training step: `graphed_step(..., '
        'kernels="compiled")`). Eager-kernel graphs from the first call while Inductor compiles the forward (and '
        "backward) in a child process; its graph swapped in once proven (as accurate as eager against float64, "
        f"faster). A second process (`{COMPILED_KERNELS_ON_DISK}`) runs the same on the caches the first left: its "
        "programs found on disk.",
        "",
    ]
    header = ["workload", "decided", "steady ms", "× launchless-compile", "× best floor", "first call ms"]
    header += ["ms while compiling", "compiled in s", "swapped at s", "swap × reduce-overhead's first call"]
    body, verdicts = [], []
    for w in workloads:
        met = targets(w, by_key)
        for mode in KERNEL_MODES:
            row = by_key.get((w, mode))
            if row is None:
                continue
            f = figures_of(w, row, by_key)
            decided = f["kernels"] or "—"
            if f["from_disk"]:  # a second process: the program another one compiled, loaded at the first capture
                decided += " (program from disk)"
            if f["kernels"] != "compiled" and f["reason"]:
                decided += f" ({f['reason']})"
            name = f"`{w}`" + (" second process" if mode == COMPILED_KERNELS_ON_DISK else "")
            ratios = [figure(f["vs_launchless_compile"], "×"), figure(f["vs_best_floor"], "×")]
            times = [figure(f[key]) for key in ("first_call_ms", "during_compile_ms", "compile_s", "swap_s")]
            first_ro = _ok(by_key.get((w, stats.REDUCE_OVERHEAD)), "first_call_ms")  # its compile, waited for
            swap_vs_ro = None if f["swap_s"] is None or not first_ro else f["swap_s"] / (first_ro / 1e3)
            body.append([name, decided, figure(f["steady_ms"]), *ratios, *times, figure(swap_vs_ro, "×")])
        verdicts.append((w, met["targets"]))
    lines += md_table(header, body) + _time_to_swap_lines(workloads, by_key)
    names = list(dict.fromkeys(name for _, met in verdicts for name in met))  # a training step adds its own
    cells = [
        [f"`{w}`", *("—" if met.get(n) is None else ("yes" if met[n] else "**no**") for n in names)]
        for w, met in verdicts
    ]
    return [*lines, "", "Targets met (yes / **no** / — not measured):", "", *md_table(["workload", *names], cells)]


def phases_text(phases: Mapping[str, float] | None) -> str:
    """A compile's seconds per phase, in their order ("start 2.1 (GPU context 1.2, import Inductor 0.9), build 0.4,
    export 1.3, compile 8.4"; "" if none): a phase "start: <part>" is a part of the start phase, what a spare
    compiler was doing while the job waited for it."""
    texts: list[str] = []
    for name, seconds in (phases or {}).items():
        phase, _, part = name.partition(": ")
        if part and texts and texts[-1].startswith(f"{phase} "):
            head, _, inner = texts[-1].partition(" (")
            inner = inner.rstrip(")")
            texts[-1] = f"{head} ({inner + ', ' if inner else ''}{part} {seconds:.1f})"
        else:
            texts.append(f"{name} {seconds:.1f}")
    return ", ".join(texts)


def _time_to_swap_lines(workloads: Sequence[str], by_key: Mapping[tuple[str, str], Row]) -> list[str]:
    """Where each compiled-kernels row's time to its swap went: the compiler's phases (``start``: a process to begin
    in, with what of a spare's boot the job waited for; ``build``: the model's modules imported and its tensors
    made; ``export``, ``compile``, ``save``), the program's read into memory beside the calls, and the seconds of
    each part of its proof (its read onto the model, capture, accuracy, timing), which calls wait for."""
    lines = []
    for w in workloads:
        for mode in KERNEL_MODES:
            row = by_key.get((w, mode))
            if row is None:
                continue
            read = row.get("read_s")
            parts = [phases_text(row.get("compile_phases"))]
            parts.append(f"read {read:.2f}" if isinstance(read, (int, float)) else "")
            if any(parts):
                process = " (second process)" if mode == COMPILED_KERNELS_ON_DISK else ""
                kept = f"; the program kept as {row['program_format']}" if row.get("program_format") else ""
                why = f" ({row['unpackaged']})" if row.get("unpackaged") else ""
                if isinstance(row.get("package_s"), (int, float)):  # Inductor's format swapped in, packaged after
                    kept += f", its package for later processes kept {row['package_s']:.1f} s after the first call"
                proof = row.get("proof_phases")
                waited = (  # what the calls that proved the program waited for: the swap's hiccups
                    "; its proof's parts (seconds inside the calls): "
                    + ", ".join(f"{name} {seconds:.2f}" for name, seconds in proof.items())
                    if proof
                    else ""
                )
                lines.append(f"- `{w}`{process}: " + ", ".join(p for p in parts if p) + f" s{kept}{why}{waited}")
    head = "Time to the swap (compiler phases, the program read into memory, then the parts of its proof):"
    return ["", head, "", *lines] if lines else []


def has_timelines(rows: Sequence[Row]) -> bool:
    return any(len(r.get("timeline") or []) > 1 for r in rows)


def timeline_chart(path: str | Path, rows: Sequence[Row], title: str) -> Any:
    """One panel per workload: each call's latency (log scale) against seconds since that mode's first call began
    (symmetric log scale: the first calls and a swap a minute later both show), a line per mode, the first call
    marked. Returns the figure."""
    workloads = [
        w for w in stats.ordered_workloads(list(rows)) if any(r["workload"] == w and r.get("timeline") for r in rows)
    ]
    modes = stats.ordered_modes(list(rows))
    fig = new_figure(7.5, 2.6 * max(1, len(workloads)) + 0.6)
    fig.suptitle(title, fontsize=10)
    for i, w in enumerate(workloads):
        ax = fig.add_subplot(len(workloads), 1, i + 1)
        for j, mode in enumerate(modes):
            row = next((r for r in rows if r["workload"] == w and r["mode"] == mode), None)
            points = (row or {}).get("timeline") or []
            if len(points) < 2:
                continue
            first_end = points[0][1] / 1e3  # the first call ends when its latency has passed
            xs = [first_end] + [t for t, _ in points[1:]]
            ys = [ms for _, ms in points]
            ax.plot(xs, ys, color=f"C{j % 10}", linewidth=1, label=mode, drawstyle="steps-post")
            ax.plot([first_end], [ys[0]], marker="o", color=f"C{j % 10}", markersize=4)
            if row is not None and row.get("swap_s"):
                ax.axvline(row["swap_s"], color=f"C{j % 10}", linestyle=":", linewidth=1)
        ax.set_xscale("symlog", linthresh=0.1)
        ax.set_xlim(left=0)
        ax.set_yscale("log")
        ax.set_title(w, fontsize=9)
        ax.set_ylabel("ms per call")
        if i == len(workloads) - 1:
            ax.set_xlabel("seconds since the first call began")
        ax.legend(fontsize=6, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, format="png")
    return fig
