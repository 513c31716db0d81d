"""Batch buckets: a call's batch padded up to one of a few captured sizes, replayed, and sliced back.

A server sees batch sizes from 1 to 32; a graph per size holds 32 graphs' memory and captures 32 times. Padding a
call of 5 rows to the bucket of 8 replays the graph of 8 instead -- but only where rows do not interact: the first
5 rows of the padded batch must be what the 5 rows give alone. That is proven per model and bucket
(``prove_rows_independent``), never assumed:

1. the padded batch runs twice, with two different fillings of the padding rows (copies of the last real row; the
   real rows' values shuffled). The same shapes run the same kernels, so the real rows must come out bit for bit
   the same both times -- any difference is the padding reaching them: batch norm in training mode, attention
   across the batch, a sum over the batch;
2. the real rows of the padded batch are compared with the call without padding: bit-identical, or within a bound
   that is measured and named (``batch-shape``: a kernel chosen by the batch size sums in another order; where
   float32 convolutions or products run in TF32, the bound is TF32's rounding, ``TF32_ULPS`` units of it);
3. every output must have the batch as its first dimension, or it cannot be sliced back (a loss, a pooled vector).

Padding rows are real values of the call (a copy of a row, or its values reordered), so token ids stay valid ids
and masks stay masks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

from ..errors import ConfigError
from .signature import FlatInputs
from .status import Label
from .verify import difference, identical

SHUFFLE_SEED = 0x5EED
TF32_EPS = 2.0**-10  # TF32 keeps 10 bits of mantissa
# TF32 kernels picked for two batch sizes: resnet18's logits differ by 2e-4 of their largest value (H200, cuDNN's
# default TF32 convolutions), 0.2 of a TF32 unit; the bound allows 8 units, far below any real interaction of rows
TF32_ULPS = 8


class RowsVerdictStatus(Label):
    """How the real rows of a padded batch compare with the call without padding."""

    BIT_IDENTICAL = "bit-identical"
    BATCH_SHAPE = "batch-shape"  # equal within a measured bound: kernels chosen by the batch size
    ROWS_INTERACT = "rows interact"  # the padding rows changed the real rows
    NOT_PER_ROW = "not per row"  # an output without the batch as its first dimension, or no shared batch dimension
    WRITES_INPUT = "writes its input"  # a padded call's copy of the input, not the caller's tensor, would be written
    DIFFERS = "differs"  # beyond the bound


@dataclasses.dataclass(frozen=True)
class RowsVerdict:
    """Whether padding to ``bucket`` is safe for this model, and how its rows compare (``max_abs`` is the largest
    difference between the padded call's real rows and the call without padding)."""

    status: RowsVerdictStatus
    bucket: int
    max_abs: float = 0.0
    bound: float = 0.0
    detail: str = ""

    @property
    def independent(self) -> bool:
        return self.status in (RowsVerdictStatus.BIT_IDENTICAL, RowsVerdictStatus.BATCH_SHAPE)


def check_buckets(sizes: Any) -> tuple[int, ...]:
    """``batch_buckets`` as given by the user: positive whole numbers, each once; sorted. A clear error otherwise."""
    example = "e.g. batch_buckets=[1, 2, 4, 8, 16, 32], or batch_buckets='auto' to take them from the sizes seen"
    if isinstance(sizes, (str, bytes)) or not isinstance(sizes, Sequence):
        raise ConfigError(f"batch_buckets must be a list of batch sizes, {example}; got {sizes!r}")
    if not sizes:
        raise ConfigError(f"batch_buckets is empty: give the batch sizes to capture, {example}")
    bad = [s for s in sizes if isinstance(s, bool) or not isinstance(s, int) or s < 1]
    if bad:
        raise ConfigError(f"batch_buckets holds {bad!r}: every bucket is a batch size of 1 or more, {example}")
    if len(set(sizes)) != len(sizes):
        twice = sorted({s for s in sizes if list(sizes).count(s) > 1})
        raise ConfigError(f"batch_buckets lists {twice} more than once; give each size once, {example}")
    return tuple(sorted(sizes))


def bucket_for(rows: int, buckets: Sequence[int]) -> int | None:
    """The smallest bucket that holds ``rows`` (``buckets`` sorted); None when the batch is larger than all."""
    for size in buckets:
        if size >= rows:
            return size
    return None


def batch_rows(leaves: Sequence[Any]) -> int | None:
    """The batch size every tensor input shares as its first dimension; None when there is no tensor input, one
    has no dimensions, or two disagree (an input that is not per row cannot be padded)."""
    sizes = {x.shape[0] if x.dim() else None for x in leaves if isinstance(x, torch.Tensor)}
    if len(sizes) != 1 or None in sizes:
        return None
    return sizes.pop()


def _shuffled(x: torch.Tensor, count: int, generator: torch.Generator) -> torch.Tensor:
    """``count`` rows made of ``x``'s own values at random positions (valid ids stay valid, masks stay masks)."""
    values = x.reshape(-1)
    picks = torch.randint(values.numel(), (count * (values.numel() // x.shape[0]),), generator=generator)
    return values[picks.to(values.device)].reshape(count, *x.shape[1:])


def pad_rows(leaves: Sequence[Any], bucket: int, *, shuffled: bool = False) -> list[Any]:
    """Every tensor input padded along its first dimension up to ``bucket`` rows: copies of its last row, or
    (``shuffled``) its own values reordered. Other leaves are kept."""
    generator = torch.Generator().manual_seed(SHUFFLE_SEED)
    out: list[Any] = []
    for x in leaves:
        if not isinstance(x, torch.Tensor) or x.shape[0] >= bucket:
            out.append(x)
            continue
        count = bucket - x.shape[0]
        extra = _shuffled(x, count, generator) if shuffled else x[-1:].expand(count, *x.shape[1:])
        out.append(torch.cat([x, extra.to(x.dtype)]))
    return out


class NotPerRow(ValueError):
    """An output does not have the padded batch as its first dimension: it cannot be sliced back."""


def slice_rows(outputs: Any, rows: int, bucket: int) -> Any:
    """The first ``rows`` rows of every tensor output of a batch padded to ``bucket`` (views: no copy)."""

    def first_rows(x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        if x.dim() == 0 or x.shape[0] != bucket:
            shape = tuple(x.shape)
            raise NotPerRow(
                f"an output of shape {shape} does not have the batch ({bucket} rows) as its first dimension"
            )
        return x[:rows]

    return pytree.tree_map(first_rows, outputs)


def _versioned_copy(x: torch.Tensor) -> torch.Tensor:
    """A copy of ``x`` with a version counter (a copy made under ``inference_mode`` has none), which tells whether the
    forward wrote it."""
    with torch.inference_mode(False):
        return x.detach().clone()


def prove_rows_independent(
    fn: Callable[..., Any], flat: FlatInputs, bucket: int, *, tolerance_ulps: float = 64.0
) -> RowsVerdict:
    """Run ``fn`` eager on the call's inputs, and padded to ``bucket`` twice with different padding; the verdict on
    padding this model to this bucket (see the module docstring). Runs under the caller's grad mode."""
    rows = batch_rows(flat.leaves)
    if rows is None:
        return RowsVerdict(
            RowsVerdictStatus.NOT_PER_ROW, bucket, detail="the tensor inputs do not share a batch dimension"
        )
    if rows >= bucket:
        return RowsVerdict(RowsVerdictStatus.BIT_IDENTICAL, bucket, detail="nothing to pad")

    def call(leaves: list[Any]) -> Any:
        args, kwargs = flat.rebuild(leaves)
        return fn(*args, **kwargs)

    # on copies: the caller's own tensors are used once, by the call itself
    own = [_versioned_copy(x) if isinstance(x, torch.Tensor) else x for x in flat.leaves]
    versions = [x._version for x in own if isinstance(x, torch.Tensor)]
    exact = call(own)
    if [x._version for x in own if isinstance(x, torch.Tensor)] != versions:
        return RowsVerdict(
            RowsVerdictStatus.WRITES_INPUT,
            bucket,
            detail="the forward writes into its input in place; a padded call would write a padded copy, not the "
            "caller's tensor",
        )
    try:
        repeated = slice_rows(call(pad_rows(flat.leaves, bucket)), rows, bucket)
        shuffled = slice_rows(call(pad_rows(flat.leaves, bucket, shuffled=True)), rows, bucket)
    except NotPerRow as exc:
        return RowsVerdict(RowsVerdictStatus.NOT_PER_ROW, bucket, detail=str(exc))
    if not identical(repeated, shuffled):
        max_abs, _, _ = difference(repeated, shuffled, tolerance_ulps)
        return RowsVerdict(
            RowsVerdictStatus.ROWS_INTERACT,
            bucket,
            max_abs=max_abs,
            detail=f"the padding rows changed the real rows by up to {max_abs:.3g} (batch norm in training mode, "
            "attention or a reduction across the batch)",
        )
    if identical(repeated, exact):
        return RowsVerdict(RowsVerdictStatus.BIT_IDENTICAL, bucket)
    max_abs, _, bound = difference(exact, repeated, tolerance_ulps)
    precision = ""
    if max_abs > bound and tf32_allowed() and _float32_outputs(exact):
        max_abs, _, bound = difference(exact, repeated, TF32_ULPS * TF32_EPS / torch.finfo(torch.float32).eps)
        precision = f" in TF32 ({TF32_ULPS} units of its rounding at the largest output)"
    if max_abs <= bound:
        return RowsVerdict(
            RowsVerdictStatus.BATCH_SHAPE,
            bucket,
            max_abs=max_abs,
            bound=bound,
            detail=f"the rows equal the call of {rows} within {max_abs:.3g} (bound {bound:.3g}): kernels chosen by "
            f"the batch size{precision}",
        )
    return RowsVerdict(
        RowsVerdictStatus.DIFFERS,
        bucket,
        max_abs=max_abs,
        bound=bound,
        detail=f"the rows differ from the call of {rows} by {max_abs:.3g}, over the bound {bound:.3g}{precision}",
    )


def tf32_allowed() -> bool:
    """Whether float32 convolutions or matrix products may round their inputs to TF32 (cuDNN's default for
    convolutions): then two kernels chosen for two batch sizes differ at TF32's rounding, not float32's."""
    return (
        torch.backends.cudnn.allow_tf32
        or torch.backends.cuda.matmul.allow_tf32
        or torch.get_float32_matmul_precision() != "highest"
    )


def _float32_outputs(outputs: Any) -> bool:
    return any(isinstance(x, torch.Tensor) and x.dtype == torch.float32 for x in pytree.tree_leaves(outputs))
