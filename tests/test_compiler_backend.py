"""CPU tests of the torch.compile backend's host logic (capture and replay are in test_cuda_compiler.py)."""

from __future__ import annotations

import logging
import types

import pytest
import torch
from dynamo_graph import dynamo_graph
from torch import nn

from launchless.compiler.backend import (
    input_names,
    launchless_backend,
    make_backend,
    static_input_indices,
    tensor_attribute_indices,
)


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.register_buffer("shift", torch.ones(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) + self.shift


def test_parameters_and_buffers_are_static_inputs_and_the_batch_is_not() -> None:
    model, x = _Net(), torch.randn(2, 4)
    gm, inputs = dynamo_graph(model, x)
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


def test_options_given_to_torch_compile_reach_the_backend_and_are_checked() -> None:
    """``torch.compile(m, backend=..., options={...})`` is the standard way to pass backend options."""
    import launchless as ll
    from launchless.compiler.backend import BackendOptions

    def inner(gm, example_inputs):
        return gm.forward

    backend = make_backend(inner)
    model, x = _Net(), torch.randn(2, 4)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, options={"max_graphs": 3, "verify": "strict"})
    assert torch.equal(compiled(x), model(x))
    assert BackendOptions().updated({"max_graphs": 3}).max_graphs == 3
    for bad, needle in (
        ({"bogus": 1}, "does not know the option(s) 'bogus'"),
        ({"max_graphs": 0}, "max_graphs=0 is not accepted"),
        ({"verify": "maybe"}, "verify='maybe' is not accepted"),
        ({"cgct": "yes"}, "cgct='yes' is not accepted; pass True or False"),
    ):
        torch._dynamo.reset()
        with pytest.raises(Exception) as info:  # Dynamo wraps what a backend raises
            torch.compile(model, backend=backend, options=bad)(x)
        assert needle in str(info.value), str(info.value)
        with pytest.raises(ll.ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
            BackendOptions().updated(bad)
    with pytest.raises(TypeError):
        make_backend(inner, bogus=1)  # a misspelt keyword is not accepted silently


def test_a_compile_mode_is_refused_with_the_fix() -> None:
    import launchless as ll

    gm, inputs = dynamo_graph(_Net(), torch.randn(2, 4))
    with pytest.raises(ll.ConfigError, match="pass launchless's options as options="):
        make_backend(lambda g, e: g.forward)(gm, inputs, mode="reduce-overhead")


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

    gm, inputs = dynamo_graph(fn, torch.randn(4))
    aten = aten_graph(gm, inputs)
    arange = [n for n in aten.graph.nodes if "arange" in str(n.target)]
    assert arange and "val" in arange[0].meta and "test_compiler_backend.py" in arange[0].meta.get("stack_trace", "")
    result = try_rewrite(gm, inputs, frozenset(), lambda g, ex: g.forward)
    assert result.compiled is None and result.why_not.startswith("no rewritable host copy")  # nothing crosses devices


class _FakeCaptured:
    """Test double of a captured graph: 'replays' by calling the compiled function (tests only)."""

    def __init__(self, fn, flat, static) -> None:
        self.fn, self.static_leaves = fn, list(flat.leaves)
        self.tensor_slots = [i for i, x in enumerate(flat.leaves) if isinstance(x, torch.Tensor) and i not in static]
        self.replays = 0
        self.collective_groups = []  # a single-process forward: no collectives
        self.junctions, self.split_from = (), None  # one graph, not a chain around operations run eager

    def replay_cloned(self, leaves):
        self.replays += 1
        return self.fn(*leaves)


class _FakeChain(_FakeCaptured):
    """Test double of a chain: two graphs with one operation run eager between them; ``changed`` makes that
    operation return another shape at the next replay (tests only)."""

    def __init__(self, fn, flat, static) -> None:
        from launchless.core.junctions import SegmentedGraph, Site

        super().__init__(fn, flat, static)
        self.graph = SegmentedGraph()
        self.graph.graphs = [object(), object()]
        self.junctions = (
            types.SimpleNamespace(name="lib::grouped_mm", guarded=False, row=lambda: {"op": "lib::grouped_mm"}),
        )
        site = Site(op=None, name="lib::grouped_mm", why_not="", source="moe.py:12")
        self.split_from = types.SimpleNamespace(site=site)
        self.changed = False

    def replay_cloned(self, leaves):
        from launchless.core.junctions import JunctionShapeChanged

        if self.changed:
            raise JunctionShapeChanged("launchless: lib::grouped_mm returned (5,) on replay, (3,) when captured")
        return super().replay_cloned(leaves)


class _Report:
    status, passed, detail = "bit-identical", True, ""

    def as_dict(self) -> dict:
        return {"status": self.status, "passed": self.passed, "detail": self.detail}


def _graphs_on_fakes(monkeypatch, tmp_path, times=None, captured=None, **options):
    """A CompiledGraphs whose capture, verification, device and timing are stand-ins: its bookkeeping runs."""
    from launchless.compiler import compiled_graphs as graphs_module
    from launchless.compiler import select
    from launchless.compiler.decisions import Decision, DecisionCache, choose
    from launchless.core import pool as pool_module

    measured = []

    def measure(runners, device, margin=0.03):
        measured.append(sorted(runners))
        t = times or {"no-graph": 2.0, "graph": 1.0}
        return Decision(
            choose({k: v for k, v in t.items() if k in runners}), {k: v for k, v in t.items() if k in runners}
        )

    monkeypatch.setattr(graphs_module, "capture_device", lambda leaves: torch.device("cpu"))
    made = captured or _FakeCaptured
    monkeypatch.setattr(graphs_module._capture, "capture", lambda fn, flat, *, static, **kw: made(fn, flat, static))
    monkeypatch.setattr(graphs_module, "verify", lambda *a, **k: _Report())
    monkeypatch.setattr(pool_module, "new_pool", lambda: ("pool",))  # CPU builds up to 2.13 have none
    monkeypatch.setattr(select, "measure", measure)
    weight = torch.nn.Parameter(torch.randn(3))
    compiled = graphs_module.CompiledGraphs(
        lambda x, w: x * w,
        frozenset({1}),
        name="graph 1",
        cache=DecisionCache(tmp_path),
        graph_key="k",
        indirection=False,
        **{"input_names": ["L_x_", "L_w_"], **options},
    )
    return compiled, weight, measured


def test_a_capture_no_chain_could_go_around_says_why_in_its_fallback(monkeypatch, tmp_path) -> None:
    """A capture that failed inside an operation, where graphs around it were tried and not kept: the signature's
    fallback names the failure and why no chain was kept (the operation that stopped the chain), not the first
    failure alone."""
    from launchless.core.capture import CaptureFailed
    from launchless.core.status import Stage

    def fails(fn, flat, static):
        cause = RuntimeError("CUDA error: operation not permitted when stream is capturing")
        fail = CaptureFailed(Stage.CAPTURE, cause, str(cause))
        fail.no_junction = "lib::lookup cannot run eager between graphs: it reads a host tensor"
        raise fail

    compiled, w, _ = _graphs_on_fakes(monkeypatch, tmp_path, captured=fails)
    x = torch.randn(3)
    for _ in range(3):
        assert torch.equal(compiled(x, w), x * w)
    (fallback,) = compiled.graph_info()["fallbacks"]
    assert "operation not permitted when stream is capturing" in fallback["reason"], fallback
    assert "no graphs around it: lib::lookup cannot run eager between graphs" in fallback["reason"], fallback


def test_capture_after_the_second_call_with_the_measured_variant(monkeypatch, tmp_path) -> None:
    compiled, w, measured = _graphs_on_fakes(monkeypatch, tmp_path)
    x = torch.randn(3)
    for _ in range(4):
        assert torch.equal(compiled(x, w), x * w)
    (graph,) = compiled.graph_info()["graphs"]
    assert graph["variant"] == "graph" and graph["times_ms"] == {"no-graph": 2.0, "graph": 1.0}
    assert graph["replays"] == 3 and measured == [["graph", "no-graph"]]
    assert graph["bytes_copied_per_replay"] == x.nbytes  # the batch is copied, the parameter is not


def test_a_chain_around_an_operation_is_kept_said_once_and_dropped_when_that_operation_changes_shape(
    monkeypatch, tmp_path, caplog
) -> None:
    """A compiled graph captured as graphs around an operation run eager: kept and replayed like one graph, said in
    one line naming the operation, shown under ``region_split``, without pointer indirection. When the operation
    returns another shape at a replay (nothing handed out yet), the chain goes and the call -- and every later one
    of that signature -- runs the compiled code: the caller gets its result, never the error."""
    compiled, w, _ = _graphs_on_fakes(monkeypatch, tmp_path, captured=_FakeChain)
    x = torch.randn(3)
    with caplog.at_level(logging.INFO, logger="launchless"):
        for _ in range(4):
            assert torch.equal(compiled(x, w), x * w)
        (row,) = compiled.graph_info()["graphs"]
        assert row["region_split"] == {
            "graphs": 2, "eager_ops": [{"op": "lib::grouped_mm"}], "reason": "lib::grouped_mm", "source": "moe.py:12"
        }  # fmt: skip
        assert row["indirection"] == "a chain of graphs around operations run eager" and row["replays"] == 3
        (entry,) = compiled._graphs.graphs.values()
        entry.graph.changed = True
        for _ in range(3):
            assert torch.equal(compiled(x, w), x * w)
    assert compiled.graph_info()["graphs"] == []
    (fallback,) = compiled.graph_info()["fallbacks"]
    assert "graphs around an operation run eager dropped" in fallback["reason"], fallback
    assert "lib::grouped_mm returned (5,) on replay, (3,) when captured" in fallback["reason"], fallback
    lines = [r.getMessage() for r in caplog.records]
    assert sum("cannot be captured as one graph (lib::grouped_mm at moe.py:12)" in m for m in lines) == 1, lines
    assert sum("returned (5,) on replay" in m for m in lines) == 1, lines


def test_a_cached_decision_is_reused_and_a_slower_graph_is_not_used(monkeypatch, tmp_path) -> None:
    compiled, w, measured = _graphs_on_fakes(monkeypatch, tmp_path, times={"no-graph": 1.0, "graph": 1.5})
    x = torch.randn(3)
    for _ in range(3):
        compiled(x, w)
    assert compiled.graph_info()["graphs"][0]["variant"] == "no-graph" and len(measured) == 1
    again, w2, measured2 = _graphs_on_fakes(monkeypatch, tmp_path)  # same cache, same key: decided already
    for _ in range(3):
        again(x, w2)
    assert measured2 == [] and again.graph_info()["graphs"][0]["variant"] == "no-graph"


def _counting_signatures(monkeypatch) -> list[int]:
    from launchless.compiler import compiled_graphs as graphs_module

    made = [0]
    real = graphs_module.signature_of_leaves

    def counted(structure, leaves):
        made[0] += 1
        return real(structure, leaves)

    monkeypatch.setattr(graphs_module, "signature_of_leaves", counted)
    return made


def test_a_fixed_signature_decided_without_a_graph_skips_the_signature_until_autocast_or_tf32_changes(
    monkeypatch, tmp_path
) -> None:
    """Dynamo's guards pin a static graph's inputs: once its one signature runs without a graph (the selective
    choice), a call checks the autocast context alone and runs the program (host time a call of a one-kernel graph
    is made of); a switched TF32 flag takes the full path again and is a signature of its own."""
    compiled, w, measured = _graphs_on_fakes(
        monkeypatch, tmp_path, times={"no-graph": 1.0, "graph": 1.5}, fixed_signature=True
    )
    made = _counting_signatures(monkeypatch)
    x = torch.randn(3)
    for _ in range(3):  # seen, captured and decided, then looked up once
        assert torch.equal(compiled(x, w), x * w)
    assert compiled.graph_info()["graphs"][0]["variant"] == "no-graph" and len(measured) == 1
    before = made[0]
    for _ in range(5):
        y = torch.randn(3)
        assert torch.equal(compiled(y, w), y * w)
    assert made[0] == before  # no signature made
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=not torch.backends.cudnn.allow_tf32):
        compiled(x, w)
    assert made[0] == before + 1  # the full path: another context is another signature
    compiled(x, w)
    compiled(x, w)
    assert made[0] == before + 2  # back in the decided context: looked up once, then skipped again


