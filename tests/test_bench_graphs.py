"""CPU tests for the bench's summary of what the launchless backend did with a workload's graphs."""

from __future__ import annotations

import torch

from launchless.apps.bench import bench_report, graphs


def info(variants: list[str], refused: list[str] = (), cgct_in_use: bool | None = None, replays: int = 10) -> dict:
    """A ``CompiledGraphs.graph_info()`` as the backend writes it."""
    return {
        "name": "graph 1",
        "static_inputs": 4,
        "graphs": [{"signature": f"(s{i})", "variant": v, "replays": replays} for i, v in enumerate(variants)],
        "fallbacks": [{"signature": "(x)", "reason": why} for why in refused],
        "cgct": None if cgct_in_use is None else {"applied": ["moved"], "why_not": None, "in_use": cgct_in_use},
    }


def test_summary_counts_variants_refusals_and_cgct_over_all_graphs() -> None:
    infos = [
        {**info(["graph", "graph+pi"], cgct_in_use=True), "demoted_inputs": ["L_self_state"]},
        info(["no-graph"], refused=["a data-dependent shape"], cgct_in_use=False),
        {**info([], refused=["a data-dependent shape", "host sync"]), "calls_over_max_graphs": 12},
    ]
    s = graphs.summarize(infos, graph_breaks=7)
    assert s["dynamo_graphs"] == 3
    assert s["variants"] == {"graph": 1, "graph+pi": 1, "no-graph": 1}
    assert s["refused"] == {"a data-dependent shape": 2, "host sync": 1}
    assert s["cgct_in_use"] == 1  # applied and undone does not count
    assert s["replays"] == 30 and s["demoted_inputs"] == 1 and s["over_max_graphs"] == 1
    assert [(g["graph"], g["variant"]) for g in s["per_graph"]] == [
        ("graph 1", "graph"),
        ("graph 1", "graph+pi"),
        ("graph 1", "no-graph"),
    ]
    assert graphs.describe(s) == (
        "3 Dynamo graphs (7 breaks): 1 graph, 1 graph+pi, 1 no-graph; "
        "refused 3: 2× a data-dependent shape; 1× host sync; CGCT in 1; "
        "1 attribute(s) reassigned every call, copied like inputs; "
        "1 with more shapes in use than max_graphs (the rest run compiled)"
    )


def test_summary_counts_the_signatures_replayed_as_graphs_around_an_operation() -> None:
    chained = info(["graph", "graph"])
    chained["graphs"][0]["region_split"] = {"graphs": 3, "eager_ops": [{"op": "lib::grouped_mm"}]}
    s = graphs.summarize([chained], graph_breaks=0)
    assert s["chains"] == 1
    assert graphs.describe(s) == "1 Dynamo graphs (0 breaks): 2 graph; 1 as graphs around an operation run eager"
    assert "around an operation" not in graphs.describe({**s, "chains": 0})


def test_markdown_has_the_section_only_when_a_row_carries_a_summary() -> None:
    env = {"date": "2026-11-29", "gpu": "NVIDIA H200"}
    base = {"kind": "inference", "status": "ok", "reason": None, "median_ms": 1.0, "min_ms": 1.0, "calls": 10}
    rows = [{**base, "workload": "w", "mode": "eager"}, {**base, "workload": "w", "mode": "launchless-compile"}]
    assert "launchless backend's graphs" not in bench_report.markdown(env, "compiler", rows)
    rows[1]["graphs"] = graphs.summarize([info(["graph"])], graph_breaks=0)
    assert "- `w`: 1 Dynamo graphs (0 breaks): 1 graph" in bench_report.markdown(env, "compiler", rows)


class Made:
    """Stands in for a CompiledGraphs in the backend's registry (on a CPU nothing is captured)."""

    def __init__(self, variants: list[str]) -> None:
        self.info = info(variants)

    def graph_info(self) -> dict:
        return self.info


