"""CGCT in the backend: a graph whose capture failed on a host<->device copy is rewritten and proven.

Only graphs that need it pay: a graph that holds host tensors next to CUDA ones (seen before it is
compiled), or whose capture failed on "cannot copy between CPU and CUDA", has its Dynamo graph
traced to aten ops (once, for real, on the example inputs; fake
tensors are then propagated for the node metadata the rewrite reads), ``rewrite.rewrite`` builds
host constants on the device and moves host tables to it once, and ``differential.differential_check``
compares the rewritten graph with the original on random inputs. When the device rounds the moved host
math differently (CUDA divides by a host scalar as a multiplication by its reciprocal), the host computation
is folded instead: run once, now, by eager's own host ops, its result a guarded device constant. Only a
bit-identical rewrite is compiled and captured; anything else keeps the graph uncaptured, with the reason
in the log. The
device copies of moved constants are then watched on every call (:class:`ConstantWatch`): a source
changed in place, or a different tensor in a static input's place, is copied into the same device
tensor -- the graphs read it there -- and a change of shape or dtype undoes the rewrite.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import fx

from ..core.verify import make_probes
from ..diagnose.blockers import DATA_DEPENDENT, HOST_SYNC
from .diagnose import INPUT_MUTATION, RNG_STATE, diagnose, source_line
from .differential import differential_check
from .index_inputs import index_like_inputs
from .rewrite import (
    ConstantGuard,
    RewriteReport,
    SkippedRewrite,
    _data_ptr,
    constant_guards,
    rewrite,
)


@dataclass
class MovedConstant:
    guard: ConstantGuard
    copy: torch.Tensor  # the device copy the compiled graph reads, in place
    input_index: int | None  # the static input it came from, or None for a graph constant


class ConstantWatch:
    """Keeps CGCT's device copies equal to their CPU sources; a check costs a few hundred ns per constant.
    A folded constant cannot follow its sources: a source with other values undoes the rewrite."""

    def __init__(self, moved: list[MovedConstant]) -> None:
        self.moved = list(moved)
        self.refreshed = 0

    def check(self, args: Sequence[Any]) -> str | None:
        """None when every copy is current (refreshed in place where its source changed); else why it cannot be."""
        for i, m in enumerate(self.moved):
            src = m.guard.source if m.input_index is None else args[m.input_index]
            if src is m.guard.source and m.guard.valid():
                continue
            if m.guard.folded is not None:  # a source of a folded computation: equal values are all it may be
                if not _equal(src, m.guard.folded):
                    return f"{m.guard.source_attr}, folded into a device constant at compile time, changed"
                self.moved[i] = replace(
                    m, guard=replace(m.guard, source=src, version=src._version, data_ptr=_data_ptr(src))
                )
                continue
            if not isinstance(src, torch.Tensor) or (src.shape, src.dtype) != (m.copy.shape, m.copy.dtype):
                return f"{m.guard.source_attr} changed shape or dtype, so its device copy cannot follow it"
            with torch.no_grad():
                m.copy.copy_(src)  # the same device tensor: every graph reads the new values
            guard = replace(m.guard, source=src, version=src._version, data_ptr=_data_ptr(src))
            self.moved[i] = replace(m, guard=guard)
            self.refreshed += 1
        return None


def _equal(a: object, b: torch.Tensor) -> bool:
    return isinstance(a, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.cpu(), b)


@dataclass
class CgctResult:
    compiled: Callable[..., Any] | None  # the rewritten graph, compiled; None when not applied
    report: RewriteReport | None
    why_not: str = ""
    moved: list[MovedConstant] = field(default_factory=list)

    @property
    def unread_inputs(self) -> frozenset[int]:
        """Static inputs the rewritten graph no longer reads (their device copies are read instead)."""
        return frozenset(m.input_index for m in self.moved if m.input_index is not None)


def trial_hazard(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> str | None:
    """Why CGCT must not run ``gm`` (or need not), or None.

    CGCT runs the graph for real (to trace it, then to compare it with its rewrite): a graph that writes
    its inputs in place (a KV cache, a step counter) or draws random numbers must not run extra times, and
    a real trace would freeze a value read on the host (``.item()``) or a data-dependent shape -- graphs
    that cannot be captured whatever CGCT does. Found on a fake-tensor trace, which runs nothing."""
    fake = traced(gm, example_inputs, "fake")
    for blocker in diagnose(fake):
        if blocker.kind in (INPUT_MUTATION, RNG_STATE):
            return f"the graph {blocker.describe()}; CGCT's trial runs would repeat it"
        if blocker.kind in (HOST_SYNC, DATA_DEPENDENT):
            return f"the graph has a {blocker.describe()}, which no rewrite makes capturable"
    for node in fake.graph.nodes:
        if isinstance(node.target, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in node.target.tags:
            where = f" at {source_line(node)}" if source_line(node) else ""
            return f"the graph draws random numbers ({node.target}{where}); CGCT's trial runs would advance the RNG"
    return None


def traced(gm: fx.GraphModule, example_inputs: Sequence[Any], tracing_mode: str) -> fx.GraphModule:
    """``gm`` (a Dynamo graph) as aten ops, each node keeping its metadata (the user's source line).

    ``tracing_mode="fake"`` runs nothing; ``"real"`` runs the graph once and keeps real constants. Called from
    inside a Dynamo backend, it traces outside Dynamo's tracing context: make_fx would otherwise pick up Dynamo's
    fake mode and add guards to its ShapeEnv that Dynamo cannot build (a crash on torch 2.11 for torchvision's
    detectors, on any dynamic-shape graph)."""
    from torch._guards import tracing
    from torch.fx import traceback as fx_traceback
    from torch.fx.experimental.proxy_tensor import make_fx

    def run(*args: Any) -> Any:
        with fx_traceback.preserve_node_meta():
            return fx.Interpreter(gm).run(*args)

    with tracing(None):
        return make_fx(run, tracing_mode=tracing_mode)(*example_inputs)


def aten_graph(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> fx.GraphModule:
    """``gm`` as aten ops with real constants, node metadata (source lines) kept, ``meta["val"]`` fake."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    aten = traced(gm, example_inputs, "real")
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fakes = [mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in example_inputs]
    FakeTensorProp(aten, mode).propagate(*fakes)
    return aten


def try_rewrite(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    static: frozenset[int],
    compile_graph: Callable[[fx.GraphModule, list], Callable[..., Any]],
) -> CgctResult:
    """Rewrite, prove and compile; never raises (a rewrite is an optimisation, not a requirement)."""
    try:
        hazard = trial_hazard(gm, example_inputs)
        if hazard:
            return CgctResult(None, None, hazard)
        original = aten_graph(gm, example_inputs)
        rewritten = copy.deepcopy(original)
        placeholders = [n.name for n in rewritten.graph.nodes if n.op == "placeholder"]
        aligned = len(placeholders) == len(example_inputs)
        statics = {  # static inputs on the host: module attributes that Dynamo passes in
            placeholders[i]: x
            for i, x in enumerate(example_inputs)
            if aligned and i in static and isinstance(x, torch.Tensor) and not x.is_cuda
        }
        report = rewrite(rewritten, static_inputs=statics)
    except Exception as exc:
        return CgctResult(None, None, f"could not trace the graph for CGCT ({type(exc).__name__}: {exc})")
    if not report.applied:
        skipped = "; ".join(s.reason for s in report.skipped[:2])
        return CgctResult(None, report, "no rewritable host copy" + (f" ({skipped})" if skipped else ""))
    leaves, from_call = list(example_inputs), index_like_inputs(gm, example_inputs)
    same, diff = differential_check(original, rewritten, lambda: make_probes(leaves, static, from_call)[0])
    if not same:  # the device rounds differently (a division by a host scalar is a multiplication there): fold
        try:
            rewritten = copy.deepcopy(original)
            report = rewrite(rewritten, static_inputs=statics, fold=True)
            folded, fold_diff = (
                differential_check(original, rewritten, lambda: make_probes(leaves, static, from_call)[0])
                if report.applied
                else (False, math.inf)
            )
        except Exception as exc:
            folded, fold_diff = False, math.inf
            report.skipped.append(SkippedRewrite("", "fold", f"{type(exc).__name__}: {exc}"))
        if not folded:
            why = f"the rewrite changed the results (max abs diff {diff:.3g})"
            why += f"; folded at compile time instead, by {fold_diff:.3g}" if math.isfinite(fold_diff) else ""
            return CgctResult(None, report, why + "; dropped")
    index = {name: i for i, name in enumerate(placeholders)}
    moved = [
        MovedConstant(g, getattr(rewritten, g.name), index[g.input_name] if g.input_name else None)
        for g in constant_guards(rewritten)
    ]
    try:
        return CgctResult(compile_graph(rewritten, leaves), report, moved=moved)
    except Exception as exc:
        return CgctResult(None, report, f"the rewritten graph did not compile ({type(exc).__name__}: {exc})")
