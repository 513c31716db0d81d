"""The decode part of the serving suite: greedy ``generate()`` of a causal LM in one mode (the modes, the race and
what ``identical`` compares with: docs/benchmarks.md, the serving suite).

Every mode generates from the same model and prompts: eager once (the reference tokens, and every mode's warm-up, so
that what a mode's first call adds is its own), then the mode once (its first call) and ``DECODE_RUNS`` times more,
each timed on the host clock until its tokens are on the host (a streamer takes every step's tokens, so the host
waits for the device at each step). The streamer notes the first new token's arrival: the time to first token; the
rest of a call is decoding, ``median_ms`` one decode step. Separate processes do not make a fair race at batch 1 (one
H200 host ran static-compile's GPT-2 small step at 1.37 to 1.86 ms over three runs), so the launchless worker also
races the modes in its one process (``interleaved_step_ms``); a race that fails leaves the row standing.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers.generation.streamers import BaseStreamer

import launchless
from launchless.runtime.static_cache import cache_keyword, cache_length, new_static_cache

from ...errors import one_line
from .measure import profile_path, synchronize_device, write_profile
from .serving_graphs import compiled_graphs
from .serving_workloads import (
    COMPILED_KERNELS,
    DECODE_MODES,
    EAGER,
    LAUNCHLESS,
    STATIC_COMPILE,
    build_decoder,
    decode_workload,
)

DECODE_RUNS = 3  # timed generate() calls after the first
PROFILED_GENERATIONS = 3  # generations under each profiler with --profile
INTERLEAVED_ROUNDS = 7  # rounds of one generate() per mode, the modes in a rotating order
SWAP_WITHIN_S = 300  # launchless with kernels="compiled" generates until its decode step is decided, this long at most


class StaticCacheUnavailable(RuntimeError):
    """The installed transformers has no static KV cache to compile decoding with."""


class FirstTokenClock(BaseStreamer):
    """Notes when ``generate()`` hands over its first new token: it streams the prompt first, then each step's."""

    def __init__(self) -> None:
        self.handed = 0
        self.first_token_at: float | None = None

    def put(self, value: torch.Tensor) -> None:
        self.handed += 1
        if self.handed == 2:
            self.first_token_at = time.perf_counter()

    def end(self) -> None:
        pass


@dataclass(frozen=True)
class Generation:
    seconds: float
    first_token_s: float
    tokens: torch.Tensor  # the new tokens, (batch, new_tokens)


@dataclass(frozen=True)
class Decoding:
    """How a mode generates, and the wrapper that holds its graphs (launchless)."""

    generate: Callable[..., torch.Tensor]
    wrapped: launchless.GraphedModule | None = None


def decoding(mode: str, model: torch.nn.Module) -> Decoding:
    """``model``'s ``generate()`` as ``mode`` runs it (see the module docstring); raises ``StaticCacheUnavailable``
    for static-compile where transformers has no static cache, which the worker reports as an error row."""
    if mode == EAGER:
        return Decoding(model.generate)
    if mode == STATIC_COMPILE:
        if not hasattr(transformers, "StaticCache"):
            raise StaticCacheUnavailable(
                f"transformers {transformers.__version__} has no static KV cache (StaticCache); it came in 4.38"
            )
        recipe = static_compile_recipe()
        if recipe is not None:  # per call: the model's own generation config is left as it was
            return Decoding(functools.partial(model.generate, **recipe))
        model.generation_config.cache_implementation = "static"
        model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
        return Decoding(model.generate)
    if mode == LAUNCHLESS:
        wrapped = launchless.wrap(model)
        return Decoding(wrapped.generate, wrapped)
    raise ValueError(f"mode {mode!r} does not decode; decode modes: {', '.join(DECODE_MODES)}")


def static_compile_recipe() -> dict[str, Any] | None:
    """generate()'s keyword arguments for transformers' static-cache compile recipe, where transformers compiles the
    forward itself (``CompileConfig``) and marks its steps; None where it does not (the forward is compiled by hand
    then, which changes the model for every later call)."""
    if not hasattr(transformers, "CompileConfig"):
        return None
    compile_config = transformers.CompileConfig(fullgraph=True, mode="reduce-overhead")
    compile_config._compile_all_devices = True  # on a CPU too (transformers compiles on accelerators only)
    return {"cache_implementation": "static", "compile_config": compile_config}


def generate_once(
    generate: Callable[..., torch.Tensor], request: dict[str, Any], *, device: torch.device
) -> Generation:
    """One timed ``generate()``; raises when it stops short of ``max_new_tokens``."""
    clock = FirstTokenClock()
    synchronize_device(device)
    began = time.perf_counter()
    output = generate(**request, streamer=clock)
    synchronize_device(device)
    seconds = time.perf_counter() - began
    prompt, wanted = request["input_ids"].shape[1], request["max_new_tokens"]
    if output.shape[1] != prompt + wanted or clock.first_token_at is None:
        raise RuntimeError(f"generate() returned {output.shape[1] - prompt} new tokens, not the {wanted} asked for")
    return Generation(seconds, clock.first_token_at - began, output[:, prompt:])


