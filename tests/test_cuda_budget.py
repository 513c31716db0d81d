"""GPU test of the memory budget across two wrapped models: graphs over it are evicted least recently used first,
across the models, and the calls stay equal to eager."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import launchless as ll
from launchless.core.verify import identical

pytestmark = pytest.mark.cuda


def _mlp(width: int) -> nn.Module:
    torch.manual_seed(width)
    return nn.Sequential(*(nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(6))).cuda().eval()


def test_two_models_share_one_budget_least_recently_used_first() -> None:
    first, second = _mlp(256), _mlp(512)
    a, b = ll.wrap(first, capture_after=1), ll.wrap(second, capture_after=1)
    try:
        with torch.no_grad():
            for rows in (1, 2, 4):  # three graphs per model, no budget yet
                xa, xb = torch.randn(rows, 256, device="cuda"), torch.randn(rows, 512, device="cuda")
                assert identical(a(xa), first(xa)) and identical(b(xb), second(xb))
            held = ll.memory_budget()
            per_model = held["by_model"]
            assert len(a.graph_info()["graphs"]) == 3 and len(b.graph_info()["graphs"]) == 3, held
            ll.set_memory_budget(held["held_bytes"] // 2)  # about half of what is held must go
            after = ll.memory_budget()
            assert after["held_bytes"] <= held["held_bytes"] // 2, (held, after)
            assert len(a.graph_info()["graphs"]) + len(b.graph_info()["graphs"]) < 6
            assert per_model  # each model's share was reported
            for rows in (1, 2, 4):  # evicted graphs are captured again as needed, under the budget
                xa = torch.randn(rows, 256, device="cuda")
                assert identical(a(xa), first(xa))
            assert ll.memory_budget()["held_bytes"] <= held["held_bytes"] // 2 or len(a.graph_info()["graphs"]) == 1
    finally:
        ll.set_memory_budget(None)


def test_doctor_says_what_the_wrapped_models_graphs_hold(capsys) -> None:
    pytest.importorskip("timm")
    from launchless.apps import cli

    assert cli.main(["doctor", "--model", "timm:resnet18"]) == 0
    said = capsys.readouterr().out
    assert "launchless.wrap(model) ('auto'): whole graph; its graphs hold" in said, said
    assert "(no memory budget set)" in said
