"""Where the first call of ``wrap(model, kernels=...)`` goes: eager kernels against compiled ones, and what of the
compiled mode's start costs it.

``kernels="compiled"`` starts a spare compiler process when the model is wrapped and a compile job when a graph is
kept; either may cost the first call (a process started beside it, a model's structure pickled in a thread beside
the capture). Each variant runs in a fresh process with a fresh program cache, ``--repeats`` times; the first call
is timed from before ``wrap()`` to its synchronized result, as ``launchless bench`` times it, then ``--calls`` more:

- ``eager``: ``wrap(model)``, eager kernels;
- ``compiled``: ``wrap(model, kernels="compiled")``;
- ``no-spare``: the same with no spare compiler process (the job starts its own);
- ``no-job``: the same with no compile job (the spare process alone).

The compiled variant's first call is also profiled (``cProfile``, the calls' thread).

    python benchmarks/first_call_cost.py --workload timm:resnet18 --repeats 2 --out /tmp/first
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import tempfile
import time
from typing import Any

import torch
from diagnostics import keep_report, run_fresh

import launchless as ll
from launchless.apps import zoo
from launchless.runtime import compiled_kernels

VARIANTS = ("eager", "compiled", "no-spare", "no-job")


class _NoSpare(compiled_kernels.SpareCompiler):
    """A spare compiler that never starts: ``take`` finds none, so the job starts its own process."""

    def __init__(self, model: torch.nn.Module) -> None:
        self._child = None


def _variant(name: str) -> str:
    """Patches this process for variant ``name``; the ``kernels`` option it wraps with."""
    if name == "no-spare":
        compiled_kernels.SpareCompiler = _NoSpare  # type: ignore[misc]
    elif name == "no-job":
        compiled_kernels.CompiledKernels.start = lambda self, *args, **kwargs: None  # type: ignore[method-assign]
    return "eager" if name == "eager" else "compiled"


def _synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def run_variant(workload: str, variant: str, *, calls: int, profile_top: int) -> dict[str, Any]:
    kernels = _variant(variant)
    built = zoo.build(workload, device="cuda" if torch.cuda.is_available() else "cpu")
    profiler = cProfile.Profile() if profile_top else None
    with torch.inference_mode():
        _synchronize()
        began = time.perf_counter()
        if profiler is not None:
            profiler.enable()
        wrapped = ll.wrap(built.model, kernels=kernels)
        wrapped(*built.args, **built.kwargs)
        _synchronize()
        if profiler is not None:
            profiler.disable()
        first_ms = (time.perf_counter() - began) * 1e3
        later = []
        for _ in range(calls):
            began = time.perf_counter()
            wrapped(*built.args, **built.kwargs)
            _synchronize()
            later.append((time.perf_counter() - began) * 1e3)
    row: dict[str, Any] = {"variant": variant, "first_call_ms": round(first_ms, 2)}
    if later:
        row["next_calls_median_ms"] = round(statistics.median(later), 4)
    if profiler is not None:
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(profile_top)
        row["profile"] = text.getvalue()
    return row


def _child(ns: argparse.Namespace, variant: str, *, profile_top: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as cache:
        arguments = [__file__, "--variant", variant, "--workload", ns.workload]
        arguments += ["--calls", str(ns.calls), "--top", str(profile_top)]
        return {"variant": variant} | run_fresh(arguments, env={"LAUNCHLESS_CACHE_DIR": cache})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="timm:resnet18", help="a zoo workload (launchless.apps.zoo)")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--repeats", type=int, default=2, help="fresh processes per variant, taken in turn")
    parser.add_argument("--calls", type=int, default=30, help="calls timed after the first")
    parser.add_argument("--top", type=int, default=40, help="functions in the compiled first call's profile")
    parser.add_argument("--out", default="", help="where the JSON and the profile go (default: printed only)")
    parser.add_argument("--variant", default="", help=argparse.SUPPRESS)  # a child's one variant
    ns = parser.parse_args()
    if ns.variant:
        print(json.dumps(run_variant(ns.workload, ns.variant, calls=ns.calls, profile_top=ns.top)))
        return
    rows = []
    for repeat in range(ns.repeats):  # variants in turn, so that a drift of the machine spreads over all
        rows += [{**_child(ns, variant, profile_top=0), "repeat": repeat} for variant in ns.variants]
    profiled = _child(ns, "compiled", profile_top=ns.top)
    profile = profiled.pop("profile", "")
    summary = {
        variant: statistics.median(r["first_call_ms"] for r in rows if r["variant"] == variant and "first_call_ms" in r)
        for variant in ns.variants
        if any(r["variant"] == variant and "first_call_ms" in r for r in rows)
    }
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    report = {"workload": ns.workload, "device": device, "torch": torch.__version__, "median_first_call_ms": summary}
    report |= {"rows": rows, "profiled": profiled}
    keep_report(report, out=ns.out, stem=f"first-call-{ns.workload.replace(':', '-')}", profile=profile)


if __name__ == "__main__":
    main()
