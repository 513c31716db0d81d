"""Decode graphs for generate(), on the CPU: the cache lengths, the refusals and their messages, and the whole path
-- static cache, routed forward, capture, verification from the same cache state, replay -- with a stand-in for the
CUDA graph that recomputes the captured function on its static inputs (``recomputing_graph``; the library itself
never captures on a CPU; ``test_cuda_decoding`` runs the real graphs)."""

from __future__ import annotations

import logging
import types

import pytest
import torch
from torch.utils import _pytree as pytree

transformers = pytest.importorskip("transformers")

from cache_writers import writes_twice_where_static  # noqa: E402
from recomputing_graph import recorded_capture  # noqa: E402

import launchless.runtime.cache_layers as cache_layers  # noqa: E402
import launchless.runtime.decode_graphs as decoding  # noqa: E402
import launchless.runtime.decode_steps as decode_steps  # noqa: E402
import launchless.runtime.loop_proofs as loop_proofs  # noqa: E402
import launchless.runtime.static_cache as static_cache  # noqa: E402
import launchless.runtime.static_caches as static_caches  # noqa: E402
from launchless import CaptureError  # noqa: E402
from launchless.core.capture import CaptureFailed  # noqa: E402
from launchless.core.status import Stage  # noqa: E402
from launchless.runtime.decode_graphs import DecodeGraphs, static_cache_refusal  # noqa: E402
from launchless.runtime.static_cache import cache_length, new_static_cache  # noqa: E402

NEW_TOKENS = 6


@pytest.fixture(autouse=True)
def one_thread():
    """Models this small decode fastest on one CPU thread: bfloat16 kernels sharing a busy machine's cores wait on
    each other (milliseconds a matmul)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_llama() -> tuple[torch.nn.Module, dict]:
    config = transformers.LlamaConfig(
        vocab_size=100,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        bos_token_id=None,
        eos_token_id=None,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 100, (2, 5), generator=torch.Generator().manual_seed(1))
    return model, {"input_ids": ids, "attention_mask": torch.ones_like(ids), "max_new_tokens": NEW_TOKENS}


def decode_graphs(model: torch.nn.Module, **options) -> DecodeGraphs:
    settings = dict(explicit=False, capture_after=2, max_graphs=4, warmup=3, verify="on", tolerance_ulps=64.0)
    return DecodeGraphs(steps=decode_steps.DecodeSteps(model, name="LlamaForCausalLM", **(settings | options)))


def eager_static(model: torch.nn.Module, request: dict, **extra) -> torch.Tensor:
    """Eager generate() on a static cache of the length decode graphs use."""
    length = cache_length(request["input_ids"].shape[1] + request["max_new_tokens"])
    cache = new_static_cache(model, batch=request["input_ids"].shape[0], length=length)
    extra = {static_cache.cache_keyword(model): cache, "do_sample": False} | extra
    return model.generate(**(request | extra), disable_compile=True)


class NewerForward(torch.nn.Module):  # newer transformers: one name for every cache
    def forward(self, input_ids, cache=None, past_key_values=None): ...


class OlderForward(torch.nn.Module):
    def forward(self, input_ids, past_key_values=None, cache_params=None): ...


class MambaForward(torch.nn.Module):  # Mamba-style models before the rename
    def forward(self, input_ids, cache_params=None): ...


@pytest.mark.parametrize(
    ("module", "keyword"),
    [(NewerForward(), "cache"), (OlderForward(), "past_key_values"), (MambaForward(), "cache_params")],
)
def test_the_cache_goes_by_the_keyword_the_forward_takes(module: torch.nn.Module, keyword: str) -> None:
    assert static_cache.cache_keyword(module) == keyword
    assert static_cache.given_cache({keyword: "given"}) == "given"


@pytest.mark.parametrize(("needed", "length"), [(1, 64), (5, 64), (64, 64), (65, 128), (191, 256), (1000, 1024)])
def test_the_cache_length_is_the_power_of_two_that_holds_the_generation(needed: int, length: int) -> None:
    assert cache_length(needed) == length


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"num_beams": 4}, "beam search (num_beams=4) reorders the cache"),
        ({"use_cache": False}, "use_cache=False runs the whole sequence again at every step"),
        ({"prompt_lookup_num_tokens": 3}, "assisted decoding crops the cache"),
        ({"cache_implementation": "offloaded"}, "cache_implementation='offloaded' was asked for"),
        ({"past_key_values": "dynamic"}, "a cache of type DynamicCache was passed in; pass none"),
    ],
)
def test_what_decodes_eager_is_named(kwargs: dict, says: str) -> None:
    model, _ = tiny_llama()
    if kwargs.get("past_key_values") == "dynamic":
        kwargs = {"past_key_values": transformers.DynamicCache()}
    assert says in static_cache_refusal(model, kwargs)
    assert static_cache_refusal(model, {}) is None


def unvouched_llama() -> tuple[torch.nn.Module, dict]:
    """A tiny Llama whose class does not tell transformers it runs on a static cache (as BERT's or Mamba's)."""
    model, request = tiny_llama()
    model._can_compile_fullgraph = False
    return model, request


def fresh(request: dict, seed: int, *, pads: int = 0) -> dict:
    """The request with new prompt ids, its first row's first ``pads`` positions padded."""
    ids = torch.randint(1, 100, request["input_ids"].shape, generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    mask[0, :pads] = 0
    return dict(request, input_ids=ids.masked_fill(mask == 0, 0), attention_mask=mask, pad_token_id=0)


@pytest.mark.parametrize("grad_mode", [torch.no_grad, torch.inference_mode])
def test_a_class_that_does_not_vouch_for_the_static_cache_decodes_through_graphs_once_proven(
    monkeypatch, grad_mode
) -> None:
    """The first call of each class (here: unpadded, then left-padded) decodes both ways and hands out generate()'s
    own tokens; later calls of a proven class replay the decode graphs, with generate()'s tokens on fresh prompts."""
    captures: list = []
    monkeypatch.setattr(decode_steps, "capture", recorded_capture(captures))
    model, request = unvouched_llama()
    graphs = decode_graphs(model)
    with grad_mode():
        for seed, pads in [(0, 0), (1, 0), (2, 0), (3, 2), (4, 3)]:
            call = fresh(request, seed, pads=pads)
            assert torch.equal(graphs.generate(model, (), dict(call)), model.generate(**call)), (seed, pads)
    info = graphs.info()
    assert [(c["left_padded"], c["proof"]) for c in info["cache_classes"]] == [(False, "proven"), (True, "proven")]
    assert info["generations_eager"] == {} and info["steps_replayed"] > 0 and captures, info
    assert info["generate_calls"] == 3, info  # the two proofs decoded eager: on the static cache, and as called


def test_a_class_whose_static_cache_parts_from_its_own_generate_goes_through_generate_with_one_warning(
    monkeypatch, caplog
) -> None:
    """A class that reads a static cache otherwise than its own (here: a hook that favours token 7 when the cache
    is static) parts at its class's first call: the caller gets generate()'s own tokens, every time, with one
    WARNING that says where the two parted; cuda_graph=True raises naming it."""
    monkeypatch.setattr(decode_steps, "capture", recorded_capture([]))
    model, request = unvouched_llama()
    keyword = static_cache.cache_keyword(model)

    def reads_static_otherwise(module, args, kwargs, output):
        if isinstance(kwargs.get(keyword), transformers.StaticCache):
            output.logits[..., 7] += 1e4
        return output

    model.register_forward_hook(reads_static_otherwise, with_kwargs=True)
    graphs = decode_graphs(model)
    single = {k: v[:1] if isinstance(v, torch.Tensor) else v for k, v in fresh(request, 0).items()}
    got, expected = RecordingStreamer(), RecordingStreamer()
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="launchless"):
        first = graphs.generate(model, (), dict(single, streamer=got))
        assert torch.equal(first, model.generate(**single, streamer=expected))
        assert got.puts == expected.puts and got.ended  # the streamer got generate()'s tokens alone
        for seed in (1, 2):
            assert torch.equal(graphs.generate(model, (), fresh(request, seed)), model.generate(**fresh(request, seed)))
    lines = [r.getMessage() for r in caplog.records if "static cache" in r.getMessage()]
    assert len(lines) == 2, lines  # one a class: batch 1, then batch 2
    assert "does not tell transformers it runs on a static cache" in lines[0], lines
    assert "batch 1, unpadded, greedy" in lines[0] and "row 0 at new token 1 (of 6)" in lines[0], lines
    info = graphs.info()
    assert [(c["batch"], c["proof"]) for c in info["cache_classes"]] == [(1, "parted"), (2, "parted")], info
    assert sum(info["generations_eager"].values()) == 3 and info["generate_calls"] == 0, info  # nothing replayed
    parted = r"parted from generate\(\) as called for .*: row 0 at new"
    with torch.no_grad(), pytest.raises(CaptureError, match=parted):
        decode_graphs(model, explicit=True).generate(model, (), fresh(request, 0))


