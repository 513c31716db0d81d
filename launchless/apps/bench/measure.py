"""Measure one (workload, mode) pair in this process and return its report row.

Per pair: first-call latency (capture or compile plus the first run; ``compile_s`` for the modes that compile),
the median and min per-call time with CUDA events after warm-up, peak GPU memory, the kernel floor (summed GPU
time of the kernels, copies and memsets one call launches, from ``torch.profiler``), the share of its kernels
that ran inside CUDA graphs and the bytes its copies moved (``DeviceProfile``), and correctness against eager on
the same weights and inputs: bit-identical, or the measured maximum difference.
"""

from __future__ import annotations

import cProfile
import io
import json
import pstats
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ...core.verify import difference, identical
from ...timing import cuda_latency, cuda_time
from .. import zoo
from . import modes, stats, training
from .workloads import BenchWorkload

PROFILE_CALLS = 10
COMPILING = ("compile", "reduce-overhead", "launchless-compile", *modes.WITHOUT)  # the modes whose first call compiles
EARLY_CALLS = 30  # calls after the first whose latency is recorded against wall time (the timeline)
SETTLE_S = 240.0  # how long a mode that changes while it runs (compiled kernels) is called until it decides
# how long after its decision such a mode is called while the package of a program swapped in in Inductor's format is
# built (for a second process): the calls meanwhile are in the timeline, and the steady state is timed after it
PACKAGE_S = 240.0
AFTER_SETTLED = 30  # calls recorded after it decided
TIMELINE_POINTS = 300  # a longer timeline is kept as the median of each of this many spans of time
TRAINING_PAUSE_S = 0.02  # between a training step's early calls: fewer steps for the eager reference to repeat
COMPARED_SEED = 0  # the generators' state before the reference call and before the call compared with it


@dataclass(frozen=True)
class DeviceProfile:
    """What one call runs on the GPU, from ``torch.profiler`` over ``PROFILE_CALLS`` calls.

    ``floor_ms``: summed device time of its kernels, copies and memsets (the launch-free limit).
    ``graph_coverage``: the share of its kernels that ran inside CUDA graphs (launched by a graph launch, not one
    by one by the host).
    ``copy_bytes``: bytes its memory copies moved (a replay's input copy; a copy made by a kernel is not counted:
    a strided one, or several inputs copied in one multi-tensor launch, as ``wrap`` copies them -- graph_info()'s
    per-graph byte counts hold those)."""

    floor_ms: float | None
    graph_coverage: float | None
    copy_bytes: float | None


HOST_API = ("cuda_runtime", "cuda_driver")  # the trace categories of the host's CUDA calls


def trace_counts(events: list[dict[str, Any]], calls: int) -> tuple[float | None, float | None]:
    """(graph coverage, copy bytes per call) from a chrome trace's events (``torch.profiler`` export). A kernel ran
    inside a graph where the host call its correlation id points to is a graph launch (``cudaGraphLaunch``): every
    kernel of a replay carries the launch's id; one the host launched itself carries its own launch call's."""
    launches = {
        (e.get("args") or {}).get("correlation"): str(e.get("name", "")) for e in events if e.get("cat") in HOST_API
    }
    kernels = [e for e in events if e.get("cat") == "kernel"]
    inside = sum(1 for k in kernels if "GraphLaunch" in launches.get((k.get("args") or {}).get("correlation"), ""))
    copied = sum(float((e.get("args") or {}).get("bytes", 0)) for e in events if e.get("cat") == "gpu_memcpy")
    return (inside / len(kernels) if kernels else None), copied / calls


