"""How each mode runs a workload: a prepared zero-argument call, timed by the worker.

Every mode gets the same model (same seed), the same inputs and the same step. reduce-overhead is
used the way PyTorch requires: ``cudagraph_mark_step_begin()`` before each call and
``zero_grad(set_to_none=True)`` in training. hand-graph is the plain recipe from PyTorch's
documentation (warm up on a side stream, capture, copy inputs in, replay); for training it captures
the whole step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree

from ...core.workspaces import own_blas_workspaces
from .stats import RACED  # compile, reduce-overhead and the graph path timed in one process: ``measure.measure_raced``

COMPILED_KERNELS = "launchless-compiled-kernels"  # wrap(kernels="compiled"): compiles in a child while it replays
COMPILED_KERNELS_ON_DISK = "launchless-compiled-kernels-on-disk"  # the same in a second process: programs on disk
KERNEL_MODES = (COMPILED_KERNELS, COMPILED_KERNELS_ON_DISK)
# the compiler path with one of its mechanisms turned off: what CGCT adds to the kernels inside graphs, what pointer
# indirection saves of the bytes copied per call (run by name: --modes ... launchless-compile-no-cgct)
WITHOUT = {"launchless-compile-no-cgct": {"cgct": False}, "launchless-compile-no-pi": {"indirection": False}}
MODES = (
    *("eager", "compile", "reduce-overhead", "hand-graph", "launchless", "launchless-compile"),
    *KERNEL_MODES,
    *WITHOUT,
    RACED,
)
CACHES_OF = {COMPILED_KERNELS_ON_DISK: COMPILED_KERNELS}
"""A mode that measures a second process: it runs on the compile caches (Inductor's, Triton's, launchless's
programs) that the named mode's process left, as a user's next process finds them."""
CACHES_SHARED = {RACED: "launchless-compile"}
"""A mode that times what the separate modes compiled and measures no first call: it runs on the named mode's compile
caches where that mode ran before it (Inductor's programs there are compile's too: the same graph and settings), and
compiles for itself where it did not."""


def default_modes(suite: str) -> tuple[str, ...]:
    """The modes a suite runs unless told: every mode in the compiled-kernels suite; elsewhere all but compiled
    kernels, whose compile in a child process per workload belongs to the suite that measures it; the modes without
    a mechanism only when named; the race in the grace suite, whose targets hold launchless within a few percent of
    PyTorch's modes."""
    from .workloads import GRACE, KERNELS

    kept = tuple(m for m in MODES if m not in WITHOUT and m != RACED)
    if suite == KERNELS:
        return kept
    return tuple(m for m in kept if m not in KERNEL_MODES) + ((RACED,) if suite == GRACE else ())


def order_problem(modes: list[str]) -> str | None:
    """Why ``modes`` cannot run in this order (None: they can): a second process's mode needs the first's run before
    it, or it would find nothing on disk and measure a first process."""
    for later, first in CACHES_OF.items():
        if later in modes and (first not in modes or modes.index(first) > modes.index(later)):
            return (
                f"mode {later} measures a second process on the programs that {first} compiled: name {first} "
                f"before it (--modes ... {first} {later})"
            )
    return None


class ModeUnavailable(Exception):
    """This mode cannot run this workload; the message is the one-line reason shown in the report."""


@dataclass
class Prepared:
    call: Callable[[], Any]
    steps_in_prepare: int = 0  # training: optimizer steps applied while preparing (warm-up runs)
    details: Callable[[], dict] | None = None  # after timing: what the mode did (launchless-compile's graphs)
    # a mode that changes while it runs (compiled kernels swapped in): None while undecided, then what it decided
    settled: Callable[[], dict | None] | None = None


