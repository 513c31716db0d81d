"""The swap of compiled kernels (``runtime.compiled_kernels``) on the CPU: a real Inductor compile in a child process,
its program captured with the stand-in graph that recomputes (``recomputing_graph``), proven as accurate as eager
against float64 and timed; what keeps eager's kernels, and what cancels a compile. ``test_cuda_compiled_kernels``
runs it with real graphs through ``wrap``."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import time
from typing import Any

import pytest
import torch
from recomputing_graph import recorded_capture
from torch import nn

import launchless.runtime.compiled_kernels as compiled_kernels
from launchless.core.cache import GraphCache
from launchless.core.kernel_swaps import KernelState
from launchless.core.signature import flatten_inputs, signature_of
from launchless.runtime.compiled_kernels import CompiledKernels
from launchless.timing import SpeedVerdict

needs_compiler = pytest.mark.skipif(shutil.which("g++") is None, reason="Inductor's CPU kernels need a C++ compiler")
COMPILE_S = 600


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(32, 64), nn.Linear(64, 32)
        self.norm = nn.LayerNorm(32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.down(torch.nn.functional.gelu(self.up(x))))


def _verdict(faster: bool) -> SpeedVerdict:
    return SpeedVerdict(1.0, 0.5 if faster else 1.2, 1.0, 0.5 if faster else 1.2, "" if faster else "not faster")


@dataclasses.dataclass
class Setup:
    model: nn.Module
    flat: Any
    sig: Any
    cache: GraphCache
    eager_graph: Any
    kernels: CompiledKernels


def _setup(monkeypatch, tmp_path, *, faster: bool = True) -> Setup:
    monkeypatch.setenv("LAUNCHLESS_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(compiled_kernels._capture, "capture", recorded_capture([]))
    monkeypatch.setattr(compiled_kernels, "judge_speed", lambda eager, candidate, **_: _verdict(faster))
    torch.manual_seed(0)
    model = Mlp().eval()
    x = torch.randn(4, 32)
    flat = flatten_inputs((x,), {})
    sig = signature_of(flat)
    cache: GraphCache = GraphCache(name="Mlp.forward", capture_after=1, max_graphs=4, guards=[])
    eager_graph = recorded_capture([])(model, flat, device=torch.device("cpu"), pool=None)
    cache.keep(sig, eager_graph, None, flat.leaves)
    kernels = CompiledKernels(model=model, name="Mlp.forward", cache=cache, warmup=1)
    return Setup(model, flat, sig, cache, eager_graph, kernels)


def _until_done(kernels: CompiledKernels, sig) -> None:
    job = kernels._entries[sig].job
    assert job.wait(COMPILE_S) is not None and job.done, job.reason


PROOF_PARTS = 4  # read, capture, accuracy, speed: one a call


def _swapped(s: Setup, graph: Any = None, model: nn.Module | None = None) -> Any:
    """The graph the calls replay once the proof is done (a part a call; every call before its end replays the
    eager-kernel graph ``graph``), or the eager-kernel graph where a part decided against the program."""
    graph = s.eager_graph if graph is None else graph
    for _ in range(PROOF_PARTS):
        replayed = s.kernels.swap(s.sig, s.flat, graph, s.model if model is None else model)
        if s.kernels.info(str)[0]["kernels"] != "compiling":
            return replayed
        assert replayed is graph  # the proof under way: this call replays the eager-kernel graph
    raise AssertionError(f"not decided after {PROOF_PARTS} calls")


@needs_compiler
def test_a_proven_faster_program_replaces_the_eager_kernel_graph_between_two_calls(monkeypatch, tmp_path) -> None:
    s = _setup(monkeypatch, tmp_path)
    with torch.no_grad():
        s.kernels.start(s.sig, s.model, s.flat)
        assert s.kernels.pending == 1 and s.kernels.info(str)[0]["kernels"] == "compiling"
        assert not s.kernels._entries[s.sig].job.done  # a child process starts and imports torch: seconds
        assert s.kernels.swap(s.sig, s.flat, s.eager_graph, s.model) is s.eager_graph  # not ready yet
        assert s.kernels.pending == 1
        _until_done(s.kernels, s.sig)
        parts = []
        for _ in range(PROOF_PARTS - 1):  # a part of the proof per call: no call waits for all of it
            assert s.kernels.swap(s.sig, s.flat, s.eager_graph, s.model) is s.eager_graph
            parts.append(list(s.kernels.info(str)[0]["proof_phases"]))
        assert parts == [["read"], ["read", "capture"], ["read", "capture", "accuracy"]]
        swapped = s.kernels.swap(s.sig, s.flat, s.eager_graph, s.model)
    row = s.kernels.info(str)[0]
    assert row["kernels"] == "compiled", row["reason"]
    assert row["program"] == "compiled"  # by this process's compiler
    assert swapped is not s.eager_graph and s.cache.graphs[s.sig] is swapped and s.kernels.pending == 0
    assert row["accuracy"]["passed"] and row["accuracy"]["compiled_error"] <= row["accuracy"]["bound"]
    assert row["speed"]["speedup"] == 2.0 and row["swap_s"] >= row["compile_s"] > 0
    # what the swapping call waited for, part by part, within the whole of it
    assert set(row["proof_phases"]) == {"read", "capture", "accuracy", "speed"}, row["proof_phases"]
    assert 0 < sum(row["proof_phases"].values()) <= row["swap_s"]
    with torch.no_grad():
        fresh = torch.randn(4, 32)
        torch.testing.assert_close(swapped.replay_cloned([fresh]), s.model(fresh), rtol=1e-5, atol=1e-5)
        s.model.norm.weight.mul_(2.0)  # loaded in place: the program is called with the model's tensors
        torch.testing.assert_close(swapped.replay_cloned([fresh]), s.model(fresh), rtol=1e-5, atol=1e-5)
        assert s.kernels.swap(s.sig, s.flat, swapped, s.model) is swapped  # decided: nothing more is read


@needs_compiler
def test_a_program_kept_in_inductors_format_says_why_on_the_swaps_line(monkeypatch, tmp_path, caplog) -> None:
    """On a machine whose package loader crashed before (its record beside the programs), the program is kept in
    Inductor's format: the swap's one log line says so and why, since another process then reads it in seconds."""
    from launchless.core import package_check
    from launchless.core.compiled_programs import cache_dir

    s = _setup(monkeypatch, tmp_path)
    record = package_check.loader_record(cache_dir())
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps({"why": "a process ... ended with signal SIGSEGV", "at": "2026-12-07T09:40:00+00:00"}))
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="launchless"):
        s.kernels.start(s.sig, s.model, s.flat)
        _until_done(s.kernels, s.sig)
        assert _swapped(s) is not s.eager_graph
    row = s.kernels.info(str)[0]
    assert row["program_format"] == "artifact" and row["unpackaged"] == package_check.loader_crashed_here(record)
    lines = [r.getMessage() for r in caplog.records if "replays Inductor's compiled kernels" in r.getMessage()]
    assert len(lines) == 1, lines
    note = f"; kept in Inductor's format, which another process reads in seconds: {row['unpackaged']}"
    assert lines[0].endswith(note), lines[0]


@needs_compiler
def test_a_program_not_faster_leaves_the_eager_kernel_graph_and_says_why(monkeypatch, tmp_path) -> None:
    s = _setup(monkeypatch, tmp_path, faster=False)
    with torch.no_grad():
        s.kernels.start(s.sig, s.model, s.flat)
        _until_done(s.kernels, s.sig)
        assert _swapped(s) is s.eager_graph
    row = s.kernels.info(str)[0]
    assert row["kernels"] == "eager" and "not faster" in row["reason"] and s.cache.graphs[s.sig] is s.eager_graph


@needs_compiler
def test_a_program_less_accurate_than_eager_is_not_used(monkeypatch, tmp_path) -> None:
    s = _setup(monkeypatch, tmp_path)
    with torch.no_grad():
        s.kernels.start(s.sig, s.model, s.flat)
        _until_done(s.kernels, s.sig)
        real_load = s.kernels._entries[s.sig].job.load

        def skewed_load(m):  # a program that is off by far more than rounding
            program = real_load(m)
            return lambda *a, **k: program(*a, **k) * 1.001

        monkeypatch.setattr(s.kernels._entries[s.sig].job, "load", skewed_load)
        assert _swapped(s) is s.eager_graph
    row = s.kernels.info(str)[0]
    assert row["kernels"] == "eager" and "not as accurate as eager" in row["reason"]


@needs_compiler
def test_a_float64_reference_that_does_not_fit_keeps_eager_kernels_saying_so(monkeypatch, tmp_path) -> None:
    """The proof needs the forward in float64 (8 bytes a parameter while it lasts): where that copy does not fit on
    the GPU, eager's kernels stay and the row says why; the calls go on."""
    s = _setup(monkeypatch, tmp_path)

    def too_large(model):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 56.00 GiB")

    monkeypatch.setattr(compiled_kernels, "float64_copy", too_large)
    with torch.no_grad():
        s.kernels.start(s.sig, s.model, s.flat)
        _until_done(s.kernels, s.sig)
        assert _swapped(s) is s.eager_graph
    row = s.kernels.info(str)[0]
    assert row["kernels"] == "eager" and "OutOfMemoryError" in row["reason"] and "56.00 GiB" in row["reason"]
    assert s.cache.graphs[s.sig] is s.eager_graph


