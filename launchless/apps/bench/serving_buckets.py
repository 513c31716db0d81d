"""The batch-bucket part of the serving suite: one model serving the trace of batch sizes in one mode (the modes:
docs/benchmarks.md, the serving suite; their wrap options: ``WRAP_OPTIONS``).

Every mode serves the same model the same trace with the same inputs, under ``torch.no_grad()``: eager once (the
reference outputs, and every mode's warm-up: kernels loaded, cuBLAS and cuDNN handles made), then the mode once (its
first pass: captures, compilations, proofs), again with each call timed from an idle device until its result is
ready (a server that answers each request before it takes the next), and a third time compared with eager's outputs.
reduce-overhead's recompile limit is raised so that every size of the trace is compiled (at PyTorch's default of 8
the sizes after the eighth would run eager).
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_leaves, tree_map, tree_unflatten

import launchless

from .measure import clone_outputs, compare_outputs, synchronize_device
from .serving_graphs import (
    NOT_ON_CPU,
    GraphsHeld,
    device_free_mark,
    held_by_compile,
    held_by_launchless,
    reserved_mark,
)
from .serving_workloads import (
    BUCKET_MODES,
    BUCKETS_AUTO,
    BUCKETS_FIXED,
    EAGER,
    GRAPH_PER_SIZE,
    LARGEST_BATCH,
    REDUCE_OVERHEAD,
    SPLIT_8,
    SPLIT_16,
    TRACE_SEED,
    batch_trace,
    bucket_builder,
)

BUCKET_SIZES = (1, 2, 4, 8, 16, 32)
RECOMPILE_LIMIT = 64  # above the 32 sizes of the trace
LARGEST_BUCKET = {SPLIT_16: 16, SPLIT_8: 8}  # the split modes' largest bucket
WRAP_OPTIONS: dict[str, dict[str, Any]] = {
    GRAPH_PER_SIZE: {"max_graphs": LARGEST_BATCH},
    BUCKETS_FIXED: {"batch_buckets": list(BUCKET_SIZES)},
    BUCKETS_AUTO: {"batch_buckets": "auto"},
    **{mode: {"batch_buckets": [b for b in BUCKET_SIZES if b <= largest]} for mode, largest in LARGEST_BUCKET.items()},
}

Inputs = tuple[tuple, dict]


@dataclass(frozen=True)
class Server:
    """How a mode serves one call, and the wrapper that holds its graphs (launchless modes)."""

    serve: Callable[[Inputs], Any]
    wrapped: launchless.GraphedModule | None = None


def server(mode: str, model: torch.nn.Module) -> Server:
    """``model`` served as ``mode`` serves it (see the module docstring); nothing runs until the first call."""
    if mode == EAGER:
        return Server(lambda inputs: model(*inputs[0], **inputs[1]))
    if mode in WRAP_OPTIONS:
        wrapped = launchless.wrap(model, capture_after=1, **WRAP_OPTIONS[mode])
        if mode in LARGEST_BUCKET:
            return Server(functools.partial(split_call, wrapped, largest=LARGEST_BUCKET[mode]), wrapped)
        return Server(lambda inputs: wrapped(*inputs[0], **inputs[1]), wrapped)
    if mode == REDUCE_OVERHEAD:
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        compiled = torch.compile(model, mode="reduce-overhead", dynamic=False)

        def marked(inputs: Inputs) -> Any:
            torch.compiler.cudagraph_mark_step_begin()
            return compiled(*inputs[0], **inputs[1])

        return Server(marked)
    raise ValueError(f"mode {mode!r} does not serve batch buckets; buckets modes: {', '.join(BUCKET_MODES)}")


def split_call(wrapped: launchless.GraphedModule, inputs: Inputs, *, largest: int) -> Any:
    """One call served in calls of at most ``largest`` rows (the first dimension of its tensors), the outputs' rows
    joined back in order."""
    args, kwargs = inputs
    rows = next(t.shape[0] for t in tree_leaves(inputs) if isinstance(t, torch.Tensor))
    if rows <= largest:
        return wrapped(*args, **kwargs)
    parts = []
    for start in range(0, rows, largest):
        part = tree_map(lambda t, s=start: t[s : s + largest] if isinstance(t, torch.Tensor) else t, inputs)
        parts.append(wrapped(*part[0], **part[1]))
    leaves, specs = zip(*(tree_flatten(p) for p in parts), strict=True)
    joined = [torch.cat(col) if isinstance(col[0], torch.Tensor) else col[0] for col in zip(*leaves, strict=True)]
    return tree_unflatten(joined, specs[0])


def waited_ms(call: Callable[[], Any], *, device: torch.device) -> float:
    """One call started with nothing queued, until its result is ready."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    began = time.perf_counter()
    call()
    return (time.perf_counter() - began) * 1e3


def measure_buckets(workload: str, mode: str, *, calls: int, device: torch.device) -> dict[str, Any]:
    """The measured fields of one buckets row (see ``serving_report``)."""
    model, make_inputs = bucket_builder(workload)(device=device)
    sizes = batch_trace(calls)
    torch.manual_seed(TRACE_SEED)
    trace = [make_inputs(rows) for rows in sizes]
    cuda = device.type == "cuda"
    with torch.no_grad():
        reference = [clone_outputs(model(*args, **kwargs)) for args, kwargs in trace]
        mark = reserved_mark() if cuda else 0
        free_mark = device_free_mark() if cuda else 0
        began = time.perf_counter()
        mode_server = server(mode, model)
        for inputs in trace:
            mode_server.serve(inputs)
        synchronize_device(device)
        first_pass_s = time.perf_counter() - began
        times = [waited_ms(functools.partial(mode_server.serve, inputs), device=device) for inputs in trace]
        pairs = zip(reference, trace, strict=True)
        compared = [compare_outputs(ref, mode_server.serve(inputs)) for ref, inputs in pairs]
    held = _held(mode, mode_server, mark) if cuda else NOT_ON_CPU
    device_bytes = free_mark - device_free_mark() if cuda else None
    total_ms = sum(times)
    return {
        "total_ms": total_ms,
        "median_ms": statistics.median(times),
        "calls": calls,
        "distinct_sizes": len(set(sizes)),
        "first_pass_s": first_pass_s,
        "compile_s": max(0.0, first_pass_s - total_ms / 1e3),
        "graphs": held.graphs,
        "graph_mem_bytes": held.bytes,
        "device_mem_bytes": device_bytes,
        "identical": all(c["status"] == "bit-identical" for c in compared),
        "max_abs_diff": max(c["max_abs_diff"] for c in compared),
        "batch_buckets": mode_server.wrapped.graph_info()["batch_buckets"] if mode_server.wrapped else None,
    }


def _held(mode: str, mode_server: Server, mark: int) -> GraphsHeld:
    if mode_server.wrapped is not None:
        return held_by_launchless(mode_server.wrapped)
    if mode == REDUCE_OVERHEAD:
        return held_by_compile(mark)
    return GraphsHeld(0, 0)  # eager
