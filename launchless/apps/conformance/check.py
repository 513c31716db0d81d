"""One model through ``launchless.wrap`` the way a user runs it, as one row of the conformance matrix.

The model is wrapped with ``cuda_graph="auto"`` (``capture_after=1``) and called under ``torch.no_grad()``: the
first call pays for capture and verification -- or for the split search when the forward cannot be captured
whole -- and is timed as such. A second call on fresh inputs is compared with eager bit for bit. Then eager and
the wrapped model are timed back to back (CUDA events) and waited-for, on the same inputs.

``status``: ``"graph"`` (the whole forward replays), ``"split"`` (captured submodules with eager code between
them, verified end to end) or ``"eager"`` (with the reason and source line); ``"error"`` when the model itself
could not be built or run. ``dry_check`` is what a machine without a GPU can do: build the model and its
inputs and find the first capture blocker on the meta device.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

import torch

from ... import wrap
from ...core.verify import difference, identical
from ...diagnose.dry_run import dry_run
from ...timing import cuda_latency, cuda_time
from ..what_ran import Ran, SplitBy, what_ran

Inputs = tuple[tuple, dict]
ROW_KEYS = (
    "model",
    "task",
    "status",
    "verified",
    "verification",
    "identical_to_eager",
    "max_abs_diff",
    "speedup",
    "speedup_waited",
    "eager_ms",
    "launchless_ms",
    "eager_waited_ms",
    "launchless_waited_ms",
    "capture_s",
    "graph_mb",
    "captured_share",
    "split_by",
    "pieces",
    "eager_parts",
    "reason",
    "source",
)


def empty_row(model: str, task: str) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(ROW_KEYS)
    row.update(model=model, task=task, status="error", verified=False)
    return row


def classify_info(row: dict[str, Any], info: dict[str, Any]) -> None:
    """status, verified, the verification class, and the reason a forward runs eager, from ``graph_info()``
    (``what_ran``)."""
    ran = what_ran(info)
    row.update(status=str(ran.ran), verified=ran.verified, graph_mb=round(ran.graph_bytes / 2**20, 2))
    row.update(reason=ran.reason, source=ran.source)
    if ran.ran is not Ran.EAGER:
        row["verification"] = str((ran.verification or {}).get("status"))
    if ran.split_by is SplitBy.OPERATION:
        row.update(split_by=str(ran.split_by), pieces=[f"{ran.graphs} graphs"])
    elif ran.split_by is SplitBy.SUBMODULE:
        row.update(split_by=str(ran.split_by), pieces=list(ran.pieces), captured_share=ran.captured_share)
    if ran.eager_parts:
        row["eager_parts"] = list(ran.eager_parts)


def check(
    model: torch.nn.Module,
    make_inputs: Callable[[], Inputs],
    *,
    name: str,
    task: str,
    iters: int = 50,
) -> dict[str, Any]:
    """The matrix row of ``model`` (on a CUDA device, in eval mode) with inputs from ``make_inputs``."""
    row = empty_row(name, task)
    wrapped = wrap(model, cuda_graph="auto", capture_after=1)
    args, kwargs = make_inputs()
    with torch.no_grad():
        torch.cuda.synchronize()
        start = time.perf_counter()
        wrapped(*args, **kwargs)
        torch.cuda.synchronize()
        row["capture_s"] = round(time.perf_counter() - start, 3)
        args, kwargs = make_inputs()
        got, want = _seeded(wrapped, args, kwargs), _seeded(model, args, kwargs)
        row["identical_to_eager"] = identical(got, want)
        if not row["identical_to_eager"]:
            try:
                row["max_abs_diff"] = difference(want, got, 0.0)[0]
            except Exception:  # outputs of other structure (a different number of detections)
                row["max_abs_diff"] = float("inf")
        del got, want
        classify_info(row, wrapped.graph_info())
        eager = cuda_time(lambda: model(*args, **kwargs), warmup=3, iters=iters)
        graphed = cuda_time(lambda: wrapped(*args, **kwargs), warmup=3, iters=iters)
        eager_waited = cuda_latency(lambda: model(*args, **kwargs), warmup=2, iters=max(10, iters // 3))
        graphed_waited = cuda_latency(lambda: wrapped(*args, **kwargs), warmup=2, iters=max(10, iters // 3))
    row.update(
        eager_ms=round(eager.median_ms, 4),
        launchless_ms=round(graphed.median_ms, 4),
        eager_waited_ms=round(eager_waited.median_ms, 4),
        launchless_waited_ms=round(graphed_waited.median_ms, 4),
        speedup=round(eager.median_ms / graphed.median_ms, 3),
        speedup_waited=round(eager_waited.median_ms / graphed_waited.median_ms, 3),
    )
    wrapped.release_graphs()
    gc.collect()
    torch.cuda.empty_cache()
    return row


def _seeded(call: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """``call`` from one generator state: a forward that draws random numbers draws the same eager and replayed."""
    torch.manual_seed(0)
    return call(*args, **kwargs)


def dry_check(model: torch.nn.Module, inputs: Inputs, *, name: str, task: str) -> dict[str, Any]:
    """What a machine without a GPU can say: the model and its inputs build, and the first capture blocker."""
    args, kwargs = inputs
    blocker = dry_run(model, args, kwargs)
    return {
        "model": name,
        "task": task,
        "built": True,
        "blocker": None if blocker is None else blocker.describe(),
    }