@needs_compiler
def test_graphs_dropped_in_the_middle_of_a_proof_end_it_and_nothing_is_swapped_in(monkeypatch, tmp_path) -> None:
    """The proof spans calls: weights replaced between two of its parts drop the graphs, and the graph it captured
    goes with it -- never kept, never replayed; the next capture starts again from the program on disk."""
    s = _setup(monkeypatch, tmp_path)
    with torch.no_grad():
        s.kernels.start(s.sig, s.model, s.flat)
        _until_done(s.kernels, s.sig)
        for _ in range(2):  # read, then capture: a graph of the program is held by the proof
            assert s.kernels.swap(s.sig, s.flat, s.eager_graph, s.model) is s.eager_graph
        proof = s.kernels._proofs[s.sig]
        assert list(s.kernels.info(str)[0]["proof_phases"]) == ["read", "capture"]
        s.kernels.cancel("load_state_dict(assign=True) replaced the weights")
        assert proof.gi_frame is None  # closed: what it captured is freed with it
        assert s.kernels.info(str) == [] and s.kernels.pending == 0 and s.kernels._proofs == {}
        assert s.kernels.swap(s.sig, s.flat, s.eager_graph, s.model) is s.eager_graph
        assert s.cache.graphs[s.sig] is s.eager_graph
        s.kernels.start(s.sig, s.model, s.flat)  # captured again: the program is on disk, proven from the start
        job = s.kernels._entries[s.sig].job
        assert job.wait(60).value == "ready" and job.reason == "found on disk"
        swapped = _swapped(s)
    assert swapped is not s.eager_graph and s.kernels.info(str)[0]["kernels"] == "compiled"