def device_profile(call: Any, calls: int = PROFILE_CALLS) -> DeviceProfile:
    """``DeviceProfile`` of ``call``; None in a field the profiler saw nothing for."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    total_us = sum(e.device_time_total for e in prof.events() if e.device_type == DeviceType.CUDA)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text()).get("traceEvents", [])
    coverage, copy_bytes = trace_counts(events, calls)
    return DeviceProfile(total_us / 1e3 / calls if total_us > 0 else None, coverage, copy_bytes)


PROFILE_ROWS = 40  # functions per cProfile table, operations in torch.profiler's


def write_profile(call: Any, path: Path, *, calls: int = PROFILE_CALLS) -> Path:
    """Where the time of ``calls`` calls goes, for a reader comparing two modes: the host's Python functions by own
    and by cumulative time (cProfile), then torch.profiler's table per operation (host and GPU time, kernels,
    copies, syncs). A debugging aid beside the row's figures, which it does not change."""
    from torch.profiler import ProfilerActivity, profile

    wait = torch.cuda.synchronize if torch.cuda.is_available() else lambda: None  # the serving suite runs on a CPU too
    wait()
    host = cProfile.Profile()
    host.enable()
    for _ in range(calls):
        call()
    wait()
    host.disable()
    text = io.StringIO()
    for order in ("tottime", "cumulative"):
        text.write(f"== cProfile of {calls} calls, by {order}\n")
        pstats.Stats(host, stream=text).sort_stats(order).print_stats(PROFILE_ROWS)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        wait()
    text.write(f"== torch.profiler over {calls} calls, by GPU time\n")
    text.write(prof.key_averages().table(sort_by="device_time_total", row_limit=PROFILE_ROWS))
    text.write(f"\n== torch.profiler over {calls} calls, by host time\n")
    text.write(prof.key_averages().table(sort_by="cpu_time_total", row_limit=PROFILE_ROWS))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text.getvalue())
    return path


def profile_path(folder: Path, workload: str, mode: str) -> Path:
    """``<folder>/<workload>--<mode>.txt``, the workload's name made a file name (``tv:fcos`` -> ``tv_fcos``)."""
    return folder / f"{re.sub(r'[^A-Za-z0-9_.@-]', '_', workload)}--{mode}.txt"


def _build(w: BenchWorkload) -> zoo.Workload:
    return zoo.build(w.zoo, batch=w.batch, device="cuda", dtype=w.torch_dtype)


