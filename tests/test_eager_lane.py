"""CPU tests of the eager lane (``launchless.runtime.eager_lane``): a wrapped model refused for good skips the
wrapper's bookkeeping on most calls, and still notices what the bookkeeping is for. On the CPU every signature is
refused for good ("no CUDA device"), which is the lane's case; the lane beside graphs is a ``cuda`` test."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

import launchless as ll
from launchless.runtime import graphed_module
from launchless.runtime.eager_lane import OPEN_AFTER, SAMPLE, EagerLane


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, *, scale: float = 1.0) -> torch.Tensor:
        return self.lin(x).relu() * scale


@pytest.fixture
def full_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many calls took the wrapper's full path (each works out its signature once)."""
    seen: list[int] = []
    signature_of = graphed_module.signature_of

    def counted(flat):  # type: ignore[no-untyped-def]
        seen.append(1)
        return signature_of(flat)

    monkeypatch.setattr(graphed_module, "signature_of", counted)
    return seen


@pytest.mark.parametrize("grad_mode", [torch.no_grad, torch.inference_mode])
def test_a_model_refused_for_good_skips_the_bookkeeping_on_most_calls_and_returns_eagers_results(
    grad_mode, full_calls: list[int]
) -> None:
    torch.manual_seed(0)
    model = Net().eval()
    wrapped = ll.wrap(model)
    calls = 20 * SAMPLE
    with grad_mode():
        for _ in range(calls):
            x = torch.randn(4, 8)  # a fresh input on every call
            assert torch.equal(wrapped(x), model(x))
    lane = wrapped.graph_info()["eager_lane"]
    assert lane["open"] and lane["calls"] == calls - len(full_calls)
    # the streak that opens it, then about one call in SAMPLE
    assert OPEN_AFTER < len(full_calls) < OPEN_AFTER + 3 * calls // SAMPLE
    assert [row["reason"] for row in wrapped.graph_info()["fallbacks"]] == ["no CUDA device"]


@pytest.mark.parametrize("phase", [0, 1])
def test_a_signature_first_seen_while_the_lane_is_open_is_still_found(phase: int) -> None:
    """Calls alternating between two signatures cannot fall into step with the samples: the second signature is
    seen (and refused with its reason) although it only comes once the lane is open, whichever the phase of the
    alternation (a sampler with a period would see one signature only, in one of the two phases)."""
    model = Net().eval()
    wrapped = ll.wrap(model)
    with torch.inference_mode():
        for _ in range(2 * OPEN_AFTER + phase):
            wrapped(torch.randn(4, 8))
        assert wrapped.graph_info()["eager_lane"]["open"]
        for _ in range(20 * SAMPLE):
            for rows in (4, 6):
                x = torch.randn(rows, 8)
                assert torch.equal(wrapped(x), model(x))
    signatures = [row["signature"] for row in wrapped.graph_info()["fallbacks"]]
    assert signatures == ["(float32[4x8]@cpu)", "(float32[6x8]@cpu)"]


def test_calls_in_grad_mode_never_take_the_lane_they_warn_and_are_counted(caplog: pytest.LogCaptureFixture) -> None:
    model = Net().eval()
    wrapped = ll.wrap(model)
    with torch.inference_mode():
        for _ in range(4 * OPEN_AFTER):
            wrapped(torch.randn(4, 8))
    assert wrapped.graph_info()["eager_lane"]["open"]
    with caplog.at_level(logging.WARNING, logger="launchless"):
        for _ in range(3 * SAMPLE):
            wrapped(torch.randn(4, 8))  # grad mode, parameters that require grad: autograd records the call
    (counted,) = wrapped.graph_info()["eager_calls"].values()
    assert counted == 3 * SAMPLE
    assert sum("grad mode is on" in r.getMessage() for r in caplog.records) == 1
    assert wrapped.graph_info()["eager_lane"]["open"]  # the grad-mode calls leave the no-grad streak as it was


def test_a_model_moved_while_the_lane_is_open_is_noticed_at_a_sample() -> None:
    """A model moved (here to float64) runs eager at once -- it is the model's own call -- and the next sampled call
    sees the move: its refusals are forgotten and the new signature is counted, refused and named."""
    model = Net().eval()
    wrapped = ll.wrap(model)
    with torch.inference_mode():
        for _ in range(4 * OPEN_AFTER):
            wrapped(torch.randn(4, 8))
        model.double()
        for _ in range(20 * SAMPLE):
            x = torch.randn(4, 8, dtype=torch.float64)
            assert torch.equal(wrapped(x), model(x))
    assert [row["signature"] for row in wrapped.graph_info()["fallbacks"]] == ["(float64[4x8]@cpu)"]
    assert wrapped.graph_info()["invalidations"] >= 1


