"""A program with other kernels than eager's held to eager's own accuracy against float64 (``core.accuracy``)."""

from __future__ import annotations

import torch
from torch import nn

from launchless.core.accuracy import (
    FLOAT32,
    TF32,
    allowed_float32_precision,
    as_accurate_as_eager,
    channels_last_copy,
    float64_copy,
    widened,
)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(64, 64)
        self.norm = nn.LayerNorm(64)
        self.register_buffer("ids", torch.arange(4))

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        y = self.norm(torch.tanh(self.lin(x)))
        return {"y": y, "best": y.argmax(-1), "picked": y[:, self.ids]}


def test_another_summation_order_passes_and_a_wrong_value_fails() -> None:
    torch.manual_seed(0)
    model = Net().eval()
    x = torch.randn(8, 64)
    with torch.no_grad():
        eager = model(x)
        reference = float64_copy(model)(*widened((x,)))
        assert reference["y"].dtype == torch.float64
        # the same forward, its matmul summed in another order (as a fused kernel would)
        reordered = torch.tanh((x.unsqueeze(1) * model.lin.weight).flip(-1).sum(-1) + model.lin.bias)
        y = model.norm(reordered)
        compiled = {"y": y, "best": y.argmax(-1), "picked": y[:, model.ids]}
    assert torch.equal(compiled["best"], eager["best"]) and not torch.equal(compiled["y"], eager["y"])
    report = as_accurate_as_eager(eager, compiled, reference)
    assert report.passed, report.detail
    assert 0 < report.compiled_error <= report.bound
    wrong = {**eager, "y": eager["y"] + 1e-3}
    report = as_accurate_as_eager(eager, wrong, reference)
    assert not report.passed and "exceeds 3 times eager's" in report.detail


def test_outputs_that_are_not_floating_point_must_equal_eagers() -> None:
    eager = {"ids": torch.tensor([1, 2]), "n": 3}
    reference = {"ids": torch.tensor([1, 2]), "n": 3}
    assert as_accurate_as_eager(eager, {"ids": torch.tensor([1, 2]), "n": 3}, reference).passed
    report = as_accurate_as_eager(eager, {"ids": torch.tensor([2, 1]), "n": 3}, reference)
    assert not report.passed and "torch.int64 output differs" in report.detail
    report = as_accurate_as_eager(eager, {"ids": torch.tensor([1, 2]), "n": 4}, reference)
    assert not report.passed and "not a tensor differs" in report.detail
    assert "structure" in as_accurate_as_eager(eager, {"ids": eager["ids"]}, reference).detail


def test_a_nan_where_eager_has_none_fails() -> None:
    eager = torch.ones(3)
    assert not as_accurate_as_eager(eager, torch.tensor([1.0, float("nan"), 1.0]), eager.double()).passed


def test_the_float64_copy_widens_floats_shares_the_rest_and_leaves_the_model_alone() -> None:
    model = Net().eval()
    wide = float64_copy(model)
    assert wide.lin.weight.dtype == torch.float64 and isinstance(wide.lin.weight, nn.Parameter)
    assert model.lin.weight.dtype == torch.float32
    assert wide.ids is model.ids  # an index buffer is the same in float64
    assert wide.lin.weight.data_ptr() != model.lin.weight.data_ptr()


def test_the_floor_is_counted_in_the_precision_the_settings_allow() -> None:
    previous = torch.get_float32_matmul_precision()
    conv = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten())
    try:
        # PyTorch's defaults: convolutions may use TF32, matrix products may not
        assert torch.get_float32_matmul_precision() == "highest"
        assert allowed_float32_precision(Net()) is FLOAT32
        if torch.backends.cudnn.allow_tf32:
            precision = allowed_float32_precision(conv)
            assert precision.eps == TF32.eps and "cudnn.allow_tf32" in precision.name
        torch.set_float32_matmul_precision("high")
        assert allowed_float32_precision(Net()).eps == TF32.eps
        torch.set_float32_matmul_precision("medium")
        assert allowed_float32_precision(Net()).eps == torch.finfo(torch.bfloat16).eps
    finally:
        torch.set_float32_matmul_precision(previous)


def test_a_tf32_rounding_passes_where_the_settings_allow_it_and_fails_where_they_do_not() -> None:
    torch.manual_seed(0)
    model = Net().eval()
    x = torch.randn(8, 64)
    with torch.no_grad():
        eager = model(x)
        reference = float64_copy(model)(*widened((x,)))
    rounded = {**eager, "y": eager["y"] * (1 + 2.0**-11)}  # half a TF32 unit off: what a TF32 kernel may round to
    strict = as_accurate_as_eager(eager, rounded, reference)
    assert not strict.passed and "units of torch.float32 precision" in strict.detail
    allowed = as_accurate_as_eager(eager, rounded, reference, float32_precision=TF32)
    assert allowed.passed, allowed.detail
    way_off = {**eager, "y": eager["y"] + 0.1}
    report = as_accurate_as_eager(eager, way_off, reference, float32_precision=TF32)
    assert not report.passed and "units of TF32 precision" in report.detail


def test_eager_laid_out_channels_last_counts_where_convolutions_may_use_tf32(monkeypatch) -> None:
    """A compiled program whose convolutions round as eager's channels-last layout does (cuDNN's TF32 kernels) is
    as accurate as eager, though eager's own layout happened to take exact kernels; a worse one is still not."""
    torch.manual_seed(0)
    convolutional = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 6 * 6, 3)).eval()
    laid_out = channels_last_copy(convolutional)
    assert laid_out is not None and laid_out is not convolutional
    assert laid_out[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert not convolutional[0].weight.is_contiguous(memory_format=torch.channels_last)  # the model is left alone
    assert channels_last_copy(Net()) is None  # no convolution: one layout
    monkeypatch.setattr("launchless.core.accuracy._convolutions_may_use_tf32", lambda: False)
    assert channels_last_copy(convolutional) is None  # exact kernels in every layout

    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        eager = convolutional(x)
        reference = float64_copy(convolutional)(*widened((x,)))
    scale = float(reference.abs().max())
    other_layout = eager + 40 * TF32.eps * scale  # TF32 rounding through a deep backward: beyond the floor
    like_it = other_layout + TF32.eps * scale
    alone = as_accurate_as_eager(eager, like_it, reference, float32_precision=TF32)
    assert not alone.passed
    both = as_accurate_as_eager(eager, like_it, reference, float32_precision=TF32, eager_other_layout=other_layout)
    assert both.passed, both.detail
    assert both.eager_error >= float((other_layout.double() - reference).abs().max()) * 0.999
    far = eager + 400 * TF32.eps * scale
    worse = as_accurate_as_eager(eager, far, reference, float32_precision=TF32, eager_other_layout=other_layout)
    assert not worse.passed
