"""CPU tests of batch buckets (``core.buckets``): the choice of bucket, padding with the call's own values, slicing
back, and the proof that rows do not interact -- refused for batch norm in training mode, attention across the
batch and a sum over the batch, accepted for a per-row model."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from launchless import ConfigError
from launchless.core.buckets import (
    NotPerRow,
    RowsVerdictStatus,
    batch_rows,
    bucket_for,
    check_buckets,
    pad_rows,
    prove_rows_independent,
    slice_rows,
)
from launchless.core.signature import flatten_inputs, signature_of


def test_buckets_are_checked_and_sorted_with_errors_that_name_the_fix() -> None:
    assert check_buckets([8, 1, 4, 2]) == (1, 2, 4, 8)
    for bad, said in [
        ([], "empty"),
        ("1,2", "list of batch sizes"),
        ([0, 4], "1 or more"),
        ([2.0], "1 or more"),
        ([True], "1 or more"),
        ([4, 4], "more than once"),
    ]:
        with pytest.raises(ConfigError, match=said) as caught:
            check_buckets(bad)
        assert "batch_buckets=[1, 2, 4, 8, 16, 32]" in str(caught.value)


@pytest.mark.parametrize(("rows", "bucket"), [(1, 1), (3, 4), (4, 4), (5, 8), (32, 32), (33, None)])
def test_a_batch_goes_to_the_smallest_bucket_that_holds_it(rows: int, bucket: int | None) -> None:
    assert bucket_for(rows, (1, 2, 4, 8, 16, 32)) == bucket


def test_the_batch_is_the_first_dimension_every_tensor_input_shares() -> None:
    ids, mask = torch.zeros(3, 7, dtype=torch.long), torch.ones(3, 7, dtype=torch.long)
    assert batch_rows([ids, mask, 0.5, None]) == 3
    assert batch_rows([ids, torch.zeros(4, 7)]) is None  # a table that is not per row
    assert batch_rows([ids, torch.tensor(1.0)]) is None
    assert batch_rows([1, "x"]) is None


def test_padding_uses_the_calls_own_values_and_slicing_gives_the_real_rows_back() -> None:
    ids = torch.tensor([[5, 6, 7], [8, 9, 10]])
    repeated, scale = pad_rows([ids, 2.0], 4)
    assert scale == 2.0 and repeated.shape == (4, 3) and torch.equal(repeated[2:], ids[-1:].expand(2, 3))
    (shuffled,) = pad_rows([ids], 4, shuffled=True)
    assert shuffled.dtype == ids.dtype and set(shuffled[2:].flatten().tolist()) <= set(ids.flatten().tolist())
    assert torch.equal(shuffled[:2], ids)
    out = {"logits": torch.arange(12.0).reshape(4, 3), "n": 1}
    sliced = slice_rows(out, 2, 4)
    assert torch.equal(sliced["logits"], out["logits"][:2]) and sliced["n"] == 1
    with pytest.raises(NotPerRow, match="does not have the batch"):
        slice_rows((out["logits"], out["logits"].sum()), 2, 4)


class PerRow(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class AcrossBatch(nn.Module):
    """Each row attends to every row of the batch: the padding rows reach the real ones."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = torch.softmax(x @ x.T, dim=-1)
        return weights @ x


