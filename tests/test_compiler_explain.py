"""CPU tests of launchless.explain and `launchless doctor` (the GPU side is in test_cuda_compiler.py)."""

from __future__ import annotations

import torch
from torch import nn

import launchless as ll
from launchless.apps import cli
from launchless.compiler import backend as _backend
from launchless.compiler import explain as _explain


class _Breaks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x).relu()
        torch._dynamo.graph_break()
        return self.b(y)


def test_explain_reports_each_graph_of_a_model(monkeypatch) -> None:
    original = _backend.make_backend
    monkeypatch.setattr(_backend, "make_backend", lambda **kw: original(lambda gm, ex: gm.forward, **kw))
    explanation = ll.explain(_Breaks(), torch.randn(3, 4))
    assert [g.name for g in explanation.graphs] == ["graph 1", "graph 2"]  # the graph break splits it
    assert all(g.info is None and "without a CUDA graph" in g.note for g in explanation.graphs)  # CPU inputs
    assert all(g.nodes >= 1 and g.blockers == [] for g in explanation.graphs)
    text = str(explanation)
    assert "graph 1" in text and "graph 2" in text and "launchless explain" in text


def test_aten_diagnosis_names_the_host_sync_of_a_dynamo_graph() -> None:
    seen = []

    def record(gm, example_inputs):
        seen.append((gm, list(example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    torch._dynamo.config.capture_scalar_outputs = True
    try:

        def fn(x: torch.Tensor) -> torch.Tensor:
            return x * x.sum().item()

        torch.compile(fn, backend=record)(torch.randn(3))
    finally:
        torch._dynamo.config.capture_scalar_outputs = False
    blockers = _explain._aten_blockers(*seen[0])
    assert any("host sync" in b for b in blockers), blockers


def test_doctor_without_cuda_says_so_and_clears_the_cache(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("LAUNCHLESS_CACHE_DIR", str(tmp_path))
    (tmp_path / "x.json").write_text("{}")
    assert cli.main(["doctor", "--clear-cache"]) == 0
    assert "removed 1 cached decision(s)" in capsys.readouterr().out and not list(tmp_path.iterdir())
    if not torch.cuda.is_available():
        assert cli.main(["doctor", "--model", "timm:resnet18"]) == 2
        assert "no CUDA device here" in capsys.readouterr().out


def test_coverage_counts_only_the_graphs_that_replays_run(monkeypatch) -> None:
    from types import SimpleNamespace

    def entry(variant: str, kernels: int | None) -> SimpleNamespace:
        return SimpleNamespace(decision=SimpleNamespace(variant=variant), kernels=kernels)

    monkeypatch.setattr(_explain, "_kernel_nodes", lambda e: e.kernels)
    assert _explain.kernels_in_graphs([entry("graph", 40), entry("graph+pi", 42)]) == 42
    assert _explain.kernels_in_graphs([entry("no-graph", 40)]) == 0  # measured slower as a graph: runs outside
    assert _explain.kernels_in_graphs([entry("graph", None), entry("graph", 5)]) is None  # not countable: no figure
    explanation = _explain.Explanation(
        [_explain.GraphReport("graph 1", 9, [], {"graphs": [{}]}, kernels=0)], kernels_per_call=50
    )
    assert explanation.coverage == 0.0


def test_the_variant_column_says_when_a_graph_has_more_shapes_than_max_graphs() -> None:
    from launchless.compiler.explain import _variants

    graph = {"variant": "graph", "times_ms": {}, "indirection": "verified", "bytes_copied_per_replay": 64}
    info = {"graphs": [graph, graph], "calls_over_max_graphs": None}
    assert "max_graphs" not in _variants(info)[0]
    info["calls_over_max_graphs"] = 40
    assert _variants(info)[0].splitlines()[-1] == "more shapes than max_graphs: 40 calls without a graph"


def test_the_variant_column_names_a_chain_and_what_runs_eager_between_its_graphs() -> None:
    """A chain around an operation run eager says so in place of pointer indirection's verdict (it has none)."""
    from launchless.compiler.explain import _variants

    region = {"graphs": 3, "eager_ops": [{"op": "lib::grouped_mm"}] * 2, "reason": "lib::grouped_mm", "source": None}
    graph = {
        "variant": "graph",
        "times_ms": {"no-graph": 2.0, "graph": 1.0},
        "indirection": "a chain of graphs around operations run eager",
        "bytes_copied_per_replay": 64,
        "region_split": region,
    }
    lines = _variants({"graphs": [graph], "calls_over_max_graphs": None})[0].splitlines()
    assert lines == ["graph (no-graph 2.000, graph 1.000)", "3 graphs, lib::grouped_mm run eager between them"]
