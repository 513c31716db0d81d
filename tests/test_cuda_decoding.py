"""Decode graphs on the GPU: ``launchless.wrap(model).generate(...)`` replays one verified graph per (batch, cache
length) for GPT-2 and a Llama-shaped decoder, greedy and sampling, batch 1 and 8, under no_grad and inference_mode:
the tokens of eager generate() on the same static cache, bit for bit. OPT (which reads its positions from the mask
where none are given), left-padded bf16 prompts (positions counted from the mask) and Gemma2 (a sliding-window cache
a graph cannot replay) decode as ``model.generate()`` does, without raising."""

from __future__ import annotations

import logging

import pytest
import torch
from cache_writers import writes_twice_where_static
from streamers import RecordingStreamer

import launchless as ll
from launchless.apps.bench.serving_workloads import build_decoder, decode_workload
from launchless.runtime.static_cache import cache_keyword, cache_length, new_static_cache

pytestmark = pytest.mark.cuda
transformers = pytest.importorskip("transformers")

GRAD_MODES = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}


def eager_static(model: torch.nn.Module, request: dict, **extra) -> torch.Tensor:
    """Eager generate() on a static cache of the length decode graphs give this request."""
    length = cache_length(request["input_ids"].shape[1] + request["max_new_tokens"])
    cache = new_static_cache(model, batch=request["input_ids"].shape[0], length=length)
    return model.generate(**request, **{cache_keyword(model): cache}, disable_compile=True, **extra)


def decoder(name: str, new_tokens: int = 32) -> tuple[torch.nn.Module, dict]:
    model, prompt = build_decoder(decode_workload(name), device=torch.device("cuda"))
    return model, {**prompt, "max_new_tokens": new_tokens, "do_sample": False}


@pytest.mark.parametrize("grad_mode", list(GRAD_MODES))
@pytest.mark.parametrize("name", ["decode:gpt2-124m@b1", "decode:gpt2-124m@b8", "decode:llama-tiny@b8"])
def test_greedy_decoding_replays_one_graph_with_eager_static_tokens(name: str, grad_mode: str) -> None:
    model, request = decoder(name)
    wrapped = ll.wrap(model)
    with GRAD_MODES[grad_mode]():
        reference = eager_static(model, request)
        first = wrapped.generate(**request)
        again = wrapped.generate(**request)
    assert torch.equal(first, reference) and torch.equal(again, reference)
    decode = wrapped.graph_info()["decode"]
    (graph,) = decode["graphs"]
    assert graph["verification"]["status"] == "bit-identical" and graph["verification"]["probes_differ"], graph
    steps = request["max_new_tokens"] - 1
    waited = wrapped.capture_after - 1  # steps seen before the capture
    # the first call decodes twice (generate()'s own loop, then the host-ahead loop: the proof), the second once
    assert decode["steps_replayed"] == 3 * steps - waited and graph["replays"] >= 3 * steps - waited, decode
    assert decode["proofs"] == 1 and decode["loop_generations"] == 1 and decode["loop_exact_inputs"] == 0, decode
    assert [c["proof"] for c in decode["classes"]] == ["proven"], decode["classes"]
    assert "forward" not in model.__dict__


def test_sampling_draws_what_eager_draws_under_the_same_seed() -> None:
    model, request = decoder("decode:llama-tiny@b8")
    request = {**request, "do_sample": True, "top_k": 50}
    wrapped = ll.wrap(model)
    with torch.no_grad():
        torch.manual_seed(11)
        reference = eager_static(model, request)
        torch.manual_seed(11)
        sampled = wrapped.generate(**request)
        torch.manual_seed(11)
        again = wrapped.generate(**request)  # replayed from its first step
    assert torch.equal(sampled, reference) and torch.equal(again, reference)
    assert wrapped.graph_info()["decode"]["steps_replayed"] > 0