def test_calls_known_to_go_through_generate_as_called_are_not_read_again(monkeypatch) -> None:
    """A class that goes through generate() as called (refused, or parted on the static cache) costs no more than
    generate(): a call like one already decided (arguments of the same shapes and values, the model as it was) is
    handed to generate() without resolving its settings again; another value, padding or a config changed in place
    is read again -- and every call's tokens are generate()'s own."""
    readings: list[int] = []
    settings_of = decoding.settings_of
    monkeypatch.setattr(decoding, "settings_of", lambda *a, **k: readings.append(1) or settings_of(*a, **k))
    monkeypatch.setattr(decode_steps, "capture", recorded_capture([]))
    model, request = unvouched_llama()
    writes_twice_where_static(model)  # the static cache parts from generate() as called: every class goes as called
    graphs = decode_graphs(model)
    calls = [
        (fresh(request, 0), 1),  # the class's first call: proven (and parted) on the static cache
        (fresh(request, 1), 0),  # like it: not read again
        (fresh(request, 2), 0),
        (fresh(request, 3, pads=2), 1),  # left-padded: another class of an unvouched model
        (fresh(request, 4, pads=1), 0),
        (dict(fresh(request, 5), max_new_tokens=NEW_TOKENS + 1), 1),  # another value
        (dict(fresh(request, 6), use_cache=False), 1),  # refused: generate() as called, the reason remembered
        (dict(fresh(request, 7), use_cache=False), 0),
    ]
    with torch.no_grad():
        for i, (call, read) in enumerate(calls):
            before = len(readings)
            assert torch.equal(graphs.generate(model, (), dict(call)), model.generate(**call)), i
            assert len(readings) - before == read, i
        model.generation_config.repetition_penalty = 1.5  # a config changed in place: read again
        before = len(readings)
        call = fresh(request, 8)
        assert torch.equal(graphs.generate(model, (), dict(call)), model.generate(**call))
        assert len(readings) - before == 1
        model.train()  # refused in training mode; once back in eval mode, read again
        for seed, read in [(9, 1), (10, 0)]:
            before = len(readings)
            graphs.generate(model, (), fresh(request, seed))
            assert len(readings) - before == read, seed
        model.eval()
        before = len(readings)
        graphs.generate(model, (), fresh(request, 11))
        assert len(readings) - before == 1
    info = graphs.info()
    assert info["steps_replayed"] == 0 and sum(info["generations_eager"].values()) == len(calls) + 4, info


@pytest.mark.parametrize(("new_tokens", "says"), [
    (6, "its attention layers hold [20, 10] positions after the generation, not one length"),
    (40, "StaticCacheOverflow: layer 0 of the static cache would be written past its end"),
])  # fmt: skip
def test_a_class_that_writes_the_static_cache_otherwise_goes_through_generate_naming_it(
    monkeypatch, caplog, new_tokens: int, says: str
) -> None:
    """Within the cache's length the layers' lengths part; past it the write is stopped on the host before it is
    made (on the GPU it would be a device-side assert, fatal to the process). Either way the call and its class
    decode through generate() as called, with one WARNING naming it."""
    monkeypatch.setattr(decode_steps, "capture", recorded_capture([]))
    model, request = unvouched_llama()
    writes_twice_where_static(model)
    request = dict(request, max_new_tokens=new_tokens)
    graphs = decode_graphs(model)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="launchless"):
        for seed in (0, 1):
            assert torch.equal(graphs.generate(model, (), fresh(request, seed)), model.generate(**fresh(request, seed)))
    lines = [r.getMessage() for r in caplog.records if "static cache" in r.getMessage()]
    assert len(lines) == 1 and says in lines[0], lines
    assert graphs.info()["steps_replayed"] == 0 and "forward" not in model.__dict__


@pytest.mark.parametrize("grad_mode", [torch.no_grad, torch.inference_mode])
def test_decode_steps_replay_one_verified_graph_and_give_eager_static_tokens(monkeypatch, grad_mode) -> None:
    captures: list = []
    monkeypatch.setattr(decode_steps, "capture", recorded_capture(captures))
    model, request = tiny_llama()
    with grad_mode():
        reference = eager_static(model, request)
        graphs = decode_graphs(model)
        first = graphs.generate(model, (), dict(request))
        second = graphs.generate(model, (), dict(request))  # the same cache, emptied in place; the same graph
    assert torch.equal(first, reference) and torch.equal(second, reference)
    assert "forward" not in model.__dict__  # the model's own forward is back
    info = graphs.info()
    # the first call proves the host-ahead loop against generate()'s own (both decode it); the second runs the loop
    assert info["proofs"] == 1 and info["loop_generations"] == 1 and info["loop_exact_inputs"] == 0, info
    assert [c["proof"] for c in info["classes"]] == ["proven"], info["classes"]
    assert len(captures) == 1 and len(info["graphs"]) == 1, info
    steps = NEW_TOKENS - 1  # the first new token comes from the prompt's forward
    assert info["prefills"] == 3 and info["steps_replayed"] == 3 * steps - 1, info  # the first step waited
    assert info["steps_eager"] == {"captured once seen 2 times": 1}, info
    verification = info["graphs"][0]["verification"]
    assert verification["status"] == "bit-identical" and verification["probes_differ"], verification
    config = model.config
    head_dim = config.hidden_size // config.num_attention_heads
    kv_bytes = 2 * 2 * config.num_key_value_heads * 64 * head_dim * 4  # keys and values of 2 sequences, float32
    counter_bytes = 8  # the length written so far, an int64 on the device
    assert info["static_caches"] == [
        {
            "batch": 2,
            "length": 64,
            "inference_mode": grad_mode is torch.inference_mode,
            "dtype": "float32",
            "bytes": config.num_hidden_layers * (kv_bytes + counter_bytes),
        }
    ]


def test_a_step_too_near_the_caches_end_for_the_warm_up_steps_decodes_eager(monkeypatch) -> None:
    """A prompt that nearly fills its static cache: a capture's warm-up steps would write past the cache's end (on the
    GPU a device-side assert, fatal to the process), so that step decodes eager, saying why."""
    monkeypatch.setattr(decode_steps, "capture", recorded_capture([]))
    model, _ = tiny_llama()
    ids = torch.randint(0, 100, (1, 61), generator=torch.Generator().manual_seed(3))
    request = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "max_new_tokens": 3}  # 64 positions
    graphs = decode_graphs(model)
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(graphs.generate(model, (), dict(request)), eager_static(model, request))
    steps = graphs.info()["steps_eager"]
    assert steps.get("too near the static cache's end to capture", 0) >= 2, steps


def test_inference_mode_and_no_grad_each_get_their_own_cache(monkeypatch) -> None:
    monkeypatch.setattr(decode_steps, "capture", recorded_capture([]))
    model, request = tiny_llama()
    reference = eager_static(model, request)
    graphs = decode_graphs(model)
    with torch.inference_mode():
        assert torch.equal(graphs.generate(model, (), dict(request)), reference)
    with torch.no_grad():  # inference tensors cannot be written here: a cache of ordinary tensors
        assert torch.equal(graphs.generate(model, (), dict(request)), reference)
    assert [c["inference_mode"] for c in graphs.info()["static_caches"]] == [True, False]


def test_sampling_draws_the_numbers_eager_draws(monkeypatch) -> None:
    monkeypatch.setattr(decode_steps, "capture", recorded_capture([]))
    model, request = tiny_llama()
    torch.manual_seed(7)
    reference = eager_static(model, request, do_sample=True)
    graphs = decode_graphs(model)
    torch.manual_seed(7)
    sampled = graphs.generate(model, (), dict(request, do_sample=True))
    assert torch.equal(sampled, reference) and not torch.equal(sampled, eager_static(model, request))
    assert graphs.info()["steps_replayed"] > 0