def test_recorder_counts_only_the_graphs_made_after_it() -> None:
    from launchless.compiler import backend

    old = Made(["graph"])
    backend._registry.add(old)
    summary = graphs.recorder()
    new = Made(["graph+pi", "no-graph"])
    backend._registry.add(new)
    s = summary()
    assert s["dynamo_graphs"] == 1 and s["variants"] == {"graph+pi": 1, "no-graph": 1}
    backend._registry.discard(old)
    backend._registry.discard(new)


def test_recorder_sees_no_graph_for_a_cpu_model_and_counts_no_break() -> None:
    from launchless.compiler.backend import launchless_backend

    torch._dynamo.reset()
    summary = graphs.recorder()
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    compiled = torch.compile(model, backend=launchless_backend)
    with torch.no_grad():
        compiled(torch.randn(2, 4))
    s = summary()
    assert s["dynamo_graphs"] == 0 and s["variants"] == {}  # a CPU graph is compiled, never captured
    assert s["graph_breaks"] == 0
    torch._dynamo.reset()


def test_runtime_summaries_say_whole_graph_split_or_eager() -> None:
    from launchless.apps.bench.graphs import describe, markdown_lines, runtime_summary

    base = {"graphs": [], "fallbacks": [], "eager_calls": {}, "split": None}
    whole = runtime_summary(base | {"graphs": [{"replays": 4}]})
    assert describe(whole) == "whole graph"
    split = {
        "pieces": [{"module": "backbone", "graphs": 1}, {"module": "rpn.head", "graphs": 1}],
        "eager": [{"module": "(root)", "reason": "host copy"}, {"module": "rpn", "reason": "host sync"}],
        "signatures": [{"status": "verified", "captured_share": 0.49, "detail": ""}],
    }
    text = describe(runtime_summary(base | {"split": split}))
    assert text == "split (host copy): 2 pieces replay (49 % of eager GPU time: backbone, rpn.head); eager: (root), rpn"
    region = {"graphs": 5, "eager_ops": [{"op": "aten::_grouped_mm"}] * 4, "speedup": 5.26}
    text = describe(runtime_summary(base | {"graphs": [{"replays": 4, "region_split": region}]}))
    assert text == (
        "split around aten::_grouped_mm: 5 graphs replay, the operation run eager between them "
        "(5.26x over eager when captured)"
    )
    split["signatures"][0] |= {"status": "dropped", "detail": "not faster than eager"}
    eager = runtime_summary(base | {"split": split, "fallbacks": [{"reason": "host copy"}]})
    assert describe(eager) == "eager: host copy; split dropped: not faster than eager"
    lines = markdown_lines([{"workload": "det", "graphs": eager}])
    assert (
        "## What `launchless` ran" in lines
        and "- `det`: eager: host copy; split dropped: not faster than eager" in lines
    )


def test_each_row_says_its_mode_where_it_is_not_its_sections_and_the_graph_path_adds_none() -> None:
    """The compiled-kernels modes run under ``wrap`` too, and the grace report's graph path copies a row: one line a
    row that ran, named by its mode where that is not the section's."""
    from launchless.apps.bench.graphs import markdown_lines, runtime_summary

    whole = runtime_summary({"graphs": [{"replays": 4}], "fallbacks": [], "eager_calls": {}, "split": None})
    backend = graphs.summarize([info(["graph"])], graph_breaks=0)
    rows = [
        {"workload": "w", "mode": "launchless", "graphs": whole},
        {"workload": "w", "mode": "launchless-compiled-kernels", "graphs": whole},
        {"workload": "w", "mode": "launchless-compile", "graphs": backend},
        {"workload": "w", "mode": "launchless-graph-path", "graphs": backend},
    ]
    lines = markdown_lines(rows)
    assert [line for line in lines if line.startswith("- ")] == [
        "- `w`: whole graph",
        "- `w` (launchless-compiled-kernels): whole graph",
        f"- `w`: {graphs.describe(backend)}",
    ]
    torch._dynamo.reset()