@pytest.mark.parametrize("name", ["decode:llama-tiny@b8", "decode:gpt2-124m@b1"])
def test_the_loop_samples_to_end_tokens_as_generate_does_streams_alike_and_leaves_the_generator_alike(
    name: str,
) -> None:
    model, request = decoder(name, new_tokens=48)
    vocabulary = model.config.vocab_size
    request = {**request, "do_sample": True, "top_k": 40, "top_p": 0.95, "temperature": 0.8}
    request["eos_token_id"] = list(range(0, vocabulary, 12))  # one token in twelve ends a sequence
    wrapped = ll.wrap(model)
    expected, got = RecordingStreamer(), RecordingStreamer()
    with torch.no_grad():
        torch.manual_seed(5)
        reference = eager_static(model, request, streamer=expected)
        after = torch.cuda.get_rng_state()
        for streamer in (None, got):  # the first call captures, the second replays
            torch.manual_seed(5)
            sampled = wrapped.generate(**request, **({"streamer": streamer} if streamer else {}))
            assert torch.equal(sampled, reference)
            assert torch.equal(torch.cuda.get_rng_state(), after)
    assert reference.shape[1] < request["input_ids"].shape[1] + 48  # it ended early: the loop ran past, dropped it
    assert got.puts == expected.puts and got.ended
    decode = wrapped.graph_info()["decode"]
    assert decode["proofs"] == 1 and decode["loop_generations"] == 1 and decode["steps_replayed"] > 0, decode


def test_the_loop_waits_for_the_gpu_as_often_for_110_tokens_as_for_60() -> None:
    """CUDA's synchronising calls, counted by PyTorch's sync debug mode: the loop reads the device a few times per
    call (generate()'s own preparation of the call, transformers' inputs for the prompt and the first two steps, their
    check), not once per token."""
    import warnings

    model, request = decoder("decode:llama-tiny@b1", new_tokens=110)
    wrapped = ll.wrap(model)
    counts = []
    with torch.no_grad():
        wrapped.generate(**request)  # captured and verified here
        for new in (60, 110):  # one cache length (128, with the prompt of 8): one graph
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    wrapped.generate(**{**request, "max_new_tokens": new})
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            counts.append(sum("synchronizing" in str(w.message) for w in caught))
    # a handful per call (7 and 6 seen on an H200), not one per token
    assert max(counts) <= 10 and abs(counts[0] - counts[1]) <= 2, counts
    assert len(wrapped.graph_info()["decode"]["graphs"]) == 1


def test_lengths_in_one_bucket_share_a_graph_and_a_longer_one_gets_its_own() -> None:
    model, request = decoder("decode:gpt2-124m@b1", new_tokens=16)
    wrapped = ll.wrap(model, cuda_graph=True)  # captured at the first decode step
    prompt = request["input_ids"].shape[1]  # 64
    with torch.inference_mode():
        for new in (16, 40, 64, 100):  # 80, 104 and 128 tokens: the cache of 128; 164: the cache of 256
            ask = {**request, "max_new_tokens": new}
            assert torch.equal(wrapped.generate(**ask), eager_static(model, ask)), new
    decode = wrapped.graph_info()["decode"]
    assert [(c["batch"], c["length"]) for c in decode["static_caches"]] == [(1, 128), (1, 256)], decode
    assert len(decode["graphs"]) == 2 and decode["steps_eager"] == {}, decode
    assert cache_length(prompt + 64) == 128 and cache_length(prompt + 100) == 256


def test_a_model_moved_after_capture_is_captured_again_on_its_new_memory(caplog) -> None:
    model, request = decoder("decode:llama-tiny@b8")
    wrapped = ll.wrap(model)
    with torch.no_grad():
        wrapped.generate(**request)
        model.to(torch.float64).to(torch.float32)  # every parameter moved to new memory, same values
        with caplog.at_level(logging.INFO, logger="launchless"):
            tokens = wrapped.generate(**request)
        assert torch.equal(tokens, eager_static(model, request))
    assert any("dropped 1 graph" in r.getMessage() for r in caplog.records), caplog.text
    assert len(wrapped.graph_info()["decode"]["graphs"]) == 1


def test_beam_search_decodes_eager_with_one_warning(caplog) -> None:
    model, request = decoder("decode:llama-tiny@b8", new_tokens=8)
    wrapped = ll.wrap(model)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="launchless"):
        tokens = wrapped.generate(**request, num_beams=2)
        assert torch.equal(tokens, model.generate(**request, num_beams=2))
    (line,) = [r.getMessage() for r in caplog.records if "decodes eager" in r.getMessage()]
    assert "beam search (num_beams=2) reorders the cache between steps" in line