@needs_compiler
def test_a_part_of_the_proof_that_raises_keeps_eager_kernels_with_the_error(monkeypatch, tmp_path) -> None:
    s = _setup(monkeypatch, tmp_path)

    def failing_capture(*args, **kwargs):
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

    with torch.no_grad():
        s.kernels.start(s.sig, s.model, s.flat)
        _until_done(s.kernels, s.sig)
        monkeypatch.setattr(compiled_kernels._capture, "capture", failing_capture)
        assert _swapped(s) is s.eager_graph
    row = s.kernels.info(str)[0]
    assert row["kernels"] == "eager" and "operation not permitted when stream is capturing" in row["reason"], row
    assert s.kernels.pending == 0 and s.kernels._proofs == {} and s.cache.graphs[s.sig] is s.eager_graph


def test_a_compile_in_flight_is_cancelled_with_the_graphs(monkeypatch, tmp_path) -> None:
    s = _setup(monkeypatch, tmp_path)
    s.kernels.start(s.sig, s.model, s.flat)
    job = s.kernels._entries[s.sig].job
    s.kernels.cancel("the model was moved to another device")
    assert job.wait(COMPILE_S).value == "cancelled" and job.reason == "the model was moved to another device"
    assert s.kernels.pending == 0 and s.kernels.info(str) == []
    deadline = time.monotonic() + 30
    while job._child is not None and job._child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert job._child is None or job._child.poll() is not None


