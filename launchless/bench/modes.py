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
import torch.nn.functional as F
from torch.utils import _pytree as pytree

MODES = ("eager", "compile", "reduce-overhead", "hand-graph", "launchless")


class ModeUnavailable(Exception):
    """This mode cannot run this workload; the message is the one-line reason shown in the report."""


@dataclass
class Prepared:
    call: Callable[[], Any]
    steps_in_prepare: int = 0  # training: optimizer steps applied while preparing (warm-up runs)


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
    with torch.cuda.graph(graph):
        out = fn(*sargs, **skwargs)
    pairs = [(s, x) for s, x in zip(static, leaves, strict=True) if isinstance(s, torch.Tensor)]

    def replay() -> Any:
        for s, x in pairs:
            s.copy_(x, non_blocking=True)
        graph.replay()
        return out

    return replay


def _compiled(model: torch.nn.Module, mode: str) -> torch.nn.Module:
    import torch._inductor.config as inductor_config

    if mode == "compile":
        inductor_config.triton.cudagraphs = False
        return torch.compile(model)
    return torch.compile(model, mode="reduce-overhead")


def inference(mode: str, model: torch.nn.Module, args: tuple, kwargs: dict) -> Prepared:
    if mode == "eager":
        return Prepared(lambda: model(*args, **kwargs))
    if mode in ("compile", "reduce-overhead"):
        compiled = _compiled(model, mode)
        if mode == "compile":
            return Prepared(lambda: compiled(*args, **kwargs))

        def marked() -> Any:
            torch.compiler.cudagraph_mark_step_begin()
            return compiled(*args, **kwargs)

        return Prepared(marked)
    if mode == "hand-graph":
        return Prepared(hand_graph(model, args, kwargs))
    if mode == "launchless":
        import launchless

        wrapped = launchless.wrap(model, cuda_graph=True)
        wrapped.capture_graph(*args, **kwargs)
        return Prepared(lambda: wrapped(*args, **kwargs))
    raise ModeUnavailable(f"unknown mode {mode!r}")


def optimizer(model: torch.nn.Module, name: str) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=True)


def train_step(
    model: torch.nn.Module, opt: torch.optim.Optimizer, *, mark: bool = False, amp: str | None = None
) -> Callable[..., Any]:
    """The user's step: zero_grad, forward (bf16 autocast when ``amp="bf16"``), loss, backward, optimizer
    step; returns the loss."""

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if mark:
            torch.compiler.cudagraph_mark_step_begin()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp == "bf16", cache_enabled=False):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return step


def training(
    mode: str,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    amp: str | None = None,
) -> Prepared:
    if mode == "eager":
        step = train_step(model, opt, amp=amp)
        return Prepared(lambda: step(x, y))
    if mode in ("compile", "reduce-overhead"):
        step = train_step(_compiled(model, mode), opt, mark=mode == "reduce-overhead", amp=amp)
        return Prepared(lambda: step(x, y))
    if mode == "hand-graph":
        step = train_step(model, opt, amp=amp)
        warmup = 3
        # Whole-step capture: warm-up steps are real steps; grads and optimizer state then live at fixed addresses.
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(warmup):
                step(x, y)
        torch.cuda.current_stream().wait_stream(stream)
        static_x, static_y = x.clone(), y.clone()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            loss = step(static_x, static_y)

        def replay() -> torch.Tensor:
            static_x.copy_(x, non_blocking=True)
            static_y.copy_(y, non_blocking=True)
            graph.replay()
            return loss

        return Prepared(replay, steps_in_prepare=warmup)
    if mode == "launchless":
        import launchless

        graphed = launchless.graphed_step(train_step(model, opt, amp=amp), model=model, optimizer=opt)
        for _ in range(graphed.capture_after):  # real steps: eager, then capture + verification
            graphed(x, y)
        info = graphed.graph_info()
        if info["level"] != "whole-step graph":
            reasons = [info["eager_reason"], *(f["reason"] for f in info["fallbacks"])]
            raise ModeUnavailable("graphed_step runs eager: " + "; ".join(r for r in reasons if r))
        return Prepared(lambda: graphed(x, y), steps_in_prepare=graphed.capture_after)
    raise ModeUnavailable(f"unknown mode {mode!r}")