def test_a_checkpoint_loaded_between_calls_is_what_decodes_next() -> None:
    model, request = decoder("decode:llama-tiny@b8")
    wrapped = ll.wrap(model)
    generator = torch.Generator(device="cuda").manual_seed(3)
    other = {
        k: v + 0.05 * torch.randn(v.shape, generator=generator, device="cuda") for k, v in model.state_dict().items()
    }
    with torch.no_grad():
        before = wrapped.generate(**request)
        model.load_state_dict(other)  # copied into the same tensors: the graph reads the new weights
        after = wrapped.generate(**request)
        assert torch.equal(after, eager_static(model, request)) and not torch.equal(after, before)
    assert len(wrapped.graph_info()["decode"]["graphs"]) == 1


def test_a_model_converted_to_half_between_calls_decodes_in_half() -> None:
    model, request = decoder("decode:llama-tiny@b8")
    wrapped = ll.wrap(model)
    with torch.inference_mode():
        wrapped.generate(**request)
        model.half()
        assert torch.equal(wrapped.generate(**request), eager_static(model, request))
    assert [c["dtype"] for c in wrapped.graph_info()["decode"]["static_caches"]] == ["float32", "float16"]


@pytest.mark.parametrize("name", ["decode:llama-tiny@b1", "decode:llama-850m@b1", "decode:gpt2-124m@b8"])
def test_transformers_compile_recipe_and_decode_graphs_take_turns_on_one_model(name: str) -> None:
    """What a user comparing the two does in one process: transformers' static-cache compile recipe (CUDA graph trees
    of its own) and launchless's decode graphs, in turns on the same model, with plain generate() between."""
    from launchless.apps.bench.serving_decode import static_compile_recipe

    recipe = static_compile_recipe()
    if recipe is None:
        pytest.skip(f"transformers {transformers.__version__} has no CompileConfig")
    model, request = decoder(name)
    wrapped = ll.wrap(model)
    with torch.no_grad():
        reference, dynamic = eager_static(model, request), model.generate(**request)
        for turn in range(3):
            compiled = model.generate(**request, **recipe)
            assert compiled.shape == reference.shape, turn
            assert torch.equal(wrapped.generate(**request), reference), turn
            assert torch.equal(model.generate(**request), dynamic), turn  # the model's own config left as it was
    torch.cuda.synchronize()
    decode = wrapped.graph_info()["decode"]
    assert len(decode["graphs"]) == 1 and decode["steps_eager"] == {"captured once seen 3 times": 2}, decode
    assert "forward" not in model.__dict__


def test_calls_written_the_usual_ways_decode_in_the_loop_and_a_kept_cache_stays_the_callers() -> None:
    """``generate(ids)``, ``generate(ids, config)``, a ``generation_config`` of the caller's own, a pad token without
    a mask that the prompt does not hold (or that is the end token, as GPT-2's usual ``pad_token_id=eos``): each
    decodes in the host-ahead loop with eager's tokens. An output that carries the cache (``return_dict_in_generate``)
    keeps its values through the next call."""
    model, request = decoder("decode:gpt2-124m@b1")
    ids, mask = request["input_ids"], request["attention_mask"]
    config = transformers.GenerationConfig(max_new_tokens=request["max_new_tokens"], do_sample=False)
    wrapped = ll.wrap(model)
    with torch.inference_mode():
        reference = eager_static(model, request)
        assert torch.equal(wrapped.generate(ids, attention_mask=mask, max_new_tokens=32, do_sample=False), reference)
        assert torch.equal(wrapped.generate(ids, config, attention_mask=mask), reference)
        assert torch.equal(wrapped.generate(input_ids=ids, attention_mask=mask, generation_config=config), reference)
        absent = next(t for t in range(model.config.vocab_size) if not bool((ids == t).any()))
        for tokens in ({"pad_token_id": absent}, {"pad_token_id": absent, "eos_token_id": absent}):  # no mask inferred
            padded = {"input_ids": ids, "max_new_tokens": 32, "do_sample": False, **tokens}
            assert torch.equal(wrapped.generate(**padded), eager_static(model, padded))
        decode = wrapped.graph_info()["decode"]
        # a class's first call is its proof (the pad and end tokens make three classes), the others run the loop
        assert decode["proofs"] == 3 and decode["loop_generations"] == 2, decode
        assert decode["through_generate"] == {} and {c["proof"] for c in decode["classes"]} == {"proven"}, decode
        first = wrapped.generate(**request, return_dict_in_generate=True)
        kept = [layer.keys.clone() for layer in first.past_key_values.layers]
        wrapped.generate(**dict(request, input_ids=ids.flip(1)), return_dict_in_generate=True)
    assert all(torch.equal(a, layer.keys) for a, layer in zip(kept, first.past_key_values.layers, strict=True))
    assert torch.equal(first.sequences, reference)