def test_a_model_the_child_cannot_import_keeps_eager_kernels(monkeypatch, tmp_path) -> None:
    s = _setup(monkeypatch, tmp_path)
    script = type("ScriptMlp", (Mlp,), {"__module__": "__main__"})()
    s.kernels.start(s.sig, script, s.flat)
    _until_done(s.kernels, s.sig)
    assert s.kernels.swap(s.sig, s.flat, s.eager_graph, script) is s.eager_graph  # decided at once: nothing to prove
    row = s.kernels.info(str)[0]
    assert row["kernels"] == KernelState.KEPT_EAGER.value
    assert "ScriptMlp is defined in the script being run (__main__)" in row["reason"]


@needs_compiler
def test_a_graph_captured_again_gets_its_program_again_from_disk_and_one_thread_swaps(monkeypatch, tmp_path) -> None:
    s = _setup(monkeypatch, tmp_path)
    with torch.no_grad():
        s.kernels.start(s.sig, s.model, s.flat)
        _until_done(s.kernels, s.sig)
        s.kernels._swapping.acquire()  # another thread is swapping: this call replays what is held
        try:
            assert s.kernels.swap(s.sig, s.flat, s.eager_graph, s.model) is s.eager_graph
            assert s.kernels.info(str)[0]["kernels"] == "compiling" and s.kernels.pending == 1
        finally:
            s.kernels._swapping.release()
        first = _swapped(s)
        assert s.kernels.info(str)[0]["kernels"] == "compiled"
        again = recorded_capture([])(s.model, s.flat, device=torch.device("cpu"), pool=None)  # evicted, captured again
        s.cache.keep(s.sig, again, None, s.flat.leaves)
        s.kernels.start(s.sig, s.model, s.flat)
        job = s.kernels._entries[s.sig].job
        assert job.wait(60).value == "ready" and job.reason == "found on disk"
        swapped = _swapped(s, again)
    assert swapped is not again and swapped is not first and s.cache.graphs[s.sig] is swapped
    assert s.kernels.info(str)[0]["kernels"] == "compiled"
    assert s.kernels.info(str)[0]["program"] == "found on disk"  # what a second process reports


def test_a_model_with_nothing_on_a_gpu_starts_no_spare_compiler(monkeypatch) -> None:
    """Graphs are captured on a GPU only: wrapping a model on the CPU with compiled kernels starts no compiler
    process (a Python process importing torch, for nothing); its calls run as eager's."""
    import launchless

    started = []
    monkeypatch.setattr(compiled_kernels, "SpareCompiler", lambda model: started.append(model))
    model = Mlp().eval()
    wrapped = launchless.wrap(model, kernels="compiled")
    x = torch.randn(4, 32)
    with torch.inference_mode():
        assert torch.equal(wrapped(x), model(x))
    assert started == [] and wrapped._compiled is not None and wrapped._compiled.take_spare() is None


def test_the_decode_steps_compile_gets_a_spare_compiler_whether_or_not_a_forwards_compile_took_the_wrappers(
    monkeypatch,
) -> None:
    """A transformers model's forward graph is often kept first (a prefill, a scoring call): its compile takes the
    spare started with the wrapper, and the decode step's compile would start a process from nothing (torch, the
    model's modules: seconds). The first generation gets one of its own then."""
    import launchless

    # the CPU model stands for one on a GPU
    monkeypatch.setattr(compiled_kernels, "gpu_of", lambda model: torch.device("cuda", 0))
    model = Mlp().eval()
    wrapped = launchless.wrap(model, kernels="compiled")
    compiled = wrapped._compiled
    assert compiled is not None
    started = compiled.take_spare()  # as a forward's compile takes it
    assert started is not None
    try:
        spare = compiled.decode_spare(model)
        assert spare is not None and spare is not started
        child = spare._child
        assert child is not None and child.poll() is None  # loading, waiting for the decode step's job
        spare.end()
        assert child.poll() is not None
    finally:
        started.end()
    untaken = launchless.wrap(model, kernels="compiled")
    first = untaken._compiled._spare if untaken._compiled is not None else None
    # the wrapper's, where no forward took it
    assert first is not None and untaken._compiled is not None and untaken._compiled.decode_spare(model) is first
    first.end()
    assert launchless.wrap(model)._compiled is None  # eager kernels: nothing compiles, no spare for the decode steps
