"""CPU tests for launchless.core.verify: bit identity, difference sizes, probes and the two-probe protocol.

``verify`` is driven with a test double for the captured graph (any object with ``replay_cloned``),
so every verdict -- bit-identical, stale, unexplained, capture-path, eager-noise -- is reachable
without a GPU.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from launchless.core.capture_path import pretend_capturing
from launchless.core.signature import flatten_inputs, tensor_spec
from launchless.core.status import VerifyStatus
from launchless.core.verify import (
    difference,
    identical,
    input_probes,
    make_probes,
    verify,
)

EPS32 = torch.finfo(torch.float32).eps


# ---- identical ------------------------------------------------------------------------------------


def test_identical_same_values() -> None:
    x = torch.randn(3, 4)
    assert identical(x, x.clone())
    assert identical((x, {"a": [x * 2]}), (x.clone(), {"a": [x * 2]}))


def test_identical_nan_equals_nan_and_signed_zeros_differ() -> None:
    nan = torch.tensor([1.0, float("nan")])
    assert identical(nan, nan.clone())
    zero, neg_zero = torch.tensor([0.0]), torch.tensor([-0.0])
    assert torch.equal(zero, neg_zero)  # value equality would miss it
    assert not identical(zero, neg_zero)


def test_identical_detects_one_ulp() -> None:
    x = torch.tensor([1.0, 2.0])
    y = torch.nextafter(x, torch.full_like(x, 3.0))
    assert not identical(x, y)


def test_identical_dtype_and_shape_mismatch() -> None:
    x = torch.ones(4)
    assert not identical(x, x.double())
    assert not identical(x, x.reshape(2, 2))
    # the same bytes under another dtype are still a different output
    assert not identical(torch.zeros(2, dtype=torch.int32), torch.zeros(2, dtype=torch.float32))


def test_identical_nested_trees() -> None:
    a, b = torch.randn(2), torch.randn(3)
    assert identical({"x": (a, [b])}, {"x": (a.clone(), [b.clone()])})
    assert not identical({"x": (a, [b])}, {"x": (a, [b + 1])})
    assert not identical((a, b), [a, b])  # tuple vs list
    assert not identical({"x": a}, {"y": a})
    assert not identical((a, b), (a,))


def test_identical_bool_and_non_contiguous() -> None:
    m = torch.tensor([[True, False], [False, True]])
    assert identical(m.t(), m.t().contiguous())
    assert not identical(m, ~m)
    x = torch.randn(3, 5)
    assert identical(x.t(), x.t().contiguous())


# ---- difference -----------------------------------------------------------------------------------


def reference_difference(ref: torch.Tensor, other: torch.Tensor, ulps: float) -> tuple[float, float, float]:
    r, o = ref.double(), other.double()
    abs_diff = (r - o).abs().max().item()
    scale = r.abs().max().item()
    return abs_diff, abs_diff / scale, ulps * torch.finfo(ref.dtype).eps * scale


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_difference_against_a_direct_computation(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    ref = (torch.randn(64, generator=g) * 5).to(dtype)
    other = (ref.double() + torch.randn(64, generator=g, dtype=torch.float64) * 1e-2).to(dtype)
    got = difference(ref, other, 64)
    assert got == pytest.approx(reference_difference(ref, other, 64), rel=1e-12)
    assert got[2] == 64 * torch.finfo(dtype).eps * ref.abs().max().item()


def test_difference_zero_for_equal_and_nan_matching_nan() -> None:
    ref = torch.tensor([1.0, float("nan"), -4.0])
    assert difference(ref, ref.clone(), 64) == (0.0, 0.0, 64 * EPS32 * 4.0)


def test_difference_nan_on_one_side_is_infinite() -> None:
    ref = torch.tensor([1.0, 2.0])
    abs_diff, rel, _ = difference(ref, torch.tensor([1.0, float("nan")]), 64)
    assert abs_diff == float("inf") and rel == float("inf")


def test_difference_shape_mismatch() -> None:
    assert difference(torch.zeros(2), torch.zeros(3), 64) == (float("inf"), float("inf"), 0.0)


def test_difference_reports_the_output_that_exceeds_its_bound_most() -> None:
    big = torch.full((4,), 1000.0)
    small = torch.full((4,), 1e-3)
    # the big output differs more in absolute terms but is within its bound; the small one is not
    big_other = big + 1000.0 * 4 * EPS32
    small_other = small * 1.01
    got = difference((big, small), (big_other, small_other), 64)
    assert got == pytest.approx(reference_difference(small, small_other, 64), rel=1e-12)
    assert got[0] > got[2]


def test_difference_zero_reference_scale() -> None:
    assert difference(torch.zeros(3), torch.zeros(3), 64) == (0.0, 0.0, 0.0)
    abs_diff, rel, bound = difference(torch.zeros(3), torch.tensor([0.0, 1e-3, 0.0]), 64)
    assert (abs_diff, rel, bound) == (pytest.approx(1e-3), float("inf"), 0.0)


def test_difference_ignores_matching_infinities() -> None:
    ref = torch.tensor([float("-inf"), 1.0, 2.0])
    other = torch.tensor([float("-inf"), 1.0, 2.0 + 2 * EPS32 * 2])
    abs_diff, _, bound = difference(ref, other, 64)
    assert abs_diff == pytest.approx(float(other[2].double() - ref[2].double()))
    assert abs_diff <= bound


def test_difference_sees_imaginary_parts() -> None:
    ref = torch.tensor([1 + 1j, 2 + 0j], dtype=torch.complex64)
    abs_diff, rel, bound = difference(ref, ref + 0.5j, 64)
    assert abs_diff == pytest.approx(0.5)
    # complex outputs are measured on their real and imaginary parts, at the real dtype's epsilon
    assert bound == pytest.approx(64 * EPS32 * 2.0) and rel == pytest.approx(0.25)
    assert difference(ref, ref.clone(), 64)[0] == 0.0


# ---- make_probes ----------------------------------------------------------------------------------


def test_float_probes_come_from_two_distributions() -> None:
    example = torch.zeros(200_000)
    (p0,), (p1,) = make_probes([example])
    assert tensor_spec(p0) == tensor_spec(example) == tensor_spec(p1)
    assert abs(p0.mean().item()) < 0.02 and abs(p0.std().item() - 1) < 0.02
    assert abs(p1.mean().item() - 2) < 0.05 and abs(p1.std().item() - 3) < 0.05
    assert not torch.equal(p0, example)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_float_probes_keep_the_dtype(dtype: torch.dtype) -> None:
    example = torch.zeros(2, 3, dtype=dtype)
    for (p,) in make_probes([example]):
        assert p.dtype == dtype and p.shape == example.shape


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.int8])
def test_int_probes_stay_within_the_observed_range(dtype: torch.dtype) -> None:
    example = torch.tensor([3, 9, 5, 4] * 50, dtype=dtype)
    probes = make_probes([example])
    for (p,) in probes:
        assert p.dtype == dtype and p.shape == example.shape
        assert p.min().item() >= 3 and p.max().item() <= 9
        assert p.unique().numel() > 1  # spread over the range, not a copy of one value
    assert not torch.equal(probes[0][0], probes[1][0])


def test_negative_int_range() -> None:
    example = torch.tensor([-7, 2], dtype=torch.int32)
    for (p,) in make_probes([example]):
        assert p.min().item() >= -7 and p.max().item() <= 2


@pytest.mark.parametrize("dtype", [torch.int64, torch.uint8])
def test_int_probe_with_the_dtypes_max_value(dtype: torch.dtype) -> None:
    top = torch.iinfo(dtype).max  # a sentinel such as int64 max: randint(lo, top + 1) would overflow
    example = torch.tensor([0, top], dtype=dtype)
    for (p,) in make_probes([example]):
        assert p.dtype == dtype and p.min().item() >= 0 and p.max().item() <= top


def test_int_probe_of_a_constant_tensor() -> None:
    example = torch.full((5,), 4, dtype=torch.int32)
    for (p,) in make_probes([example]):
        assert torch.equal(p, example)


def test_bool_empty_and_non_tensor_leaves_are_kept() -> None:
    mask = torch.tensor([True, False, True])
    empty = torch.zeros(0, 3)
    marker = object()
    for probe in make_probes([mask, empty, 7, "s", None, marker]):
        assert torch.equal(probe[0], mask) and probe[0] is not mask
        assert probe[1].shape == (0, 3)
        assert probe[2:] == [7, "s", None, marker] and probe[5] is marker


def test_probes_are_deterministic_and_leave_the_global_rng_alone() -> None:
    leaves = [torch.zeros(5), torch.tensor([1, 9]), torch.zeros(2, 2, dtype=torch.float64)]
    torch.manual_seed(1)
    state = torch.get_rng_state()
    first = make_probes(leaves)
    assert torch.equal(torch.get_rng_state(), state)
    torch.manual_seed(2)  # a different global seed gives the same probes
    second = make_probes(leaves)
    assert identical(first, second)
    # the two probes of one call are different draws
    assert not identical(first[0][0], first[1][0])
    assert not identical(first[0][2], first[1][2])


@pytest.mark.parametrize(
    "example",
    [
        torch.zeros(2, 3, 4, 5).to(memory_format=torch.channels_last),
        torch.zeros(4, 3).t(),
        torch.arange(12).reshape(4, 3).t(),
    ],
    ids=["channels_last", "transposed", "transposed-int"],
)
def test_probes_keep_the_example_layout(example: torch.Tensor) -> None:
    """The layout selects kernels (cuDNN NHWC vs NCHW): eager must run on the graph's own signature."""
    probes = make_probes([example])
    for (p,) in probes:
        assert p.stride() == example.stride()
        assert tensor_spec(p) == tensor_spec(example)
    if example.is_floating_point():
        assert not any(torch.equal(p, example) for (p,) in probes)
    else:  # integers come from the call: as given, then reordered
        assert torch.equal(probes[0][0], example) and not torch.equal(probes[1][0], example)


