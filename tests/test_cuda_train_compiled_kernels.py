"""``graphed_step(..., kernels="compiled")`` on the GPU: the step graph from the third step, Inductor's forward and
backward compiled beside the steps in a child process, and the step graph over them swapped in between two steps
once as accurate as eager against float64 and faster; fresh batches every step, a checkpoint resumed while
compiling, and a forward that draws random numbers keeping eager's kernels with the reason."""

from __future__ import annotations

import copy
import logging
import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import launchless as ll
from launchless.core.accuracy import (
    allowed_float32_precision,
    as_accurate_as_eager,
    channels_last_copy,
    float64_copy,
)

pytestmark = pytest.mark.cuda
COMPILE_S = 300


class Blocks(nn.Module):
    """Launch-bound: small convolutions, norms and activations that Inductor fuses, forward and backward."""

    def __init__(self, width: int = 32, depth: int = 4, dropout: float = 0.0) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, width, 3, padding=1)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Conv2d(width, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU()) for _ in range(depth)
        )
        self.drop = nn.Dropout(dropout) if dropout else nn.Identity()
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = x + block(x) * 0.5
        return self.head(self.drop(x.mean((2, 3))))


def _batch(generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(8, 3, 16, 16, generator=generator)
    return x.cuda(), torch.randint(0, 10, (8,), generator=generator).cuda()


def _step_of(model: nn.Module, opt: torch.optim.Optimizer):
    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return step


def _loss_and_gradients(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, list]:
    """One eager forward and backward of ``model`` (a copy, in training mode): the loss and the gradients."""
    model.zero_grad(set_to_none=True)  # a copy carries the gradients of what it copied
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    return loss.detach(), [p.grad for p in model.parameters()]


def _until_decided(step: ll.GraphedStep, call) -> dict:
    deadline = time.monotonic() + COMPILE_S
    while time.monotonic() < deadline:
        call()
        rows = step.graph_info()["compiled_kernels"]
        if rows and rows[0]["kernels"] != "compiling":
            return rows[0]
        time.sleep(0.05)
    raise AssertionError(f"not decided within {COMPILE_S} s: {step.graph_info()['compiled_kernels']}")


@pytest.mark.parametrize(
    "optimizer",
    [
        lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9),
        lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3),
    ],
    ids=["sgd-momentum", "adamw"],
)
def test_the_step_over_compiled_kernels_swaps_in_and_trains_as_eager_does(optimizer, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("LAUNCHLESS_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    model = Blocks().cuda().train()
    opt = optimizer(model)
    graphed = ll.graphed_step(_step_of(model, opt), model=model, optimizer=opt, kernels="compiled")
    generator = torch.Generator().manual_seed(1)
    with caplog.at_level(logging.INFO, logger="launchless"):
        for _ in range(4):  # the eager-kernel step graph from the third step
            graphed(*_batch(generator))
        assert graphed.graph_info()["level"] == "whole-step graph"
        assert graphed.graph_info()["compiled_kernels"][0]["kernels"] == "compiling"
        row = _until_decided(graphed, lambda: graphed(*_batch(generator)))
    assert row["kernels"] == "compiled", row["reason"]
    assert row["accuracy"]["passed"] and row["speed"]["speedup"] > 1.0
    assert set(row["proof_phases"]) == {"read", "capture", "accuracy", "speed"}, row["proof_phases"]
    assert [r for r in caplog.records if "replays Inductor's compiled forward and backward" in r.message]
    # fresh batches through the compiled step graph: each step's loss and the gradients it leaves as accurate as
    # eager's against float64 from the same state (fused kernels round otherwise, and a convolution laid out
    # channels-last by Inductor rounds as eager's channels-last layout does, to TF32)
    precision = allowed_float32_precision(model)
    for _ in range(5):
        x, y = _batch(generator)
        before = copy.deepcopy(model)
        got = graphed(x, y).detach().clone(), [p.grad.clone() for p in model.parameters()]
        want, exact = _loss_and_gradients(before, x, y), _loss_and_gradients(float64_copy(before), x.double(), y)
        laid_out = channels_last_copy(before)
        other = _loss_and_gradients(laid_out, x, y) if laid_out is not None else None
        report = as_accurate_as_eager(want, got, exact, float32_precision=precision, eager_other_layout=other)
        assert report.passed, report.detail
    assert len(graphed.graph_info()["graphs"]) == 1


def test_a_checkpoint_resumed_while_compiling_cancels_it_and_a_dropout_forward_keeps_eager_kernels(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("LAUNCHLESS_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    model = Blocks(width=16, depth=2).cuda().train()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    graphed = ll.graphed_step(_step_of(model, opt), model=model, optimizer=opt, kernels="compiled")
    generator = torch.Generator().manual_seed(2)
    for _ in range(3):
        graphed(*_batch(generator))
    assert graphed.graph_info()["compiled_kernels"][0]["kernels"] == "compiling"
    opt.load_state_dict(copy.deepcopy(opt.state_dict()))  # a resumed checkpoint: new state, graphs and compile go
    graphed(*_batch(generator))
    assert graphed.graph_info()["compiled_kernels"] == []  # cancelled with the graphs
    row = _until_decided(graphed, lambda: graphed(*_batch(generator)))
    assert row["kernels"] == "compiled", row["reason"]

    dropping = Blocks(width=16, depth=2, dropout=0.1).cuda().train()
    opt = torch.optim.SGD(dropping.parameters(), lr=0.05)
    graphed = ll.graphed_step(_step_of(dropping, opt), model=dropping, optimizer=opt, kernels="compiled")
    row = _until_decided(graphed, lambda: graphed(*_batch(generator)))
    assert row["kernels"] == "eager" and "draws random numbers" in row["reason"], row
