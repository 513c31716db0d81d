"""GPU tests of graph memory across models: graphs over the memory budget are evicted least recently used first,
across the models, and the calls stay equal to eager; models wrapped with memory_pool="shared" hold less together
than apart and replay exactly when they take turns on two streams."""

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


def test_models_in_one_shared_pool_hold_less_and_replay_exactly_from_two_streams() -> None:
    torch.manual_seed(0)
    models = [
        torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda().eval()
        for _ in range(3)
    ]
    x = torch.randn(256, 1024, device="cuda")

    def captured(memory_pool: str) -> list:
        wrapped = [ll.wrap(m, cuda_graph=True, memory_pool=memory_pool) for m in models]
        with torch.no_grad():
            for w in wrapped:
                w(x)
        torch.cuda.synchronize()
        return wrapped

    apart = captured("own")
    apart_bytes = sum(w.graph_info()["pool_bytes"] for w in apart)
    for w in apart:
        w.release_graphs()
    shared = captured("shared")
    shared_bytes = shared[0].graph_info()["pool_bytes"]  # the whole pool: every model's graphs
    assert shared[0].graph_info()["memory_pool"] == "shared"
    assert 0 < shared_bytes < apart_bytes, (shared_bytes, apart_bytes)  # intermediates reused across models
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    with torch.no_grad():
        references = [m(x) for m in models]
        outputs = []
        for i in range(30):  # the models take turns on two streams: each replay waits for the last one
            stream = streams[i % 2]
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                outputs.append(shared[i % 3](x))
        torch.cuda.synchronize()
    assert all(torch.equal(out, references[i % 3]) for i, out in enumerate(outputs))