def hand_graph(fn: Callable[..., Any], args: tuple, kwargs: dict, warmup: int = 3) -> Callable[[], Any]:
    """Capture ``fn(*args, **kwargs)``; the returned call copies the inputs in, replays and returns the outputs."""
    leaves, spec = pytree.tree_flatten((args, kwargs))
    static = [x.clone() if isinstance(x, torch.Tensor) else x for x in leaves]
    sargs, skwargs = pytree.tree_unflatten(static, spec)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn(*sargs, **skwargs)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with own_blas_workspaces(), torch.cuda.graph(graph):  # a later capture empties PyTorch's shared workspaces
        out = fn(*sargs, **skwargs)
    pairs = [(s, x) for s, x in zip(static, leaves, strict=True) if isinstance(s, torch.Tensor)]

    def replay() -> Any:
        for s, x in pairs:
            s.copy_(x, non_blocking=True)
        graph.replay()
        return out

    return replay


def eager_random_draws() -> None:
    """Inductor draws random numbers with eager's generator and kernels (``fallback_random``) in every mode that
    compiles, so that a forward that draws -- a diffusion sampling step's noise -- is compared with eager's on the
    same draws (Inductor's own generator draws others from the same seed: every compiled mode would differ from eager
    by the noise, as wrong as a wrong result looks). Inductor's decomposition of a training step's dropout still draws
    otherwise than eager's fused kernel."""
    import torch._inductor.config as inductor_config

    inductor_config.fallback_random = True


def compiled_model(model: torch.nn.Module, mode: str) -> torch.nn.Module:
    import torch._inductor.config as inductor_config

    eager_random_draws()
    if mode == "compile":
        inductor_config.triton.cudagraphs = False
        return torch.compile(model)
    return torch.compile(model, mode="reduce-overhead")


def inference(mode: str, model: torch.nn.Module, args: tuple, kwargs: dict) -> Prepared:
    if mode == "eager":
        return Prepared(lambda: model(*args, **kwargs))
    if mode in ("compile", "reduce-overhead"):
        compiled = compiled_model(model, mode)
        if mode == "compile":
            return Prepared(lambda: compiled(*args, **kwargs))

        def marked() -> Any:
            torch.compiler.cudagraph_mark_step_begin()
            return compiled(*args, **kwargs)

        return Prepared(marked)
    if mode == "hand-graph":
        return Prepared(hand_graph(model, args, kwargs))
    if mode == "launchless-compile" or mode in WITHOUT:  # Inductor kernels in launchless graphs
        from launchless.compiler.backend import launchless_backend, make_backend

        from .graphs import recorder

        summary = recorder()
        eager_random_draws()
        backend = make_backend(**WITHOUT[mode]) if mode in WITHOUT else launchless_backend
        compiled = torch.compile(model, backend=backend)
        return Prepared(lambda: compiled(*args, **kwargs), details=summary)
    if mode == "launchless":  # as a user runs it: "auto", captured (or split) at the first call
        import launchless

        from .graphs import runtime_summary

        wrapped = launchless.wrap(model, cuda_graph="auto", capture_after=1)
        return Prepared(lambda: wrapped(*args, **kwargs), details=lambda: runtime_summary(wrapped.graph_info()))
    if mode in KERNEL_MODES:  # eager-kernel graphs at once; Inductor's swapped in once compiled and proven
        import launchless

        from .graphs import runtime_summary

        wrapped = launchless.wrap(model, cuda_graph="auto", capture_after=1, kernels="compiled")
        return Prepared(
            lambda: wrapped(*args, **kwargs),
            details=lambda: runtime_summary(wrapped.graph_info()),
            settled=lambda: kernels_decided(wrapped.graph_info()),
        )
    raise ModeUnavailable(f"unknown mode {mode!r}")


def kernels_decided(info: dict) -> dict | None:
    """The compiled kernels' row of the one signature a workload calls, once decided (swapped in or not); None while
    it compiles (or before its graph is captured)."""
    rows = info.get("compiled_kernels") or []
    if not rows or rows[0]["kernels"] == "compiling":
        return None
    return rows[0]
