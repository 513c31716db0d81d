"""What a smaller largest bucket would buy: the serving suite's trace served with buckets up to 8 or 16 rows, each
larger call split into calls of the largest bucket (their outputs joined), against a graph per size and the buckets
up to 32. The buckets target asks for a quarter of a graph per size's memory at 0.9x its speed; a model's graphs
share one pool, whose size is what the largest batch replayed at once needs, so a quarter of the memory means
replaying about a quarter of the rows at once, and so several replays for the larger calls. This measures that trade:
trace time (each call waited for, as the serving suite times it), graph memory by launchless's count
(``memory_budget()["held_bytes"]``: pool growth and static input buffers) and by the driver's (free memory lost,
with PyTorch's cached free blocks given back), and the largest difference from eager. One (workload, mode) a process:
the memory count is the process's.

    PYTHONPATH=. python benchmarks/bucket_split.py buckets:resnet18@64 split-8 --out split.jsonl
    PYTHONPATH=. python benchmarks/bucket_split.py --report split.jsonl --out results/DATE-bucket-split  # .md, .png
"""

import argparse
import functools
import json
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

import launchless
from launchless.apps.bench.measure import clone_outputs, compare_outputs
from launchless.apps.bench.serving_buckets import BUCKET_SIZES, waited_ms
from launchless.apps.bench.serving_graphs import device_free_mark
from launchless.apps.bench.serving_workloads import LARGEST_BATCH, TRACE_CALLS, TRACE_SEED, batch_trace, bucket_builder

MiB = 1 << 20
LARGEST_BUCKET = {"graph-per-size": None, "buckets": 32, "split-16": 16, "split-8": 8}


def split_call(wrapped: launchless.GraphedModule, rows: int, largest: int, inputs: tuple[tuple, dict]) -> Any:
    """One call served in calls of at most ``largest`` rows, the outputs' rows joined back in order."""
    args, kwargs = inputs
    if rows <= largest:
        return wrapped(*args, **kwargs)
    parts = []
    for start in range(0, rows, largest):
        part = tree_map(lambda t, s=start: t[s : s + largest] if isinstance(t, torch.Tensor) else t, (args, kwargs))
        parts.append(wrapped(*part[0], **part[1]))
    leaves, spec = zip(*(tree_flatten(p) for p in parts), strict=True)
    joined = [
        torch.cat(column) if isinstance(column[0], torch.Tensor) else column[0] for column in zip(*leaves, strict=True)
    ]
    return tree_unflatten(joined, spec[0])


