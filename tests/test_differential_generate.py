"""The differential harness's decode rows on the CPU: which references a call is compared with, when a row is
``eager-fails``, and the requests a multi-codebook decoder gets (and, marked ``zoo``, models of the causal-LM
population whose rows were ``eager-fails`` for the harness's own reasons)."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
import torch

from launchless.apps.differential import generate
from launchless.apps.differential.candidate import Built, Candidate, Library
from launchless.apps.differential.rows import Entry, GradMode, Result
from launchless.runtime.cache_layers import StaticCacheOverflow


@pytest.fixture
def on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rows move prompts with ``.cuda()`` and wait with ``torch.cuda.synchronize()``: both stay on the CPU."""
    monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *args, **kwargs: self)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args, **kwargs: None)


def _transformers() -> Any:
    return pytest.importorskip("transformers")


def _tiny_mpt() -> torch.nn.Module:
    """MPT: its class does not vouch for a static cache, its config turns the cache off, and its generate() feeds the
    whole sequence at every step (a static cache overflows after a few)."""
    transformers = _transformers()
    config = transformers.MptConfig(d_model=64, n_heads=4, n_layers=2, vocab_size=128, max_seq_len=128)
    torch.manual_seed(0)
    return transformers.MptForCausalLM(config).eval()


def _tiny_llama() -> torch.nn.Module:
    """A model launchless decodes through a static cache."""
    transformers = _transformers()
    config = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def _tiny_musicgen() -> torch.nn.Module:
    """A decoder over four audio codebooks, its pad and start id moved inside the vocabulary as the shrinker does."""
    transformers = _transformers()
    config = transformers.MusicgenDecoderConfig(
        vocab_size=64,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        ffn_dim=128,
        num_codebooks=4,
        pad_token_id=63,
        bos_token_id=63,
    )
    torch.manual_seed(0)
    return transformers.MusicgenForCausalLM(config).eval()


def _candidate(model: torch.nn.Module) -> tuple[Candidate, Built]:
    built = Built(model, lambda generator, device: ((), {}), type(model).__name__)
    return Candidate(Library.TRANSFORMERS_CAUSAL, model.config.model_type, "decoder", lambda device: built), built


def _row(model: torch.nn.Module, entry: Entry = Entry.GENERATE_GREEDY_B1) -> dict[str, Any]:
    candidate, built = _candidate(model)
    return generate.generate_row(candidate, built, entry, GradMode.INFERENCE_MODE, seed=0)


def _counting(monkeypatch: pytest.MonkeyPatch, name: str) -> list[int]:
    """Counts the calls of ``generate.<name>`` (still run)."""
    calls: list[int] = []
    real = getattr(generate, name)

    def counted(model: torch.nn.Module, request: dict[str, Any]) -> torch.Tensor:
        calls.append(1)
        return real(model, request)

    monkeypatch.setattr(generate, name, counted)
    return calls


def _request(model: torch.nn.Module) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(0)
    return {**generate._prompt(Entry.GENERATE_GREEDY_B1, 128, generator), "do_sample": False}


def test_the_static_reference_is_not_made_for_a_call_launchless_refuses_and_is_checked_where_made(
    on_cpu, monkeypatch
) -> None:
    """MPT's config turns its cache off (each step feeds the whole sequence): launchless refuses the call, and no
    static reference is made. Made anyway, a write past the static cache's end (on the GPU a device-side assert that
    ends the worker) is stopped on the host first: MPT does not vouch for the static cache."""
    model = _tiny_mpt()
    request = _request(model)
    assert "use_cache=False" in (generate._static_refusal(model, request) or "")
    with pytest.raises(StaticCacheOverflow, match="would be written past its end"), torch.inference_mode():
        generate._reference(model, request)
    static = _counting(monkeypatch, "_reference")
    row = _row(model)
    assert static == []
    assert row["result"] == Result.IDENTICAL.value, row["reason"]
    assert row["calls"] == row["identical_calls"] == generate.GENERATE_CALLS
    assert "static-cache reference" not in (row["reason"] or "")


def test_the_static_reference_is_made_where_launchless_decodes_on_a_static_cache(on_cpu, monkeypatch) -> None:
    model = _tiny_llama()
    request = _request(model)
    assert generate._static_refusal(model, request) is None
    with torch.inference_mode():
        wants, dropped = generate._references(model, request, seed=0)
    assert dropped is None and len(wants) == 2
    static = _counting(monkeypatch, "_reference")
    row = _row(model)
    assert len(static) == generate.GENERATE_CALLS
    assert row["result"] == Result.IDENTICAL.value, row["reason"]


def test_a_static_reference_that_raises_is_dropped_and_named_not_eager_fails(on_cpu, monkeypatch) -> None:
    def raises(model: torch.nn.Module, request: dict[str, Any]) -> torch.Tensor:
        raise RuntimeError("the static cache overflowed")

    monkeypatch.setattr(generate, "_reference", raises)
    row = _row(_tiny_llama())
    assert row["result"] == Result.IDENTICAL.value
    assert row["calls"] == row["identical_calls"] == generate.GENERATE_CALLS
    assert row["reason"].count("static-cache reference dropped: RuntimeError: the static cache overflowed") == 1