def test_a_signature_dynamo_does_not_pin_is_made_on_every_call(monkeypatch, tmp_path) -> None:
    compiled, w, _ = _graphs_on_fakes(monkeypatch, tmp_path, times={"no-graph": 1.0, "graph": 1.5})
    made = _counting_signatures(monkeypatch)
    x = torch.randn(3)
    for _ in range(8):
        compiled(x, w)
    assert compiled.graph_info()["graphs"][0]["variant"] == "no-graph" and made[0] == 8


def test_only_a_graph_of_static_tensor_inputs_has_a_fixed_signature() -> None:
    from launchless.compiler.backend import fixed_signature

    seen: list[bool] = []

    def backend(gm, example_inputs):
        seen.append(fixed_signature(gm))
        return gm.forward

    static = torch.compile(lambda x: (x * 2).sin(), backend=backend, dynamic=False)
    static(torch.randn(4))
    dynamic = torch.compile(lambda x: (x * 2).sin(), backend=backend, dynamic=True)
    dynamic(torch.randn(4, 3)[:, 1])
    assert seen == [True, False]


def test_a_drifted_variant_is_measured_again_and_the_new_decision_cached(monkeypatch, tmp_path, caplog) -> None:
    from launchless.compiler.decisions import DriftMonitor

    class _SlowEvent:  # every sampled production call takes 5 ms: the graph chosen at 1 ms has drifted
        def __init__(self, **_) -> None:
            pass

        def record(self) -> None:
            pass

        def synchronize(self) -> None:
            pass

        def elapsed_time(self, _end) -> float:
            return 5.0

    compiled, w, measured = _graphs_on_fakes(monkeypatch, tmp_path)
    x = torch.randn(3)
    for _ in range(2):
        compiled(x, w)  # the second call captures and decides: graph (1 ms) over no-graph (2 ms)
    (entry,) = compiled._graphs.graphs.values()
    entry.monitor = DriftMonitor(entry.decision, every=1, window=2)
    monkeypatch.setattr(torch.cuda, "Event", _SlowEvent)
    with caplog.at_level(logging.INFO, logger="launchless"):
        for _ in range(2):
            assert torch.equal(compiled(x, w), x * w)
    assert measured == [["graph", "no-graph"], ["graph", "no-graph"]]  # measured again, the same variants
    assert sum("graph drifted; now graph" in r.getMessage() for r in caplog.records) == 1
    again, w2, measured2 = _graphs_on_fakes(monkeypatch, tmp_path)  # a new process finds the re-made decision
    for _ in range(2):
        again(x, w2)
    assert measured2 == []