# ---- models the loop must drive, caches it cannot follow, left-padded bf16 prompts ---------------------------------
def random_decoder(config_class: str, model_class: str, **config: object) -> torch.nn.Module:
    """A small causal LM of random weights (seeded), bf16, on the GPU; SDPA attention unless ``config`` says."""
    settings = dict(vocab_size=4096, bos_token_id=None, eos_token_id=None, attn_implementation="sdpa") | config
    settings = {k: v for k, v in settings.items() if v is not None}
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**settings))
    return model.to(device="cuda", dtype=torch.bfloat16).eval()


def static_call(model: torch.nn.Module, request: dict) -> torch.Tensor:
    """transformers' own static-cache call, uncompiled, its cache as long as the wrapper's (``max_cache_len``): a
    cache of another length attends over another masked length, which can round otherwise in bf16."""
    needed = request["input_ids"].shape[1] + request["max_new_tokens"]
    return model.generate(
        **request, cache_implementation="static", disable_compile=True, max_cache_len=cache_length(needed)
    )


def prompt_of(batch: int, length: int) -> dict:
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 4096, (batch, length), generator=generator).cuda()
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


@pytest.mark.parametrize("grad_mode", list(GRAD_MODES))
def test_opt_decodes_through_graphs_with_generates_tokens_and_never_raises(grad_mode: str) -> None:
    """OPT computes its positions from the attention mask where none are given; the loop once left them out beside
    the static cache's 4-D mask and OPT raised (too many values to unpack). Inside generate() it gets generate()'s
    position ids: the tokens are the model's own static-cache call's, the class proven, the steps replayed."""
    model = random_decoder(
        "OPTConfig",
        "OPTForCausalLM",
        hidden_size=256,
        word_embed_proj_dim=256,
        ffn_dim=1024,
        num_hidden_layers=4,
        num_attention_heads=4,
        max_position_embeddings=512,
        pad_token_id=1,
    )
    request = {**prompt_of(2, 16), "max_new_tokens": 48, "do_sample": False}
    wrapped = ll.wrap(model)
    with GRAD_MODES[grad_mode]():
        default = model.generate(**request)  # the model's own call: its dynamic cache
        static = static_call(model, request)
        for _ in range(2):  # the proof, then the host-ahead loop
            tokens = wrapped.generate(**request)
            assert torch.equal(tokens, static), (tokens, static)
    assert default.shape == static.shape  # both of generate()'s caches work; the graphs decode on the static one
    decode = wrapped.graph_info()["decode"]
    assert [c["proof"] for c in decode["classes"]] == ["proven"], decode["classes"]
    assert decode["loop_generations"] == 1 and decode["steps_replayed"] > 0 and decode["generations_eager"] == {}


def gemma2(sliding_window: int) -> torch.nn.Module:
    return random_decoder(
        "Gemma2Config",
        "Gemma2ForCausalLM",
        hidden_size=256,
        intermediate_size=1024,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=512,
        sliding_window=sliding_window,
        pad_token_id=0,
        attn_implementation=None,  # its own default (SDPA it refuses in newer transformers)
    )


def interleaved_generations(request: dict, **generates) -> dict[str, float]:
    """The least wall time of seven interleaved generations of each (the host's noise left out)."""
    import time

    times: dict[str, list[float]] = {name: [] for name in generates}
    for _ in range(7):
        for name, generate in generates.items():
            torch.cuda.synchronize()
            start = time.perf_counter()
            generate(**request)
            torch.cuda.synchronize()
            times[name].append(time.perf_counter() - start)
    return {name: min(values) for name, values in times.items()}


