"""Compiled decode steps on the GPU: ``launchless.wrap(model, kernels="compiled").generate(...)`` decodes through
eager-kernel graphs from its first call, compiles each decode graph's step beside the generations, and swaps the
proven program's graph in between two calls; fresh prompts on every call, under no_grad and inference_mode, the
tokens of eager generate() on the same static cache. A checkpoint loaded while the step compiles cancels the compile:
the next calls decode the new weights."""

from __future__ import annotations

import time

import pytest
import torch

import launchless as ll
from launchless.core.compiled_programs import JobState
from launchless.runtime.static_cache import cache_keyword, cache_length, new_static_cache

pytestmark = pytest.mark.cuda
transformers = pytest.importorskip("transformers")

GRAD_MODES = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}
SWAP_WITHIN_S = 300


def _llama() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
        max_position_embeddings=256,
    )
    return transformers.LlamaForCausalLM(config).cuda().eval()


def _request(generator: torch.Generator, batch: int = 1) -> dict:
    ids = torch.randint(1, 512, (batch, 12), generator=generator).cuda()  # fresh tokens every call
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "max_new_tokens": 16, "do_sample": False}


def _eager_static(model: torch.nn.Module, request: dict) -> torch.Tensor:
    length = cache_length(request["input_ids"].shape[1] + request["max_new_tokens"])
    cache = new_static_cache(model, batch=request["input_ids"].shape[0], length=length)
    return model.generate(**request, **{cache_keyword(model): cache}, disable_compile=True)


def _rows(wrapped: ll.GraphedModule) -> list[dict]:
    decode = wrapped.graph_info()["decode"]
    return [] if decode is None else decode["compiled_kernels"]


@pytest.mark.parametrize("grad_mode", list(GRAD_MODES))
def test_compiled_decode_steps_are_swapped_in_between_calls_with_eagers_tokens(grad_mode, tmp_path, monkeypatch):
    monkeypatch.setenv("LAUNCHLESS_CACHE_DIR", str(tmp_path))
    model = _llama()
    wrapped = ll.wrap(model, kernels="compiled")
    generator = torch.Generator().manual_seed(1)
    deadline, calls = time.monotonic() + SWAP_WITHIN_S, 0
    with GRAD_MODES[grad_mode]():
        while True:
            request = _request(generator)
            tokens = wrapped.generate(**request)
            calls += 1
            assert torch.equal(tokens, _eager_static(model, request)), f"call {calls}"
            rows = _rows(wrapped)
            if (rows and all(r["kernels"] != "compiling" for r in rows)) or time.monotonic() > deadline:
                break
        (row,) = rows
        assert row["kernels"] == "compiled", row
        assert row["accuracy"]["passed"] and row["speed"]["speedup"] > 1.0, row
        assert set(row["proof_phases"]) == {"read", "capture", "accuracy", "speed"}, row["proof_phases"]
        replayed = wrapped.graph_info()["decode"]["steps_replayed"]
        for _ in range(3):  # after the swap: the compiled step's graph replays, fresh prompts, eager's tokens
            request = _request(generator)
            assert torch.equal(wrapped.generate(**request), _eager_static(model, request))
    assert wrapped.graph_info()["decode"]["steps_replayed"] >= replayed + 3 * 14
    assert "forward" not in model.__dict__


def test_a_checkpoint_loaded_while_the_step_compiles_cancels_it_and_the_new_weights_decode(tmp_path, monkeypatch):
    monkeypatch.setenv("LAUNCHLESS_CACHE_DIR", str(tmp_path))
    model = _llama()
    wrapped = ll.wrap(model, kernels="compiled")
    generator = torch.Generator().manual_seed(2)
    other = {k: torch.randn_like(v) * 0.02 for k, v in model.state_dict().items()}
    with torch.inference_mode():
        wrapped.generate(**_request(generator))
        (row,) = _rows(wrapped)
        assert row["kernels"] == "compiling", row
        (compiling,) = wrapped._decode.steps.kernels._compiles.values()
    model.load_state_dict(other, assign=True)  # a checkpoint's tensors replace the weights, while the step compiles
    with torch.inference_mode():
        for _ in range(3):
            request = _request(generator)
            assert torch.equal(wrapped.generate(**request), _eager_static(model, request))
    assert compiling.decision.job.state is JobState.CANCELLED, compiling.decision.job.reason
    rows = _rows(wrapped)  # the step compiles again, for the new tensors
    assert [r["kernels"] for r in rows] == ["compiling"] or [r["kernels"] for r in rows] == ["compiled"], rows