def test_a_graph_that_replays_stale_values_is_refused_and_decoding_stays_exact(monkeypatch, caplog) -> None:
    def stale_capture(fn, flat, *, device, pool, warmup=3, **_):
        graph = recorded_capture([])(fn, flat, device=device, pool=pool, warmup=warmup)
        graph.graph.replay = lambda: None  # replays nothing: the outputs of the capture, whatever the tokens
        return graph

    monkeypatch.setattr(decode_steps, "capture", stale_capture)
    model, request = tiny_llama()
    reference = eager_static(model, request)
    graphs = decode_graphs(model)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="launchless"):
        tokens = graphs.generate(model, (), dict(request))
    assert torch.equal(tokens, reference)
    info = graphs.info()
    assert info["graphs"] == [] and info["steps_replayed"] == 0, info
    (fallback,) = info["fallbacks"]
    assert fallback["stage"] == "verification" and "differs from eager" in fallback["reason"], fallback
    assert any("a decode step is not replayed as a graph" in r.getMessage() for r in caplog.records)


def test_the_models_forward_is_put_back_when_generate_raises(monkeypatch) -> None:
    monkeypatch.setattr(decode_steps, "capture", recorded_capture([]))
    model, request = tiny_llama()
    own = model.forward
    model.forward = own  # an instance's own forward, set by the user
    graphs = decode_graphs(model)
    with pytest.raises(ValueError):
        graphs.generate(model, (), dict(request, max_new_tokens=-1))
    assert model.__dict__["forward"] is own


def test_a_cache_that_keeps_host_side_state_is_refused_by_name(monkeypatch) -> None:
    from transformers import cache_utils

    update = cache_utils.StaticLayer.update

    def counting_update(self, *args, **kwargs):
        self.updates = getattr(self, "updates", 0) + 1  # host state a graph would not advance
        return update(self, *args, **kwargs)

    monkeypatch.setattr(cache_utils.StaticLayer, "update", counting_update)
    monkeypatch.setattr(decode_steps, "capture", recorded_capture([]))
    model, request = tiny_llama()
    reference = eager_static(model, request)
    graphs = decode_graphs(model)
    with torch.no_grad():
        assert torch.equal(graphs.generate(model, (), dict(request)), reference)
    (fallback,) = graphs.info()["fallbacks"]
    assert "changes the cache's host-side state (layers[0].updates, layers[1].updates)" in fallback["reason"]
    assert "cannot be made static" in fallback["reason"]


def test_the_wrapper_generates_as_the_model_does_off_the_gpu() -> None:
    import launchless

    model, request = tiny_llama()
    wrapped = launchless.wrap(model)
    assert torch.equal(wrapped.generate(**request), model.generate(**request))
    assert wrapped.graph_info()["decode"] is None  # nothing was captured, nothing pretended


def test_a_cache_given_new_tensors_gets_its_graph_captured_again(monkeypatch, caplog) -> None:
    captures: list = []
    monkeypatch.setattr(decode_steps, "capture", recorded_capture(captures))
    model, request = tiny_llama()
    reference = eager_static(model, request)
    graphs = decode_graphs(model)
    with torch.no_grad():
        graphs.generate(model, (), dict(request))
        (cache,) = graphs._caches.held()
        for layer in cache.layers:  # what a library that reallocates its cache does: same values, new memory
            layer.keys, layer.values = layer.keys.clone(), layer.values.clone()
        with caplog.at_level(logging.INFO, logger="launchless"):
            assert torch.equal(graphs.generate(model, (), dict(request)), reference)
    assert len(captures) == 2 and len(graphs.info()["graphs"]) == 1
    assert any("holds other tensors than its decode graph was captured on" in r.getMessage() for r in caplog.records)


def test_the_static_cache_recipe_already_set_on_the_model_is_taken_over(monkeypatch) -> None:
    monkeypatch.setattr(decode_steps, "capture", recorded_capture([]))
    model, request = tiny_llama()
    reference = eager_static(model, request)
    plain = transformers.GenerationConfig.from_model_config(model.config)  # the caller's own, without the recipe
    model.generation_config.cache_implementation = "static"  # transformers' recipe, set before wrapping
    graphs = decode_graphs(model)
    with torch.no_grad():
        assert torch.equal(graphs.generate(model, (), dict(request)), reference)
        # transformers fills what a caller's config leaves unset from the model's, the recipe's cache included
        assert torch.equal(graphs.generate(model, (), dict(request, generation_config=plain)), reference)
    assert graphs.info()["steps_replayed"] > 0 and graphs.info()["generations_eager"] == {}


def test_graphs_evicted_for_callers_caches_let_those_caches_go(monkeypatch) -> None:
    import weakref

    monkeypatch.setattr(decode_steps, "capture", recorded_capture([]))
    model, request = tiny_llama()
    reference = eager_static(model, request)
    graphs = decode_graphs(model, max_graphs=2)
    given = []
    with torch.no_grad():
        for _ in range(4):  # a new cache of the caller's each time: a new graph each time
            cache = new_static_cache(model, batch=2, length=64)
            given.append(weakref.ref(cache))
            keyword = static_cache.cache_keyword(model)
            assert torch.equal(graphs.generate(model, (), dict(request, **{keyword: cache})), reference)
            del cache
    assert len(graphs.info()["graphs"]) == 2
    assert [ref() is None for ref in given] == [True, True, False, False]  # only the graphs held keep theirs


def test_a_new_cache_never_takes_the_key_of_a_freed_one() -> None:
    """A cache made where a freed one was can have its id(); its graphs' keys must still be new, or the cache would
    read as an evicted shape coming back and stop evicting (the flake this test pins down)."""
    model, _ = tiny_llama()
    graphs = decode_graphs(model)
    seen, ids = set(), set()
    for _ in range(20):
        cache = new_static_cache(model, batch=1, length=64)
        serial = graphs.steps.serial(cache)
        assert serial == graphs.steps.serial(cache) and serial not in seen
        seen.add(serial)
        ids.add(id(cache))
        del cache
    assert len(seen) == 20  # whether or not ids came back (len(ids) may be smaller)


def test_threads_generating_at_once_each_get_eager_static_tokens(monkeypatch) -> None:
    import threading

    monkeypatch.setattr(decode_steps, "capture", recorded_capture([]))
    model, request = tiny_llama()
    reference = eager_static(model, request)
    dynamic = model.generate(**request)  # plain generate(), as a thread that does not go through the wrapper
    graphs = decode_graphs(model)
    results: dict[str, list] = {"wrapped": [], "plain": []}
    errors: list[BaseException] = []

    def run(kind: str) -> None:
        try:
            with torch.no_grad():
                for _ in range(3):
                    if kind == "wrapped":
                        results[kind].append(graphs.generate(model, (), dict(request)))
                    else:  # model.generate while the wrapper routes the forward: the caller's own cache, eager
                        results[kind].append(model.generate(**request))
        except BaseException as exc:  # reported below, from the main thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(kind,)) for kind in ("wrapped", "wrapped", "plain")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(results["wrapped"]) == 6 and all(torch.equal(t, reference) for t in results["wrapped"])
    assert len(results["plain"]) == 3 and all(torch.equal(t, dynamic) for t in results["plain"])
    assert "forward" not in model.__dict__


def test_a_model_converted_between_calls_gets_a_cache_of_its_new_dtype(monkeypatch) -> None:
    monkeypatch.setattr(decode_steps, "capture", recorded_capture([]))
    model, request = tiny_llama()
    graphs = decode_graphs(model)
    with torch.no_grad():
        graphs.generate(model, (), dict(request))
        model.double()  # the float32 cache's keys could not take the model's float64 ones
        assert torch.equal(graphs.generate(model, (), dict(request)), eager_static(model, request))
    assert [c["dtype"] for c in graphs.info()["static_caches"]] == ["float32", "float64"]


# ---- the host-ahead loop (launchless.runtime.decode_loop) ---------------------------------------------------------
from streamers import RecordingStreamer  # noqa: E402

from launchless.runtime import decode_loop  # noqa: E402


def loop_info(graphs: DecodeGraphs) -> tuple[int, dict]:
    info = graphs.info()
    return info["loop_generations"], info["through_generate"]


def test_the_host_reads_the_device_as_often_for_fifty_tokens_as_for_twenty(monkeypatch) -> None:
    """Without an end-of-sequence token or a streamer the loop never waits for the device after the second step:
    the reads of device values (bool, item, cpu, tolist) do not grow with the number of tokens."""
    monkeypatch.setattr(decode_steps, "capture", recorded_capture([]))
    model, request = tiny_llama()
    graphs = decode_graphs(model)
    reads = {"n": 0}

    def counted(name):
        original = getattr(torch.Tensor, name)

        def read(self, *args, **kwargs):
            reads["n"] += 1
            return original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, read)

    counts = []
    with torch.no_grad():
        graphs.generate(model, (), dict(request, max_new_tokens=50))  # captured and verified here
        for name in ("__bool__", "item", "cpu", "tolist"):
            counted(name)
        for new in (20, 50):  # one cache length (64): one graph
            reads["n"] = 0
            graphs.generate(model, (), dict(request, max_new_tokens=new))
            counts.append(reads["n"])
    monkeypatch.undo()
    assert counts[0] == counts[1], counts
    assert loop_info(graphs)[0] == 2  # the first call was the proof