def test_moved_parameters_and_too_many_shapes_each_log_once(monkeypatch, tmp_path, caplog) -> None:
    compiled, w, _ = _graphs_on_fakes(monkeypatch, tmp_path, max_graphs=1)
    with caplog.at_level(logging.INFO, logger="launchless"):
        for _ in range(3):  # captured and replayed
            compiled(torch.randn(3), w)
        moved = torch.nn.Parameter(torch.randn(3))  # w replaced (load_state_dict(assign=True) does this)
        for _ in range(4):
            x = torch.randn(3)
            assert torch.equal(compiled(x, moved), x * moved)
        for n in (4, 4, 2, 2, 4, 4):  # two batch shapes, one parameter, room for one graph
            x = torch.randn(n, 3)
            assert torch.equal(compiled(x, moved), x * moved)
    messages = [r.getMessage() for r in caplog.records]
    assert sum("evicting" in m for m in messages) == 1
    assert sum("L_w_ moved; dropped 1 graph(s), captured again" in m for m in messages) == 1


def test_more_shapes_in_use_than_max_graphs_stops_eviction_instead_of_capturing_every_call(
    monkeypatch, tmp_path, caplog
) -> None:
    """Mask R-CNN's mask paste: ~100 sizes every call. LRU eviction would capture (and measure) one graph per
    call forever; once an evicted shape comes back the graphs held stay and the other shapes run compiled."""
    compiled, _, measured = _graphs_on_fakes(monkeypatch, tmp_path, max_graphs=2)
    ws = {n: torch.nn.Parameter(torch.randn(n)) for n in (3, 4, 5)}
    compiled._graphs.guards = []  # one parameter per shape here; the real one is shared
    with caplog.at_level(logging.INFO, logger="launchless"):
        for _ in range(6):
            for n in (3, 4, 5):
                x = torch.randn(n)
                assert torch.equal(compiled(x, ws[n]), x * ws[n])
    info = compiled.graph_info()
    # round 2 captures 3 and 4, then 5 evicting 3; round 3 counts 3 again, round 4 finds it evicted: stop
    assert len(info["graphs"]) == 2 and len(measured) == 3
    assert [g["replays"] for g in info["graphs"]] == [5, 5]  # 4 and 5 keep replaying: captured, then 4 rounds
    assert info["calls_over_max_graphs"] == 3  # shape 3 in rounds 4 to 6
    messages = [r.getMessage() for r in caplog.records]
    assert sum("needs more than max_graphs=2 shapes at once" in m for m in messages) == 1, messages
    assert sum("evicting" in m for m in messages) == 1


