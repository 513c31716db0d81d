"""Where a launchless decode step's time goes: interleaved rounds of one greedy ``generate()`` per mode in one process,
kernels and GPU kernel time per token, and a cProfile of three launchless calls (host time by function).

Modes: ``ll-default`` (``wrap(model).generate``, its own static cache), ``ll-192`` (the same on a static cache of 192
positions, transformers' own length for the serving suite's 64 + 128 tokens), ``eager-static`` (eager ``generate()``
on a static cache of 256) and ``static-compile`` (transformers' static-cache compile recipe). The numbers in
``benchmarks/results/2026-12-01-decode-host-profile.md`` were taken with ``generate()``'s own
loop; the host-ahead loop (``launchless.runtime.decode_loop``) now takes these calls, so the ``ll-*`` rows measure it.

    PYTHONPATH=. python benchmarks/decode_host_profile.py decode:llama-850m@b1
"""

import argparse
import cProfile
import functools
import io
import json
import pstats
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

import launchless
from launchless.apps.bench.serving_decode import decode_step_ms, generate_once, static_compile_recipe
from launchless.apps.bench.serving_workloads import build_decoder, decode_workload
from launchless.runtime.static_cache import cache_keyword, new_static_cache

NEW_TOKENS = 128
ROUNDS = 7


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload", nargs="?", default="decode:llama-850m@b1")
    args = parser.parse_args()
    device = torch.device("cuda")
    model, prompt = build_decoder(decode_workload(args.workload), device=device)
    request = {**prompt, "max_new_tokens": NEW_TOKENS, "do_sample": False}
    wrapped = launchless.wrap(model)
    keyword = cache_keyword(model)
    batch = prompt["input_ids"].shape[0]
    caches = {length: new_static_cache(model, batch=batch, length=length) for length in (192, 256)}

    def on_cache(length: int, generate: Callable[..., Any], **extra: Any) -> Callable[..., Any]:
        def run(**kwargs: Any) -> Any:
            caches[length].reset()
            return generate(**kwargs, **{keyword: caches[length]}, **extra)

        return run

    modes: dict[str, Callable[..., Any]] = {
        "ll-default": wrapped.generate,
        "ll-192": on_cache(192, wrapped.generate),
        "eager-static": on_cache(256, model.generate, disable_compile=True),
    }
    for generate in modes.values():
        for _ in range(2):  # capture and verification happen here
            generate_once(generate, request, device=device)
    began = time.perf_counter()
    modes["static-compile"] = functools.partial(model.generate, **static_compile_recipe())
    generate_once(modes["static-compile"], request, device=device)
    print("static-compile first call s", round(time.perf_counter() - began, 2), flush=True)

    steps: dict[str, list[float]] = {mode: [] for mode in modes}
    order = list(modes)
    for round_ in range(ROUNDS):
        for mode in order[round_ % len(order) :] + order[: round_ % len(order)]:
            steps[mode].append(decode_step_ms(generate_once(modes[mode], request, device=device), NEW_TOKENS))
    print(json.dumps({mode: round(statistics.median(times), 4) for mode, times in steps.items()}), flush=True)

    for mode in ("ll-default", "ll-192", "static-compile"):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            generate_once(modes[mode], request, device=device)
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        per_token = sum(e.device_time for e in kernels) / 1e3 / NEW_TOKENS
        print(mode, "kernels/token", len(kernels) / NEW_TOKENS, "kernel ms/token", per_token, flush=True)

    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(3):
        generate_once(modes["ll-default"], request, device=device)
    profiler.disable()
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime").print_stats(35)
    stats.sort_stats("cumulative").print_stats(60)
    print(text.getvalue())


if __name__ == "__main__":
    main()