@pytest.mark.parametrize("grad_mode", list(GRAD_MODES))
def test_a_gemma2_window_that_fills_goes_through_generate_as_called_at_its_speed(grad_mode: str, caplog) -> None:
    """A sliding window of 32 tokens fills within a generation of 48: a full window rolls by a length counted on the
    host, which no graph replays. Found before decoding: generate() runs as called, on the model's own cache, with
    one line; no work of launchless per step (within 3 % of generate()'s time)."""
    model = gemma2(sliding_window=32)
    request = {**prompt_of(2, 16), "max_new_tokens": 32, "do_sample": False}
    wrapped = ll.wrap(model)
    with GRAD_MODES[grad_mode](), caplog.at_level(logging.INFO, logger="launchless"):
        reference = model.generate(**request)
        for _ in range(2):
            assert torch.equal(wrapped.generate(**request), reference)
        best = interleaved_generations(request, eager=model.generate, wrapped=wrapped.generate)
    lines = [r.getMessage() for r in caplog.records if r.name == "launchless"]
    assert len(lines) == 1 and "sliding window (32 tokens) fills within this generation (48 tokens)" in lines[0], lines
    decode = wrapped.graph_info()["decode"]
    assert decode["prefills"] == 0 and decode["static_caches"] == [] and decode["graphs"] == [], decode
    assert best["wrapped"] <= 1.03 * best["eager"], best


@pytest.mark.parametrize("grad_mode", list(GRAD_MODES))
def test_a_gemma2_window_that_does_not_fill_replays_graphs_with_eager_static_tokens(grad_mode: str) -> None:
    """Gemma2's sliding-window layers count their length in Python; within the window every step takes the same
    branch and mask sizes, the count is proven not to reach the outputs, and launchless advances it after each
    replay. The tokens are eager generate()'s on the same static cache, the steps replay, faster than eager."""
    model = gemma2(sliding_window=512)
    request = {**prompt_of(2, 16), "max_new_tokens": 32, "do_sample": False}
    wrapped = ll.wrap(model)
    with GRAD_MODES[grad_mode]():
        reference = eager_static(model, request)
        for _ in range(3):
            assert torch.equal(wrapped.generate(**request), reference)
        best = interleaved_generations(request, eager=lambda **r: eager_static(model, r), wrapped=wrapped.generate)
    decode = wrapped.graph_info()["decode"]
    assert decode["steps_replayed"] > 0 and decode["generations_eager"] == {}, decode
    assert [c["proof"] for c in decode["classes"]] == ["proven"], decode["classes"]
    assert best["wrapped"] < best["eager"], best


@pytest.mark.parametrize("grad_mode", list(GRAD_MODES))
def test_left_padded_bf16_prompts_decode_in_the_loop_with_generates_tokens(grad_mode: str) -> None:
    """Four prompts of 12, 9, 6 and 3 tokens, left-padded, a bf16 Llama-shaped decoder: generate() counts each
    row's positions from its mask; the loop once let the model count them from the cache, and bf16 rope rounded
    otherwise (rows 1 and 2 parted at new tokens 4 and 16). The tokens are generate()'s on the static cache, and the
    class is proven in the loop (not only sent to generate()'s own loop by the proof)."""
    model = random_decoder(
        "LlamaConfig",
        "LlamaForCausalLM",
        hidden_size=256,
        intermediate_size=1024,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        pad_token_id=0,
    )
    request = prompt_of(4, 12)
    for row, length in enumerate((12, 9, 6, 3)):
        request["attention_mask"][row, : 12 - length] = 0
        request["input_ids"][row, : 12 - length] = 0
    request |= {"max_new_tokens": 48, "do_sample": False, "pad_token_id": 0}
    wrapped = ll.wrap(model)
    with GRAD_MODES[grad_mode]():
        reference = static_call(model, request)
        for _ in range(3):  # the proof, then the host-ahead loop twice
            tokens = wrapped.generate(**request)
            parted = [
                (row, int((tokens[row] != reference[row]).nonzero()[0]))
                for row in range(4)
                if not torch.equal(tokens[row], reference[row])
            ]
            assert not parted, parted
    decode = wrapped.graph_info()["decode"]
    (kind,) = decode["classes"]
    assert kind["left_padded"] and kind["proof"] == "proven", kind
    assert decode["loop_generations"] == 2 and decode["steps_replayed"] > 0, decode


@pytest.mark.parametrize("grad_mode", list(GRAD_MODES))
def test_a_cache_layer_no_step_writes_keeps_its_cpu_tensors_and_the_steps_still_replay(grad_mode: str) -> None:
    """Mllama decoding text alone never writes its cross-attention layers' cache: they keep the CPU tensors they
    were made with. The capture once took its device from the cache's first tensor (the CPU) and raised; the
    generation fell back to generate(). The step's device is its GPU tensors': the steps replay with eager's
    static-cache tokens."""
    model = random_decoder(
        "MllamaTextConfig",
        "MllamaForCausalLM",
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        cross_attention_layers=[0],
        pad_token_id=0,
    )
    request = {**prompt_of(1, 12), "max_new_tokens": 16, "do_sample": False}
    wrapped = ll.wrap(model)
    with GRAD_MODES[grad_mode]():
        reference = eager_static(model, request)
        for _ in range(3):
            assert torch.equal(wrapped.generate(**request), reference)
    decode = wrapped.graph_info()["decode"]
    assert decode["steps_replayed"] > 0 and decode["generations_eager"] == {}, decode


