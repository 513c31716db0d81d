"""Compiled decode steps (``runtime.decode_kernels``) on the CPU: a real Inductor compile of a GPT-2 decode step on a
static cache in a child process, its program captured with the stand-in graph that recomputes
(``recomputing_graph``), proven (replayed bit for bit, as accurate as eager against float64, logits and cache alike)
and swapped in between two generations; what cancels a compile. ``test_cuda_decode_kernels`` runs it with real
graphs through ``wrap(...).generate``."""

from __future__ import annotations

import dataclasses
import shutil
from typing import Any

import pytest
import torch
from recomputing_graph import recorded_capture

import launchless.runtime.decode_kernels as decode_kernels
from launchless.core.cache import GraphCache
from launchless.core.compiled_programs import ROUTING, JobState
from launchless.core.signature import Signature, flatten_inputs, signature_of
from launchless.runtime.cache_layers import HostCounters
from launchless.runtime.decode_kernels import DecodeKernels
from launchless.runtime.static_cache import cache_keyword, cache_tensors, new_static_cache
from launchless.timing import SpeedVerdict

transformers = pytest.importorskip("transformers")
needs_compiler = pytest.mark.skipif(shutil.which("g++") is None, reason="Inductor's CPU kernels need a C++ compiler")
COMPILE_S = 600
PROMPT = 4
CACHE_LENGTH = 16


@dataclasses.dataclass
class Held:
    cache: Any
    counters: HostCounters


@dataclasses.dataclass
class Setup:
    model: Any
    cache: Any
    keyword: str
    flat: Any
    key: Signature
    graphs: GraphCache
    eager_graph: Any
    kernels: DecodeKernels


def _setup(monkeypatch, tmp_path, *, faster: bool = True) -> Setup:
    monkeypatch.setenv("LAUNCHLESS_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(decode_kernels, "capture", recorded_capture([]))
    verdict = SpeedVerdict(1.0, 0.5 if faster else 1.2, 1.0, 0.5 if faster else 1.2, "" if faster else "not faster")

    def judge(eager, candidate, **_):  # replays as many as the cache has positions: each replay must start afresh
        for _ in range(2 * CACHE_LENGTH):
            eager(), candidate()
        return verdict

    monkeypatch.setattr(decode_kernels, "judge_speed", judge)
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=128, n_positions=32)
    model = transformers.GPT2LMHeadModel(config).eval()
    keyword = cache_keyword(model)
    cache = new_static_cache(model, batch=1, length=CACHE_LENGTH)
    with torch.no_grad():  # the prompt fills the cache's first positions
        model(input_ids=torch.randint(0, 128, (1, PROMPT)), cache_position=torch.arange(PROMPT), **{keyword: cache})
    flat = flatten_inputs((), {"input_ids": torch.tensor([[7]]), "cache_position": torch.tensor([PROMPT])})
    sig = signature_of(flat)
    key = Signature(("decode", 0, sig.structure), sig.leaves, sig.context)
    forward = type(model).forward.__get__(model)

    def step(**tensors: Any) -> Any:
        return {k: v for k, v in forward(**tensors, **{keyword: cache}).items() if v is not cache}

    graphs: GraphCache = GraphCache(name="GPT2LMHeadModel decode steps", capture_after=1, max_graphs=4, guards=[])
    eager_graph = recorded_capture([])(step, flat, device=torch.device("cpu"), pool=None, warmup=1)
    graphs.keep(key, eager_graph, None, flat.leaves)
    held = Held(cache, HostCounters.of(cache))
    kernels = DecodeKernels(name="GPT2LMHeadModel", graphs=graphs, held=lambda k: held, warmup=1, verify="on")
    return Setup(model, cache, keyword, flat, key, graphs, eager_graph, kernels)


def _start(s: Setup) -> None:
    forward = type(s.model).forward.__get__(s.model)
    s.kernels.start(s.key, forward, s.cache, s.keyword, s.flat)


def _eager_step(s: Setup, ids: torch.Tensor) -> Any:
    return s.model(input_ids=ids, cache_position=torch.tensor([PROMPT]), **{s.keyword: s.cache}).logits


