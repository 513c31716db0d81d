"""Batch-1 latency of launchless.wrap against eager and a hand-written torch.cuda.graph capture.

Side by side in one process per model, CUDA-event medians after warm-up. Also the wrapper's own
Python cost per call: host time of ``wrapped(x)`` minus host time of the same work written by hand
(copy the input into the static buffer, replay, clone the output), in alternating rounds.
PyTorch's default precision unless ``--tf32`` (TF32 matmuls, as many deployments run).

    python benchmarks/runtime_latency.py --out DIR [--models timm:resnet18 hf:gpt2 ...] [--tf32]
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
from torch.utils import _pytree as pytree

import launchless as ll
from launchless.apps import zoo
from launchless.apps.bench.modes import hand_graph
from launchless.apps.environment import describe
from launchless.timing import cuda_time, host_overhead_us

MODELS = [
    "timm:resnet18",
    "timm:mobilenetv3_small_100",
    "timm:efficientnet_b0",
    "timm:convnext_atto",
    "timm:vit_tiny_patch16_224",
    "hf:bert-base",
    "hf:gpt2",
    "hf:t5-small",
]


def bench_model(name: str, iters: int) -> dict:
    w = zoo.build(name, device="cuda")
    args, kwargs = w.inputs()  # fresh tensors: every call copies into the static buffers
    row: dict = {"model": name}
    with torch.no_grad():
        row["eager_ms"] = cuda_time(lambda: w.model(*args, **kwargs), iters=iters).median_ms
        replay = hand_graph(w.model, args, kwargs)

        outs = [t for t in pytree.tree_leaves(replay()) if isinstance(t, torch.Tensor)]

        def replay_and_clone():  # the cheapest hand-written equivalent: clones into a flat list
            replay()
            return [t.clone() for t in outs]

        row["hand_graph_ms"] = cuda_time(replay, iters=iters).median_ms
        m = ll.wrap(w.model, cuda_graph=True)
        info = m.capture_graph(*w.args, **w.kwargs)
        row["capture_ms"] = info["capture_ms"]
        row["verification"] = info["verification"]["status"]
        row["max_abs_diff"] = info["verification"]["max_abs_diff"]
        row["launchless_ms"] = cuda_time(lambda: m(*args, **kwargs), iters=iters).median_ms
        row["wrapper_us"] = host_overhead_us(lambda: m(*args, **kwargs), replay_and_clone)
    row["vs_hand"] = row["launchless_ms"] / row["hand_graph_ms"]
    row["speedup_vs_eager"] = row["eager_ms"] / row["launchless_ms"]
    m.release_graphs()
    return row


def _diff(row: dict) -> str:
    return "" if row["max_abs_diff"] == 0 else f" ({row['max_abs_diff']:.2g})"


def markdown(env: dict, rows: list[dict]) -> str:
    precision = "TF32 matmuls" if env["tf32_matmul"] else "PyTorch default precision (fp32 matmuls)"
    head = (
        f"# launchless.wrap latency, batch 1, {precision}\n\n{env['date']} · {env['gpu']} · driver {env['driver']} · "
        f"torch {env['torch']} · CUDA {env['cuda']} · triton {env['triton']}\n\n"
        "| model | eager ms | hand graph ms | launchless ms | launchless / hand | speed-up vs eager | "
        "wrapper Python µs/call | capture ms | verification |\n|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = [
        f"| {r['model']} | {r['eager_ms']:.3f} | {r['hand_graph_ms']:.3f} | {r['launchless_ms']:.3f} | "
        f"{r['vs_hand']:.3f}× | {r['speedup_vs_eager']:.2f}× | {r['wrapper_us']:.1f} | {r['capture_ms']:.0f} | "
        f"{r['verification']}{_diff(r)} |"
        for r in rows
    ]
    return head + "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=MODELS)
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--out", default=os.environ.get("OUT", "out"))
    parser.add_argument("--tf32", action="store_true", help="allow TF32 in matmuls (cuDNN convs use it by default)")
    a = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = a.tf32
    env = describe() | {"tf32_matmul": a.tf32}
    rows = []
    for name in a.models:
        rows.append(bench_model(name, a.iters))
        print(json.dumps(rows[-1]), flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "runtime_latency_tf32" if a.tf32 else "runtime_latency"
    (out / f"{stem}.json").write_text(json.dumps({"environment": env, "rows": rows}, indent=2))
    text = markdown(env, rows)
    (out / f"{stem}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