def population_decoder(name: str, dtype: torch.dtype) -> torch.nn.Module:
    """A causal LM of the differential population (transformers' own list), shrunk, random weights, on the GPU."""
    from launchless.apps.differential.candidate import Library
    from launchless.apps.differential.population import candidates, pick

    (candidate,) = pick(candidates(Library.TRANSFORMERS_CAUSAL), [name])
    torch.manual_seed(0)
    return candidate.build("cpu").model.to(device="cuda", dtype=dtype).eval()


def fresh_request(model: torch.nn.Module, generator: torch.Generator, *, new_tokens: int) -> dict:
    """A greedy request of two fresh 10-token prompts from the model's first 4096 ids (3 and up: no special tokens)."""
    ids = torch.randint(3, min(model.config.vocab_size, 4096), (2, 10), generator=generator).cuda()
    request = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "max_new_tokens": new_tokens}
    return request | {"do_sample": False, "pad_token_id": 0}


@pytest.mark.parametrize("grad_mode", list(GRAD_MODES))
@pytest.mark.parametrize("name", ["qwen3_5", "jamba", "bamba", "nemotron_h"])
def test_a_hybrids_linear_attention_states_replay_with_eager_static_tokens(name: str, grad_mode: str) -> None:
    """Hybrid decoders keep linear-attention states (a convolution window and a recurrent state of fixed shapes,
    copied into in place each step) beside attention layers: the decode graph follows them. A fresh prompt each
    call, batch 2, float32: every call's tokens are eager generate()'s on the same static cache, the class proven,
    the steps replayed."""
    model = population_decoder(name, torch.float32)
    wrapped = ll.wrap(model)
    generator = torch.Generator().manual_seed(5)
    with GRAD_MODES[grad_mode]():
        for call in range(3):
            request = fresh_request(model, generator, new_tokens=24)
            reference = eager_static(model, request)
            assert torch.equal(wrapped.generate(**request), reference), f"call {call}"
    decode = wrapped.graph_info()["decode"]
    assert decode["steps_replayed"] > 0 and decode["generations_eager"] == {}, decode
    if name in OWN_STEP_INPUTS:  # generate()'s own loop decodes them, its steps replaying the graphs
        assert decode["classes"] == [] and list(decode["through_generate"]) == [OWN_INPUTS_SAY], decode
    else:
        assert [c["proof"] for c in decode["classes"]] == ["proven"], decode["classes"]


# hybrids whose class prepares a step's inputs its own way (``prepare_inputs_for_generation``), and what is said of it
OWN_STEP_INPUTS = ("bamba", "nemotron_h")
OWN_INPUTS_SAY = "this transformers prepares a step's inputs in a way the loop does not follow"


@pytest.mark.parametrize("grad_mode", list(GRAD_MODES))
@pytest.mark.parametrize("name", ["bert", "gpt_neo", "falcon_h1", "mamba"])
def test_decoders_that_do_not_vouch_for_the_static_cache_replay_once_their_class_is_proven(
    name: str, grad_mode: str
) -> None:
    """Classes that do not tell transformers they run on a static cache (an encoder as a decoder, GPT-Neo, a
    hybrid, Mamba -- which takes its cache as ``cache_params``): a class's first call decodes eager both ways and
    hands out generate()'s own tokens; later calls, on fresh prompts, replay the decode graphs with the tokens of
    generate() as called."""
    model = population_decoder(name, torch.float32)
    assert not (getattr(model, "_can_compile_fullgraph", False) or getattr(model, "_supports_static_cache", False))
    wrapped = ll.wrap(model)
    generator = torch.Generator().manual_seed(7)
    with GRAD_MODES[grad_mode]():
        for call in range(4):
            request = fresh_request(model, generator, new_tokens=20)
            assert torch.equal(wrapped.generate(**request), model.generate(**request)), f"call {call}"
    decode = wrapped.graph_info()["decode"]
    assert [c["proof"] for c in decode["cache_classes"]] == ["proven"], decode["cache_classes"]
    assert decode["steps_replayed"] > 0 and decode["generations_eager"] == {}, decode


