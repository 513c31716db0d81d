"""CGCT in the backend: a graph whose capture failed on a host<->device copy is rewritten and proven.

Only graphs that need it pay: when capturing a compiled graph fails with "cannot copy between CPU
and CUDA", its Dynamo graph is traced to aten ops (once, for real, on the example inputs; fake
tensors are then propagated for the node metadata the rewrite reads), ``rewrite.rewrite`` builds
host constants on the device and moves host tables to it once, and ``rewrite.differential_check``
compares the rewritten graph with the original on random inputs. Only a bit-identical rewrite is
compiled and captured; anything else keeps the graph uncaptured, with the reason in the log.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from ..verify import make_probes
from .rewrite import RewriteReport, differential_check, rewrite


@dataclass
class CgctResult:
    compiled: Callable[..., Any] | None  # the rewritten graph, compiled; None when not applied
    report: RewriteReport | None
    why_not: str = ""


def aten_graph(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> fx.GraphModule:
    """``gm`` as aten ops with real constants, node metadata (source lines) kept, ``meta["val"]`` fake."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx import traceback as fx_traceback
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    def run(*args: Any) -> Any:
        with fx_traceback.preserve_node_meta():
            return fx.Interpreter(gm).run(*args)

    aten = make_fx(run, tracing_mode="real")(*example_inputs)
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
        original = aten_graph(gm, example_inputs)
        rewritten = copy.deepcopy(original)
        report = rewrite(rewritten)
    except Exception as exc:
        return CgctResult(None, None, f"could not trace the graph for CGCT ({type(exc).__name__}: {exc})")
    if not report.applied:
        skipped = "; ".join(s.reason for s in report.skipped[:2])
        return CgctResult(None, report, "no rewritable host copy" + (f" ({skipped})" if skipped else ""))
    leaves = list(example_inputs)
    same, diff = differential_check(original, rewritten, lambda: make_probes(leaves, static)[0])
    if not same:
        return CgctResult(None, report, f"the rewrite changed the results (max abs diff {diff:.3g}); dropped")
    try:
        return CgctResult(compile_graph(rewritten, leaves), report)
    except Exception as exc:
        return CgctResult(None, report, f"the rewritten graph did not compile ({type(exc).__name__}: {exc})")