def test_the_row_is_eager_fails_where_model_generate_as_called_raises(on_cpu, monkeypatch) -> None:
    def raises(model: torch.nn.Module, request: dict[str, Any]) -> torch.Tensor:
        raise ValueError("the model's own generate() failed")

    monkeypatch.setattr(generate, "_as_called", raises)
    row = _row(_tiny_llama())
    assert row["result"] == Result.EAGER_FAILS.value
    assert row["calls"] == 0
    assert "ValueError: the model's own generate() failed" in row["reason"]


def _shifted(model: torch.nn.Module, request: dict[str, Any]) -> torch.Tensor:
    """Tokens no accelerated call returns: what generate() returns, one id up."""
    return model.generate(**request) + 1


def test_tokens_match_the_static_reference_where_generate_as_called_differs(on_cpu, monkeypatch) -> None:
    monkeypatch.setattr(generate, "_as_called", _shifted)
    row = _row(_tiny_llama())
    assert row["result"] == Result.IDENTICAL.value, row["reason"]


def test_tokens_are_compared_with_the_references_made_only(on_cpu, monkeypatch) -> None:
    """MPT gets no static reference: tokens unlike ``model.generate()`` as called differ, whatever a static cache
    would have given."""
    monkeypatch.setattr(generate, "_as_called", _shifted)
    row = _row(_tiny_mpt())
    assert row["result"] == Result.DIFFERS.value
    assert row["identical_calls"] == 0


def test_prompts_of_one_row_per_sequence_are_drawn_as_before(on_cpu) -> None:
    from launchless.apps.differential.inputs import token_ids

    prompt = generate._prompt(Entry.GENERATE_GREEDY_B4, 100, torch.Generator().manual_seed(3))
    ids = token_ids(torch.Generator().manual_seed(3), 4, generate.PROMPT, 100)
    mask = torch.ones_like(ids)
    for row, pads in enumerate(generate.LEFT_PADS):
        ids[row, :pads], mask[row, :pads] = 0, 0
    assert torch.equal(prompt["input_ids"], ids) and torch.equal(prompt["attention_mask"], mask)
    assert prompt["pad_token_id"] == 0


def test_a_multi_codebook_decoder_gets_a_row_of_ids_per_codebook_and_a_pad_id_its_heads_never_emit(
    on_cpu,
) -> None:
    prompt = generate._prompt(Entry.GENERATE_GREEDY_B4, 64, torch.Generator().manual_seed(0), codebooks=4)
    assert prompt["input_ids"].shape == (16, generate.PROMPT)
    assert prompt["attention_mask"].shape == (4, generate.PROMPT)
    ids = prompt["input_ids"].view(4, 4, generate.PROMPT)
    for row, pads in enumerate(generate.LEFT_PADS):
        assert (ids[row, :, :pads] == 0).all() and (ids[row, :, pads:] != 0).all()
        assert prompt["attention_mask"][row].tolist() == [0] * pads + [1] * (generate.PROMPT - pads)
    model = _tiny_musicgen()
    assert generate._codebook_ids(model, generate._vocabulary(model)) == {
        "pad_token_id": 64,
        "decoder_start_token_id": 64,
    }
    assert generate._codebook_ids(_tiny_llama(), 128) == {}  # embeddings no wider than the head: nothing to add


def test_a_row_of_ids_per_codebook_only_where_the_forward_took_them() -> None:
    from launchless.apps.differential.hf_inputs import Layout, make_inputs

    model = _tiny_musicgen()
    assert generate._codebooks(model, Built(model, lambda generator, device: ((), {}))) == 1  # no layout fitted
    for rows, codebooks in ((False, 1), (True, 4)):
        fitted = Built(model, partial(make_inputs, (), model.config, layout=Layout(codebook_rows=rows)))
        assert generate._codebooks(model, fitted) == codebooks


# Causal LMs of the population whose decode rows were ``eager-fails`` only because of the harness: a static-cache
# reference their class refuses (MPT overflows it, MiniMax keeps a cache of its own) or a request the model cannot
# take (MusicGen Melody: one row of ids per codebook, and a pad id outside its heads).
FIXED_ROWS = ("mpt", "minimax", "musicgen_melody")


@pytest.mark.zoo
@pytest.mark.parametrize("name", FIXED_ROWS)
def test_population_models_whose_rows_eager_failed_on_the_harness_decode(name: str, on_cpu) -> None:
    _transformers()
    from launchless.apps.differential.population import candidates, pick

    (candidate,) = pick(candidates(Library.TRANSFORMERS_CAUSAL), [name])
    built = candidate.build("cpu")
    for entry, mode in generate.REQUESTS:
        row = generate.generate_row(candidate, built, entry, mode, seed=0)
        assert row["result"] == Result.IDENTICAL.value, (entry, mode, row["reason"])
