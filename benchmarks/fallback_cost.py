"""Where a wrapped call that runs without a graph spends more than eager: host time, kernels, copies.

A row of the differential report that runs eager (or split) under "auto" and is slower than eager alone breaks the
promise even though no graph replays. This script runs such models as the differential harness does (its builder,
fresh inputs, ``wrap`` in "auto", the row's calls), then per grad mode on the last call's inputs:

- eager against wrapped as the timing pass reads them (back to back and waited for, interleaved rounds, a close
  call repeated);
- the wrapper's extra host microseconds per call over eager (``timing.host_overhead_us``: rounds alternating
  between the two, each from an idle GPU);
- the kernels and copies each call launches (``torch.profiler``), eager against wrapped: a wrapped call that
  launches more than eager does work of its own on the GPU;
- the wrapped call's Python profile (``cProfile``: the functions with the most own time, then launchless's own
  functions by time spent inside them).

    python benchmarks/fallback_cost.py --out /tmp/f transformers:paligemma transformers:switch_transformers
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import io
import json
import pstats
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

import launchless as ll
from launchless.apps.differential.candidate import Library
from launchless.apps.differential.population import candidates, pick
from launchless.apps.differential.rows import GradMode
from launchless.apps.differential.runner import CALLS, grad_mode
from launchless.apps.differential.timing import measured
from launchless.timing import host_overhead_us

PROFILED_CALLS = 5


def _launches(call: Any, *, calls: int = PROFILED_CALLS) -> Counter:
    """Kernels and copies per call on the GPU, by name."""
    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    counts: Counter = Counter()
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            counts[event.name[:90]] += 1
    return Counter({name: n / calls for name, n in counts.items()})


def _python_profile(call: Any, *, calls: int = 50, top: int = 25) -> str:
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        call()
    profiler.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats("launchless", top)  # the wrapper's own functions, where they go
    return text.getvalue()


def measure(key: str, out: Path) -> list[dict[str, Any]]:
    library, _, name = key.partition(":")
    (candidate,) = pick(candidates(Library(library)), [name])
    torch.manual_seed(0)
    built = candidate.build("cpu")
    model = built.model.to("cuda")
    rows = []
    for mode in GradMode:
        wrapped = ll.wrap(model)
        generator = torch.Generator().manual_seed(CALLS)
        with grad_mode(mode):
            for _ in range(CALLS):
                args, kwargs = built.make_inputs(generator, "cuda")
                wrapped(*args, **kwargs)
            eager = functools.partial(model, *args, **kwargs)
            fast = functools.partial(wrapped, *args, **kwargs)

            reading = measured(eager, fast)
            extra_host_us = host_overhead_us(fast, eager)
            eager_launches, wrapped_launches = _launches(eager), _launches(fast)
            extra = {k: v for k, v in (wrapped_launches - eager_launches).items() if v}
            missing = {k: v for k, v in (eager_launches - wrapped_launches).items() if v}
            profile_text = _python_profile(fast)
        info = wrapped.graph_info()
        row = {
            "model": key,
            "grad_mode": mode.value,
            **reading,
            "wrapped_extra_host_us": extra_host_us,
            "eager_launches": sum(eager_launches.values()),
            "wrapped_launches": sum(wrapped_launches.values()),
            "wrapped_extra_launches": extra,
            "wrapped_missing_launches": missing,
            "graphs": len(info.get("graphs", [])),
            "split": info.get("split") is not None,
            "fallbacks": [f.get("reason") for f in info.get("fallbacks", [])],
        }
        rows.append(row)
        (out / f"{name}-{mode.value}-profile.txt").write_text(profile_text)
        print(json.dumps(row), flush=True)
        del wrapped, eager, fast
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="library:model, as the differential report names them")
    parser.add_argument("--out", type=Path, required=True)
    arguments = parser.parse_args()
    arguments.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for key in arguments.models:
        try:
            rows.extend(measure(key, arguments.out))
        except Exception as exc:  # one model's failure leaves the others measured
            print(f"{key}: {type(exc).__name__}: {exc}", flush=True)
    (arguments.out / "fallback-cost.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
