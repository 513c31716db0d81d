"""The compiler path's evidence besides speed (which `launchless bench --suite compiler` measures).

1. Capture coverage of the models a host->device copy keeps out of plain capture: whole-model
   runtime capture (launchless.wrap), the compiler path without CGCT, and with CGCT -- the share of
   one call's kernels that run inside CUDA graphs, plus the rewrites applied.
2. Bytes copied per replay with and without pointer indirection on a large-input workload.

Each model runs in this process one after the other; a JSON line per result is appended to
``<out>/compiler-evidence.jsonl`` as soon as it exists, so a run cut short keeps what it measured.
A markdown table is written at the end.

    python benchmarks/compiler_evidence.py --out /tmp/evidence [--models tv:raft_small hf:mistral-tiny]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import launchless as ll
from launchless.apps import zoo
from launchless.apps.bench.workloads import COMPILER, WORKLOADS
from launchless.apps.environment import describe as describe_environment

# the models a host copy keeps out of plain capture, fasterrcnn_mobilenet (in the standard suite too) among them
BLOCKED = [w.zoo for w in WORKLOADS.values() if w.suites == (COMPILER,)] + ["tv:fasterrcnn_mobilenet_v3_large_fpn"]


def runtime_capture(model: torch.nn.Module, args: tuple, kwargs: dict) -> str:
    try:
        wrapped = ll.wrap(model, cuda_graph=True)
        wrapped.capture_graph(*args, **kwargs)
        return "captured"
    except Exception as exc:  # the error names the blocker
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"


def coverage(model: torch.nn.Module, args: tuple, kwargs: dict, **options: object) -> dict:
    start = time.perf_counter()
    explanation = ll.explain(model, *args, backend_options=options, **kwargs)
    return {
        "coverage": explanation.coverage,
        "kernels_per_call": explanation.kernels_per_call,
        "graphs": len(explanation.graphs),
        "captured_graphs": sum(1 for g in explanation.graphs if g.info and g.info["graphs"]),
        "rewrites": [r for g in explanation.graphs if g.info and g.info.get("cgct") for r in g.info["cgct"]["applied"]],
        "seconds": time.perf_counter() - start,
    }


def bytes_copied(indirection: bool) -> dict:
    """A convolution on a 1x3x1024x1024 image: the input copy is a visible share of a short graph."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 3, 1))
    model = model.cuda().eval()
    x = torch.randn(1, 3, 1024, 1024, device="cuda")
    explanation = ll.explain(model, x, backend_options={"indirection": indirection, "reprofile": True})
    graphs = [g for e in explanation.graphs if e.info for g in e.info["graphs"]]
    return {"indirection": indirection, "graphs": graphs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--models", nargs="*", default=BLOCKED, help="zoo names (none: only the bytes measurement)")
    parser.add_argument("--skip-bytes", action="store_true")
    a = parser.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    lines = out / "compiler-evidence.jsonl"
    rows = []

    def emit(row: dict) -> None:
        rows.append(row)
        with lines.open("a") as f:
            f.write(json.dumps(row, default=str) + "\n")
        print(json.dumps(row, default=str), flush=True)

    emit({"environment": describe_environment()})
    if not a.skip_bytes:
        for flag in (False, True):
            emit({"bytes_copied": bytes_copied(flag)})
    for name in a.models:
        if not zoo.available(name):
            emit({"model": name, "skipped": "package missing"})
            continue
        w = zoo.build(name, device="cuda")
        row = {"model": name, "runtime_capture": runtime_capture(w.model, w.args, w.kwargs)}
        with torch.no_grad():
            for label, options in (("compiler_without_cgct", {"cgct": False}), ("compiler_with_cgct", {})):
                try:
                    row[label] = coverage(w.model, w.args, w.kwargs, **options)
                except Exception as exc:
                    row[label] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
        emit(row)
    table = [
        "| model | runtime capture | coverage without CGCT | coverage with CGCT | rewrites |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        if "model" not in row or "skipped" in row:
            continue
        cov = [
            row[k].get("coverage") if isinstance(row[k], dict) else None
            for k in ("compiler_without_cgct", "compiler_with_cgct")
        ]
        text = ["—" if c is None else f"{c:.0%}" for c in cov]
        rewrites = (
            len(row["compiler_with_cgct"].get("rewrites", [])) if isinstance(row["compiler_with_cgct"], dict) else 0
        )
        table.append(f"| `{row['model']}` | {row['runtime_capture'][:60]} | {text[0]} | {text[1]} | {rewrites} |")
    (out / "compiler-evidence.md").write_text("\n".join(table) + "\n")


if __name__ == "__main__":
    main()