class BatchNormTraining(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


class SumOverBatch(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x * 2, x.sum()


@torch.no_grad()
@pytest.mark.parametrize(
    ("model", "status"),
    [
        (PerRow().eval(), {RowsVerdictStatus.BIT_IDENTICAL, RowsVerdictStatus.BATCH_SHAPE}),
        (AcrossBatch(), {RowsVerdictStatus.ROWS_INTERACT}),
        (BatchNormTraining().train(), {RowsVerdictStatus.ROWS_INTERACT}),
        (SumOverBatch(), {RowsVerdictStatus.NOT_PER_ROW}),
    ],
    ids=["per-row", "attention-across-batch", "batchnorm-training", "sum-over-batch"],
)
def test_padding_is_proven_safe_only_where_rows_do_not_interact(model: nn.Module, status: set) -> None:
    x = torch.randn(3, 8)
    verdict = prove_rows_independent(model, flatten_inputs((x,), {}), 8)
    assert verdict.status in status, verdict
    assert verdict.independent == (
        RowsVerdictStatus.ROWS_INTERACT not in status and RowsVerdictStatus.NOT_PER_ROW not in status
    )
    if verdict.status is RowsVerdictStatus.ROWS_INTERACT:
        assert verdict.max_abs > 0 and "padding rows changed the real rows" in verdict.detail


@torch.no_grad()
class RoundsByBatchSize(nn.Module):
    """Rows kept apart, but the result rounded differently at each batch size, as two TF32 kernels would."""

    def __init__(self, relative: float) -> None:
        super().__init__()
        self.relative = relative

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * (1 + self.relative * (x.shape[0] % 2))


@torch.no_grad()
@pytest.mark.parametrize(
    ("tf32", "relative", "status"),
    [
        (True, 2e-4, RowsVerdictStatus.BATCH_SHAPE),
        (False, 2e-4, RowsVerdictStatus.DIFFERS),
        (True, 2e-2, RowsVerdictStatus.DIFFERS),
    ],
)
def test_kernels_that_round_in_tf32_are_held_to_tf32s_rounding(
    monkeypatch: pytest.MonkeyPatch, tf32: bool, relative: float, status: RowsVerdictStatus
) -> None:
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", tf32)
    matmul = torch.backends.cuda.matmul  # its flags live in C++: set and restored by hand, not monkeypatched
    matmul_tf32 = matmul.allow_tf32
    matmul.allow_tf32 = False
    try:
        x = torch.randn(3, 8)
        verdict = prove_rows_independent(RoundsByBatchSize(relative), flatten_inputs((x,), {}), 4)
    finally:
        matmul.allow_tf32 = matmul_tf32
    assert verdict.status is status, verdict
    assert ("TF32" in verdict.detail) is tf32, verdict.detail  # the bound that was applied is named


def test_inputs_that_do_not_share_a_batch_are_not_padded() -> None:
    verdict = prove_rows_independent(
        lambda x, table: x + table.sum(), flatten_inputs((torch.ones(3, 2), torch.ones(5)), {}), 4
    )
    assert verdict.status is RowsVerdictStatus.NOT_PER_ROW and "share a batch" in verdict.detail


def test_automatic_buckets_are_the_powers_of_two_that_hold_the_sizes_seen() -> None:
    from launchless.runtime.batch_buckets import BatchBucketing

    bucketing = BatchBucketing("auto", name="m", tolerance_ulps=64.0)
    buckets = []
    for rows in (5, 2, 7, 1, 16, 17, 6):
        flat = flatten_inputs((torch.zeros(rows, 3),), {})
        plan = bucketing.plan(flat, signature_of(flat))
        buckets.append(plan.bucket)
        assert plan.padded_flat().leaves[0].shape == (plan.bucket, 3) and plan.rows == rows
        assert plan.flat is flat  # the call's own inputs: a replay writes them into the graph's buffers
    assert buckets == [8, 2, 8, 1, 16, 32, 8]
    assert bucketing.sizes == (1, 2, 8, 16, 32) and bucketing.info()["automatic"]


def _through_buckets(bucketing, sizes) -> None:
    """Each size planned and counted as a call through its bucket (what a replay does, without the graph)."""
    for rows in sizes:
        flat = flatten_inputs((torch.zeros(rows, 3),), {})
        plan = bucketing.plan(flat, signature_of(flat))
        bucketing.count(plan)


def test_traffic_far_below_its_buckets_gets_one_warning_naming_the_sizes_padded_most(caplog) -> None:
    import logging

    from launchless.runtime.batch_buckets import PADDING_LOOK_EVERY, BatchBucketing

    bucketing = BatchBucketing([1, 32], name="ranker", tolerance_ulps=64.0)
    with caplog.at_level(logging.WARNING, logger="launchless"):
        _through_buckets(bucketing, [3, 3, 5, 1] * PADDING_LOOK_EVERY)  # 3 and 5 rows padded to 32
    said = [r.getMessage() for r in caplog.records if "were padding" in r.getMessage()]
    assert len(said) == 1, said  # once, not per look
    assert "ranker" in said[0] and "buckets [1, 32]" in said[0] and "batch_buckets='auto'" in said[0]
    looked = PADDING_LOOK_EVERY  # the first look, at that many padded calls: 3, 3, 5, 3, 3, 5, ...
    threes, fives = 2 * (looked // 3) + min(looked % 3, 2), looked // 3 + max(looked % 3 - 2, 0)
    assert f"3 rows ({threes} calls), 5 rows ({fives} calls)" in said[0]
    info = bucketing.info()
    assert info["padding_rows"] == 2 * PADDING_LOOK_EVERY * 29 + PADDING_LOOK_EVERY * 27
    assert info["padding_share"] == pytest.approx(info["padding_rows"] / (PADDING_LOOK_EVERY * (3 * 32 + 1)))


def test_traffic_that_fits_powers_of_two_is_padded_without_a_warning(caplog) -> None:
    import logging

    from launchless.runtime.batch_buckets import PADDING_LOOK_EVERY, BatchBucketing

    bucketing = BatchBucketing([1, 2, 4, 8, 16, 32], name="m", tolerance_ulps=64.0)
    with caplog.at_level(logging.WARNING, logger="launchless"):
        _through_buckets(bucketing, list(range(1, 33)) * PADDING_LOOK_EVERY)  # every size; under half is padding
    assert not [r for r in caplog.records if "were padding" in r.getMessage()]
    assert 0.0 < bucketing.info()["padding_share"] < 0.5


class HalvesItsInput(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(0.5)
        return x * 2


@pytest.mark.parametrize("grad_mode", [torch.no_grad, torch.inference_mode], ids=["no_grad", "inference_mode"])
def test_a_forward_writing_its_input_is_refused_padding_and_the_callers_tensor_is_left_to_the_call(grad_mode) -> None:
    """A padded call would write a padded copy of the input, never the caller's tensor; the proof runs on copies."""
    with grad_mode():
        x = torch.randn(3, 8)
        before = x.clone()
        verdict = prove_rows_independent(HalvesItsInput(), flatten_inputs((x,), {}), 8)
    assert verdict.status is RowsVerdictStatus.WRITES_INPUT and not verdict.independent, verdict
    assert torch.equal(x, before), "the proof wrote the caller's tensor"