def test_end_of_sequence_tokens_pad_and_stop_the_loop_as_they_stop_generate(monkeypatch) -> None:
    monkeypatch.setattr(decode_steps, "capture", recorded_capture([]))
    model, request = tiny_llama()
    request = dict(request, max_new_tokens=40)
    prompt = request["input_ids"].shape[1]
    plain = eager_static(model, request)
    eos = [int(plain[0, prompt + 2]), int(plain[1, prompt + 4])]  # row 0 ends first, row 1 two steps later
    reference = eager_static(model, request, eos_token_id=eos)
    assert reference.shape[1] < prompt + 40  # generate() stopped early: the loop ran past the end and dropped it
    graphs = decode_graphs(model)
    with torch.no_grad():
        for _ in range(3):  # the proof, then the loop twice
            assert torch.equal(graphs.generate(model, (), dict(request, eos_token_id=eos)), reference)
    assert loop_info(graphs) == (2, {})


@pytest.mark.parametrize(
    "sampling",
    [{}, {"temperature": 0.7}, {"top_k": 5}, {"top_p": 0.8}, {"temperature": 1.3, "top_k": 20, "top_p": 0.9}],
)
def test_sampling_in_the_loop_draws_what_generate_draws_and_leaves_the_generator_where_it_would(
    monkeypatch, sampling
) -> None:
    monkeypatch.setattr(decode_steps, "capture", recorded_capture([]))
    model, request = tiny_llama()
    request = dict(request, max_new_tokens=40, eos_token_id=list(range(25)), **sampling)
    torch.manual_seed(3)
    reference = eager_static(model, request, do_sample=True)
    after = torch.get_rng_state()
    assert reference.shape[1] < request["input_ids"].shape[1] + 40  # ended early: the loop drew past the end
    graphs = decode_graphs(model)
    with torch.no_grad():
        for _ in range(2):  # the proof, then the loop
            torch.manual_seed(3)
            assert torch.equal(graphs.generate(model, (), dict(request, do_sample=True)), reference)
            assert torch.equal(torch.get_rng_state(), after)
    assert loop_info(graphs) == (1, {})


def test_a_streamer_gets_from_the_loop_what_generate_hands_it(monkeypatch) -> None:
    monkeypatch.setattr(decode_steps, "capture", recorded_capture([]))
    model, request = tiny_llama()
    request = dict(request, max_new_tokens=40)
    expected = RecordingStreamer()
    eager_static(model, request, streamer=expected)
    graphs = decode_graphs(model)
    for _ in range(2):  # the proof (generate()'s own loop streams), then the loop
        got = RecordingStreamer()
        with torch.no_grad():
            graphs.generate(model, (), dict(request, streamer=got))
        assert got.puts == expected.puts and got.ended and len(got.puts) == 41
    assert loop_info(graphs) == (1, {})


def test_left_padded_prompts_decode_in_the_loop_as_in_generate(monkeypatch) -> None:
    monkeypatch.setattr(decode_steps, "capture", recorded_capture([]))
    model, request = tiny_llama()
    mask = request["attention_mask"].clone()
    mask[1, :2] = 0  # the second prompt is three tokens, padded on the left
    request = dict(request, attention_mask=mask, pad_token_id=0, max_new_tokens=20)
    reference = eager_static(model, request)
    graphs = decode_graphs(model)
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(graphs.generate(model, (), dict(request)), reference)
    assert loop_info(graphs) == (1, {}) and graphs.info()["loop_exact_inputs"] == 0


def test_inputs_the_loop_would_advance_wrongly_are_taken_from_transformers_with_one_line(monkeypatch, caplog) -> None:
    monkeypatch.setattr(decode_steps, "capture", recorded_capture([]))
    advance = decode_loop._advance

    def forgetful(inputs, chosen, *, column):  # the new position never attended: a rule transformers disagrees with
        advance(inputs, chosen, column=column)
        inputs["attention_mask"].select(-1, column).fill_(False)

    monkeypatch.setattr(decode_loop, "_advance", forgetful)
    model, request = tiny_llama()
    reference = eager_static(model, request)
    graphs = decode_graphs(model)
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="launchless"):
        for _ in range(2):  # the proof's loop and the loop: each takes transformers' inputs
            assert torch.equal(graphs.generate(model, (), dict(request)), reference)
    assert graphs.info()["loop_exact_inputs"] == 2 and graphs.info()["classes"][0]["proof"] == "proven"
    lines = [r.getMessage() for r in caplog.records if "differ from transformers'" in r.getMessage()]
    assert len(lines) == 1 and "its 'attention_mask' differs" in lines[0], lines


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ({"repetition_penalty": 1.3}, "the generation settings ask for repetition_penalty=1.3"),
        ({"min_new_tokens": 3}, "the generation settings ask for min_new_tokens=3"),
        ({"output_scores": True, "return_dict_in_generate": True}, "output_scores=True"),
        ({"logits_processor": "list"}, "generate() was given logits_processor"),
        ({"num_return_sequences": 2, "do_sample": True}, "num_return_sequences=2"),
    ],
)
def test_calls_the_loop_cannot_decode_exactly_go_through_generate_with_one_line(
    monkeypatch, caplog, extra, says
) -> None:
    monkeypatch.setattr(decode_steps, "capture", recorded_capture([]))
    model, request = tiny_llama()
    if extra.get("logits_processor") == "list":
        extra = dict(extra, logits_processor=transformers.LogitsProcessorList())
    torch.manual_seed(0)
    reference = eager_static(model, request, **extra)
    graphs = decode_graphs(model)
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="launchless"):
        for _ in range(2):
            torch.manual_seed(0)
            got = graphs.generate(model, (), dict(request, **extra))
    expected = reference.sequences if hasattr(reference, "sequences") else reference
    assert torch.equal(got.sequences if hasattr(got, "sequences") else got, expected)
    loops, why = loop_info(graphs)
    assert loops == 0 and len(why) == 1 and says in next(iter(why)), why
    assert sum("decodes through transformers' own loop" in r.getMessage() for r in caplog.records) == 1


def test_a_model_class_that_decodes_its_own_way_goes_through_its_generate(monkeypatch) -> None:
    monkeypatch.setattr(decode_steps, "capture", recorded_capture([]))

    class OwnUpdate(transformers.LlamaForCausalLM):
        def _update_model_kwargs_for_generation(self, outputs, model_kwargs, **kwargs):  # e.g. rope deltas
            return super()._update_model_kwargs_for_generation(outputs, model_kwargs, **kwargs)

    model, request = tiny_llama()
    model.__class__ = OwnUpdate
    reference = eager_static(model, request)
    graphs = decode_graphs(model)
    with torch.no_grad():
        assert torch.equal(graphs.generate(model, (), dict(request)), reference)
    loops, why = loop_info(graphs)
    assert loops == 0 and list(why) == ["OwnUpdate overrides generate()'s _update_model_kwargs_for_generation"], why
    assert graphs.info()["steps_replayed"] > 0


@pytest.mark.parametrize(
    ("made_under", "decoded_under"), [("inference_mode", "no_grad"), ("no_grad", "inference_mode")]
)
def test_a_prompt_made_under_one_grad_mode_decodes_in_the_loop_under_the_other(
    monkeypatch, made_under: str, decoded_under: str
) -> None:
    monkeypatch.setattr(decode_steps, "capture", recorded_capture([]))
    modes = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}
    model, request = tiny_llama()
    reference = eager_static(model, request)
    with modes[made_under]():
        request = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in request.items()}
    graphs = decode_graphs(model)
    with modes[decoded_under]():
        for _ in range(3):
            assert torch.equal(graphs.generate(model, (), dict(request)), reference)
    assert loop_info(graphs) == (2, {}) and graphs.info()["steps_replayed"] > 0


