"""Where the host time of a call goes, side by side for several modes: cProfile over timed calls.

When two modes replay the same kernels (launchless-compile and reduce-overhead share Inductor's) but one is
slower per call, the difference is host work: Python between graphs, guards, copies, syncs. This runs one zoo
model in each mode the way ``launchless bench`` does (``launchless.apps.bench.modes``), times each call (CUDA events
and host clock) unprofiled and under cProfile, writes the top functions by own and cumulative time and
torch.profiler's per-op table (ten calls: CUDA API calls, copies, syncs). A debugging aid for the device, not a
benchmark.

    python benchmarks/profile_host.py tv:fcos_resnet50_fpn --modes reduce-overhead launchless-compile --out /tmp/p
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import time
from pathlib import Path

import torch

from launchless.apps import zoo
from launchless.apps.bench.modes import inference

CALL = "profile_host.call"
_LAUNCHES = ("cudaGraphLaunch", "cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC")


def _launch_offsets(events) -> dict:
    """Median µs from a call's start to its first launch and to its first graph launch, and from its last launch
    to its end: the host work a waited-for call puts before the GPU starts, and what it does after."""
    calls = [e for e in events if e.name == CALL]
    launches = sorted((e for e in events if e.name in _LAUNCHES), key=lambda e: e.time_range.start)
    first, first_graph, tail = [], [], []
    for c in calls:
        inside = [e for e in launches if c.time_range.start <= e.time_range.start <= c.time_range.end]
        if not inside:
            continue
        first.append(inside[0].time_range.start - c.time_range.start)
        tail.append(c.time_range.end - inside[-1].time_range.end)
        graphs = [e for e in inside if e.name == "cudaGraphLaunch"]
        if graphs:
            first_graph.append(graphs[0].time_range.start - c.time_range.start)
    median = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
    return {
        "to_first_launch_us": median(first),
        "to_first_graph_launch_us": median(first_graph),
        "after_last_launch_us": median(tail),
    }


def _profile(mode: str, name: str, calls: int, warmup: int, out: Path) -> dict:
    torch._dynamo.reset()
    w = zoo.build(name, device="cuda")
    with torch.no_grad():
        w.model(*w.args, **w.kwargs)  # as the bench: the eager reference call comes first
        prepared = inference(mode, w.model, w.args, w.kwargs)
        for _ in range(warmup):
            prepared.call()
        torch.cuda.synchronize()
        plain = []  # unprofiled: cProfile slows Python-heavy modes more than others
        for _ in range(calls):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            prepared.call()
            end.record()
            end.synchronize()
            plain.append(start.elapsed_time(end))
        gpu_ms, host_ms = [], []
        profiler = cProfile.Profile()
        for _ in range(calls):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            start.record()
            profiler.enable()
            prepared.call()
            profiler.disable()
            end.record()
            host_ms.append((time.perf_counter() - t0) * 1e3)
            end.synchronize()
            gpu_ms.append(start.elapsed_time(end))
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        ) as prof:
            for _ in range(10):
                torch.cuda.synchronize()  # each call from an idle GPU, as a waited-for call
                with torch.profiler.record_function(CALL):
                    prepared.call()
            torch.cuda.synchronize()
        prof.export_chrome_trace(str(out / f"{name.replace(':', '_')}-{mode}-trace.json"))
    ops = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=45, max_name_column_width=60)
    (out / f"{name.replace(':', '_')}-{mode}-ops.txt").write_text(ops)
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime").print_stats(40)
    stats.sort_stats("cumulative").print_stats(60)
    (out / f"{name.replace(':', '_')}-{mode}.txt").write_text(text.getvalue())
    result = {
        "model": name,
        "mode": mode,
        **_launch_offsets(prof.events()),
        "unprofiled_ms_median": statistics.median(plain),
        "gpu_ms_median": statistics.median(gpu_ms),
        "host_ms_median": statistics.median(host_ms),
        "calls": calls,
    }
    if prepared.details is not None:
        result["details"] = prepared.details()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--modes", nargs="+", default=["reduce-overhead", "launchless-compile"])
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--out", required=True)
    a = parser.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    results = [_profile(mode, a.model, a.calls, a.warmup, out) for mode in a.modes]
    for r in results:
        print(json.dumps({k: v for k, v in r.items() if k != "details"}))
    (out / f"{a.model.replace(':', '_')}.json").write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