def test_integer_inputs_are_probed_from_the_call_whole_rows_kept() -> None:
    """Ids and boxes are never drawn at random (an id out of range, a box with crossed corners: a device-side assert
    ends the process). The second probe reorders the call's rows, or a single row's tokens, keeping each row whole."""
    boxes = torch.tensor([[[10, 20, 30, 40], [5, 6, 7, 8], [0, 0, 1, 1]]])  # one image, three boxes (x0, y0, x1, y1)
    ids = torch.tensor([[101, 7, 9, 102]])
    mask = torch.ones(1, 4, dtype=torch.bool)
    (b0, i0, m0), (b1, i1, m1) = make_probes([boxes, ids, mask])
    assert torch.equal(b0, boxes) and torch.equal(i0, ids)
    assert torch.equal(b1, boxes.roll(1, 1)) and torch.equal(i1, ids.roll(1, 1))
    assert all((b1[0] == row).all(-1).any() for row in boxes[0])  # every box as given, corners in order
    assert torch.equal(m0, mask) and torch.equal(m1, mask)


# ---- verify() with a test double for the graph ----------------------------------------------------


class FakeGraph:
    """Stands in for CapturedGraph: replay_cloned(leaves) returns what ``produce`` makes of them."""

    def __init__(self, produce) -> None:
        self.produce = produce
        self.seen: list[list] = []

    def replay_cloned(self, leaves: list):
        self.seen.append(leaves)
        return self.produce(leaves)