def synchronize_device(device: torch.device) -> None:
    """Wait for the work queued on ``device`` (none on the CPU, where a call has ended when it returns)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def compare_outputs(reference: Any, output: Any) -> dict:
    if identical(reference, output):
        return {"status": "bit-identical", "max_abs_diff": 0.0}
    return {"status": "differs", "max_abs_diff": difference(reference, output, 0.0)[0]}


def clone_outputs(tree: Any) -> Any:
    from torch.utils._pytree import tree_map

    return tree_map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, tree)


def early_calls(prepared: modes.Prepared, start: float, *, pause_s: float = 0.0) -> dict:
    """The calls after the first, each waited for, as (seconds since the first call began, ms): ``EARLY_CALLS`` of
    them, or for a mode that changes while it runs, until it decides (at most ``SETTLE_S``) and ``AFTER_SETTLED``
    more. Such a mode's row adds when it decided (``swap_s``), its calls' median latency until then
    (``during_compile_ms``) and what it decided (``kernels``, ``kernels_reason``, ``compile_s``, and the
    compiler's ``compile_phases``); where a package of the program swapped in is still being built, the calls go on
    until it is (at most ``PACKAGE_S`` more: ``package_s``, when it was done). ``pause_s``: idle time after each
    call (training steps, each of which the correctness check repeats eager); ``early_calls`` counts the calls
    made; a mode that does not change adds its calls' median (``early_ms``), the pace its calls while compiling
    are held to (the same wait and pause: a step after an idle pause costs more than back-to-back calls)."""
    points: list[tuple[float, float]] = [(0.0, (time.perf_counter() - start) * 1e3)]  # the first call
    decided: dict | None = None
    decided_at = after = 0
    package_s: float | None = None
    while True:
        began = time.perf_counter()
        prepared.call()
        torch.cuda.synchronize()
        points.append((began - start, (time.perf_counter() - began) * 1e3))
        if pause_s:
            time.sleep(pause_s)
        if prepared.settled is None:
            if len(points) > EARLY_CALLS:
                break
            continue
        if decided is None:
            decided = prepared.settled()
            decided_at = len(points)
            if decided is None and began - start > SETTLE_S:
                break
        else:
            after += 1
            if after >= AFTER_SETTLED:
                latest = prepared.settled() or decided or {}
                if latest.get("package_pending") and began - start <= points[decided_at - 1][0] + PACKAGE_S:
                    continue
                if decided is not None and decided.get("package_pending"):  # built or given up: when; why none
                    package_s = None if latest.get("package_pending") else round(began - start, 4)  # as the timeline
                    kept = {key: latest.get(key) for key in ("unpackaged", "compile_phases")}  # the package's too
                    decided = {**decided, **kept}
                break
    row: dict[str, Any] = {"timeline": thinned(points), "early_calls": len(points) - 1}
    if prepared.settled is None:  # what a call costs waited for this way: the pace calls while compiling are held to
        early = sorted(ms for _, ms in points[1:])
        row["early_ms"] = early[len(early) // 2] if early else None
    else:
        during = (
            sorted(ms for _, ms in points[1:decided_at]) if decided is not None else sorted(ms for _, ms in points[1:])
        )
        row["during_compile_ms"] = during[len(during) // 2] if during else None
        row["swap_s"] = points[decided_at - 1][0] if decided is not None and decided["kernels"] == "compiled" else None
        row["kernels"] = None if decided is None else decided["kernels"]
        row["kernels_reason"] = "not decided within the bench's wait" if decided is None else decided["reason"]
        row["compile_s"] = None if decided is None else decided.get("compile_s")
        row["compile_phases"] = None if decided is None else decided.get("compile_phases")
        row["read_s"] = None if decided is None else decided.get("read_s")  # the program read into memory
        row["proof_phases"] = None if decided is None else decided.get("proof_phases")  # the swap call's wait
        row["program"] = None if decided is None else decided.get("program")  # "found on disk": a second process
        row["program_format"] = None if decided is None else decided.get("program_format")  # package or artifact
        row["unpackaged"] = None if decided is None else decided.get("unpackaged")  # why no package, where not
        row["package_s"] = package_s  # a package built after Inductor's format swapped in: done at (for later ones)
    return row


def thinned(points: list[tuple[float, float]]) -> list[list[float]]:
    """At most ``TIMELINE_POINTS`` points: the first call as it is, the others as the median latency of the calls
    in each of equal spans of time."""
    if len(points) <= TIMELINE_POINTS:
        return [[round(t, 4), round(ms, 4)] for t, ms in points]
    first, rest = points[0], points[1:]
    t0, t1 = rest[0][0], rest[-1][0]
    width = (t1 - t0) / (TIMELINE_POINTS - 1) or 1.0
    spans: dict[int, list[tuple[float, float]]] = {}
    for t, ms in rest:
        spans.setdefault(int((t - t0) / width), []).append((t, ms))
    out = [[round(first[0], 4), round(first[1], 4)]]
    for span in spans.values():
        ms_sorted = sorted(ms for _, ms in span)
        out.append([round(span[0][0], 4), round(ms_sorted[len(ms_sorted) // 2], 4)])
    return out


RACE_ROUNDS = 7  # rounds of the raced modes, each round every mode in turn, the order rotating
RACE_WARMUP = 6  # calls before the rounds: compiled, captured (launchless decides its variant on its first calls)


def race_contestants(kind: str) -> tuple[str, ...]:
    """The modes ``raced`` times in one process: PyTorch's two compiled modes and launchless's graph path for the
    workload's kind (the compiler backend for inference, ``graphed_step`` for a training step)."""
    return ("compile", "reduce-overhead", stats.graph_path_mode(kind))


def measure_raced(w: BenchWorkload, iters: int) -> dict:
    """The ``raced`` row: ``race_contestants`` prepared in this one process (inference: on the one model; training:
    each on its own seeded setup), warmed up, then ``RACE_ROUNDS`` rounds of back-to-back calls (``cuda_time``), each
    round every mode in turn, the order rotating; per mode the median of its rounds' medians (``raced_ms``) and the
    rounds themselves. The calls of a round are ``iters`` spread over the rounds (at least 10)."""
    contestants = race_contestants(w.kind)
    per_round = max(10, iters // RACE_ROUNDS)
    grad = torch.enable_grad() if w.kind == "training" else torch.no_grad()
    with grad:
        if w.kind == "inference":
            built = _build(w)
            prepared = {m: modes.inference(m, built.model, built.args, built.kwargs) for m in contestants}
        else:
            prepared = {m: training.training(m, training.setup(w)) for m in contestants}
        for ready in prepared.values():
            for _ in range(RACE_WARMUP):
                ready.call()
        torch.cuda.synchronize()
        rounds: dict[str, list[float]] = {m: [] for m in contestants}
        for r in range(RACE_ROUNDS):
            for mode in contestants[r % len(contestants) :] + contestants[: r % len(contestants)]:
                rounds[mode].append(cuda_time(prepared[mode].call, warmup=3, iters=per_round).median_ms)
    return {
        "workload": w.name,
        "mode": modes.RACED,
        "kind": w.kind,
        "status": "ok",
        "reason": None,
        "raced_ms": {m: sorted(times)[len(times) // 2] for m, times in rounds.items()},
        "raced_rounds_ms": {m: [round(t, 5) for t in times] for m, times in rounds.items()},
        "raced_calls_per_round": per_round,
    }


def measure(w: BenchWorkload, mode: str, iters: int, *, profile_dir: Path | None = None) -> dict:
    """The report row for one pair; raises ModeUnavailable when the mode cannot run the workload. ``profile_dir``:
    where the pair's profile goes too (``write_profile``), after its figures are taken."""
    if mode == modes.RACED:
        return measure_raced(w, iters)
    built = _build(w) if w.kind == "inference" else None
    row: dict = {"workload": w.name, "mode": mode, "kind": w.kind, "status": "ok", "reason": None}
    grad = torch.enable_grad() if w.kind == "training" else torch.no_grad()
    with grad:
        if w.kind == "inference":
            args, kwargs = built.args, built.kwargs
            torch.manual_seed(COMPARED_SEED)  # a forward that draws random numbers (a diffusion step's noise)
            reference = clone_outputs(built.model(*args, **kwargs))
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        if w.kind == "inference":
            prepared = modes.inference(mode, built.model, args, kwargs)
        else:
            prepared = training.training(mode, training.setup(w))
        prepared.call()
        torch.cuda.synchronize()
        row["first_call_ms"] = (time.perf_counter() - start) * 1e3
        if w.kind == "inference":
            row.update(early_calls(prepared, start))
        else:  # every mode's steps paced alike: a step after an idle pause costs more than one back to back
            row.update(early_calls(prepared, start, pause_s=TRAINING_PAUSE_S))
        if w.kind == "inference":  # the same draws as the reference's (a graph replays from the generator's state)
            torch.manual_seed(COMPARED_SEED)
        output = clone_outputs(prepared.call())
        timing = cuda_time(prepared.call, warmup=5, iters=iters)
        row.update(median_ms=timing.median_ms, min_ms=timing.min_ms, calls=timing.calls)
        row["latency_ms"] = cuda_latency(prepared.call, warmup=0, iters=iters).median_ms
        row["peak_mem_mb"] = torch.cuda.max_memory_allocated() / 2**20
        profiled = device_profile(prepared.call)
        floor = row["kernel_floor_ms"] = profiled.floor_ms
        row["floor_ratio"] = timing.median_ms / floor if floor else None
        row.update(graph_coverage=profiled.graph_coverage, copy_bytes=profiled.copy_bytes)
        if mode in COMPILING:
            row["compile_s"] = row["first_call_ms"] / 1e3  # Dynamo, Inductor (and the capture) with the first run
        if prepared.details is not None:
            row["graphs"] = prepared.details()
        if profile_dir is not None:
            write_profile(prepared.call, profile_path(profile_dir, w.name, mode))
    if w.kind == "inference":
        row["correctness"] = (
            {"status": "reference", "max_abs_diff": 0.0} if mode == "eager" else compare_outputs(reference, output)
        )
    else:
        steps = prepared.steps_in_prepare + 2 + row.get("early_calls", 0)  # the first call, early ones, this one
        row["correctness"] = compare_outputs(training.eager_loss_after(w, steps), output)
    return row