@pytest.mark.parametrize("length", [{}, {"max_length": 12}], ids=["unset", "max_length"])
def test_a_call_without_max_new_tokens_stops_where_generate_stops(monkeypatch, length: dict) -> None:
    """Unset, the length is transformers' default taken as new tokens after the prompt (filled in at generate():
    the model's generation config holds none); ``max_length`` counts the prompt. The static cache is sized from what
    generate() will use, and the loop stops where generate() stops."""
    monkeypatch.setattr(decode_steps, "capture", recorded_capture([]))
    model, request = tiny_llama()
    del request["max_new_tokens"]
    request |= length
    reference = model.generate(**request, do_sample=False)  # the default dynamic cache: tiny lengths round alike
    graphs = decode_graphs(model)
    with torch.no_grad():
        for _ in range(2):
            tokens = graphs.generate(model, (), dict(request))
            assert tokens.shape == reference.shape and torch.equal(tokens, reference)
    assert reference.shape[1] == (12 if length else 5 + 20)
    assert graphs.info()["loop_generations"] == 1


def test_a_prompt_and_config_passed_by_position_or_own_config_decode_in_the_loop(monkeypatch) -> None:
    monkeypatch.setattr(decode_steps, "capture", recorded_capture([]))
    model, request = tiny_llama()
    reference = eager_static(model, request)
    ids, rest = request["input_ids"], {k: v for k, v in request.items() if k != "input_ids"}
    graphs = decode_graphs(model)
    config = transformers.GenerationConfig(max_new_tokens=NEW_TOKENS, do_sample=False)
    with torch.no_grad():
        assert torch.equal(graphs.generate(model, (ids,), dict(rest)), reference)  # generate(ids, ...)
        mask = {"attention_mask": request["attention_mask"]}
        assert torch.equal(graphs.generate(model, (ids, config), mask), reference)  # generate(ids, config, ...)
        # a config of its own leaves use_cache, num_beams, ... unset (transformers 5) until generate() fills them in
        by_name = graphs.generate(model, (), dict(mask, input_ids=ids, generation_config=config))
        assert torch.equal(by_name, reference)
        assert loop_info(graphs) == (2, {})  # the first was the proof
        with pytest.raises(TypeError, match="multiple values for argument 'inputs'"):  # as generate() itself says
            graphs.generate(model, (ids,), dict(rest, inputs=ids))
    assert loop_info(graphs) == (2, {"generate() was given positional arguments": 1})


@pytest.mark.parametrize(
    "tokens",
    [
        {"pad_token_id": 7},  # a pad token the prompt does not hold: generate() attends to every position
        {"pad_token_id": 7, "eos_token_id": 7},  # the pad token is the end token: no mask is inferred
        {"pad_token_id": 3},  # the prompt holds it: generate() infers the mask from it
    ],
    ids=["pad-not-in-prompt", "pad-is-eos", "pad-in-prompt"],
)
def test_a_pad_token_without_a_mask_decodes_in_the_loop_on_the_mask_generate_infers(monkeypatch, tokens: dict) -> None:
    """The loop runs inside generate(), on the mask generate() inferred (or none)."""
    monkeypatch.setattr(decode_steps, "capture", recorded_capture([]))
    model, request = tiny_llama()
    del request["attention_mask"]
    request["input_ids"] = request["input_ids"].clamp(min=8)
    request["input_ids"][0, :2] = 3  # a left-padded first row, by the token of the last case
    request |= tokens
    reference = eager_static(model, request)
    graphs = decode_graphs(model)
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(graphs.generate(model, (), dict(request)), reference)
    assert loop_info(graphs) == (1, {})
    (kind,) = graphs.info()["classes"]
    assert kind["left_padded"] is (tokens == {"pad_token_id": 3}) and kind["proof"] == "proven", kind


def test_the_cache_an_output_carries_is_the_callers_and_stays_as_it_was(monkeypatch) -> None:
    """``return_dict_in_generate=True`` returns the cache with the sequences; the wrapper's own static cache is emptied
    and refilled by the next call, so the output carries a copy of it."""
    monkeypatch.setattr(decode_steps, "capture", recorded_capture([]))
    model, request = tiny_llama()
    graphs = decode_graphs(model)
    with torch.no_grad():
        first = graphs.generate(model, (), dict(request, return_dict_in_generate=True))
        kept = [t.clone() for t in pytree.tree_leaves(_cache_tensors(first.past_key_values))]
        other = dict(request, input_ids=request["input_ids"].flip(0), return_dict_in_generate=True)
        second = graphs.generate(model, (), other)
    assert first.past_key_values is not second.past_key_values
    assert first.past_key_values not in [held for held in graphs._caches.held()]
    after = pytree.tree_leaves(_cache_tensors(first.past_key_values))
    assert kept and all(torch.equal(a, b) for a, b in zip(kept, after, strict=True))
    refilled = pytree.tree_leaves(_cache_tensors(second.past_key_values))
    assert not all(torch.equal(a, b) for a, b in zip(after, refilled, strict=True))
    assert torch.equal(first.sequences, eager_static(model, request))


def _cache_tensors(cache) -> list:
    """A static cache's key and value tensors, layer by layer (transformers 5: ``layers``; older: lists)."""
    if hasattr(cache, "layers"):
        return [[layer.keys, layer.values] for layer in cache.layers]
    return [cache.key_cache, cache.value_cache]


