"""GPU behaviour of graphed_step (issue: training capture). Run with ``python -m pytest -m cuda``."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import launchless as ll
from launchless.verify import identical

pytestmark = pytest.mark.cuda


def _pair(build, opt_factory, *, step_body=None):
    """Two identical (model, optimizer, step) triples: one to graph, one as the eager reference."""
    out = []
    torch.manual_seed(0)
    base = build().cuda().train()
    for _ in range(2):
        model = copy.deepcopy(base)
        opt = opt_factory(model)

        def step(x, y, model=model, opt=opt):
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss

        out.append((model, opt, step_body(model, opt) if step_body else step))
    return out


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(32, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 10))


def _batch(n: int = 16):
    return torch.randn(n, 32, device="cuda"), torch.randint(0, 10, (n,), device="cuda")


@pytest.mark.parametrize(
    "opt_factory",
    [
        lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4),
        lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3),
        lambda m: torch.optim.Adam(m.parameters(), lr=1e-3, foreach=True),
    ],
    ids=["sgd-nesterov", "adamw", "adam-foreach"],
)
def test_whole_step_replays_and_tracks_eager(opt_factory) -> None:
    (gm, gopt, gstep), (em, _eopt, estep) = _pair(_mlp, opt_factory)
    graphed = ll.graphed_step(gstep, model=gm, optimizer=gopt)
    x, y = _batch()
    for i in range(8):
        torch.manual_seed(i)
        lg = graphed(x, y)
        torch.manual_seed(i)
        le = estep(x, y)
        assert torch.allclose(lg, le, rtol=1e-5, atol=1e-6), (i, float(lg), float(le))
    info = graphed.graph_info()
    print(info)
    assert info["level"] == "whole-step graph" and info["graphs"][0]["replays"] >= 5
    assert info["graphs"][0]["verification"]["passed"]
    for a, b in zip(gm.state_dict().values(), em.state_dict().values(), strict=True):
        assert torch.allclose(a.float(), b.float(), rtol=1e-4, atol=1e-5)  # BN stats and num_batches_tracked too


def test_scheduler_inside_the_step_keeps_stepping() -> None:
    def body(model, opt):
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)

        def step(x, y):
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            sched.step()
            return loss

        return step

    (gm, gopt, gstep), _ = _pair(_mlp, lambda m: torch.optim.SGD(m.parameters(), lr=0.1), step_body=body)
    graphed = ll.graphed_step(gstep, model=gm, optimizer=gopt)
    x, y = _batch()
    for _ in range(6):
        graphed(x, y)
    assert graphed.graph_info()["level"] == "whole-step graph"
    assert float(gopt.param_groups[0]["lr"]) == pytest.approx(0.1 * 0.5**6)
    before = gm[0].weight.detach().clone()
    graphed(x, y)  # a replay must use the current (tiny) lr: the step moves the weights by little
    moved = (gm[0].weight - before).abs().max().item()
    assert 0 < moved < 1e-2


def test_item_in_the_step_falls_back_with_one_line(caplog: pytest.LogCaptureFixture) -> None:
    def body(model, opt):
        def step(x, y):
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            print_value = loss.item()  # the host sync under test
            return torch.tensor(print_value)

        return step

    (gm, gopt, gstep), _ = _pair(_mlp, lambda m: torch.optim.SGD(m.parameters(), lr=0.1), step_body=body)
    graphed = ll.graphed_step(gstep, model=gm, optimizer=gopt)
    x, y = _batch()
    with caplog.at_level(logging.INFO, logger="launchless"):
        for _ in range(6):
            graphed(x, y)
    lines = [r.getMessage() for r in caplog.records if "runs eager" in r.getMessage()]
    assert len(lines) == 1 and "test_cuda_train.py" in lines[0], lines
    assert graphed.graph_info()["fallbacks"]


def test_set_to_none_between_steps_keeps_static_grads() -> None:
    (gm, gopt, gstep), (em, _eopt, estep) = _pair(_mlp, lambda m: torch.optim.SGD(m.parameters(), lr=0.1))
    graphed = ll.graphed_step(gstep, model=gm, optimizer=gopt)
    x, y = _batch()
    for i in range(6):
        torch.manual_seed(i)
        graphed(x, y)
        gopt.zero_grad(set_to_none=True)  # user code outside the step
        torch.manual_seed(i)
        estep(x, y)
    assert all(p.grad is not None for p in gm.parameters())
    assert identical(list(gm.parameters()), list(em.parameters())) or all(
        torch.allclose(a, b, atol=1e-5) for a, b in zip(gm.parameters(), em.parameters(), strict=True)
    )