def first_divergence(reference: torch.Tensor, generations: list[Generation]) -> int | None:
    """The first new-token position where any generation left the reference's tokens; None where none did."""
    differing = [g.tokens != reference for g in generations if not torch.equal(g.tokens, reference)]
    return min(int(d.any(dim=0).nonzero()[0]) for d in differing) if differing else None


def eager_equivalent(mode: str, model: torch.nn.Module, request: dict[str, Any]) -> Callable[..., torch.Tensor]:
    """Eager ``generate()`` computing what ``mode`` computes, graphs and compilation aside: the default dynamic cache
    for eager, a static cache of transformers' own length for static-compile, a static cache of launchless's bucket
    length for launchless (off the GPU, where nothing is captured, plain ``generate()``). A mode is ``identical`` when
    its tokens are this one's."""
    if mode == EAGER or next(model.parameters()).device.type != "cuda":  # off the GPU wrap() generates as it is
        return model.generate
    if mode == STATIC_COMPILE:
        return functools.partial(model.generate, cache_implementation="static", disable_compile=True)
    needed = request["input_ids"].shape[1] + request["max_new_tokens"]

    def static(**kwargs: Any) -> torch.Tensor:
        cache = new_static_cache(model, batch=kwargs["input_ids"].shape[0], length=cache_length(needed))
        return model.generate(**kwargs, **{cache_keyword(model): cache}, disable_compile=True)

    return static


def measure_decode(
    workload: str, mode: str, *, device: torch.device, profile_dir: Path | None = None
) -> dict[str, Any]:
    """The measured fields of one decode row (see ``serving_report``); ``profile_dir``: where the profile of
    ``PROFILED_GENERATIONS`` of the mode's generations goes too, once the figures are taken."""
    decode = decode_workload(workload)
    model, prompt = build_decoder(decode, device=device)
    new_tokens = decode.decoder.new_tokens
    request = {**prompt, "max_new_tokens": new_tokens, "do_sample": False}
    dynamic = generate_once(model.generate, request, device=device).tokens  # also every mode's warm-up
    reference = generate_once(eager_equivalent(mode, model, request), request, device=device).tokens
    mode_decoding = decoding(mode, model)
    first = generate_once(mode_decoding.generate, request, device=device)
    runs = [generate_once(mode_decoding.generate, request, device=device) for _ in range(DECODE_RUNS)]
    step_ms = statistics.median(decode_step_ms(g, new_tokens) for g in runs)
    generate_s = statistics.median(g.seconds for g in runs)
    divergence = first_divergence(reference, [first, *runs])
    if profile_dir is not None:
        generation = functools.partial(mode_decoding.generate, **request)
        write_profile(generation, profile_path(profile_dir, workload, mode), calls=PROFILED_GENERATIONS)
    interleaved, interleaved_error, compiled = None, None, {}
    if mode == LAUNCHLESS and device.type == "cuda":
        try:
            compiled_decoding, compiled = compiled_kernels_decoding(model, request, reference, device=device)
            interleaved = interleaved_step_ms(
                model, mode_decoding, request, device=device, compiled_kernels=compiled_decoding
            )
        except Exception as exc:  # the row measured above stands; the report names what stopped the race
            interleaved_error = one_line(exc)
    return {
        "median_ms": step_ms,
        "tokens_per_s": decode.batch * 1e3 / step_ms,
        "ttft_ms": statistics.median(g.first_token_s for g in runs) * 1e3,
        "generate_ms": generate_s * 1e3,
        "first_call_s": first.seconds,
        "compile_s": max(0.0, first.seconds - generate_s),
        "runs": DECODE_RUNS,
        "graphs": _graphs(mode, mode_decoding) if device.type == "cuda" else None,
        **_loop_fields(mode_decoding),
        "identical": divergence is None,
        "first_divergence": divergence,
        "dynamic_divergence": first_divergence(dynamic, [first]),
        "interleaved_ms": interleaved,
        "interleaved_rounds": INTERLEAVED_ROUNDS if interleaved else None,
        "interleaved_error": interleaved_error,
        **compiled,
    }


def decode_step_ms(generation: Generation, new_tokens: int) -> float:
    """A decode step of one generate() call: the time after the first new token over the tokens after it."""
    return (generation.seconds - generation.first_token_s) / (new_tokens - 1) * 1e3


