"""CPU tests for the pure parts of launchless.core.capture: output cloning and static input buffers.

A replay overwrites the graph's static output buffers in place. ``CapturedGraph.replay_cloned``
must therefore hand back tensors that share no memory with them, whatever the output tree looks like.
A stand-in for ``torch.cuda.CUDAGraph`` (its ``replay`` recomputes into the static buffers in place)
lets that be checked end to end without a GPU.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict

import pytest
import torch
from torch.utils import _pytree as pytree

from launchless.core.capture import CapturedGraph, _static_like
from launchless.core.output_copies import make_cloner


def storages(tree) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)}


def assert_fresh_copy(copy, original) -> None:
    """Same tree, same values, and not one tensor sharing memory with the original."""
    assert type(copy) is type(original)
    assert pytree.tree_structure(copy) == pytree.tree_structure(original)
    for c, o in zip(pytree.tree_leaves(copy), pytree.tree_leaves(original), strict=True):
        if isinstance(o, torch.Tensor):
            assert torch.equal(c, o) and c.dtype == o.dtype
        else:
            assert c == o
    assert storages(copy).isdisjoint(storages(original))


def t(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


@pytest.mark.parametrize(
    "outputs",
    [
        pytest.param(t(2, 3), id="tensor"),
        pytest.param((t(2), t(3), 4, None), id="tuple"),
        pytest.param([t(2), 1.5, t(1)], id="list"),
        pytest.param({"logits": t(2), "n": 3}, id="dict"),
        pytest.param((t(2), t(3), t(1).long()), id="tuple-of-tensors(a Dynamo graph's)"),
        pytest.param({"a": t(2), "b": t(2, 2)}, id="dict-of-tensors"),
    ],
)
@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no-grad"])
def test_flat_outputs_are_cloned(outputs, grad: bool) -> None:
    clone = make_cloner(outputs)
    with torch.set_grad_enabled(grad):
        first, second = clone(), clone()
    assert_fresh_copy(first, outputs)
    assert storages(first).isdisjoint(storages(second))


@pytest.mark.parametrize(
    "outputs",
    [
        pytest.param((t(2), (t(3), t(1))), id="tuple-in-tuple"),
        pytest.param({"boxes": [t(4), t(4)]}, id="list-in-dict"),
        pytest.param([{"boxes": t(3, 4), "scores": t(3)}], id="dicts-in-list(torchvision detection)"),
    ],
)
def test_nested_outputs_are_cloned(outputs) -> None:
    assert_fresh_copy(make_cloner(outputs)(), outputs)


def test_cloner_reads_the_current_values_of_the_static_outputs() -> None:
    static = (torch.zeros(3), {"a": torch.zeros(2)})
    clone = make_cloner(static)
    static[0].fill_(1.0)  # what a replay does
    static[1]["a"].fill_(2.0)
    got = clone()
    assert torch.equal(got[0], torch.ones(3)) and torch.equal(got[1]["a"], torch.full((2,), 2.0))


@dataclasses.dataclass
class Output(OrderedDict):
    """A ModelOutput-like output: an OrderedDict dataclass, keys mirrored as attributes."""

    logits: torch.Tensor | None = None
    aux: torch.Tensor | None = None

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None:
                self[f.name] = value


def test_modeloutput_like_is_rebuilt_with_keys_attributes_and_order() -> None:
    out = Output(logits=t(2), aux=t(3))
    got = make_cloner(out)()
    assert type(got) is Output
    assert list(got.keys()) == ["logits", "aux"]
    assert torch.equal(got.logits, out.logits) and torch.equal(got["aux"], out["aux"])
    assert got.logits is got["logits"]  # attribute and item are the same clone
    assert storages(got).isdisjoint(storages(out))


def test_transformers_model_output() -> None:
    modeling_outputs = pytest.importorskip("transformers.modeling_outputs")
    out = modeling_outputs.BaseModelOutputWithPooling(last_hidden_state=t(1, 4, 8), pooler_output=t(1, 8))
    got = make_cloner(out)()
    assert_fresh_copy(got, out)
    assert list(got.keys()) == ["last_hidden_state", "pooler_output"]
    assert got.hidden_states is None and got.attentions is None
    assert torch.equal(got[0], out.last_hidden_state) and got.to_tuple()[1] is got.pooler_output


def test_transformers_model_output_with_hidden_states_is_cloned() -> None:
    modeling_outputs = pytest.importorskip("transformers.modeling_outputs")
    out = modeling_outputs.BaseModelOutput(last_hidden_state=t(1, 4, 8), hidden_states=(t(1, 4, 8), t(1, 4, 8)))
    assert_fresh_copy(make_cloner(out)(), out)


def test_outputs_are_copied_in_one_launch_per_dtype_keeping_each_layout(monkeypatch) -> None:
    """A clone per tensor is a launch per tensor; the copies go in one multi-tensor launch per dtype."""
    calls = []
    real = torch._foreach_copy_
    monkeypatch.setattr(torch, "_foreach_copy_", lambda dst, src: calls.append(len(dst)) or real(dst, src))
    nhwc = t(1, 3, 4, 4).to(memory_format=torch.channels_last)
    outputs = (t(2), nhwc, t(3).expand(2, 3), torch.arange(4), torch.arange(5), t(2).bfloat16(), t(2) > 0, 7)
    with torch.no_grad():
        got = make_cloner(outputs)()
    assert_fresh_copy(got, outputs)
    assert got[1].stride() == nhwc.stride() and got[2].shape == (2, 3)
    assert sorted(calls) == [2, 3]  # three float32 tensors, two int64; the lone bfloat16 and bool are copied alone
    assert_fresh_copy(make_cloner(outputs)(), outputs)  # in grad mode: a clone each (foreach has no autograd)
    assert sorted(calls) == [2, 3]


def test_kept_outputs_are_not_copied_and_the_fill_puts_the_callers_tensors_there() -> None:
    outputs = {"boxes": t(3, 4), "anchors": [t(2), t(5)]}
    mine = torch.zeros(5)
    got = make_cloner(outputs, keep=frozenset({2}))(lambda leaves: leaves.__setitem__(2, mine))
    assert got["anchors"][1] is mine and torch.equal(got["boxes"], outputs["boxes"])
    assert storages(got).isdisjoint(storages(outputs))


# ---- CapturedGraph with a stand-in for torch.cuda.CUDAGraph -----------------------------------------


class RecomputingGraph:
    """replay() recomputes ``fn`` on the static inputs and writes the result into the static outputs in place."""

    def __init__(self, fn, static_inputs: list, static_outputs) -> None:
        self.fn, self.static_inputs, self.static_outputs = fn, static_inputs, static_outputs

    def replay(self) -> None:
        fresh = self.fn(*self.static_inputs)
        for dst, src in zip(pytree.tree_leaves(self.static_outputs), pytree.tree_leaves(fresh), strict=True):
            dst.copy_(src)


def captured(fn, example: torch.Tensor) -> CapturedGraph:
    static_in = [_static_like(example, example.device)]
    static_out = fn(*static_in)
    graph = RecomputingGraph(fn, static_in, static_out)
    return CapturedGraph(graph, static_in, [0], static_out, capture_ms=0.0, pool_growth=0)  # type: ignore[arg-type]


def test_replay_cloned_results_survive_the_next_replay() -> None:
    def fn(x: torch.Tensor):
        return x * 2, x.sum(0)

    g = captured(fn, torch.zeros(3, 2))
    x1, x2 = torch.randn(3, 2), torch.randn(3, 2)
    first = g.replay_cloned([x1])
    second = g.replay_cloned([x2])
    assert torch.equal(first[0], x1 * 2) and torch.equal(first[1], x1.sum(0))
    assert torch.equal(second[0], x2 * 2)
    assert g.replays == 2


def test_replay_returns_the_static_outputs() -> None:
    g = captured(lambda x: x + 1, torch.zeros(4))
    x = torch.randn(4)
    out = g.replay([x])
    assert out is g.outputs and torch.equal(out, x + 1)
    g.replay([torch.zeros(4)])
    assert torch.equal(out, torch.ones(4))  # overwritten: that is what outputs="static" means


def test_load_skips_the_static_buffer_itself() -> None:
    g = captured(lambda x: x * 3, torch.zeros(2))
    static = g.static_leaves[0]
    static.fill_(5.0)
    version = static._version
    assert torch.equal(g.replay_cloned([static]), torch.full((2,), 15.0))
    assert static._version == version  # no copy of the buffer onto itself


def test_nested_replay_cloned_results_survive_the_next_replay() -> None:
    def fn(x: torch.Tensor):
        return x * 2, (x + 1,)

    g = captured(fn, torch.zeros(3))
    x1 = torch.randn(3)
    first = g.replay_cloned([x1])
    g.replay_cloned([torch.randn(3)])
    assert torch.equal(first[1][0], x1 + 1)


def test_outputs_that_are_inputs_or_views_of_them_are_the_callers_tensors_and_the_rest_copies() -> None:
    """As in eager (``x.to(x.dtype)`` returns ``x``): a copy would move a module attribute stored back from it."""

    def fn(x: torch.Tensor):
        return x * 2, x, x[1:]

    g = captured(fn, torch.zeros(3))
    x1 = torch.randn(3)
    doubled, same, tail = g.replay_cloned([x1])
    assert same is x1 and tail.untyped_storage().data_ptr() == x1.untyped_storage().data_ptr()
    assert torch.equal(tail, x1[1:]) and tail.storage_offset() == 1
    assert torch.equal(doubled, x1 * 2) and doubled.untyped_storage().data_ptr() != g.outputs[0].data_ptr()


# ---- static input buffers -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "example",
    [
        pytest.param(torch.randn(2, 3), id="contiguous"),
        pytest.param(torch.randn(3, 2).t(), id="transposed"),
        pytest.param(torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last), id="channels_last"),
        pytest.param(torch.arange(6).reshape(2, 3), id="int"),
    ],
)
def test_static_like_keeps_dense_layout_and_values(example: torch.Tensor) -> None:
    static = _static_like(example, example.device)
    assert static.stride() == example.stride() and static.dtype == example.dtype
    assert torch.equal(static, example)
    assert static.untyped_storage().data_ptr() != example.untyped_storage().data_ptr()


def test_static_like_of_a_non_dense_view_is_dense() -> None:
    base = torch.randn(4, 6)
    example = base[1:, ::2]
    static = _static_like(example, example.device)
    assert torch.equal(static, example)
    assert static.is_contiguous() and static.storage_offset() == 0


def test_static_like_keeps_requires_grad_as_a_leaf_and_honours_device() -> None:
    example = torch.randn(3, requires_grad=True)
    static = _static_like(example, torch.device("cpu"))
    assert static.requires_grad and static.is_leaf and torch.equal(static, example)
    meta = _static_like(torch.randn(2, 3).t(), torch.device("meta"))
    assert meta.device.type == "meta" and meta.stride() == (1, 3)


# ---- outputs that are inputs ------------------------------------------------------------------------


def test_an_output_that_is_an_input_or_views_it_is_the_callers_tensor_as_in_eager() -> None:
    def fn(x: torch.Tensor):
        return x, x * 2, x[1:]  # the input itself, a new tensor, a view of the input

    g = captured(fn, torch.zeros(3))
    assert [(a.position, a.leaf, a.view is None) for a in g.aliases] == [(0, 0, True), (2, 0, False)]
    for _ in range(2):
        x = torch.randn(3)
        same, doubled, tail = g.replay_cloned([x])
        assert same is x  # eager's `return x` hands back x: no copy, no new address each call
        assert tail.untyped_storage().data_ptr() == x.untyped_storage().data_ptr() and torch.equal(tail, x[1:])
        assert torch.equal(doubled, x * 2) and not storages(doubled) & storages(g.outputs)


def test_a_view_of_an_input_laid_out_otherwise_is_a_copy_with_the_right_values() -> None:
    g = captured(lambda x: x[0], torch.zeros(2, 3))
    x = torch.randn(3, 2).t()  # same shape, transposed strides: the captured view would point elsewhere
    out = g.replay_cloned([x])
    assert torch.equal(out, x[0]) and out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()


def test_a_static_input_returned_by_the_graph_keeps_its_address_across_replays() -> None:
    anchors = torch.randn(4)  # a module attribute read in place (no placeholder), returned as `.to()` returns it

    def fn(a: torch.Tensor):
        return a, a * 2

    graph = RecomputingGraph(fn, [anchors], fn(anchors))
    g = CapturedGraph(graph, [anchors], [], graph.static_outputs, capture_ms=0.0, pool_growth=0)  # type: ignore[arg-type]
    for _ in range(3):
        out = g.replay_cloned([anchors])
        assert out[0] is anchors and torch.equal(out[1], anchors * 2)


def test_several_inputs_are_loaded_in_one_multi_tensor_launch(monkeypatch) -> None:
    calls = []
    real = torch._foreach_copy_
    monkeypatch.setattr(torch, "_foreach_copy_", lambda dst, src, **kw: calls.append(len(dst)) or real(dst, src, **kw))
    static_in = [torch.zeros(2), torch.zeros(3, dtype=torch.int64), torch.zeros(4)]
    graph = RecomputingGraph(lambda a, b, c: a.sum() + b.sum() + c.sum(), static_in, torch.zeros(()))
    g = CapturedGraph(graph, static_in, [0, 1, 2], graph.static_outputs, capture_ms=0.0, pool_growth=0)  # type: ignore[arg-type]
    a, b = torch.randn(2), torch.arange(3)
    with torch.no_grad():
        out = g.replay_cloned([a, b, static_in[2]])  # the third is the buffer itself: not copied onto itself
    assert calls == [2] and torch.equal(out, a.sum() + b.sum())
    a.requires_grad_()
    out = g.replay_cloned([a, b, static_in[2]])  # in grad mode: a copy each (foreach has no autograd formula)
    assert calls == [2] and torch.equal(out, a.sum() + b.sum())


def test_a_graph_holds_its_pool_share_and_its_input_buffers() -> None:
    from launchless.core.cache import graph_bytes

    static_in = [torch.zeros(8, 3), torch.zeros(8, dtype=torch.int64), torch.zeros(5)]
    graph = RecomputingGraph(lambda x, ids, w: x * 2, static_in, torch.zeros(8, 3))
    # the third leaf is read in place (a parameter the compiler hands over): not a buffer of the graph's own
    g = CapturedGraph(graph, static_in, [0, 1], graph.static_outputs, capture_ms=0.0, pool_growth=4096)  # type: ignore[arg-type]
    assert g.input_bytes == 8 * 3 * 4 + 8 * 8
    assert g.held_bytes == graph_bytes(g) == 4096 + g.input_bytes


def test_a_call_padded_to_a_bucket_fills_only_its_rows_of_the_input_buffers() -> None:
    def fn(x: torch.Tensor, ids: torch.Tensor):
        return x * 2 + ids[:, None]

    static_in = [torch.zeros(8, 3), torch.zeros(8, dtype=torch.int64)]
    graph = RecomputingGraph(fn, static_in, fn(*static_in))
    g = CapturedGraph(graph, static_in, [0, 1], graph.static_outputs, capture_ms=0.0, pool_growth=0)  # type: ignore[arg-type]
    full = [torch.randn(8, 3), torch.arange(8)]
    g.replay([t.clone() for t in full])
    x, ids = torch.randn(5, 3), torch.arange(5) + 10
    with torch.no_grad():
        out = g.replay_cloned([x, ids], rows=5)
    assert torch.equal(out[:5], x * 2 + ids[:, None])
    assert torch.equal(out[5:], full[0][5:] * 2 + full[1][5:, None])  # the other rows keep the earlier call's inputs


@pytest.mark.parametrize("enabled", [True, False])
def test_no_collection_during_a_capture_and_the_collector_is_left_as_found(enabled: bool) -> None:
    import gc

    from launchless.core.capture import _no_cyclic_gc

    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        with _no_cyclic_gc():
            assert not gc.isenabled()
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


# ---- a forward that writes into its input: the replay's write copied back into the caller's tensor --------------


def halves_its_input(x: torch.Tensor) -> torch.Tensor:
    x.mul_(0.5)
    return x + 1


def test_an_input_the_forward_writes_gets_the_replays_write_as_eager_leaves_it() -> None:
    example = torch.zeros(4)
    g = captured(halves_its_input, example)  # the stand-in's first run wrote the static copy: restore it
    g.written = (0,)
    x = torch.randn(4)
    want_x, mine = x * 0.5, x.clone()
    out = g.replay_cloned([x])
    assert torch.equal(x, want_x) and torch.equal(out, want_x + 1)
    assert torch.equal(mine * 0.5 + 1, out)
    bucket = torch.randn(4)
    call = bucket[:3].clone()
    g.replay_cloned([call], rows=3)  # a call padded to a bucket: only its rows come back
    assert torch.equal(call, bucket[:3] * 0.5)


def test_written_inputs_are_refused_without_write_back_or_where_they_share_memory() -> None:
    from launchless.core.capture import CaptureFailed, _written_slots

    a, b = torch.randn(4), torch.randn(4)
    assert _written_slots([a, b], [0, 1], [0, 0], [0, 0], write_back=False) == ()
    with pytest.raises(CaptureFailed, match="writes into its own input in place"):
        _written_slots([a, b], [0, 1], [0, 0], [1, 0], write_back=False)
    assert _written_slots([a, b], [0, 1], [0, 0], [1, 0], write_back=True) == (0,)
    with pytest.raises(CaptureFailed, match="shares memory with another input"):
        _written_slots([a, a[1:]], [0, 1], [0, 0], [1, 0], write_back=True)
    empty = torch.empty(0)
    assert _written_slots([empty, torch.empty(0)], [0, 1], [0, 0], [1, 0], write_back=True) == (0,)
    # a CPU tensor given to a GPU graph: the graph would write it once, at capture, never on replay
    with pytest.raises(CaptureFailed, match="writes in place into a CPU tensor"):
        _written_slots([a, b], [0, 1], [0, 0], [0, 1], write_back=True, host=frozenset({1}))
    assert _written_slots([a, b], [0, 1], [0, 0], [1, 0], write_back=True, host=frozenset({1})) == (0,)
