"""Why a model is slow under ``torch.compile(backend="launchless")``: per-call times and every graph's state.

Runs one zoo model under the launchless backend with launchless's log lines on, times each call on its own
(CUDA events and host time), and prints the distribution, the slowest calls' positions, and each compiled
graph's ``graph_info()`` (variant, decision times, replays, CGCT). A debugging aid for the device, not a
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

from launchless import zoo
from launchless.compiler import backend as _backend
from launchless.compiler.compiled_graphs import CompiledGraphs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--out", required=True)
    a = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)

    w = zoo.build(a.model, device="cuda")
    recorded: list[tuple[int, object]] = []
    inner = _backend.make_backend()

    def recording(gm, example_inputs):
        compiled = inner(gm, example_inputs)
        recorded.append((len(gm.graph.nodes), compiled))
        return compiled

    compiled = torch.compile(w.model, backend=recording)
    host_ms, gpu_ms = [], []
    with torch.no_grad():
        for _ in range(a.warmup):
            compiled(*w.args, **w.kwargs)
        torch.cuda.synchronize()
        for _ in range(a.calls):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            start.record()
            compiled(*w.args, **w.kwargs)
            end.record()
            host_ms.append((time.perf_counter() - t0) * 1e3)
            end.synchronize()
            gpu_ms.append(start.elapsed_time(end))

    def spread(xs: list[float]) -> dict:
        q = statistics.quantiles(xs, n=10)
        return {"min": min(xs), "p10": q[0], "median": statistics.median(xs), "p90": q[-1], "max": max(xs)}

    graphs = []
    for i, (nodes, runner) in enumerate(recorded, 1):
        entry = {"graph": i, "fx_nodes": nodes, "type": type(runner).__name__}
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
    for g in graphs:
        info = g.get("info") or {}
        print(g["graph"], g["fx_nodes"], g["type"], json.dumps(info, default=str)[:600])


if __name__ == "__main__":
    main()
