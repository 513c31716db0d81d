"""A program with other kernels than eager's held to eager's own accuracy, against a float64 reference.

Inductor's fused kernels add and multiply in another order than eager's: their results differ from eager's in the
last bits, so bit identity cannot prove them and a fixed tolerance proves nothing (what is a rounding difference
for one forward is a bug for another). What can be proven is that the compiled program is no less accurate than
eager: both are compared with the same forward run in float64 on the same inputs, and the compiled program's error
may be at most ``MULTIPLIER`` times eager's (plus a few units of the output's precision, where eager happens to
round exactly to the float64 result). This is the check PyTorch's own benchmark suites apply to compiled models
(``torch._dynamo.utils.same`` with an ``fp64_ref``). Outputs that are not floating point (indices, counts, masks)
must equal eager's.

The floor is counted in the coarsest precision PyTorch's settings let the model's float32 kernels use: TF32 where
convolutions may use it (``torch.backends.cudnn.allow_tf32``, on by default) and the model has convolutions, or where
matrix products may (``torch.set_float32_matmul_precision("high")``); bfloat16 under ``"medium"``. A compiled
program may pick a TF32 kernel where eager's happened not to (Inductor lays a convolution out channels-last, and
cuDNN then takes a tensor-core kernel): that is a rounding the settings allow eager too, not an error. Through a
whole backward those roundings add up beyond any few units, so where convolutions may use TF32 eager is also run
laid out channels-last (``channels_last_copy``): the same model in eager, as a user may lay it out, under the same
settings; eager's error is the larger of its two layouts'.

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


@dataclasses.dataclass(frozen=True)
class Precision:
    """The coarsest rounding float32 kernels are allowed: its unit and the setting that allows it."""

    eps: float
    name: str


FLOAT32 = Precision(torch.finfo(torch.float32).eps, "float32")
TF32 = Precision(2.0**-10, "TF32")  # 10 explicit mantissa bits
BFLOAT16 = Precision(torch.finfo(torch.bfloat16).eps, "bfloat16")


def allowed_float32_precision(model: torch.nn.Module) -> Precision:
    """What PyTorch's settings, as they are now, let ``model``'s float32 convolutions and matrix products round to."""
    matmul = torch.get_float32_matmul_precision()
    if matmul == "medium":
        return Precision(BFLOAT16.eps, 'bfloat16 (torch.set_float32_matmul_precision("medium"))')
    if matmul == "high":
        return Precision(TF32.eps, 'TF32 (torch.set_float32_matmul_precision("high"))')
    if _convolutions_may_use_tf32() and any(isinstance(m, torch.nn.modules.conv._ConvNd) for m in model.modules()):
        return Precision(TF32.eps, "TF32 (torch.backends.cudnn.allow_tf32, on by default, for convolutions)")
    return FLOAT32


def _convolutions_may_use_tf32() -> bool:
    conv = getattr(getattr(torch.backends.cudnn, "conv", None), "fp32_precision", None)  # torch >= 2.9's setting
    if conv in ("tf32", "ieee"):
        return conv == "tf32"
    try:
        return bool(torch.backends.cudnn.allow_tf32)
    except RuntimeError:  # the legacy and the new settings were mixed: TF32 is allowed somewhere
        return True


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


def channels_last_copy(model: torch.nn.Module) -> torch.nn.Module | None:
    """Eager's other layout, where it may round otherwise: a copy of ``model`` laid out channels-last, where the
    settings let convolutions use TF32 and the model has 2-D or 3-D convolutions (None elsewhere: one layout, one
    rounding). cuDNN picks its kernels per layout -- measured on an H200, resnet18's gradients from the NCHW layout
    came out of exact float32 kernels and those of the channels-last one out of TF32 ones, 25 times further from
    float64 -- and a convolution takes the channels-last layout of its weight."""
    convolutional = any(isinstance(m, (torch.nn.Conv2d, torch.nn.Conv3d)) for m in model.modules())
    if not convolutional or not _convolutions_may_use_tf32():
        return None
    copied = copy.deepcopy(model)
    for module in copied.modules():
        if isinstance(module, torch.nn.Conv2d):
            module.to(memory_format=torch.channels_last)
        elif isinstance(module, torch.nn.Conv3d):
            module.to(memory_format=torch.channels_last_3d)
    return copied


def widened(tree: Any) -> Any:
    """The inputs with floating point tensors in float64."""
    return pytree.tree_map_only(torch.Tensor, lambda t: t.to(torch.float64) if t.is_floating_point() else t, tree)


def as_accurate_as_eager(
    eager: Any,
    compiled: Any,
    reference: Any,
    *,
    float32_precision: Precision = FLOAT32,
    eager_other_layout: Any = None,
) -> AccuracyReport:
    """Judge ``compiled`` against ``eager``, both against the float64 ``reference`` (the same forward in float64
    on the same inputs). ``float32_precision``: the unit of the floor for float32 outputs
    (``allowed_float32_precision``). ``eager_other_layout``: the same eager run in its other layout
    (``channels_last_copy``), whose error per output counts as eager's where it is larger."""
    for tree in (eager, compiled, reference, eager_other_layout):
        see_into(tree)
    if not pytree.tree_structure(eager) == pytree.tree_structure(compiled) == pytree.tree_structure(reference):
        return AccuracyReport(False, detail="the outputs' structure differs from eager's")
    laid_out_alike = pytree.tree_structure(eager_other_layout) == pytree.tree_structure(eager)
    others = pytree.tree_leaves(eager_other_layout) if eager_other_layout is not None and laid_out_alike else None
    worst, worst_excess = AccuracyReport(True), float("-inf")
    for i, (e, c, r) in enumerate(
        zip(pytree.tree_leaves(eager), pytree.tree_leaves(compiled), pytree.tree_leaves(reference), strict=True)
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
        other = others[i] if others is not None else None
        report = _judged(e, c, r, float32_precision, other if isinstance(other, torch.Tensor) else None)
        if not report.passed:
            return report
        if report.compiled_error - report.bound > worst_excess:
            worst, worst_excess = report, report.compiled_error - report.bound
    return worst


def _judged(
    eager: torch.Tensor,
    compiled: torch.Tensor,
    reference: torch.Tensor,
    float32_precision: Precision,
    eager_other_layout: torch.Tensor | None,
) -> AccuracyReport:
    ref = reference.detach().to(torch.complex128 if reference.is_complex() else torch.float64)
    eager_error, compiled_error = _error(eager, ref), _error(compiled, ref)
    if eager_other_layout is not None and eager_other_layout.shape == eager.shape:
        eager_error = max(eager_error, _error(eager_other_layout, ref))
    finite = ref[ref.isfinite()].abs()
    scale = float(finite.max()) if finite.numel() else 0.0
    dtype = eager.real.dtype if eager.is_complex() else eager.dtype
    eps, unit = torch.finfo(dtype).eps, str(dtype)
    if dtype == torch.float32 and float32_precision.eps > eps:
        eps, unit = float32_precision.eps, float32_precision.name
    bound = MULTIPLIER * eager_error + FLOOR_ULPS * eps * scale
    if compiled_error <= bound:
        return AccuracyReport(True, compiled_error, eager_error, bound)
    return AccuracyReport(
        False,
        compiled_error,
        eager_error,
        bound,
        detail=f"its error against float64 ({compiled_error:.3g}) exceeds {MULTIPLIER:g} times eager's "
        f"({eager_error:.3g}) plus {FLOOR_ULPS:g} units of {unit} precision",
    )


def _error(value: torch.Tensor, reference: torch.Tensor) -> float:
    """The largest difference from ``reference``; a NaN or an infinity where the reference has none is infinite."""
    wide = value.detach().to(reference.dtype)
    same = (wide == reference) | (wide.isnan() & reference.isnan())
    diff = torch.where(same, torch.zeros((), dtype=torch.float64, device=wide.device), (wide - reference).abs())
    diff = diff.nan_to_num(nan=float("inf"))
    return float(diff.max()) if diff.numel() else 0.0
