"""The decode loop over transformers' whole causal-LM list, on the CPU: every architecture of
``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` that builds, shrunk, decoded through decode graphs against ``model.generate()``
on the harness's four requests (greedy batch 1 under both grad modes, greedy batch 4 left-padded in bfloat16, sampling
under a seed in float32), fresh prompts on every call.

The graphs are the recomputing stand-in (``recomputing_graph``), which like a CUDA graph leaves the host state a step
changes alone on replay, so what is checked here is the loop, the static cache, the routing of the step's inputs and
the per-class proofs -- on whatever transformers release is installed, so that a release that changes generate() in a
way the loop does not follow fails here before it fails a user. A request that decodes without replaying a single
step must name why in ``graph_info()["decode"]``: no fallback is silent. The GPU's graphs are the ``cuda``
differential's."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")

from recomputing_graph import recorded_capture  # noqa: E402

import launchless.runtime.decode_steps as decode_steps  # noqa: E402
from launchless.apps.differential import generate  # noqa: E402
from launchless.apps.differential.candidate import Candidate, Library, NotInLibraryError  # noqa: E402
from launchless.apps.differential.population import candidates  # noqa: E402
from launchless.apps.differential.runner import grad_mode, one_line  # noqa: E402
from launchless.runtime.cache_lengths import CacheLengths  # noqa: E402
from launchless.runtime.decode_graphs import DecodeGraphs  # noqa: E402

CALLS = 2  # per request: the first proves its class (both loops), the second decodes in the host-ahead loop

try:
    CAUSAL = candidates(Library.TRANSFORMERS_CAUSAL)
except ImportError:  # an older transformers without the list's modules: the harness's own tests say so
    CAUSAL = []


def _decoding_on_cpu(monkeypatch: pytest.MonkeyPatch, *, host_reads_fail: bool) -> Iterator[None]:
    """The requests move prompts with ``.cuda()``: they stay on the CPU; steps are captured by the stand-in; one
    thread (bfloat16 kernels of models this small decode fastest so on a shared machine)."""
    monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *args, **kwargs: self)
    monkeypatch.setattr(decode_steps, "capture", recorded_capture([], host_reads_fail=host_reads_fail))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def on_cpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    yield from _decoding_on_cpu(monkeypatch, host_reads_fail=False)


def _built(name: str) -> Any:
    """The causal LM ``name`` of transformers' list, built on the CPU with the same random weights every run."""
    candidate = next((c for c in CAUSAL if c.name == name), None)
    if candidate is None:
        pytest.skip(f"{name} is not in this transformers release's causal-LM list")
    torch.manual_seed(0)
    return candidate.build("cpu")


