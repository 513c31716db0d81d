"""Why a model is slow under ``torch.compile(backend="launchless")``: per-call times and every graph's state.

Runs one zoo model under the launchless backend with launchless's log lines on, times each call on its own
(CUDA events and host time), and prints the distribution, each Dynamo graph's share of a call (its calls' GPU
timeline spans and host time, the rest being the model's Python between graphs) and each compiled graph's
``graph_info()`` (variant, decision times, replays, fallbacks, CGCT). A debugging aid for the device, not a
benchmark: ``launchless bench`` measures.

    python benchmarks/diagnose_compiled.py tv:fasterrcnn_mobilenet_v3_large_fpn --calls 200 --out /tmp/diag
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from pathlib import Path

import torch

from launchless.apps import zoo
from launchless.compiler import backend as _backend
from launchless.compiler.compiled_graphs import CompiledGraphs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--out", required=True)
    parser.add_argument(
        "--compile-first", action="store_true", help="compile on the first call (the bench runs it eagerly first)"
    )
    a = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)

    w = zoo.build(a.model, device="cuda")
    recorded: list[tuple[int, object]] = []
    codes: list[str] = []  # each Dynamo graph's code with its source lines, to read on any machine afterwards
    spans: list[list[tuple[float, torch.cuda.Event, torch.cuda.Event]]] = []  # per graph, its timed calls
    timing = [False]
    inner = _backend.make_backend()

    def recording(gm, example_inputs):
        compiled = inner(gm, example_inputs)
        recorded.append((len(gm.graph.nodes), compiled))
        codes.append(gm.print_readable(print_output=False, include_stride=True, include_device=True)[:40000])
        mine: list = []
        spans.append(mine)

        def timed(*args):  # host time and GPU-timeline span of each call of this graph, while timing
            if not timing[0]:
                return compiled(*args)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            start.record()
            out = compiled(*args)
            end.record()
            mine.append((time.perf_counter() - t0, start, end))
            return out

        return timed

    compiled = torch.compile(w.model, backend=recording)
    host_ms, gpu_ms = [], []
    with torch.no_grad():
        if not a.compile_first:  # as launchless bench does: its eager reference call comes first
            w.model(*w.args, **w.kwargs)
        for _ in range(a.warmup):
            compiled(*w.args, **w.kwargs)
        torch.cuda.synchronize()
        timing[0] = True
        for _ in range(a.calls):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            start.record()
            compiled(*w.args, **w.kwargs)
            end.record()
            host_ms.append((time.perf_counter() - t0) * 1e3)
            end.synchronize()
            gpu_ms.append(start.elapsed_time(end))
        timing[0] = False

    def spread(xs: list[float]) -> dict:
        q = statistics.quantiles(xs, n=10)
        return {"min": min(xs), "p10": q[0], "median": statistics.median(xs), "p90": q[-1], "max": max(xs)}

    graphs = []
    for i, (nodes, runner) in enumerate(recorded, 1):
        mine = spans[i - 1]
        entry = {
            "graph": i,
            "fx_nodes": nodes,
            "type": type(runner).__name__,
            "calls": len(mine),
            "host_ms_per_call": sum(h for h, _, _ in mine) * 1e3 / a.calls,
            "gpu_span_ms_per_call": sum(s.elapsed_time(e) for _, s, e in mine) / a.calls,
            "code": codes[i - 1],
        }
        if isinstance(runner, CompiledGraphs):
            entry["info"] = runner.graph_info()
        graphs.append(entry)
    slow = sorted(range(len(gpu_ms)), key=gpu_ms.__getitem__)[-10:]
    result = {
        "model": a.model,
        "gpu_ms": spread(gpu_ms),
        "host_ms": spread(host_ms),
        "slowest_calls": sorted(slow),
        "first_40_gpu_ms": [round(x, 2) for x in gpu_ms[:40]],
        "graphs": graphs,
    }
    text = json.dumps(result, indent=1, default=str)
    (out / f"{a.model.replace(':', '_')}.json").write_text(text)
    print(json.dumps({k: v for k, v in result.items() if k != "graphs"}, default=str))
    inside = sum(g["gpu_span_ms_per_call"] for g in graphs)
    median = statistics.median(gpu_ms)
    print(f"per call: {median:.3f} ms, of which {inside:.3f} ms inside the {len(graphs)} graphs' calls")
    for g in sorted(graphs, key=lambda g: -g["gpu_span_ms_per_call"]):
        info = g.get("info") or {}
        variants = [(x["variant"], x["times_ms"]) for x in info.get("graphs", [])]
        print(
            f"graph {g['graph']}: {g['gpu_span_ms_per_call']:.3f} ms span, {g['host_ms_per_call']:.3f} ms host, "
            f"{g['calls']} calls, {g['fx_nodes']} fx nodes, {g['type']}: {variants} {info.get('fallbacks', '')}"[:700]
        )


if __name__ == "__main__":
    main()