@pytest.fixture
def no_cuda_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """verify() reruns eager on a fresh torch.cuda.Stream() when replay differs; without a GPU that rerun
    becomes a plain eager call (verify._eager runs on the current stream when given None)."""
    monkeypatch.setattr(torch.cuda, "Stream", lambda *args, **kwargs: None)


def small_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4)).eval()


def setup(model: nn.Module, *args, **kwargs):
    flat = flatten_inputs(args, kwargs)

    def eager(leaves):
        a, k = flat.rebuild(leaves)
        with torch.no_grad():
            return model(*a, **k)

    return flat, eager


def ulps_off(out: torch.Tensor, ulps: float) -> torch.Tensor:
    return out + out.abs().max() * ulps * EPS32


@torch.no_grad()
def test_graph_equal_to_eager_is_bit_identical() -> None:
    model = small_model()
    flat, eager = setup(model, torch.randn(3, 8))
    graph = FakeGraph(eager)
    report = verify(graph, model, flat)
    assert report.status == VerifyStatus.BIT_IDENTICAL and report.passed
    assert report.probes_differ and report.detail == ""
    assert report.as_dict()["status"] == VerifyStatus.BIT_IDENTICAL
    # the graph was fed the two probes, not the example
    probes = make_probes(flat.leaves)
    assert len(graph.seen) == 2 and identical(graph.seen, list(probes))