class _Anchored(nn.Module):
    """AnchorGenerator's pattern: a tensor attribute reassigned from its own ``.to()`` in every forward."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.register_buffer("shift", torch.ones(3))
        self.anchors = [torch.ones(3)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.anchors = [a.to(x) for a in self.anchors]
        return self.fc(x) + self.shift + self.anchors[0]


def test_tensor_attributes_are_told_from_parameters_and_buffers() -> None:
    model = _Anchored()
    gm, inputs = dynamo_graph(model, torch.randn(2, 4))
    names = input_names(gm)
    static = static_input_indices(gm, inputs)
    attributes = tensor_attribute_indices(names, inputs, static)
    assert [inputs[i] is model.anchors[0] for i in attributes] == [True]
    assert {id(inputs[i]) for i in static - attributes} == {id(model.fc.weight), id(model.fc.bias), id(model.shift)}
    assert tensor_attribute_indices([], inputs, static) == static - {
        i for i in static if isinstance(inputs[i], nn.Parameter)
    }  # no names: every non-parameter counts as an attribute, the safe side


def test_an_attribute_reassigned_every_call_is_demoted_to_an_input_with_one_line(monkeypatch, tmp_path, caplog) -> None:
    compiled, _, _ = _graphs_on_fakes(monkeypatch, tmp_path, attributes=frozenset({1}))
    with caplog.at_level(logging.INFO, logger="launchless"):
        for _ in range(12):
            x, anchors = torch.randn(3), torch.randn(3)  # a new tensor each call, as `self.a = a.to(x)` can give
            assert torch.equal(compiled(x, anchors), x * anchors)
    info = compiled.graph_info()
    (graph,) = info["graphs"]
    assert info["demoted_inputs"] == ["L_w_"] and info["static_inputs"] == 0
    assert graph["replays"] >= 5 and graph["bytes_copied_per_replay"] == 2 * x.nbytes  # now copied like the batch
    messages = [r.getMessage() for r in caplog.records]
    assert sum("L_w_ gets a new tensor on every call" in m and "copy_" in m for m in messages) == 1
    assert sum("captured again" in m for m in messages) == 1


def test_an_attribute_is_checked_on_every_call_even_outside_the_spot_check(monkeypatch, tmp_path, caplog) -> None:
    from launchless.compiler import compiled_graphs as graphs_module
    from launchless.core import relocation

    n = 21
    hidden = next(i for i in range(1, n) if i - 1 not in relocation.spread(n - 1))  # not among the 8 spot-checked
    _graphs_on_fakes(monkeypatch, tmp_path)  # the stand-ins for capture, verification and timing

    def fn(x, *static):
        return x + sum(static)

    compiled = graphs_module.CompiledGraphs(
        fn,
        frozenset(range(1, n)),
        name="graph 1",
        cache=None,
        selective=False,
        indirection=False,
        attributes=frozenset({hidden}),
    )
    tensors = [nn.Parameter(torch.randn(3)) if i != hidden else torch.randn(3) for i in range(1, n)]
    x = torch.randn(3)
    with caplog.at_level(logging.INFO, logger="launchless"):
        for _ in range(3):
            compiled(x, *tensors)
        tensors[hidden - 1] = torch.randn(3)  # reassigned once, e.g. by a user between calls
        assert torch.equal(compiled(x, *tensors), fn(x, *tensors))
    assert (
        sum(f"input {hidden} moved; dropped 1 graph(s), captured again" in r.getMessage() for r in caplog.records) == 1
    )


def test_a_graph_the_compiler_rejects_runs_as_the_fx_graph_with_one_line(caplog: pytest.LogCaptureFixture) -> None:
    model, x = _Net(), torch.randn(2, 4)

    def broken(gm, example_inputs):
        raise RuntimeError("Unhandled FakeTensor Device Propagation for aten.cat.default, found two different devices")

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=make_backend(broken))
    with caplog.at_level(logging.INFO, logger="launchless"):
        for _ in range(3):
            assert torch.equal(compiled(x), model(x))
    lines = [r.getMessage() for r in caplog.records if "did not compile" in r.getMessage()]
    assert len(lines) == 1 and "two different devices" in lines[0] and "CGCT: no rewritable host copy" in lines[0]


@pytest.mark.parametrize(
    ("fn", "hazard"),
    [
        (lambda x, cache: cache.add_(1) * x, "input mutation"),
        (lambda x, cache: x + torch.rand_like(x), "draws random numbers"),
        (lambda x, cache: x * cache, None),
    ],
    ids=["writes-an-input", "random", "clean"],
)
def test_cgct_does_not_run_a_graph_whose_extra_runs_would_change_state(fn, hazard) -> None:
    """CGCT runs the graph for real (trace, trials): a KV-cache write or an RNG draw must not happen again."""
    from launchless.compiler.cgct import trial_hazard, try_rewrite

    x, cache = torch.randn(4), torch.zeros(4)
    gm, inputs = dynamo_graph(fn, x, cache)  # (runs it once, as the user's first call does)
    before = cache.clone()
    found = trial_hazard(gm, inputs)
    if hazard is None:
        assert found is None
        return
    assert hazard in found and "CGCT's trial runs" in found
    state = torch.random.get_rng_state()
    result = try_rewrite(gm, inputs, frozenset(), lambda g, ex: g.forward)
    assert result.compiled is None and result.why_not == found
    assert torch.equal(cache, before) and torch.equal(torch.random.get_rng_state(), state)  # nothing ran again


def test_a_graph_with_host_tensors_is_rewritten_before_its_one_compile(monkeypatch, caplog) -> None:
    """CGCT up front: Inductor compiles only the rewritten graph; the original is compiled only to undo it."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from launchless.compiler import backend as backend_module
    from launchless.compiler.cgct import CgctResult
    from launchless.compiler.rewrite import AppliedRewrite, RewriteReport

    gm = torch.fx.symbolic_trace(lambda x: x * 2)  # no node values: the inputs' devices decide
    with FakeTensorMode():
        cuda_inputs = [torch.empty(4, device="cuda")]  # a GPU graph, as Dynamo would hand it over
    assert not backend_module.holds_host_tensors(gm, cuda_inputs)
    with FakeTensorMode():
        assert backend_module.holds_host_tensors(gm, [*cuda_inputs, torch.empty(2)])
    compiles, rewritten = [], object()

    def inner(g, example_inputs):
        compiles.append(g)
        return g.forward

    report = RewriteReport(applied=[AppliedRewrite("built on the device", "_to_copy", "cuda:0")])
    monkeypatch.setattr(backend_module, "holds_host_tensors", lambda g, ex: True)
    monkeypatch.setattr(backend_module, "try_rewrite", lambda g, ex, static, c: CgctResult(rewritten, report))
    with caplog.at_level(logging.INFO, logger="launchless"):
        graphs = make_backend(inner, cgct=True)(gm, cuda_inputs)
    assert compiles == [] and graphs.compiled is rewritten and graphs.source is None  # no second CGCT later
    assert graphs.graph_info()["cgct"]["in_use"]
    assert sum("CGCT rewrote host copies" in r.getMessage() for r in caplog.records) == 1
    graphs._undo_cgct("test")  # undoing compiles the original graph, once, only then
    assert compiles == [gm] and graphs.compiled == gm.forward and not graphs.graph_info()["cgct"]["in_use"]

    failed = CgctResult(None, report, "the rewrite changed the results (max abs diff 1); dropped")
    monkeypatch.setattr(backend_module, "try_rewrite", lambda g, ex, static, c: failed)
    graphs = make_backend(inner, cgct=True)(gm, cuda_inputs)
    assert compiles == [gm, gm] and graphs.cgct is failed and graphs.source is None  # tried once, not again