# ---- the proof per class of calls, models the loop must drive, caches it cannot follow, the safety net ------------
def tiny_opt() -> tuple[torch.nn.Module, dict]:
    config = transformers.OPTConfig(
        vocab_size=256,
        hidden_size=32,
        ffn_dim=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    model = transformers.OPTForCausalLM(config).eval().to(torch.bfloat16)
    ids = torch.randint(3, 256, (2, 6), generator=torch.Generator().manual_seed(1))
    return model, {"input_ids": ids, "attention_mask": torch.ones_like(ids), "max_new_tokens": 48}


def test_opt_decodes_in_the_loop_on_the_position_ids_generate_builds(monkeypatch) -> None:
    """OPT reads its positions from the attention mask where none are given; the loop once gave none beside the
    static cache's 4-D mask, and OPT's attention raised. Inside generate() it gets generate()'s position ids."""
    monkeypatch.setattr(decode_steps, "capture", recorded_capture([]))
    model, request = tiny_opt()
    with torch.no_grad():
        dynamic = model.generate(**request, do_sample=False)  # the model's default call
        static = eager_static(model, request)
        graphs = decode_graphs(model)
        for _ in range(2):  # the proof, then the loop
            assert torch.equal(graphs.generate(model, (), dict(request)), static)
    assert torch.equal(static, dynamic)
    info = graphs.info()
    assert info["loop_generations"] == 1 and [c["proof"] for c in info["classes"]] == ["proven"], info
    assert info["steps_replayed"] > 0 and info["generations_eager"] == {}, info


def padded_bf16_llama() -> tuple[torch.nn.Module, dict]:
    """Four prompts of 12, 9, 6 and 3 tokens, left-padded, a bf16 Llama: the loop once let the model count positions
    from the cache (0, 1, ...) where generate() counts them from the mask, which rounds rope otherwise in bf16."""
    config = transformers.LlamaConfig(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval().to(torch.bfloat16)
    ids = torch.randint(1, 512, (4, 12), generator=torch.Generator().manual_seed(2))
    mask = torch.zeros_like(ids)
    for row, length in enumerate((12, 9, 6, 3)):
        mask[row, 12 - length :] = 1
        ids[row, : 12 - length] = 0
    return model, {"input_ids": ids, "attention_mask": mask, "pad_token_id": 0, "max_new_tokens": 40}


@pytest.mark.parametrize("grad_mode", [torch.no_grad, torch.inference_mode])
def test_left_padded_bf16_prompts_are_proven_in_the_loop_on_generates_position_ids(monkeypatch, grad_mode) -> None:
    monkeypatch.setattr(decode_steps, "capture", recorded_capture([]))
    model, request = padded_bf16_llama()
    with grad_mode():
        reference = model.generate(**request, do_sample=False, cache_implementation="static", disable_compile=True)
        graphs = decode_graphs(model)
        for _ in range(2):
            assert torch.equal(graphs.generate(model, (), dict(request)), reference)
    (kind,) = graphs.info()["classes"]
    assert kind["left_padded"] and kind["batch"] == 4 and kind["dtype"] == "bfloat16", kind
    assert kind["proof"] == "proven", kind  # the loop's own tokens are generate()'s, not only the safety net's
    assert graphs.info()["loop_generations"] == 1


def tiny_gemma2(*, sliding_window: int = 4096) -> tuple[torch.nn.Module, dict]:
    """A Gemma2 of four layers (sliding-window and full attention in turn); 6 + 20 tokens a generation."""
    config = transformers.Gemma2Config(
        vocab_size=256,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=128,
        sliding_window=sliding_window,
    )
    torch.manual_seed(0)
    model = transformers.Gemma2ForCausalLM(config).eval().to(torch.bfloat16)
    ids = torch.randint(3, 256, (2, 6), generator=torch.Generator().manual_seed(1))
    return model, {"input_ids": ids, "attention_mask": torch.ones_like(ids), "max_new_tokens": 20, "do_sample": False}


def test_a_sliding_window_that_fills_goes_through_generate_as_called_with_one_warning(monkeypatch, caplog) -> None:
    """A sliding window of 16 tokens fills within a generation of 26: once full, each step rolls the window by a
    length counted on the host, which no graph replays. Refused before decoding: generate() runs as called (the
    model's own cache), nothing routed, no step of ours."""
    monkeypatch.setattr(decode_steps, "capture", recorded_capture([]))
    model, request = tiny_gemma2(sliding_window=16)
    calls = []
    generate = model.generate

    def spied(*args, **kwargs):
        calls.append(kwargs)
        return generate(*args, **kwargs)

    model.generate = spied
    with torch.no_grad():
        reference = generate(**request)
        graphs = decode_graphs(model)
        with caplog.at_level(logging.INFO, logger="launchless"):
            for _ in range(2):
                assert torch.equal(graphs.generate(model, (), dict(request)), reference)
    assert calls == [request, request]  # as the caller called it: no cache, no settings of ours
    lines = [r.getMessage() for r in caplog.records if r.name == "launchless"]
    assert len(lines) == 1 and "sliding window (16 tokens) fills within this generation (26 tokens)" in lines[0], lines
    info = graphs.info()
    assert info["prefills"] == 0 and info["static_caches"] == [] and info["graphs"] == [], info
    with pytest.raises(CaptureError, match="sliding window"):
        decode_graphs(model, explicit=True).generate(model, (), dict(request))


def host_frozen_capture(captures: list, monkeypatch):
    """``recorded_capture`` whose replays leave the lengths cache layers count in Python as they were: a CUDA graph
    runs kernels, not the Python that advanced them (the stand-in recomputes in Python, which would)."""
    from transformers.cache_utils import StaticSlidingWindowLayer

    layers: list = []
    init = StaticSlidingWindowLayer.__init__

    def registered(self, *args, **kwargs):
        init(self, *args, **kwargs)
        layers.append(self)

    monkeypatch.setattr(StaticSlidingWindowLayer, "__init__", registered)
    record = recorded_capture(captures)

    def capture(fn, flat, **options):
        captured = record(fn, flat, **options)
        replay = captured.graph.replay

        def frozen() -> None:
            counts = [layer.cumulative_length_int for layer in layers]
            replay()
            for layer, count in zip(layers, counts, strict=True):
                layer.cumulative_length_int = count

        captured.graph.replay = frozen
        return captured

    return capture


@pytest.mark.parametrize("grad_mode", [torch.no_grad, torch.inference_mode])
def test_a_sliding_window_that_does_not_fill_decodes_through_graphs_with_eager_static_tokens(
    monkeypatch, grad_mode
) -> None:
    """Gemma2's sliding-window layers count their length on the host; within the window every step takes the same
    branch and mask sizes, and launchless advances the count after each replay. Tokens are eager's on the static
    cache, the steps replay, and the cache's counts end where eager's do."""
    captures: list = []
    monkeypatch.setattr(decode_steps, "capture", host_frozen_capture(captures, monkeypatch))
    model, request = tiny_gemma2(sliding_window=64)
    with grad_mode():
        reference = eager_static(model, request)
        graphs = decode_graphs(model)
        for _ in range(2):
            assert torch.equal(graphs.generate(model, (), dict(request)), reference)
    info = graphs.info()
    assert captures and info["steps_replayed"] > 0 and info["generations_eager"] == {}, info
    assert info["steps_eager"].keys() <= {"captured once seen 2 times"}, info["steps_eager"]
    (cache,) = graphs._caches.held()
    sliding = [layer for layer in cache.layers if hasattr(layer, "cumulative_length_int")]
    assert sliding and {layer.cumulative_length_int for layer in sliding} == {6 + 20 - 1}  # the last token unwritten


def test_a_step_that_reads_the_host_count_is_refused_at_capture(monkeypatch, caplog) -> None:
    """A step whose outputs depend on the count a sliding-window layer keeps in Python would replay the count it
    was captured at: run with the count one off, it differs; the graph is refused with one line and steps run
    eager, with the tokens of eager generate() on the static cache. No step of the class replaying, its later calls
    go through generate() as called (eager steps on a static cache cost more)."""
    from transformers.cache_utils import StaticSlidingWindowLayer

    monkeypatch.setattr(decode_steps, "capture", host_frozen_capture([], monkeypatch))
    made: list = []
    init = StaticSlidingWindowLayer.__init__  # host_frozen_capture's registering one

    def remembered(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(StaticSlidingWindowLayer, "__init__", remembered)
    model, request = tiny_gemma2(sliding_window=64)
    # the logits lean on the newest cache's count: what a model reading ``get_seq_length()`` of a sliding layer does
    model.lm_head.register_forward_hook(lambda module, inputs, out: out + made[-1].cumulative_length_int * 0.05)
    with torch.no_grad():
        reference = eager_static(model, request)
        graphs = decode_graphs(model)
        with caplog.at_level(logging.INFO, logger="launchless"):
            assert torch.equal(graphs.generate(model, (), dict(request)), reference)
            second = graphs.generate(model, (), dict(request))
        assert torch.equal(second, model.generate(**request))
    info = graphs.info()
    assert info["steps_replayed"] == 0 and info["graphs"] == [], info
    assert info["generate_calls"] == 1 and len(info["generations_eager"]) == 1, info
    said = "reads the length its cache counts on the host"
    lines = [r.getMessage() for r in caplog.records if said in r.getMessage()]
    assert len(lines) == 2, [r.getMessage() for r in caplog.records]  # the refusal, and the class's way from then
    assert "no decode step replays as a graph" in lines[1] and "Calls like it do so from now on" in lines[1], lines


@pytest.mark.parametrize("vouches", [True, False])
def test_a_class_none_of_whose_steps_can_be_captured_goes_through_generate_as_called(
    monkeypatch, caplog, vouches: bool
) -> None:
    """A step whose capture fails (on the GPU: a host read while capturing) runs eager with its reason; a class none of
    whose steps replays goes through generate() as called from then on, with one line -- whether its model's class
    vouches for the static cache or had it proven first."""

    def fails(fn, flat, **kwargs):
        raise CaptureFailed(Stage.CAPTURE, RuntimeError("operation not permitted when stream is capturing"), "no")

    monkeypatch.setattr(decode_steps, "capture", fails)
    model, request = tiny_llama() if vouches else unvouched_llama()
    graphs = decode_graphs(model)
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="launchless"):
        for seed in range(4):
            call = fresh(request, seed)
            got = graphs.generate(model, (), dict(call))
            assert torch.equal(got, model.generate(**call)) or torch.equal(got, eager_static(model, call)), seed
    info = graphs.info()
    assert info["generate_calls"] == 1 and info["steps_replayed"] == 0, info  # the proof decodes eager, not routed
    lines = [r.getMessage() for r in caplog.records if "no decode step replays as a graph" in r.getMessage()]
    assert len(lines) == 1 and "operation not permitted" in lines[0], lines
    assert sum(info["generations_eager"].values()) == (3 if vouches else 2), info


def tiny_rwkv() -> tuple[torch.nn.Module, dict]:
    """A tiny RWKV: a recurrent causal LM whose forward takes no cache argument (its state goes as ``state``)."""
    config = transformers.RwkvConfig(
        vocab_size=100,
        hidden_size=32,
        attention_hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        context_length=64,
        bos_token_id=None,
        eos_token_id=None,
    )
    torch.manual_seed(0)
    model = transformers.RwkvForCausalLM(config).eval()
    ids = torch.randint(0, 100, (1, 5), generator=torch.Generator().manual_seed(1))
    return model, {"input_ids": ids, "attention_mask": torch.ones_like(ids), "max_new_tokens": NEW_TOKENS}


def test_a_model_whose_steps_keep_their_own_state_goes_through_generate_as_called_naming_why(
    monkeypatch, caplog
) -> None:
    """RWKV's decode steps carry their own state (``state``) and never run on the static cache: each is refused with
    that reason (its forward and source line) in ``steps_eager`` -- or, where transformers hands the step the static
    cache all the same, its capture is refused for writing ``state`` in place, one WARNING --, and its class goes
    through generate() as called, named in ``classes`` and ``generations_eager``, with one line (INFO: nothing the
    caller can change), not one per call. Its tokens are generate()'s own."""
    monkeypatch.setattr(decode_steps, "capture", recorded_capture([]))
    model, request = tiny_rwkv()
    graphs = decode_graphs(model)
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="launchless"):
        for seed in range(4):
            call = fresh(request, seed)
            assert torch.equal(graphs.generate(model, (), dict(call)), model.generate(**call)), seed
    info = graphs.info()
    assert info["steps_replayed"] == 0 and info["generate_calls"] == 1, info  # the first call proves the cache
    if IN_PLACE in info["steps_eager"]:  # transformers that hand RWKV's step the static cache (5.17): it writes `state`
        step_reason = IN_PLACE
        assert set(info["steps_eager"]) <= {IN_PLACE, "captured once seen 2 times"}, info
    else:  # transformers that hand it none (5.25): named before any capture
        (step_reason,) = info["steps_eager"]
        said = f"{static_cache.OffCache.NO_CACHE_ARGUMENT}: RwkvForCausalLM.forward at modeling_rwkv.py:"
        keyword = static_cache.cache_keyword(model)
        assert step_reason.startswith(said), step_reason
        assert step_reason.endswith(f"takes no `{keyword}` and carries its own state in `state`"), step_reason
    assert [(c["proof"], step_reason in c["reason"]) for c in info["classes"]] == [("fell back", True)], info
    how = "replays as a graph" if step_reason == IN_PLACE else "runs on the static cache"
    assert info["classes"][0]["reason"].startswith(f"no decode step {how}"), info
    (reason,) = info["generations_eager"]
    assert step_reason in reason and info["generations_eager"][reason] == 2, info  # the third and fourth calls
    lines = [r for r in caplog.records if step_reason in r.getMessage()]
    levels = [logging.WARNING, logging.INFO] if step_reason == IN_PLACE else [logging.INFO]
    assert [r.levelno for r in lines] == levels, [r.getMessage() for r in caplog.records]


def test_cuda_graph_true_raises_for_a_step_that_keeps_its_own_state(monkeypatch) -> None:
    monkeypatch.setattr(decode_steps, "capture", recorded_capture([]))
    model, request = tiny_rwkv()
    graphs = decode_graphs(model, explicit=True)
    with torch.no_grad():
        graphs.generate(model, (), dict(fresh(request, 0)))  # the static cache proven against generate() as called
        with pytest.raises(CaptureError, match="a decode step is not replayed as a graph") as raised:
            graphs.generate(model, (), dict(fresh(request, 1)))
    reason = raised.value.reason
    assert reason.startswith(static_cache.OffCache.NO_CACHE_ARGUMENT.value) or reason == IN_PLACE, reason


IN_PLACE = "the forward writes into its own input in place"  # RWKV's step on the static cache it ignores


class TakesTheCache(torch.nn.Module):
    def forward(self, input_ids, cache=None): ...


class KeepsItsState(torch.nn.Module):
    def forward(self, input_ids, mems=None, **kwargs): ...


@pytest.mark.parametrize(
    ("module", "args", "kwargs", "says"),
    [
        (TakesTheCache(), (), {"cache": "ours"}, None),
        (TakesTheCache(), (torch.zeros(1, 1),), {"cache": "ours"}, "TakesTheCache.forward at test_decoding.py:"),
        (TakesTheCache(), (), {"cache": None}, "TakesTheCache.forward at test_decoding.py:"),
        # the static cache reaches its **kwargs under another name than the one the model takes a cache by
        (KeepsItsState(), (), {"mems": (torch.zeros(1),), "past_key_values": "ours"}, "takes no `cache` and carries"),
    ],
    ids=["on the cache", "by position", "not handed", "own state"],
)
def test_a_decode_step_off_the_static_cache_says_why(module, args: tuple, kwargs: dict, says: str | None) -> None:
    """Every step that does not run on the static cache is named by its ``OffCache`` kind, the forward and the
    source line defining it; a step on the cache is not."""
    why = static_cache.off_cache(module.forward, "ours", "cache", args, kwargs)
    if says is None:
        assert why == ""
        return
    assert says in why, why
    assert sum(why.startswith(f"{kind}: ") for kind in static_cache.OffCache) == 1, why


def test_a_class_whose_loop_parts_keeps_to_generates_own_loop_with_one_warning(monkeypatch, caplog) -> None:
    """A loop that parts from generate()'s own loop (here: it feeds row 1 a wrong token from the fourth step) is
    caught at the class's first call: the caller gets generate()'s tokens, one WARNING says where it parted, and the
    class keeps to generate()'s own loop. Another class (batch 1, no row 1) is proven on its own."""
    monkeypatch.setattr(decode_steps, "capture", recorded_capture([]))
    advance = decode_loop._advance

    def parting(inputs, chosen, *, column):
        advance(inputs, chosen, column=column)
        if inputs["input_ids"].shape[0] > 1 and column >= 5 + 3:
            inputs["input_ids"][1] = 0

    monkeypatch.setattr(decode_loop, "_advance", parting)
    model, request = tiny_llama()
    request = dict(request, max_new_tokens=12)
    reference = eager_static(model, request)
    single = dict(request, input_ids=request["input_ids"][:1], attention_mask=request["attention_mask"][:1])
    graphs = decode_graphs(model)
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="launchless"):
        for _ in range(2):
            assert torch.equal(graphs.generate(model, (), dict(request)), reference)
        for _ in range(2):
            assert torch.equal(graphs.generate(model, (), dict(single)), eager_static(model, single))
    lines = [r.getMessage() for r in caplog.records if "parted" in r.getMessage()]
    assert len(lines) == 1 and "row 1 at new token 5 (of 12)" in lines[0] and "batch 2" in lines[0], lines
    info = graphs.info()
    assert [(c["batch"], c["proof"]) for c in info["classes"]] == [(2, "parted"), (1, "proven")], info["classes"]
    assert "row 1 at new token 5" in info["classes"][0]["reason"]
    assert info["proofs"] == 2 and info["loop_generations"] == 1, info  # batch 1's second call
    assert list(info["through_generate"].values()) == [2], info  # batch 2's proof and its second call


