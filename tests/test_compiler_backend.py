"""CPU tests of the torch.compile backend's host logic (capture and replay are in test_cuda_compiler.py)."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from launchless.compiler.backend import launchless_backend, make_backend, static_input_indices


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.register_buffer("shift", torch.ones(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) + self.shift


def _dynamo_graph(model: nn.Module, *inputs: torch.Tensor):
    """The FX graph and example inputs Dynamo hands to a backend."""
    seen = []

    def record(gm, example_inputs):
        seen.append((gm, list(example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    torch.compile(model, backend=record)(*inputs)
    return seen[0]


def test_parameters_and_buffers_are_static_inputs_and_the_batch_is_not() -> None:
    model, x = _Net(), torch.randn(2, 4)
    gm, inputs = _dynamo_graph(model, x)
    static = static_input_indices(gm, inputs)
    ids = {id(model.fc.weight), id(model.fc.bias), id(model.shift)}
    assert {id(inputs[i]) for i in static} == ids
    assert [i for i, t in enumerate(inputs) if t is x] == [i for i in range(len(inputs)) if i not in static]


def test_a_cpu_graph_runs_compiled_with_one_line(caplog: pytest.LogCaptureFixture) -> None:
    model, x = _Net(), torch.randn(2, 4)
    calls = []

    def inner(gm, example_inputs):
        calls.append(gm)
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=make_backend(inner))
    with caplog.at_level(logging.INFO, logger="launchless"):
        for _ in range(3):
            assert torch.equal(compiled(x), model(x))
    lines = [r.getMessage() for r in caplog.records if "without a CUDA graph" in r.getMessage()]
    assert len(calls) == 1 and len(lines) == 1 and "has no CUDA input" in lines[0]


def test_the_backend_is_found_by_name() -> None:
    from torch._dynamo.backends.registry import lookup_backend

    try:
        found = lookup_backend("launchless")
    except Exception as exc:  # the entry point exists only when the package is installed (pip install -e .)
        pytest.skip(f"launchless is not installed as a package here: {exc}")
    assert found is launchless_backend


def test_cgct_traces_a_dynamo_graph_to_aten_with_source_lines_and_leaves_cpu_graphs_alone() -> None:
    from launchless.compiler.cgct import aten_graph, try_rewrite

    def fn(x: torch.Tensor) -> torch.Tensor:
        return x * 2 + torch.arange(x.shape[0])

    seen = []

    def record(gm, example_inputs):
        seen.append((gm, list(example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=record)(torch.randn(4))
    gm, inputs = seen[0]
    aten = aten_graph(gm, inputs)
    arange = [n for n in aten.graph.nodes if "arange" in str(n.target)]
    assert arange and "val" in arange[0].meta and "test_compiler_backend.py" in arange[0].meta.get("stack_trace", "")
    result = try_rewrite(gm, inputs, frozenset(), lambda g, ex: g.forward)
    assert result.compiled is None and result.why_not.startswith("no rewritable host copy")  # nothing crosses devices