@pytest.mark.parametrize("grad_mode", list(GRAD_MODES))
@pytest.mark.parametrize("name", ["xglm", "trocr", "mvp", "roformer"])
def test_decoders_that_read_their_cache_length_in_python_replay_their_steps(name: str, grad_mode: str) -> None:
    """XGLM compares ``2 + n + length`` with its position table; TrOCR, MVP and RoFormer build ``arange(length,
    length + n)`` -- the length being the static cache's device tensor, whose read fails a capture. The comparison
    holds alike for every length the cache can hold, and the positions are computed on the device: fresh prompts on
    every call, the tokens of ``model.generate()`` (as called, or on the same static cache), the steps replayed."""
    model = population_decoder(name, torch.float32)
    wrapped = ll.wrap(model)
    generator = torch.Generator().manual_seed(9)
    with GRAD_MODES[grad_mode]():
        for call in range(4):
            request = fresh_request(model, generator, new_tokens=20)
            got = wrapped.generate(**request)
            wants = [model.generate(**request), eager_static(model, request)]
            assert any(got.shape == want.shape and torch.equal(got, want) for want in wants), f"call {call}"
    decode = wrapped.graph_info()["decode"]
    assert decode["steps_replayed"] > 0 and decode["generations_eager"] == {}, decode


def test_a_write_past_the_static_cache_is_stopped_on_the_host_not_asserted_on_the_device(caplog) -> None:
    """A class that does not vouch for the static cache and writes it more often than once a token (here: its first
    attention layer writes every token twice where the cache is static) would write past its end -- on the GPU a
    device-side assert that ends the process. The proof's writes are checked on the host first: the call decodes as
    generate() as called, one WARNING names the write, and the GPU goes on working."""
    model, request = decoder("decode:llama-tiny@b8", new_tokens=40)
    model._can_compile_fullgraph = False
    writes_twice_where_static(model)
    wrapped = ll.wrap(model)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="launchless"):
        for _ in range(2):
            assert torch.equal(wrapped.generate(**request), model.generate(**request))
    torch.cuda.synchronize()
    lines = [r.getMessage() for r in caplog.records if "StaticCacheOverflow" in r.getMessage()]
    assert len(lines) == 1 and "would be written past its end" in lines[0], lines
    assert wrapped.graph_info()["decode"]["steps_replayed"] == 0


@pytest.mark.parametrize("grad_mode", list(GRAD_MODES))
def test_a_decode_step_that_cannot_be_captured_is_named_and_its_class_goes_through_generate(
    caplog, grad_mode: str
) -> None:
    """LongCat-Flash's experts find which of them were hit with `nonzero` (a shape read on the host) while
    capturing: the refusal names the operation and its source line, as a forward's capture error does; no step of
    the class replaying, its later calls go through generate() as called -- eager steps on a static cache would cost
    more. Every call's tokens are those of generate(), on fresh prompts."""
    model = population_decoder("longcat_flash", torch.float32)
    if getattr(model.config, "_experts_implementation_internal", None) is not None:
        model.config._experts_implementation_internal = "eager"  # releases that choose grouped matmuls
    wrapped = ll.wrap(model)
    generator = torch.Generator().manual_seed(3)
    with GRAD_MODES[grad_mode](), caplog.at_level(logging.INFO, logger="launchless"):
        for call in range(4):
            request = fresh_request(model, generator, new_tokens=16)
            got = wrapped.generate(**request)
            assert torch.equal(got, model.generate(**request)) or torch.equal(got, eager_static(model, request)), call
    refused = [r.getMessage() for r in caplog.records if "a decode step is not replayed as a graph" in r.getMessage()]
    assert len(refused) == 1 and "`aten." in refused[0] and ".py:" in refused[0], refused
    decode = wrapped.graph_info()["decode"]
    assert decode["steps_replayed"] == 0 and decode["generate_calls"] == 1, decode  # then generate() as called
    assert any("no decode step replays as a graph" in c["reason"] for c in decode["classes"]), decode["classes"]
    (fallback,) = decode["fallbacks"]  # the operation and its line as fields too, not only inside the reason
    assert fallback["operation"].startswith("aten.") and "modeling_longcat_flash.py:" in fallback["source"], fallback