def test_a_loop_that_leaves_the_generator_elsewhere_is_not_proven(monkeypatch, caplog) -> None:
    monkeypatch.setattr(decode_steps, "capture", recorded_capture([]))
    run_loop = loop_proofs.run_loop

    def drawing(*args, **kwargs):
        result = run_loop(*args, **kwargs)
        torch.rand(1)  # one number more than generate() draws
        return result

    monkeypatch.setattr(loop_proofs, "run_loop", drawing)
    model, request = tiny_llama()
    request = dict(request, top_k=10)
    torch.manual_seed(4)
    reference = eager_static(model, request, do_sample=True)
    request["do_sample"] = True
    after = torch.get_rng_state()
    graphs = decode_graphs(model)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="launchless"):
        torch.manual_seed(4)
        assert torch.equal(graphs.generate(model, (), dict(request)), reference)
    assert torch.equal(torch.get_rng_state(), after)  # where generate()'s own loop left it
    (kind,) = graphs.info()["classes"]
    assert kind["proof"] == "parted" and "random-number generator is left elsewhere" in kind["reason"], kind
    assert kind["choice"] == {"do_sample": True, "temperature": 1.0, "top_k": 10, "top_p": 1.0}, kind


def test_an_error_of_launchless_own_path_falls_back_to_generate_naming_its_source_line(monkeypatch, caplog) -> None:
    monkeypatch.setattr(decode_steps, "capture", recorded_capture([]))

    def broken(*args, **kwargs):
        raise RuntimeError("a step launchless got wrong")

    monkeypatch.setattr(loop_proofs, "own_loop", broken)
    model, request = tiny_llama()
    reference = model.generate(**request)  # the model's own call: its default cache
    graphs = decode_graphs(model)
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="launchless"):
        for _ in range(2):
            assert torch.equal(graphs.generate(model, (), dict(request)), reference)
    lines = [r.getMessage() for r in caplog.records if "raised" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "RuntimeError: a step launchless got wrong at test_decoding.py:" in lines[0], lines
    assert 'raise RuntimeError("a step launchless got wrong")' in lines[0], lines
    info = graphs.info()
    (kind,) = info["classes"]
    assert kind["proof"] == "fell back" and "RuntimeError" in kind["reason"], kind
    assert info["prefills"] == 0 and info["generate_calls"] == 1, info  # the second call went straight to generate()
    assert "forward" not in model.__dict__
    streamed = decode_graphs(model)
    with torch.no_grad(), pytest.raises(RuntimeError, match="launchless got wrong"):  # the prompt was streamed
        streamed.generate(model, (), dict(request, streamer=RecordingStreamer()))


def test_an_error_of_the_models_own_generate_is_raised_as_is(monkeypatch) -> None:
    monkeypatch.setattr(decode_steps, "capture", recorded_capture([]))
    model, request = tiny_llama()
    graphs = decode_graphs(model)
    with torch.no_grad(), pytest.raises(ValueError, match="max_new_tokens"):
        graphs.generate(model, (), dict(request, max_new_tokens=-1))
    assert graphs.info()["classes"] == []


def test_an_error_reading_the_call_falls_back_to_generate_for_good_with_one_warning(monkeypatch, caplog) -> None:
    """Before any decoding (the static cache a model gets, its layers read): an error there is launchless's, and the
    model's generate() decodes every call as called from then on."""

    def unbuildable(model, **_):
        raise ValueError("this config makes no static cache")

    monkeypatch.setattr(static_caches, "new_static_cache", unbuildable)
    model, request = tiny_llama()
    reference = model.generate(**request)
    graphs = decode_graphs(model)
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="launchless"):
        for _ in range(2):
            assert torch.equal(graphs.generate(model, (), dict(request)), reference)
    lines = [r.getMessage() for r in caplog.records if r.name == "launchless"]
    assert len(lines) == 1 and "ValueError: this config makes no static cache at test_decoding.py:" in lines[0], lines
    info = graphs.info()
    assert info["generate_calls"] == 0 and list(info["generations_eager"].values()) == [2], info
    with pytest.raises(ValueError, match="this config makes no static cache"):
        decode_graphs(model, explicit=True).generate(model, (), dict(request))