@pytest.fixture
def strict_capture(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """As ``on_cpu``, with a capture that fails where the step reads a tensor's value on the host, as CUDA fails it."""
    yield from _decoding_on_cpu(monkeypatch, host_reads_fail=True)


def _decode_graphs(model: torch.nn.Module) -> DecodeGraphs:
    steps = decode_steps.DecodeSteps(
        model,
        name=type(model).__name__,
        explicit=False,
        capture_after=2,
        max_graphs=4,
        warmup=3,
        verify="on",
        tolerance_ulps=64.0,
    )
    return DecodeGraphs(steps=steps)


@pytest.mark.zoo
@pytest.mark.parametrize("candidate", CAUSAL, ids=[c.name for c in CAUSAL])
def test_every_causal_lm_decodes_through_graphs_with_the_tokens_of_generate(candidate: Candidate, on_cpu) -> None:
    torch.manual_seed(0)  # the random weights: the same model on every run
    try:
        built = candidate.build("cpu")
    except NotInLibraryError as exc:
        pytest.skip(f"does not build in the library itself: {exc}")
    failed: list[str] = []
    decoded = 0
    for entry, mode in generate.REQUESTS:
        decoded_before = decoded
        model, requests = generate._requests(built, entry)
        graphs = _decode_graphs(model)
        prompts = torch.Generator().manual_seed(0)
        with grad_mode(mode):
            for call in range(CALLS):
                request = requests(prompts)
                try:
                    wants, _ = generate._references(model, request, seed=call)
                except Exception as exc:  # model.generate() itself raises on this request: nothing to compare
                    failed.append(f"{entry.value}: eager generate() raises {one_line(exc)}")
                    break
                _decodes_as_generate(graphs, model, request, wants, call, f"{entry.value} under {mode.value}")
                decoded += 1
        if decoded > decoded_before:  # eager generate() itself may raise on a request: then nothing decoded
            _assert_a_fallback_names_its_reason(graphs.info(), f"{entry.value} under {mode.value}")
    if not decoded:
        pytest.skip("; ".join(failed))


def _decodes_as_generate(
    graphs: DecodeGraphs, model: torch.nn.Module, request: dict, wants: list, call: int, label: str
) -> None:
    """The request decoded through ``graphs`` has the tokens of one of ``model.generate()``'s references."""
    torch.manual_seed(call)
    got = graphs.generate(model, (), dict(request))  # raising here, where generate() works, fails
    assert any(got.shape == want.shape and torch.equal(got, want) for want in wants), (
        f"{label}, call {call}: tokens differ from model.generate(); {_why(graphs.info())}"
    )


def _assert_a_fallback_names_its_reason(info: dict[str, Any], request: str) -> None:
    """A request whose generations decoded without replaying a single decode step must say why in
    ``graph_info()["decode"]``: a generation sent through ``generate()`` as called, or a step run eager, by reason."""
    if not info["steps_replayed"]:
        assert info["generations_eager"] or info["steps_eager"], (
            f"{request}: no decode step replayed, and no reason was recorded; {_why(info)}"
        )


def _why(info: dict[str, Any]) -> str:
    return f"classes {info.get('classes')}, eager {info.get('generations_eager')}, steps {info.get('steps_eager')}"


READ_THE_LENGTH = ["xglm", "trocr", "mvp", "roformer"]  # positions from the cache's length, read in Python


@pytest.mark.zoo
@pytest.mark.parametrize("name", READ_THE_LENGTH)
def test_decoders_that_read_their_cache_length_on_the_host_replay_their_steps(name: str, strict_capture) -> None:
    """XGLM compares ``2 + n + length`` with its position table, TrOCR, MVP and RoFormer build ``arange(length,
    length + n)``, the length being the static cache's device tensor: every request replays its decode steps, with
    ``model.generate()``'s tokens; without the cache's lengths followed, the same capture fails on the read."""
    built = _built(name)
    for entry, mode in generate.REQUESTS:
        model, requests = generate._requests(built, entry)
        graphs = _decode_graphs(model)
        prompts = torch.Generator().manual_seed(0)
        with grad_mode(mode):
            for call in range(CALLS):
                request = requests(prompts)
                wants, _ = generate._references(model, request, seed=call)
                _decodes_as_generate(graphs, model, request, wants, call, f"{entry.value} under {mode.value}")
        assert graphs.info()["steps_replayed"], f"{entry.value} under {mode.value}: {_why(graphs.info())}"


@pytest.mark.zoo
def test_without_the_lengths_followed_the_strict_capture_fails_on_the_read(
    strict_capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stand-in the test above relies on: with the mode a no-op, XGLM's steps are refused for the host read."""
    monkeypatch.setattr(decode_steps, "CacheLengths", lambda cache: CacheLengths(None))
    built = _built("xglm")
    entry, mode = generate.REQUESTS[0]
    model, requests = generate._requests(built, entry)
    graphs = _decode_graphs(model)
    prompts = torch.Generator().manual_seed(0)
    with grad_mode(mode):
        for _ in range(CALLS):  # a class that does not vouch for the static cache proves it first, then captures
            graphs.generate(model, (), dict(requests(prompts)))
    info = graphs.info()
    assert not info["steps_replayed"]
    assert any("operation not permitted when stream is capturing" in why for why in info["steps_eager"]), _why(info)


@pytest.mark.zoo
def test_a_step_whose_shape_follows_its_values_is_refused_by_name_and_its_class_goes_through_generate(
    strict_capture, caplog
) -> None:
    """LongCat-Flash's experts, run one by one (transformers' "eager" experts), find which were hit with ``nonzero``,
    a shape its values choose, which fails a capture on the GPU as on this stand-in: the refusal names the kind and
    the model's source line, no step of the class replays, and every call's tokens are ``model.generate()``'s."""
    built = _built("longcat_flash")
    if getattr(built.model.config, "_experts_implementation_internal", None) is not None:
        built.model.config._experts_implementation_internal = "eager"  # releases that choose grouped matmuls
    entry, mode = generate.REQUESTS[0]
    model, requests = generate._requests(built, entry)
    graphs = _decode_graphs(model)
    prompts = torch.Generator().manual_seed(0)
    with grad_mode(mode), caplog.at_level(logging.INFO, logger="launchless"):
        for call in range(CALLS + 1):
            request = requests(prompts)
            wants, _ = generate._references(model, request, seed=call)
            _decodes_as_generate(graphs, model, request, wants, call, f"{entry.value} under {mode.value}")
    refused = [r.getMessage() for r in caplog.records if "a decode step is not replayed as a graph" in r.getMessage()]
    assert len(refused) == 1 and "data-dependent shape at " in refused[0], refused
    info = graphs.info()
    assert info["steps_replayed"] == 0, _why(info)
    (fallback,) = info["fallbacks"]
    assert "modeling_longcat_flash.py:" in fallback["source"] and "nonzero" in fallback["source"], fallback