def test_the_lane_leaves_the_process_random_state_alone() -> None:
    import random

    random.seed(5)
    expected = [random.random() for _ in range(4)]
    random.seed(5)
    lane = EagerLane()
    for _ in range(OPEN_AFTER):
        lane.eager_for_good(lane.full_call())
    drawn = []
    for _ in range(4):
        lane.bypass()
        drawn.append(random.random())
    assert drawn == expected


def test_a_streak_broken_by_any_other_outcome_closes_the_lane() -> None:
    lane = EagerLane()
    for _ in range(OPEN_AFTER - 1):
        lane.eager_for_good(lane.full_call())
    assert not lane.open and not lane.bypass()
    lane.eager_for_good(lane.full_call())
    assert lane.open
    lane.full_call()  # a call that ended otherwise (captured, waited, replayed)
    assert not lane.open and not lane.bypass()


def test_a_piece_of_a_split_refused_for_good_takes_the_lane_through_its_modules_own_forward() -> None:
    """A split routes a piece's submodule to the piece (an instance ``forward``): the lane must run what eager runs
    for a piece -- the submodule's own forward -- not the submodule's ``__call__``, which comes back to the piece."""
    from launchless.runtime.graphed_module import _make_piece

    model = Net().eval()
    options = {"max_graphs": 8, "warmup": 1, "verify": "on", "tolerance_ulps": 64.0, "address_check": "events"}
    piece = _make_piece(model.lin, options={**options, "memory_pool": "own"})
    model.lin.__dict__["forward"] = piece  # as the split routes it
    try:
        with torch.inference_mode():
            for _ in range(10 * SAMPLE):
                x = torch.randn(4, 8)
                assert torch.equal(model(x), (x @ model.lin.weight.T + model.lin.bias).relu())
    finally:
        del model.lin.__dict__["forward"]
    assert piece.graph_info()["eager_lane"]["calls"] > 0


def test_a_refusal_waiting_to_be_tried_again_keeps_the_lane_shut_so_that_every_call_counts_toward_it(
    full_calls: list[int],
) -> None:
    """An out-of-memory refusal is tried again after 8 calls: while it waits the lane stays shut (the first sample
    sees it), so each call counts toward the retry, which then runs; refused for good again, the lane reopens."""
    from launchless.core.cache import RETRY_FIRST, Refusal
    from launchless.core.signature import flatten_inputs, signature_of
    from launchless.core.status import Stage

    model = Net().eval()
    wrapped = ll.wrap(model)
    x = torch.randn(4, 8)
    with torch.inference_mode():
        for _ in range(4 * OPEN_AFTER):
            wrapped(x)
        assert wrapped.graph_info()["eager_lane"]["open"]
        sig = signature_of(flatten_inputs((x,), {}))
        wrapped._cache.refuse(sig, Refusal(Stage.CAPTURE, "out of memory", transient=True))
        before = len(full_calls)
        for _ in range(20 * SAMPLE):  # until a sample takes the full path: it sees the retry waiting
            wrapped(x)
            if len(full_calls) > before:
                break
        assert len(full_calls) == before + 1 and not wrapped.graph_info()["eager_lane"]["open"]
        for _ in range(RETRY_FIRST - 1):  # the sampled call counted one
            wrapped(x)
            assert not wrapped.graph_info()["eager_lane"]["open"]
        assert wrapped.graph_info()["fallbacks"][0]["reason"] == "no CUDA device"  # tried again, refused for good
        for _ in range(OPEN_AFTER):
            wrapped(x)
        assert wrapped.graph_info()["eager_lane"]["open"]


def test_a_model_with_a_signature_running_split_never_opens_the_lane(monkeypatch: pytest.MonkeyPatch) -> None:
    """A signature that runs split must be routed through its pieces on every call: while any does, another
    signature refused for good does not open the lane (its calls could not be told apart without the full path)."""
    model = Net().eval()
    wrapped = ll.wrap(model)
    monkeypatch.setattr(wrapped._model_split, "runs_any", lambda: True)
    with torch.inference_mode():
        for _ in range(4 * OPEN_AFTER):
            wrapped(torch.randn(4, 8))
    assert not wrapped.graph_info()["eager_lane"]["open"]
    monkeypatch.undo()
    with torch.inference_mode():
        for _ in range(OPEN_AFTER):
            wrapped(torch.randn(4, 8))
    assert wrapped.graph_info()["eager_lane"]["open"]