def test_a_cache_layer_without_an_update_is_named_not_raised() -> None:
    """Hybrid decoders (linear attention beside attention) keep layers with no ``update`` of their own: a graph
    cannot follow them, and reading the cache must say so instead of raising."""
    from transformers.cache_utils import StaticLayer

    class LinearAttentionLayer:  # keeps a recurrent state, no key/value update
        pass

    cache = types.SimpleNamespace(layers=[StaticLayer(max_cache_len=8), LinearAttentionLayer()])
    model = torch.nn.Linear(2, 2)
    reason = cache_layers.unfollowed_layers(model, cache)
    assert "LinearAttentionLayer" in reason and "StaticLayer" not in reason, reason


def hybrid(name: str) -> tuple[torch.nn.Module, dict]:
    """A hybrid decoder of the differential population (linear attention beside attention), shrunk, random weights."""
    from launchless.apps.differential.candidate import Library
    from launchless.apps.differential.population import candidates, pick

    (candidate,) = pick(candidates(Library.TRANSFORMERS_CAUSAL), [name])
    torch.manual_seed(0)
    model = candidate.build("cpu").model
    ids = torch.randint(1, 100, (2, 5), generator=torch.Generator().manual_seed(1))
    return model, {"input_ids": ids, "attention_mask": torch.ones_like(ids), "max_new_tokens": NEW_TOKENS}


@pytest.mark.zoo
@pytest.mark.parametrize("name", ["qwen3_5", "jamba"])
def test_a_hybrids_linear_attention_states_are_followed_and_decode_with_generates_tokens(monkeypatch, name) -> None:
    """A hybrid's static cache holds linear-attention layers (convolution and recurrent states of fixed shapes, updated
    in place each step) beside attention layers: the graph follows both -- the states are among the cache's tensors,
    restored around the capture, and no host-side flag changes while decoding -- and the tokens are generate()'s."""
    captures: list = []
    monkeypatch.setattr(decode_steps, "capture", recorded_capture(captures))
    model, request = hybrid(name)
    cache = new_static_cache(model, batch=2, length=64)
    assert cache_layers.LayerPlan.of(cache).unfollowed == (), cache_layers.LayerPlan.of(cache)
    linear = [layer for layer in cache.layers if cache_layers.linear_states_followed(layer)]
    assert linear, [type(layer).__name__ for layer in cache.layers]
    with torch.no_grad():
        reference = eager_static(model, request)
        graphs = decode_graphs(model)
        first = graphs.generate(model, (), dict(request))
        second = graphs.generate(model, (), dict(request))
    assert torch.equal(first, reference) and torch.equal(second, reference)
    info = graphs.info()
    assert info["steps_replayed"] > 0 and info["generations_eager"] == {}, info
    assert [c["proof"] for c in info["classes"]] == ["proven"], info["classes"]
    (held,) = graphs._caches.held()
    states = [t for layer in held.layers if cache_layers.linear_states_followed(layer)
              for t in (*layer.conv_states.values(), *layer.recurrent_states.values()) if t is not None]  # fmt: skip
    assert states and all(any(t is s for s in static_cache.cache_tensors(held)) for t in states)


def test_a_linear_attention_layer_recording_its_past_is_not_followed() -> None:
    """Recording its past (for assisted decoding's crop), the layer assigns growing states instead of copying into
    fixed ones: a graph would replay into the old tensors."""
    from transformers.cache_utils import LinearAttentionLayer

    layer = LinearAttentionLayer()
    assert cache_layers.followed(layer)
    layer.record_past = True
    assert not cache_layers.followed(layer)

    class OwnUpdate(LinearAttentionLayer):
        def update_conv_state(self, conv_states, state_idx=0, **kwargs):
            return conv_states

    assert not cache_layers.followed(OwnUpdate())


def test_the_room_left_in_a_cache_is_read_where_each_layer_holds_its_length() -> None:
    """A layer no step has written keeps its length where it was made (Mllama's cross-attention layers stay on the
    host while the self-attention layers' lengths are on the GPU): each is read where it is, none is stacked with
    another device's, and the room ends at the fullest layer's end."""
    written = types.SimpleNamespace(cumulative_length=torch.tensor(5), max_cache_len=8)
    unwritten = types.SimpleNamespace(cumulative_length=torch.tensor(0), max_cache_len=8)
    positions = cache_layers.DevicePositions(types.SimpleNamespace(layers=[unwritten, written]))
    assert positions.fits(3) and not positions.fits(4)
    assert cache_layers.DevicePositions(types.SimpleNamespace(layers=[])).fits(10**6)


CUDA_CAPTURE_TEXT = (
    "CUDA error: operation not permitted when stream is capturing\n"
    "Search for `cudaErrorStreamCaptureUnsupported' in https://docs.nvidia.com/cuda/ for more information.\n"
    "CUDA kernel errors might be asynchronously reported at some other API call.\n"
)


def test_a_decode_step_whose_blocker_cannot_be_named_is_refused_in_one_line(monkeypatch) -> None:
    def failing_capture(fn, flat, **_):
        try:
            raise RuntimeError(CUDA_CAPTURE_TEXT)
        except RuntimeError as exc:
            raise CaptureFailed(Stage.CAPTURE, exc, str(exc)) from exc

    def naming_fails(*_args, **_kwargs):
        raise RuntimeError("the step could not run again")

    monkeypatch.setattr(decode_steps, "capture", failing_capture)
    monkeypatch.setattr(decode_steps, "capture_error", naming_fails)
    model, request = tiny_llama()
    reference = eager_static(model, request)
    graphs = decode_graphs(model)
    with torch.no_grad():
        assert torch.equal(graphs.generate(model, (), dict(request)), reference)
    reasons = list(graphs.info()["steps_eager"]) + [f["reason"] for f in graphs.info()["fallbacks"]]
    refusal = next(why for why in reasons if "PyTorch said" in why)
    assert "\n" not in refusal
    assert refusal.startswith("host sync at ")
    assert "test_decoding.py" in refusal  # where the error was raised: the line a user would look at
    assert refusal.endswith("PyTorch said: CUDA error: operation not permitted when stream is capturing")


def test_where_a_sequence_parts_is_named_per_row_for_one_and_for_several_codebooks() -> None:
    """A multi-codebook decoder's generate() returns a row of ids per codebook (batch x codebooks x length); the
    proof once raised reading where such sequences part."""
    from launchless.runtime.call_classes import parting

    expected = torch.zeros(2, 4, 10, dtype=torch.long)
    got = expected.clone()
    got[1, 2, 7] = 5
    got[1, 0, 9] = 5
    assert parting(expected, got, start=4) == "row 1 at new token 4 (of 6)"
    assert parting(expected[:, 0], got[:, 0], start=4) == "row 1 at new token 6 (of 6)"
    assert parting(expected, expected.clone(), start=4) == ""
    assert parting(expected, got[..., :8], start=4) == "it decoded 4 new tokens, generate() 6"
