"""A program with other kernels than eager's held to eager's own accuracy, against a float64 reference.

Inductor's fused kernels add and multiply in another order than eager's: their results differ from eager's in the
last bits, so bit identity cannot prove them and a fixed tolerance proves nothing (what is a rounding difference
for one forward is a bug for another). What can be proven is that the compiled program is no less accurate than
eager: both are compared with the same forward run in float64 on the same inputs, and the compiled program's error
may be at most ``MULTIPLIER`` times eager's (plus a few units of the output's precision, where eager happens to
round exactly to the float64 result). This is the check PyTorch's own benchmark suites apply to compiled models
(``torch._dynamo.utils.same`` with an ``fp64_ref``). Outputs that are not floating point (indices, counts, masks)
must equal eager's.

The float64 copy shares the model's non-floating tensors and is made tensor by tensor (at most the float64 copy
in memory besides the model); it is dropped after the check.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch
from torch.utils import _pytree as pytree

from .output_tree import see_into

MULTIPLIER = 3.0  # the compiled error may be this many times eager's error (PyTorch's benchmarks: 2 to 3)
FLOOR_ULPS = 8.0  # plus this many units of the output dtype's precision at the output's largest magnitude


@dataclasses.dataclass
class AccuracyReport:
    """Whether a program is as accurate as eager on one input: the worst output's errors against float64."""

    passed: bool
    compiled_error: float = 0.0
    eager_error: float = 0.0
    bound: float = 0.0
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def float64_copy(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with every floating point parameter and buffer in float64 (a copy; the others are shared)."""
    memo: dict[int, Any] = {}
    for tensor in [*model.parameters(), *model.buffers()]:
        if tensor.is_floating_point() and id(tensor) not in memo:
            wide = tensor.detach().to(torch.float64)
            memo[id(tensor)] = (
                torch.nn.Parameter(wide, tensor.requires_grad) if isinstance(tensor, torch.nn.Parameter) else wide
            )
        elif id(tensor) not in memo:
            memo[id(tensor)] = tensor  # shared: indices and counts are the same in float64
    return copy.deepcopy(model, memo)


def widened(tree: Any) -> Any:
    """The inputs with floating point tensors in float64."""
    return pytree.tree_map_only(torch.Tensor, lambda t: t.to(torch.float64) if t.is_floating_point() else t, tree)


def as_accurate_as_eager(eager: Any, compiled: Any, reference: Any) -> AccuracyReport:
    """Judge ``compiled`` against ``eager``, both against the float64 ``reference`` (the same forward in float64
    on the same inputs)."""
    for tree in (eager, compiled, reference):
        see_into(tree)
    if not pytree.tree_structure(eager) == pytree.tree_structure(compiled) == pytree.tree_structure(reference):
        return AccuracyReport(False, detail="the outputs' structure differs from eager's")
    worst, worst_excess = AccuracyReport(True), float("-inf")
    for e, c, r in zip(
        pytree.tree_leaves(eager), pytree.tree_leaves(compiled), pytree.tree_leaves(reference), strict=True
    ):
        if not isinstance(e, torch.Tensor):
            if e != c:
                return AccuracyReport(
                    False, detail=f"an output that is not a tensor differs from eager's ({e!r}, {c!r})"
                )
            continue
        if not isinstance(c, torch.Tensor) or e.shape != c.shape or e.dtype != c.dtype:
            return AccuracyReport(False, detail="an output's shape or dtype differs from eager's")
        if not (e.is_floating_point() or e.is_complex()):
            if not torch.equal(e, c):
                return AccuracyReport(False, detail=f"a {e.dtype} output differs from eager's")
            continue
        report = _judged(e, c, r)
        if not report.passed:
            return report
        if report.compiled_error - report.bound > worst_excess:
            worst, worst_excess = report, report.compiled_error - report.bound
    return worst


def _judged(eager: torch.Tensor, compiled: torch.Tensor, reference: torch.Tensor) -> AccuracyReport:
    ref = reference.detach().to(torch.complex128 if reference.is_complex() else torch.float64)
    eager_error, compiled_error = _error(eager, ref), _error(compiled, ref)
    finite = ref[ref.isfinite()].abs()
    scale = float(finite.max()) if finite.numel() else 0.0
    eps = torch.finfo(eager.real.dtype if eager.is_complex() else eager.dtype).eps
    bound = MULTIPLIER * eager_error + FLOOR_ULPS * eps * scale
    if compiled_error <= bound:
        return AccuracyReport(True, compiled_error, eager_error, bound)
    return AccuracyReport(
        False,
        compiled_error,
        eager_error,
        bound,
        detail=f"its error against float64 ({compiled_error:.3g}) exceeds {MULTIPLIER:g} times eager's "
        f"({eager_error:.3g}) plus {FLOOR_ULPS:g} units of {eager.dtype} precision",
    )


def _error(value: torch.Tensor, reference: torch.Tensor) -> float:
    """The largest difference from ``reference``; a NaN or an infinity where the reference has none is infinite."""
    wide = value.detach().to(reference.dtype)
    same = (wide == reference) | (wide.isnan() & reference.isnan())
    diff = torch.where(same, torch.zeros((), dtype=torch.float64, device=wide.device), (wide - reference).abs())
    diff = diff.nan_to_num(nan=float("inf"))
    return float(diff.max()) if diff.numel() else 0.0