@torch.no_grad()
def test_verify_accepts_keyword_and_scalar_inputs() -> None:
    class Scaled(nn.Module):
        def forward(self, x: torch.Tensor, *, scale: float, bias: torch.Tensor) -> torch.Tensor:
            return x * scale + bias

    model = Scaled()
    flat, eager = setup(model, torch.randn(2, 3), scale=2.5, bias=torch.randn(3))
    report = verify(FakeGraph(eager), model, flat)
    assert report.status == VerifyStatus.BIT_IDENTICAL and report.passed


@torch.no_grad()
def test_stale_graph_fails() -> None:
    model = small_model()
    x = torch.randn(3, 8)
    flat, _ = setup(model, x)
    frozen = model(x)
    report = verify(FakeGraph(lambda leaves: frozen.clone()), model, flat)
    assert report.status == VerifyStatus.FAILED and not report.passed
    assert not report.probes_differ
    assert "stale" in report.detail


@torch.no_grad()
def test_input_independent_output_is_not_called_stale() -> None:
    class Const(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("c", torch.arange(4.0))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.c * 2

    model = Const()
    flat, eager = setup(model, torch.randn(4))
    report = verify(FakeGraph(eager), model, flat)
    assert report.status == VerifyStatus.BIT_IDENTICAL and report.passed
    assert "do not depend on the inputs" in report.detail


@torch.no_grad()
def test_unexplained_difference_fails(no_cuda_stream) -> None:
    model = small_model()
    flat, eager = setup(model, torch.randn(3, 8))
    graph = FakeGraph(lambda leaves: ulps_off(eager(leaves), 2))
    report = verify(graph, model, flat)
    assert report.status == VerifyStatus.FAILED and not report.passed
    assert "eager is deterministic" in report.detail and "no capture-dependent branch" in report.detail
    # the measured size is the size of the difference on the probes
    probes = make_probes(flat.leaves)
    expected = max(
        (difference(eager(p), ulps_off(eager(p), 2), 64) for p in probes),
        key=lambda d: d[0] - d[2],
    )
    assert (report.max_abs, report.max_rel, report.bound) == pytest.approx(expected)
    assert 0 < report.max_abs <= report.bound  # small, and still refused: nothing explains it


@torch.no_grad()
def test_capture_branch_explains_a_small_difference(no_cuda_stream) -> None:
    model = small_model()
    flat, eager = setup(model, torch.randn(3, 8))

    def graph() -> FakeGraph:
        return FakeGraph(lambda leaves: ulps_off(eager(leaves), 2))

    report = verify(graph(), model, flat, branches=["lib.py:1"])
    assert report.status == VerifyStatus.CAPTURE_PATH and report.passed
    assert report.branches == ["lib.py:1"]
    assert "branches on is_current_stream_capturing()" in report.detail
    assert 0 < report.max_abs <= report.bound

    strict = verify(graph(), model, flat, mode="strict", branches=["lib.py:1"])
    assert strict.status == VerifyStatus.CAPTURE_PATH and not strict.passed
    assert "verify='strict' demands bit identity" in strict.detail

    tight = verify(graph(), model, flat, tolerance_ulps=0.5, branches=["lib.py:1"])
    assert tight.status == VerifyStatus.CAPTURE_PATH and not tight.passed
    assert "exceeds the rounding bound" in tight.detail
    assert tight.max_abs > tight.bound


@torch.no_grad()
def test_capture_branch_beyond_the_bound_fails(no_cuda_stream) -> None:
    model = small_model()
    flat, eager = setup(model, torch.randn(3, 8))
    graph = FakeGraph(lambda leaves: ulps_off(eager(leaves), 1000))
    report = verify(graph, model, flat, branches=["lib.py:1"])
    assert report.status == VerifyStatus.CAPTURE_PATH and not report.passed
    assert report.max_abs > report.bound
    assert "exceeds the rounding bound" in report.detail


class CaptureAware(nn.Module):
    """Takes a slightly different path while a stream is capturing, like transformers' SDPA mask check."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.cuda.is_current_stream_capturing():
            return (x * 3) / 3
        return x * 1.0


@torch.no_grad()
def test_forced_capture_path_reproducing_the_graph_is_named(no_cuda_stream, monkeypatch: pytest.MonkeyPatch) -> None:
    # Without a usable GPU the real query may raise; eager outside a capture is told "not capturing".
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    model = CaptureAware()
    flat, eager = setup(model, torch.randn(1000))

    def replay(leaves):
        with pretend_capturing():
            return eager(leaves)

    assert not identical(eager(flat.leaves), replay(flat.leaves))  # the two paths really differ
    report = verify(FakeGraph(replay), model, flat)
    assert report.status == VerifyStatus.CAPTURE_PATH and report.passed
    assert report.branches == []
    assert "eager forced onto the capture path reproduces the graph bit for bit" in report.detail


class Noisy(nn.Module):
    """Differs from itself run to run by up to ``amount`` (relative), as atomics' summation order does; not a random
    draw, which runs from one generator state repeat exactly."""

    def __init__(self, amount: float) -> None:
        super().__init__()
        self.amount = amount
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        pattern = torch.linspace(0, 1, x.numel()).reshape(x.shape).roll(self.calls)
        return x + pattern * self.amount * x.abs().max()


@torch.no_grad()
def test_eager_noise_within_the_bound_passes(no_cuda_stream) -> None:
    model = Noisy(4 * EPS32)
    flat, eager = setup(model, torch.randn(256))
    report = verify(FakeGraph(eager), model, flat)
    assert report.status == VerifyStatus.EAGER_NOISE and report.passed
    assert "eager run twice" in report.detail
    assert 0 < report.max_abs <= report.bound

    strict = verify(FakeGraph(eager), model, flat, mode="strict")
    assert strict.status == VerifyStatus.EAGER_NOISE and not strict.passed


@torch.no_grad()
def test_eager_noise_beyond_the_bound_fails(no_cuda_stream) -> None:
    model = Noisy(1e-2)
    flat, eager = setup(model, torch.randn(256))
    report = verify(FakeGraph(eager), model, flat)
    assert report.status == VerifyStatus.EAGER_NOISE and not report.passed
    assert "exceeds the rounding bound" in report.detail


@torch.no_grad()
def test_verify_does_not_touch_the_example_inputs() -> None:
    model = small_model()
    x = torch.randn(3, 8)
    before = x.clone()
    flat, eager = setup(model, x)
    verify(FakeGraph(eager), model, flat)
    assert flat.leaves[0] is x and identical(x, before)


def test_status_names_are_the_public_strings() -> None:
    # graph_info()["graphs"][i]["verification"]["status"] and the demo compare against these strings
    assert {VerifyStatus.BIT_IDENTICAL, VerifyStatus.EAGER_NOISE, VerifyStatus.CAPTURE_PATH, VerifyStatus.FAILED} == {
        "bit-identical",
        "eager-noise",
        "capture-path",
        "failed",
    }


class RowLookup(nn.Module):
    """Rows of ``table`` picked by float row ids, as roi_align reads a box's batch index: an id out of range reads
    whatever memory holds (noise here), so eager differs from itself on random probes and nowhere else."""

    def forward(self, table: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        index = rows.long()
        valid = (index >= 0) & (index < table.shape[0]) & (rows == index)
        picked = table[index.clamp(0, table.shape[0] - 1)]
        self.reads = getattr(self, "reads", 0) + 1  # what stray memory holds changes from run to run
        return torch.where(valid[:, None], picked, torch.full_like(picked, 1e3 * self.reads))


def _row_lookup_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(8, 4), torch.randperm(8).float()


@torch.no_grad()
def test_a_model_that_random_probes_do_not_fit_is_verified_on_its_own_inputs(no_cuda_stream) -> None:
    model = RowLookup()
    flat, eager = setup(model, *_row_lookup_inputs())
    report = verify(FakeGraph(eager), model, flat)
    assert report.status == VerifyStatus.BIT_IDENTICAL and report.passed and report.probes_differ
    assert "outside the inputs' domain" in report.detail and "own inputs" in report.detail


@torch.no_grad()
def test_a_stale_graph_still_fails_on_the_models_own_inputs(no_cuda_stream) -> None:
    model = RowLookup()
    flat, eager = setup(model, *_row_lookup_inputs())
    frozen = eager(flat.leaves)

    def stale_on_real_rows(leaves):  # follows random probes (noise and all), freezes real rows
        rows = leaves[1]
        return frozen.clone() if bool((rows == rows.long()).all() & (rows >= 0).all()) else eager(leaves)

    graph = FakeGraph(stale_on_real_rows)
    report = verify(graph, model, flat)
    assert len(graph.seen) == 4  # the second protocol ran, on the model's own rows
    assert (
        not report.passed
        and report.status == VerifyStatus.EAGER_NOISE
        and "exceeds the rounding bound" in report.detail
    )


def test_input_probes_reorder_rows_and_keep_the_rest() -> None:
    table, rows = torch.randn(8, 4), torch.arange(8.0)
    single = torch.randn(1, 3)
    first, second = input_probes([table, rows, single, 2.0], keep=frozenset({0}))
    assert first[0] is table and second[0] is table  # kept: read in place
    assert torch.equal(first[1], rows) and first[1] is not rows
    assert torch.equal(second[1], rows.roll(1, 0)) and torch.equal(second[2], single) and second[3] == 2.0


def test_inputs_read_as_addresses_are_probed_from_the_call_and_the_rest_at_random() -> None:
    """roi_align's boxes carry a batch index as a float: a random one reads out of bounds, on a GPU a fault."""
    image, boxes = torch.zeros(1, 2, 4, 4), torch.tensor([[0.0, 1, 1, 3, 3], [0.0, 0, 0, 2, 2]])
    strided = torch.tensor([[0.0, 0.0], [1.0, 2.0]]).t()
    first, second = make_probes([image, boxes, strided], from_call=frozenset({1, 2}))
    assert not torch.equal(first[0], image) and not torch.equal(second[0], image)  # random, as before
    assert torch.equal(first[1], boxes) and first[1] is not boxes
    assert torch.equal(second[1], boxes.roll(1, 0))  # every row one the model was given, in another order
    assert first[2].stride() == strided.stride() and torch.equal(second[2], strided.roll(1, 0))


class Schedule(nn.Module):
    """A float timestep indexing a noise schedule (diffusers' pattern): a random one is out of range -- on a GPU
    a failed index check that ends the process, on the CPU an IndexError."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("alphas", torch.linspace(1, 0, 8))

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return x * self.alphas[t.long()].view(-1, 1)


@torch.no_grad()
def test_inputs_read_as_addresses_are_probed_from_the_call_so_eager_stays_in_range() -> None:
    model = Schedule()
    flat, eager = setup(model, torch.randn(16, 3), torch.arange(16.0) % 8)
    report = verify(FakeGraph(eager), model, flat)  # random timesteps: eager raises on them (the hazard itself)
    assert report.passed and "eager raised on them: IndexError" in report.detail, report  # proven on the call's own
    report = verify(FakeGraph(eager), model, flat, from_call=frozenset({1}))
    assert report.status == VerifyStatus.BIT_IDENTICAL and report.passed and report.probes_differ  # x is still random
    assert report.as_dict()["inputs_probed_from_the_call"] == [1]


class SplitBySizes(nn.Module):
    """Sizes kept in an integer tensor split a sequence (a deformable-attention detector's feature map shapes): random
    sizes no longer add up to the sequence's length, and eager raises on them."""

    def forward(self, sequence: torch.Tensor, shapes: torch.Tensor) -> torch.Tensor:
        parts = sequence.split([int(h) * int(w) for h, w in shapes.tolist()], dim=1)
        return torch.cat([part.cumsum(1) * (level + 1) for level, part in enumerate(parts)], dim=1)


@torch.no_grad()
def test_integer_sizes_are_probed_from_the_call_and_verify_at_once() -> None:
    model = SplitBySizes()
    shapes = torch.tensor([[4, 5], [2, 3], [1, 2]])
    flat, eager = setup(model, torch.randn(2, 28, 3), shapes)
    report = verify(FakeGraph(eager), model, flat)
    assert report.passed and report.status == VerifyStatus.BIT_IDENTICAL and report.detail == "", report


@torch.no_grad()
def test_probes_eager_raises_on_are_replaced_by_the_calls_own_inputs_and_the_call_is_not_failed() -> None:
    model = SplitBySizes()
    shapes = torch.tensor([[4.0, 5.0], [2.0, 3.0], [1.0, 2.0]])  # sizes kept as floats: drawn at random
    flat, eager = setup(model, torch.randn(2, 28, 3), shapes)
    report = verify(FakeGraph(eager), model, flat)
    assert report.passed and report.status == VerifyStatus.BIT_IDENTICAL, report
    assert "split_with_sizes" in report.detail and "call's own inputs" in report.detail, report.detail
    stale = verify(FakeGraph(lambda leaves: eager(flat.leaves)), model, flat)  # replays what it captured
    assert not stale.passed and stale.status == VerifyStatus.FAILED, stale


@torch.no_grad()
def test_probes_eager_raises_on_everywhere_fail_verification_without_raising() -> None:
    model = SplitBySizes()
    flat, eager = setup(model, torch.randn(1, 28, 3), torch.tensor([[4.0, 7.0]]))
    report = verify(FakeGraph(eager), model, flat)  # one row each: reordered, the call's inputs are the same again
    assert not report.passed and "eager raised on random probes" in report.detail, report


@torch.no_grad()
def test_a_graph_that_raises_where_eager_does_not_fails_verification() -> None:
    model = small_model()
    flat, _ = setup(model, torch.randn(3, 8))

    def broken(leaves):
        raise ValueError("a piece's eager code refused the probe")

    report = verify(FakeGraph(broken), model, flat)
    assert not report.passed and "the graph raised on a probe where eager did not (ValueError" in report.detail


class CountingModel(nn.Module):
    """Counts its forward calls: each one would run the collectives of a sharded forward."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = small_model()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.inner(x)


@torch.no_grad()
@pytest.mark.parametrize("replay_is", ["identical", "off by far", "eager noise"], ids=str)
def test_lockstep_verification_makes_the_same_calls_whatever_it_finds(replay_is: str, no_cuda_stream) -> None:
    """Every rank of a forward with collectives must run it the same number of times, or one rank waits forever."""
    model = CountingModel()
    flat, eager = setup(model, torch.randn(3, 8))
    produce = {
        "identical": eager,
        "off by far": lambda leaves: eager(leaves) + 1.0,
        "eager noise": lambda leaves: ulps_off(eager(leaves), 2),
    }[replay_is]
    counts, graphs = [], []
    for lockstep in (True, False):
        model.calls = 0
        graphs.append(FakeGraph(produce))
        verify(graphs[-1], model, flat, lockstep=lockstep)
        counts.append((model.calls, len(graphs[-1].seen)))
    # two protocols (random probes, the call's own inputs) of 2 eager runs and 2 replays, each probe rerun 3 times;
    # the double's replays call the model too: 2 * (2 + 2 * 3) + 4 calls
    assert counts[0] == (20, 4), counts
    assert counts[1][0] < 16, "without lockstep only the runs a finding calls for are made"


def test_equal_outputs_holding_a_container_never_seen_before_are_identical() -> None:
    """An output class launchless has not looked into yet (a cache on a model's first call) is looked into: two
    equal ones compare by their tensors, not as two distinct objects."""

    @dataclasses.dataclass(eq=False)
    class FirstSeen:
        keys: torch.Tensor
        length: int

    a = {"logits": torch.ones(2), "cache": FirstSeen(torch.arange(3.0), 3)}
    b = {"logits": torch.ones(2), "cache": FirstSeen(torch.arange(3.0), 3)}
    assert identical(a, b) and difference(a, b, 64.0)[0] == 0.0
    assert not identical(a, {"logits": torch.ones(2), "cache": FirstSeen(torch.arange(3.0) + 1, 3)})


class WritesItsInput(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(0.5)
        return x.exp()


class WritingGraph(FakeGraph):
    """A graph of a forward that writes its input: it works on its own static copy and, with ``writes_back``,
    copies the write into the caller's tensor as ``CapturedGraph.write_back`` does."""

    written = (0,)

    def __init__(self, model: nn.Module, *, writes_back: bool) -> None:
        def produce(leaves: list) -> torch.Tensor:
            static = leaves[0].clone()
            out = model(static)
            if writes_back:
                leaves[0].copy_(static)
            return out

        super().__init__(produce)


@torch.no_grad()
def test_a_forward_writing_its_input_is_proven_on_its_writes_as_well_as_its_outputs(no_cuda_stream) -> None:
    model = WritesItsInput()
    x = torch.randn(3, 4)
    flat, _ = setup(model, x)
    before = x.clone()
    report = verify(WritingGraph(model, writes_back=True), model, flat)
    assert report.status == VerifyStatus.BIT_IDENTICAL and report.passed, report
    assert torch.equal(x, before), "verification never writes the call's own tensors"
    missing = verify(WritingGraph(model, writes_back=False), model, flat)
    assert not missing.passed, "a replay that leaves the caller's tensor unwritten differs from eager"