def report(rows_path: str, prefix: str) -> None:
    """``prefix``.md (each mode's speed and memory over a graph per size's) and ``prefix``.png (memory against
    speed, one line per workload) from the rows in ``rows_path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in Path(rows_path).read_text().splitlines()]
    per_size = {r["workload"]: r for r in rows if r["mode"] == "graph-per-size"}
    lines = [
        "| workload | mode | largest bucket | replays | trace ms | × graph-per-size speed | held MiB "
        "| × graph-per-size held | driver MiB | × graph-per-size driver | graphs | max abs diff |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    figure, axes = plt.subplots(figsize=(6.5, 4.2))
    for workload in per_size:
        base = per_size[workload]
        own = [r for r in rows if r["workload"] == workload]
        for r in own:
            speed, held = base["trace_ms"] / r["trace_ms"], r["held_mib"] / base["held_mib"]
            lines.append(
                f"| `{workload}` | {r['mode']} | {r['largest_bucket']} | {r['replays']} | {r['trace_ms']:.1f} "
                f"| {speed:.2f}× | {r['held_mib']:.1f} | {held:.2f}× | {r['driver_mib']:.0f} "
                f"| {r['driver_mib'] / base['driver_mib']:.2f}× | {r['graphs']} | {r['max_abs_diff']:.2g} |"
            )
        axes.plot(
            [r["held_mib"] / base["held_mib"] for r in own],
            [base["trace_ms"] / r["trace_ms"] for r in own],
            marker="o",
            label=workload,
        )
        for r in own:
            axes.annotate(r["mode"], (r["held_mib"] / base["held_mib"], base["trace_ms"] / r["trace_ms"]), fontsize=7)
    axes.axvline(0.25, color="grey", linestyle="--", linewidth=0.8)
    axes.axhline(0.9, color="grey", linestyle="--", linewidth=0.8)
    axes.set_xlabel("graph memory held, × a graph per size (target ≤ 0.25)")
    axes.set_ylabel("trace speed, × a graph per size (target ≥ 0.9)")
    axes.set_xlim(0, 1.05)
    axes.set_ylim(0, 1.1)
    axes.legend(fontsize=8)
    axes.set_title(f"{rows[0]['versions']['gpu']}, torch {rows[0]['versions']['torch']}", fontsize=9)
    figure.tight_layout()
    figure.savefig(f"{prefix}.png", dpi=120)
    with open(f"{prefix}.md", "w") as f:
        f.write("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload", nargs="?")
    parser.add_argument("mode", nargs="?", choices=tuple(LARGEST_BUCKET))
    parser.add_argument(
        "--out",
        required=True,
        help="JSON-lines file the row is appended to (with --report: the prefix of the .md and .png written)",
    )
    parser.add_argument("--report", metavar="ROWS_JSONL", help="write the table and chart of earlier rows instead")
    args = parser.parse_args()
    if args.report:
        report(args.report, args.out)
        return
    if args.workload is None or args.mode is None:
        parser.error("give a workload and a mode, or --report ROWS_JSONL")
    device = torch.device("cuda")
    model, make_inputs = bucket_builder(args.workload)(device=device)
    sizes = batch_trace(TRACE_CALLS)
    torch.manual_seed(TRACE_SEED)
    trace = [make_inputs(rows) for rows in sizes]
    largest = LARGEST_BUCKET[args.mode]
    with torch.no_grad():
        reference = [clone_outputs(model(*a, **k)) for a, k in trace]
        free_before = device_free_mark()
        if largest is None:
            wrapped = launchless.wrap(model, capture_after=1, max_graphs=LARGEST_BATCH)
            largest = LARGEST_BATCH
        else:
            buckets = [b for b in BUCKET_SIZES if b <= largest]
            wrapped = launchless.wrap(model, capture_after=1, batch_buckets=buckets)
        serve = functools.partial(split_call, wrapped, largest=largest)
        began = time.perf_counter()
        for rows, inputs in zip(sizes, trace, strict=True):
            serve(rows, inputs=inputs)
        torch.cuda.synchronize()
        first_pass_s = time.perf_counter() - began
        times = [
            waited_ms(functools.partial(serve, rows, inputs=inputs), device=device)
            for rows, inputs in zip(sizes, trace, strict=True)
        ]
        compared = [
            compare_outputs(ref, serve(rows, inputs=inputs))
            for ref, rows, inputs in zip(reference, sizes, trace, strict=True)
        ]
    info = wrapped.graph_info()
    row = {
        "workload": args.workload,
        "mode": args.mode,
        "largest_bucket": largest,
        "trace_ms": sum(times),
        "first_pass_s": first_pass_s,
        "graphs": len(info["graphs"]),
        "held_mib": launchless.memory_budget()["held_bytes"] / MiB,
        "driver_mib": (free_before - device_free_mark()) / MiB,
        "replays": sum(-(-rows // largest) for rows in sizes),
        "max_abs_diff": max(c["max_abs_diff"] for c in compared),
        "identical": all(c["status"] == "bit-identical" for c in compared),
        "eager_calls": info["eager_calls"],
        "fallbacks": info["fallbacks"],
        "batch_buckets": info["batch_buckets"],
        "versions": {"torch": torch.__version__, "gpu": torch.cuda.get_device_name()},
    }
    print(json.dumps(row))
    with open(args.out, "a") as f:
        f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