def compiled_kernels_decoding(
    model: torch.nn.Module, request: dict[str, Any], reference: torch.Tensor, *, device: torch.device
) -> tuple[Decoding, dict[str, Any]]:
    """``launchless.wrap(model, kernels="compiled")``, driven until its decode step's compiled program is decided
    (``SWAP_WITHIN_S`` at most): the decoding, and the row's ``compiled_*`` fields -- its first call, when the swap
    came (from the first call's start), each call's decode step against that time (the timeline), the decisions,
    whether every call's tokens were the reference's, and where they first left them in the calls before the decision
    (the eager-kernel graphs' calls, the compiled program's proof done in parts inside them: None unless the proof
    disturbed a generation) and in those after it (Inductor's kernels: a near tie between two tokens may fall the
    other way, as under transformers' compiled recipe)."""
    wrapped = launchless.wrap(model, kernels="compiled")
    began = time.perf_counter()
    timeline: list[list[float]] = []
    rows: list[dict[str, Any]] = []
    before: list[Generation] = []
    after: list[Generation] = []
    swap_at, first_call_s = None, None
    while time.perf_counter() < began + SWAP_WITHIN_S:
        started = time.perf_counter() - began
        generation = generate_once(wrapped.generate, request, device=device)
        first_call_s = generation.seconds if first_call_s is None else first_call_s
        timeline.append([round(started, 3), round(decode_step_ms(generation, request["max_new_tokens"]), 4)])
        rows = (wrapped.graph_info()["decode"] or {}).get("compiled_kernels") or []
        if rows and all(r["kernels"] != "compiling" for r in rows):  # decided at this call's start
            swap_at = started if any(r["kernels"] == "compiled" for r in rows) else None
            after.append(generation)
            break
        before.append(generation)
    after += [generate_once(wrapped.generate, request, device=device) for _ in range(DECODE_RUNS)]
    return Decoding(wrapped.generate, wrapped), {
        "compiled_first_call_s": first_call_s,
        "compiled_swap_s": swap_at,
        "compiled_kernels": rows,
        "compiled_identical": all(torch.equal(g.tokens, reference) for g in before + after),
        "compiled_divergence_before": first_divergence(reference, before),
        "compiled_divergence_after": first_divergence(reference, after),
        "compiled_timeline": timeline,
    }


def interleaved_step_ms(
    model: torch.nn.Module,
    launchless_decoding: Decoding,
    request: dict[str, Any],
    *,
    device: torch.device,
    compiled_kernels: Decoding | None = None,
) -> dict[str, float]:
    """The median decode step of each decode mode, the modes taking turns in this process (see the module docstring):
    {mode: ms}. Static-compile is left out where transformers cannot compile the forward per call.
    ``compiled_kernels``: launchless with ``kernels="compiled"``, its step decided, raced too."""
    generates: dict[str, Callable[..., torch.Tensor]] = {
        EAGER: model.generate,
        LAUNCHLESS: launchless_decoding.generate,
    }
    if compiled_kernels is not None:
        generates[COMPILED_KERNELS] = compiled_kernels.generate
    recipe = static_compile_recipe() if hasattr(transformers, "StaticCache") else None
    if recipe is not None:  # by hand (without CompileConfig) it would compile the forward eager calls too
        generates[STATIC_COMPILE] = functools.partial(model.generate, **recipe)
        generate_once(generates[STATIC_COMPILE], request, device=device)  # compiled here, not in the rounds
    steps: dict[str, list[float]] = {mode: [] for mode in generates}
    order = list(generates)
    for round_ in range(INTERLEAVED_ROUNDS):
        for mode in order[round_ % len(order) :] + order[: round_ % len(order)]:
            generation = generate_once(generates[mode], request, device=device)
            steps[mode].append(decode_step_ms(generation, request["max_new_tokens"]))
    return {mode: statistics.median(times) for mode, times in steps.items()}


def _loop_fields(mode_decoding: Decoding) -> dict[str, Any]:
    """For launchless: how many of its generations the host-ahead loop decoded, and why any went through
    ``generate()``'s own loop (``runtime.decode_loop``); nothing for the other modes, or where nothing decoded
    through graphs (off the GPU)."""
    if mode_decoding.wrapped is None:
        return {}
    decode = mode_decoding.wrapped.graph_info()["decode"]
    if decode is None:
        return {}
    return {"loop_generations": decode["loop_generations"], "through_generate": decode["through_generate"]}


def _graphs(mode: str, mode_decoding: Decoding) -> int:
    """The CUDA graphs the mode holds on the GPU."""
    if mode_decoding.wrapped is not None:
        info = mode_decoding.wrapped.graph_info()
        return len(info["graphs"]) + (len(info["decode"]["graphs"]) if info["decode"] else 0)
    return compiled_graphs() if mode == STATIC_COMPILE else 0
