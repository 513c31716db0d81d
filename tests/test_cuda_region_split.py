"""GPU tests of region splits: a forward that cannot be captured because one operation syncs inside its own kernel
code (``torch.histc`` without a range, ``torch._grouped_mm`` on float32) replays as graphs with that operation run
eager between them -- verified against eager, timed, and dropped when not faster. A value read on the host
(``.item()``, ``bool(t)``) is run between graphs too, read again at every replay and checked against the captured
value; an operation whose shape follows the values (``nonzero``) or a host copy never is."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

import launchless as ll
from launchless.core.verify import identical
from launchless.runtime import capture_flow
from launchless.timing import SpeedVerdict

pytestmark = pytest.mark.cuda

GRAD_MODES = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}


class Layers(nn.Module):
    """Small layers: launch-bound at batch 1, where graphs pay off."""

    def __init__(self, width: int = 64, depth: int = 12) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + torch.tanh(layer(x))
        return x


class Between(nn.Module):
    """Layers, the operation under test (``middle``), layers."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.before, self.after = Layers(), Layers()

    def middle(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.after(self.middle(self.before(x)))


class Histogram(Between):
    """``torch.histc`` without a range reads the data's minimum and maximum on the host, inside its kernel code."""

    def middle(self, x: torch.Tensor) -> torch.Tensor:
        counts = torch.histc(x, bins=64)  # depends on the values: a different input, different counts
        return x + counts.view(1, -1) / x.numel()


def _rows(m) -> list[dict]:
    return m.graph_info()["graphs"]


@pytest.mark.parametrize("grad_mode", list(GRAD_MODES))
def test_an_operation_that_syncs_inside_runs_eager_between_two_verified_graphs(grad_mode, caplog) -> None:
    model = Histogram().cuda().eval()
    m = ll.wrap(model, cuda_graph="auto", capture_after=1)
    inputs = [torch.randn(1, 64, device="cuda") * (i + 1) for i in range(4)]
    with GRAD_MODES[grad_mode](), caplog.at_level(logging.INFO, logger="launchless"):
        for x in inputs:
            assert identical(m(x), model(x))  # the counts follow the input: the junction is not frozen
        made_in_mode = torch.randn(1, 64, device="cuda")
    with torch.no_grad():
        assert identical(m(made_in_mode), model(made_in_mode))
    (row,) = _rows(m)
    region = row["region_split"]
    assert region["graphs"] == 2 and [j["op"] for j in region["eager_ops"]] == ["aten::histc"], region
    assert "test_cuda_region_split.py" in region["eager_ops"][0]["source"], region
    assert row["verification"]["status"] == "bit-identical" and row["replays"] >= 4, row
    assert region["speedup"] > 1.03, region
    assert m.graph_info()["split"] is None, "no split by submodule was needed"
    lines = [r.getMessage() for r in caplog.records if "cannot be captured as one graph" in r.getMessage()]
    assert len(lines) == 1 and "aten::histc" in lines[0] and "verified against eager" in lines[0], lines


def test_junctions_in_a_row_and_at_the_end_of_the_forward() -> None:
    class Ends(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = Layers()

        def forward(self, x):
            y = self.body(x)
            twice = torch.histc(torch.histc(y, bins=32), bins=8)  # no kernel between the two: an empty graph
            return y.sum() + twice, torch.histc(y, bins=16)  # the last operation is a junction

    model = Ends().cuda().eval()
    m = ll.wrap(model, cuda_graph="auto", capture_after=1)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(1, 64, device="cuda")
            assert identical(m(x), model(x))
    (row,) = _rows(m)
    assert len(row["region_split"]["eager_ops"]) == 3, row


def test_grouped_mm_in_float32_runs_eager_between_graphs() -> None:
    class Experts(nn.Module):  # the experts of a mixture-of-experts layer, tokens sorted by expert
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.pre, self.post = Layers(32), Layers(48)
            self.weight = nn.Parameter(torch.randn(4, 32, 48) / 8)
            self.register_buffer("offs", torch.tensor([2, 5, 5, 8], dtype=torch.int32))

        def forward(self, x):
            return self.post(torch._grouped_mm(self.pre(x), self.weight, offs=self.offs))

    model = Experts().cuda().eval()
    m = ll.wrap(model, cuda_graph="auto", capture_after=1)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(8, 32, device="cuda")
            assert identical(m(x), model(x))
    (row,) = _rows(m)
    if "region_split" not in row:
        pytest.skip("this build captures torch._grouped_mm on float32 whole")
    assert [j["op"] for j in row["region_split"]["eager_ops"]] == ["aten::_grouped_mm"], row


@pytest.mark.parametrize(
    "blocker",
    [
        lambda x: x + x[x > 0].sum(),  # masked_select: a shape from the values
        lambda x: x + x.cpu().mean().to(x.device),  # a host copy
    ],
    ids=["masked-select", "cpu-copy"],
)
def test_an_operation_whose_shape_or_host_copy_reaches_the_host_never_runs_between_graphs(blocker) -> None:
    class Blocked(Between):
        def middle(self, x):
            return blocker(x)

    model = Blocked().cuda().eval()
    m = ll.wrap(model, cuda_graph="auto", capture_after=1)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(1, 64, device="cuda")
            assert identical(m(x), model(x))
    assert all("region_split" not in row for row in _rows(m)), _rows(m)
    split = m.graph_info()["split"]
    assert split is not None and {p["module"] for p in split["pieces"]} == {"before", "after"}, split


class Asserted(Between):
    """XLM's pattern: a count read on the host for an assertion, the same value for every call of one shape."""

    def middle(self, x: torch.Tensor) -> torch.Tensor:
        assert torch.isfinite(x).sum().item() == x.numel()
        return x


READ_OP = "aten::_local_scalar_dense"  # .item(), named alike in both grad modes


@pytest.mark.parametrize("grad_mode", list(GRAD_MODES))
def test_a_value_read_on_the_host_runs_between_two_graphs_and_is_checked_at_every_replay(grad_mode, caplog) -> None:
    model = Asserted().cuda().eval()
    m = ll.wrap(model, cuda_graph="auto", capture_after=1)
    with GRAD_MODES[grad_mode](), caplog.at_level(logging.INFO, logger="launchless"):
        for i in range(5):
            x = torch.randn(1, 64, device="cuda") * (i + 1)
            assert identical(m(x), model(x)), f"call {i}"
    (row,) = _rows(m)
    region = row["region_split"]
    (read,) = region["eager_ops"]
    assert region["graphs"] == 2 and read["op"] == READ_OP and read["value_read"] == 64, region
    assert "test_cuda_region_split.py" in read["source"], read
    assert row["verification"]["status"] == "bit-identical" and row["replays"] >= 5, row
    assert m.graph_info()["split"] is None, "no split by submodule was needed"
    lines = [r.getMessage() for r in caplog.records if "cannot be captured as one graph" in r.getMessage()]
    assert len(lines) == 1 and "read again at every replay" in lines[0], lines


class Branching(Between):
    """A branch on a value read on the host: taken by no call until one brings a huge value."""

    def middle(self, x: torch.Tensor) -> torch.Tensor:
        if bool((x.abs() > 1e4).any()):
            return x.clamp(-1e4, 1e4) * 2
        return x


@pytest.mark.parametrize("grad_mode", list(GRAD_MODES))
def test_a_value_read_that_changes_at_a_replay_drops_the_graphs_and_the_call_is_eagers(grad_mode, caplog) -> None:
    model = Branching().cuda().eval()
    m = ll.wrap(model, cuda_graph="auto", capture_after=1)
    with GRAD_MODES[grad_mode](), caplog.at_level(logging.INFO, logger="launchless"):
        for i in range(3):
            x = torch.randn(1, 64, device="cuda")
            assert identical(m(x), model(x)), f"call {i}"
        assert "region_split" in _rows(m)[0], _rows(m)
        huge = torch.randn(1, 64, device="cuda")
        huge[0, 0] = 1e6  # the read says True now: eager would take the branch
        assert identical(m(huge), model(huge))
        for i in range(3):
            x = torch.randn(1, 64, device="cuda")
            assert identical(m(x), model(x)), f"call {i} after the change"
    assert _rows(m) == [], "the graphs after the read are dropped"
    (refused,) = m.graph_info()["fallbacks"]
    assert "another value than at its capture" in refused["reason"], refused
    lines = [r.getMessage() for r in caplog.records if "read True on replay, False when captured" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in caplog.records]


class NoisyBranching(Branching):
    """Noise drawn by the graph before the read: a replay stopped at the read must leave the generator as it found
    it, for the call's eager run to draw what eager draws."""

    def middle(self, x: torch.Tensor) -> torch.Tensor:
        return super().middle(x + 0.01 * torch.randn_like(x))


def _seeded(fn, x: torch.Tensor, seed: int) -> tuple[object, torch.Tensor]:
    torch.manual_seed(seed)
    return fn(x), torch.cuda.get_rng_state()


@pytest.mark.parametrize("grad_mode", list(GRAD_MODES))
def test_a_replay_stopped_at_a_changed_read_leaves_eagers_draws(grad_mode) -> None:
    model = NoisyBranching().cuda().eval()
    m = ll.wrap(model, cuda_graph="auto", capture_after=1)
    with GRAD_MODES[grad_mode]():
        inputs = [torch.randn(1, 64, device="cuda") for _ in range(4)]
        inputs[3][0, 0] = 1e6  # the read says True at the fourth call: the chain stops there
        for i, x in enumerate(inputs):
            want, eager_state = _seeded(model, x, 10 + i)
            got, state = _seeded(m, x, 10 + i)
            assert identical(got, want), f"call {i}: other draws than eager's"
            assert torch.equal(state, eager_state), f"call {i}: the generator left elsewhere"
            if i == 2:
                assert "region_split" in _rows(m)[0], _rows(m)
    assert _rows(m) == [], "the chain went at the changed read"


@pytest.mark.parametrize("grad_mode", list(GRAD_MODES))
def test_xlms_length_assertions_run_between_graphs_on_fresh_token_ids(grad_mode) -> None:
    """transformers' XLM reads the longest length on the host (``assert lengths.max().item() <= slen``; again in
    its mask code where no attention mask is given): its forward replays as graphs around the reads, token ids
    fresh at every call."""
    pytest.importorskip("transformers")
    from launchless.apps.differential.candidate import Library
    from launchless.apps.differential.population import candidates, pick

    (candidate,) = pick(candidates(Library.TRANSFORMERS_CAUSAL), ["xlm"])
    built = candidate.build("cpu")
    model = built.model.cuda().eval()
    m = ll.wrap(model, cuda_graph="auto", capture_after=1)
    with GRAD_MODES[grad_mode]():
        for i in range(6):
            args, kwargs = built.make_inputs(torch.Generator().manual_seed(i), "cuda")
            assert identical(m(*args, **kwargs), model(*args, **kwargs)), f"call {i}"
    (row,) = _rows(m)
    reads = row["region_split"]["eager_ops"]
    assert reads and {r["op"] for r in reads} == {READ_OP}, row
    assert row["region_split"]["graphs"] == len(reads) + 1, row
    assert all("modeling_xlm.py" in r["source"] for r in reads), reads


def _judged_slower(monkeypatch) -> None:
    """Every chain is judged not faster than eager (its runs still made, as the real judge makes them)."""

    def slower(eager, candidate):
        eager(), candidate()
        return SpeedVerdict(1.0, 1.1, 1.0, 1.1, "not faster than eager (1.100 ms against 1.000 ms a call)")

    monkeypatch.setattr(capture_flow, "judge_speed", slower)


def test_a_region_split_that_is_not_faster_is_dropped_with_the_reason(monkeypatch) -> None:
    _judged_slower(monkeypatch)
    model = Histogram().cuda().eval()
    m = ll.wrap(model, cuda_graph="auto", capture_after=1)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(1, 64, device="cuda")
            assert identical(m(x), model(x))
    assert all("region_split" not in row for row in _rows(m))
    (refused,) = m.graph_info()["fallbacks"]
    assert "Graphs around aten::histc" in refused["message"], refused
    assert "tried and dropped: not faster than eager" in refused["message"], refused


@pytest.mark.parametrize("grad_mode", list(GRAD_MODES))
def test_a_dropped_chain_of_a_forward_that_draws_noise_leaves_eagers_draws(grad_mode, monkeypatch) -> None:
    """A chain judged not faster is refused; naming its blocker captures the forward again, whose warm-up draws:
    the call's own eager result must still draw from where the call began, and leave the generator where eager
    leaves it."""

    _judged_slower(monkeypatch)
    model = NoisyBranching().cuda().eval()
    m = ll.wrap(model, cuda_graph="auto", capture_after=1)
    with GRAD_MODES[grad_mode]():
        for i in range(4):
            x = torch.randn(1, 64, device="cuda")
            want, eager_state = _seeded(model, x, 10 + i)
            got, state = _seeded(m, x, 10 + i)
            assert identical(got, want), f"call {i}: other draws than eager's"
            assert torch.equal(state, eager_state), f"call {i}: the generator left elsewhere"
    assert all("region_split" not in row for row in _rows(m)), _rows(m)
    assert any("tried and dropped" in row["message"] for row in m.graph_info()["fallbacks"]), m.graph_info()


def test_capture_graph_does_not_run_operations_between_graphs_but_names_them() -> None:
    model = Histogram().cuda().eval()
    m = ll.wrap(model, cuda_graph=True)
    with torch.no_grad(), pytest.raises(ll.CaptureError) as caught:
        m.capture_graph(torch.randn(1, 64, device="cuda"))
    message = str(caught.value)
    assert "A call replays it as 2 graphs with aten::histc run eager between them" in message, message
    assert m.graph_info()["graphs"] == [], "the chain the note names was released"


@pytest.mark.parametrize("grad_mode", list(GRAD_MODES))
def test_cuda_graph_true_replays_graphs_between_operations_from_the_first_call(grad_mode) -> None:
    """True graphs at first sight: a forward one operation keeps from being one graph replays as the chain "auto"
    would keep, from its first call, a fresh input each call."""
    model = Histogram().cuda().eval()
    m = ll.wrap(model, cuda_graph=True)
    with GRAD_MODES[grad_mode]():
        for i in range(4):
            x = torch.randn(1, 64, device="cuda") * (i + 1)
            assert identical(m(x), model(x)), f"call {i}"
    (row,) = _rows(m)
    assert row["region_split"]["eager_ops"][0]["op"] == "aten::histc" and row["replays"] >= 4, row


def test_cuda_graph_true_raises_where_neither_the_chain_nor_a_split_is_faster(monkeypatch) -> None:
    """Neither the chain nor the split by submodule faster than eager: True raises, naming both as tried."""
    from launchless.runtime import split

    def slower(eager, candidate, **_):
        eager(), candidate()
        return SpeedVerdict(1.0, 1.1, 1.0, 1.1, "not faster than eager (1.100 ms against 1.000 ms a call)")

    monkeypatch.setattr(capture_flow, "judge_speed", slower)
    monkeypatch.setattr(split, "judge_speed", slower)
    model = Histogram().cuda().eval()
    m = ll.wrap(model, cuda_graph=True)
    with torch.no_grad(), pytest.raises(ll.CaptureError) as caught:
        m(torch.randn(1, 64, device="cuda"))
    message = str(caught.value)
    assert "Graphs around aten::histc" in message and "split by submodule was tried and dropped" in message, message
    assert m.graph_info()["graphs"] == []


def test_a_region_split_follows_new_weights_and_a_moved_model() -> None:
    model = Histogram().cuda().eval()
    m = ll.wrap(model, cuda_graph="auto", capture_after=1)
    x = torch.randn(1, 64, device="cuda")
    with torch.no_grad():
        m(x), m(x)
        fresh = Histogram()
        fresh.before.layers[0].weight.data.mul_(3)
        model.load_state_dict(fresh.state_dict())
        assert identical(m(x), model(x))
        model.to(torch.float64)
        x64 = x.double()
        assert identical(m(x64), model(x64))