def test_moved_constants_are_kept_current_per_call_and_a_new_shape_undoes_the_rewrite(caplog) -> None:
    """The watch runs on every call: an in-place change is copied over; a new shape brings the original back."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    from launchless.compiler.cgct import CgctResult, MovedConstant
    from launchless.compiler.compiled_graphs import CompiledGraphs
    from launchless.compiler.rewrite import constant_guards, rewrite

    table = torch.randn(4)
    gm = make_fx(lambda x, t: x * t.to(x.device, copy=True))(torch.randn(4), table)
    report = rewrite(gm, "cpu", {[n.name for n in gm.graph.nodes if n.op == "placeholder"][1]: table})
    (guard,) = constant_guards(gm)
    result = CgctResult(gm.forward, report, moved=[MovedConstant(guard, gm._launchless_const_0, 1)])
    originals = []
    graphs = CompiledGraphs(lambda x, t: x * t, frozenset({1}), name="graph 1", selective=False)
    graphs.adopt_cgct(result, lambda: originals.append(1) or (lambda x, t: x * t))
    with FakeTensorMode():
        cuda_x = torch.empty(4, device="cuda")
    assert graphs._host_inputs_are_static([cuda_x, table])  # a host attribute beside GPU inputs: CGCT's case
    assert graphs._addresses.order == []  # its address is not checked: the watch follows it
    assert not graphs._host_inputs_are_static([torch.randn(4), table])  # nothing on the GPU
    x = torch.randn(4)
    assert torch.equal(graphs(x, table), x * table)  # (first call: runs compiled, the rewritten graph)
    table.mul_(3)
    assert torch.equal(graphs(x, table), x * table) and graphs.graph_info()["cgct"]["constants_refreshed"] == 1
    with caplog.at_level(logging.INFO, logger="launchless"):
        wider = torch.randn(5)
        assert torch.equal(graphs(torch.randn(5).zero_() + 1, wider), wider)  # the original graph, compiled now
    assert originals == [1] and not graphs.graph_info()["cgct"]["in_use"]
    assert graphs._addresses.order == [1]  # the original graph reads it: its address is checked again
    assert sum("CGCT undone" in r.getMessage() for r in caplog.records) == 1


def test_cgct_leaves_a_graph_with_a_host_sync_alone_without_running_it() -> None:
    """A real trace would freeze the value `.item()` read; no rewrite makes such a graph capturable anyway."""
    from launchless.compiler.cgct import try_rewrite

    calls = []
    gm = torch.fx.symbolic_trace(lambda x: x * x.sum().item())
    inner = lambda g, ex: calls.append(g) or g.forward  # noqa: E731
    result = try_rewrite(gm, [torch.randn(4)], frozenset(), inner)
    assert result.compiled is None and calls == []
    assert result.why_not.startswith("the graph has a host sync") and "_local_scalar_dense" in result.why_not


_NO_RECOMPILE = """
import torch
from torch import nn
from launchless.core import relocation
from launchless.compiler.backend import make_backend