@needs_compiler
def test_a_compiled_decode_step_writes_the_caches_own_tensors_and_is_swapped_in_between_generations(
    monkeypatch, tmp_path
) -> None:
    s = _setup(monkeypatch, tmp_path)

    def routed(*args: Any, **kwargs: Any) -> Any:  # generate() routes the model's calls while it decodes
        raise AssertionError("the compile must not call the routed forward")

    setattr(routed, ROUTING, True)
    s.model.forward = routed  # the compile sends the model as its class defines it
    with torch.no_grad():
        _start(s)
        del s.model.forward
        assert s.kernels.pending == 1 and s.kernels.info()[0]["kernels"] == "compiling"
        job = s.kernels._compiles[s.key].decision.compile
        assert job.wait(COMPILE_S) is JobState.READY, job.reason
        parts = []
        for ended_at in (CACHE_LENGTH - 1, PROMPT + 3, CACHE_LENGTH - 2, CACHE_LENGTH - 1):  # a part a generate()
            for layer in s.cache.layers:  # where the last generation ended: each part runs from the kept step
                layer.cumulative_length.fill_(ended_at)
            before = [t.clone() for t in cache_tensors(s.cache)]
            s.kernels.swap_ready()
            for was, now in zip(before, cache_tensors(s.cache), strict=True):  # each part put the cache back
                assert torch.equal(was, now)
            parts.append(list(s.kernels.info()[0]["proof_phases"]))
            if len(parts) < 4:
                assert s.kernels.pending == 1 and s.graphs.graphs[s.key] is s.eager_graph  # still eager's kernels
        assert parts == [
            ["read"],
            ["read", "capture"],
            ["read", "capture", "accuracy"],
            ["read", "capture", "accuracy", "speed"],
        ]
        row = s.kernels.info()[0]
        assert row["kernels"] == "compiled", row["reason"]
        assert row["accuracy"]["passed"] and s.kernels.pending == 0 and s.kernels._proofs == {}
        swapped = s.graphs.graphs[s.key]
        assert swapped is not s.eager_graph
        for layer in s.cache.layers:
            layer.cumulative_length.fill_(PROMPT)
        before = [t.clone() for t in cache_tensors(s.cache)]
        ids = torch.tensor([[11]])
        replayed = swapped.replay_cloned([ids, torch.tensor([PROMPT])])["logits"]
        written = [t.clone() for t in cache_tensors(s.cache)]
        for t, was in zip(cache_tensors(s.cache), before, strict=True):
            t.copy_(was)
        eager = _eager_step(s, ids)
        torch.testing.assert_close(replayed, eager, rtol=1e-5, atol=1e-5)
        assert any(not torch.equal(w, b) for w, b in zip(written, before, strict=True))  # the program wrote the cache
        for w, e in zip(written, cache_tensors(s.cache), strict=True):  # where and what eager writes
            torch.testing.assert_close(w, e, rtol=1e-5, atol=1e-5)


@needs_compiler
def test_a_decode_step_not_faster_keeps_eager_kernels_and_a_forgotten_graph_cancels_its_compile(
    monkeypatch, tmp_path
) -> None:
    s = _setup(monkeypatch, tmp_path, faster=False)
    with torch.no_grad():
        _start(s)
        job = s.kernels._compiles[s.key].decision.compile
        assert job.wait(COMPILE_S) is JobState.READY, job.reason
        for _ in range(4):  # read, capture, accuracy, speed: a part a generate()
            s.kernels.swap_ready()
    row = s.kernels.info()[0]
    assert row["kernels"] == "eager" and "not faster" in row["reason"]
    assert s.graphs.graphs[s.key] is s.eager_graph

    s = _setup(monkeypatch, tmp_path / "other")
    _start(s)
    job = s.kernels._compiles[s.key].decision.compile
    s.kernels.forget(s.key, "its cache was dropped")
    assert job.state is JobState.CANCELLED and job.reason == "its cache was dropped"
    assert s.kernels.pending == 0 and s.kernels.info() == []

    s = _setup(monkeypatch, tmp_path / "during")  # forgotten in the middle of its proof: it ends, nothing swapped in
    with torch.no_grad():
        _start(s)
        assert s.kernels._compiles[s.key].decision.compile.wait(COMPILE_S) is JobState.READY
        s.kernels.swap_ready()
        s.kernels.swap_ready()  # read, then capture: a graph of the program is held by the proof
        proof = s.kernels._proofs[s.key]
        s.kernels.forget(s.key, "its cache was re-allocated")
    assert proof.gi_frame is None and s.kernels._proofs == {} and s.kernels.pending == 0
    assert s.graphs.graphs[s.key] is s.eager_graph


def test_a_forward_replaced_on_the_instance_is_not_compiled_as_the_step(monkeypatch, tmp_path) -> None:
    s = _setup(monkeypatch, tmp_path)
    s.kernels.start(s.key, lambda **kwargs: None, s.cache, s.keyword, s.flat)
    row = s.kernels.info()[0]
    assert row["kernels"] == "eager" and "replaced on the instance" in row["reason"]
    assert s.kernels.pending == 0