compiles = []

def inner(gm, example_inputs):  # stands in for Inductor; its callable installs relocation as a capture does
    compiles.append(gm)
    def run(*args):
        relocation.epoch()
        return gm.forward(*args)
    return run

class Sliced(nn.Module):  # Mistral's `for layer in self.layers[:n]`: a ModuleList built in forward
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])

    def forward(self, x):
        for layer in self.layers[:2]:
            x = layer(x)
        return x

backend = make_backend(inner)
compiled = torch.compile(Sliced(), backend=backend)
x = torch.randn(2, 4)
for _ in range(4):
    compiled(x)
print(len(compiles))
"""


def test_the_backend_installs_relocation_before_tracing_so_nothing_recompiles_later() -> None:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _NO_RECOMPILE], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["1"], out.stdout  # hooks installed at the first capture: 2 (a recompile)


def test_inputs_read_as_addresses_are_verified_on_the_calls_values_and_named(monkeypatch, tmp_path) -> None:
    from launchless.compiler import compiled_graphs as graphs_module

    compiled, w, _ = _graphs_on_fakes(monkeypatch, tmp_path, index_inputs=frozenset({0}))
    seen = []
    monkeypatch.setattr(graphs_module, "verify", lambda *a, **k: seen.append(k.get("from_call")) or _Report())
    for _ in range(3):
        compiled(torch.randn(3), w)
    assert seen == [frozenset({0})]  # one capture, verified with the batch taken from the call
    assert compiled.graph_info()["index_inputs"] == ["L_x_"]


def test_calling_modules_reads_the_classes_an_fx_graph_holds_and_skips_what_it_cannot_read() -> None:
    """The modules whose classes' forwards an FX graph holds code of, as Dynamo records them (a class, or its
    qualified name); an entry of another form is skipped, never an error in the backend."""
    from torch import fx

    from launchless.compiler.backend import calling_modules

    graph = fx.Graph()
    x = graph.placeholder("x")
    first = graph.call_function(torch.relu, (x,))
    second = graph.call_function(torch.neg, (first,))
    third = graph.call_function(torch.abs, (second,))
    graph.output(third)
    first.meta["nn_module_stack"] = {"a": ("backbone", torch.nn.ReLU)}
    second.meta["nn_module_stack"] = {"b": ("head", "torchvision.models.detection.ssdlite.SSDLiteHead")}
    third.meta["nn_module_stack"] = {"c": "an entry of another form", "d": ("path",)}
    modules = calling_modules(fx.GraphModule(torch.nn.Module(), graph))
    assert modules == {"torch.nn.modules.activation", "torchvision.models.detection.ssdlite"}
