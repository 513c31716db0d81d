"""``wrap(model, kernels="compiled")`` on the GPU: eager-kernel graphs from the first repeat, Inductor's program
compiled beside the calls in a child process, swapped in between two calls once as accurate as eager against float64
and faster; fresh inputs on every call, both grad modes, weights loaded in place and replaced while compiling."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn

import launchless
from launchless.core.accuracy import allowed_float32_precision, as_accurate_as_eager, float64_copy, widened

pytestmark = pytest.mark.cuda

COMPILE_S = 300  # a cold Inductor compile of a small model in a child process


class Blocks(nn.Module):
    """Launch-bound: many small kernels that Inductor fuses into few."""

    def __init__(self, width: int = 64, depth: int = 6) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, width, 3, padding=1)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Conv2d(width, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU()) for _ in range(depth)
        )
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = x + block(x) * 0.5
        return self.head(x.mean((2, 3)))


GRAD_MODES = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}


def _fresh(generator: torch.Generator) -> torch.Tensor:
    return torch.randn(2, 3, 32, 32, generator=generator).cuda()


def _accurate(model: nn.Module, x: torch.Tensor, got: torch.Tensor) -> bool:
    reference = float64_copy(model)(*widened((x,)))
    report = as_accurate_as_eager(model(x), got, reference, float32_precision=allowed_float32_precision(model))
    return report.passed


def _until_decided(wrapped: launchless.GraphedModule, call) -> dict:
    """Call until the signature's compiled kernels are decided; the row."""
    deadline = time.monotonic() + COMPILE_S
    while time.monotonic() < deadline:
        call()
        rows = wrapped.graph_info()["compiled_kernels"]
        if rows and rows[0]["kernels"] != "compiling":
            return rows[0]
        time.sleep(0.05)
    raise AssertionError(f"not decided within {COMPILE_S} s: {wrapped.graph_info()['compiled_kernels']}")


@pytest.mark.parametrize("grad_mode", GRAD_MODES)
def test_compiled_kernels_replace_eager_kernels_between_calls_on_fresh_inputs(
    grad_mode, tmp_path, monkeypatch, caplog
) -> None:
    monkeypatch.setenv("LAUNCHLESS_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    model = Blocks().cuda().eval()
    wrapped = launchless.wrap(model, kernels="compiled")
    generator = torch.Generator().manual_seed(1)
    with GRAD_MODES[grad_mode](), caplog.at_level(logging.INFO, logger="launchless"):
        for _ in range(4):  # the eager-kernel graph from the third call, bit-identical to eager
            x = _fresh(generator)
            assert torch.equal(wrapped(x), model(x))
        assert wrapped.graph_info()["compiled_kernels"][0]["kernels"] == "compiling"
        row = _until_decided(wrapped, lambda: wrapped(_fresh(generator)))
        assert row["kernels"] == "compiled", row["reason"]
        assert row["accuracy"]["passed"] and row["speed"]["speedup"] > 1.0
        assert row["swap_s"] >= row["compile_s"] > 0
        assert set(row["proof_phases"]) == {"read", "capture", "accuracy", "speed"}, row["proof_phases"]
        for _ in range(5):  # fresh inputs through the compiled kernels' graph
            x = _fresh(generator)
            got = wrapped(x)
            assert _accurate(model, x, got)  # fused kernels round otherwise: held to eager's accuracy
        with torch.no_grad():  # a checkpoint loaded into the same tensors: the program reads the model's own
            for p in model.parameters():
                p.mul_(0.9)
        x = _fresh(generator)
        assert _accurate(model, x, wrapped(x))
    assert [r.message for r in caplog.records if "replays Inductor's compiled kernels" in r.message]
    assert len(wrapped.graph_info()["graphs"]) == 1


def test_weights_replaced_while_compiling_cancel_the_compile_and_the_next_is_loaded_on_the_new_ones(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv("LAUNCHLESS_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    model = Blocks(width=32).cuda().eval()
    wrapped = launchless.wrap(model, kernels="compiled")
    generator = torch.Generator().manual_seed(2)
    with torch.inference_mode():
        for _ in range(3):
            wrapped(_fresh(generator))
    assert wrapped.graph_info()["compiled_kernels"][0]["kernels"] == "compiling"
    fresh = Blocks(width=32).cuda().eval()
    model.load_state_dict(fresh.state_dict(), assign=True)  # new tensors: the graphs and the compile go
    with torch.inference_mode():
        x = _fresh(generator)
        assert torch.equal(wrapped(x), fresh(x))  # eager on the new weights, no stale graph
        row = _until_decided(wrapped, lambda: wrapped(_fresh(generator)))
        assert row["kernels"] == "compiled", row["reason"]
        x = _fresh(generator)
        assert _accurate(fresh, x, wrapped(x))


def test_a_model_defined_in_the_script_run_keeps_eager_kernels_saying_why(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("LAUNCHLESS_CACHE_DIR", str(tmp_path))
    script_class = type("ScriptBlocks", (Blocks,), {"__module__": "__main__"})  # as a class in a user's script
    model = script_class(width=16, depth=2).cuda().eval()
    wrapped = launchless.wrap(model, kernels="compiled")
    generator = torch.Generator().manual_seed(3)

    def call() -> None:
        x = _fresh(generator)
        assert torch.equal(wrapped(x), model(x))  # the eager-kernel graph throughout

    with torch.no_grad():
        row = _until_decided(wrapped, call)
    assert row["kernels"] == "eager"
    assert "ScriptBlocks is defined in the script being run (__main__)" in row["reason"]
    assert wrapped.graph_info()["graphs"][0]["replays"] > 0


SECOND_PROCESS = """
import json, sys, time
import torch
import launchless
from test_cuda_compiled_kernels import Blocks

torch.manual_seed(4)
model = Blocks().cuda().eval()
wrapped = launchless.wrap(model, kernels="compiled")
began, calls, row = time.perf_counter(), 0, None
with torch.inference_mode():
    while time.perf_counter() - began < 120 and row is None:
        x = torch.randn(2, 3, 32, 32, device="cuda")
        out = wrapped(x)
        calls += 1
        rows = wrapped.graph_info()["compiled_kernels"]
        row = rows[0] if rows and rows[0]["kernels"] != "compiling" else None
        if row is None:
            time.sleep(0.01)  # the program on disk is read beside the calls
    torch.cuda.synchronize()
    accurate = bool(torch.allclose(wrapped(x), model(x), rtol=1e-3, atol=1e-3))
print(json.dumps({"row": row, "calls": calls, "seconds": time.perf_counter() - began, "accurate": accurate,
                  "inductor_imported": "torch._inductor" in sys.modules}))
"""


EXITS_EARLY = """
import torch
import launchless
from test_cuda_compiled_kernels import Blocks

wrapped = launchless.wrap(Blocks().cuda().eval(), kernels="compiled")
with torch.inference_mode():
    for _ in range(4):  # the graph kept at the second: its program compiled (or read from disk) beside the rest
        wrapped(torch.randn(2, 3, 32, 32, device="cuda"))
torch.cuda.synchronize()
"""


def _exits_cleanly(env: dict[str, str]) -> None:
    """A process that exits while its program is compiled or read exits as eager's would: no compiler left running,
    no thread stopped inside torch (``terminate called without an active exception``)."""
    done = subprocess.run([sys.executable, "-c", EXITS_EARLY], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "terminate" not in done.stderr, done.stderr[-3000:]


def _tests_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}


def test_a_process_that_exits_while_compiling_exits_cleanly(tmp_path) -> None:
    for attempt in range(3):  # the thread stopped inside torch was seen once in three
        _exits_cleanly({**_tests_env(), "LAUNCHLESS_CACHE_DIR": str(tmp_path / str(attempt))})


def test_a_second_process_finds_the_program_on_disk_and_swaps_it_in_once_read(tmp_path, monkeypatch) -> None:
    """The programs are kept on disk, keyed by the model's code and the call's signature: another process running the
    same model (other weights) reads the program the first compiled -- beside its calls, once its eager-kernel graph
    is kept -- and replays compiled kernels from the next call, with no compile of its own."""
    monkeypatch.setenv("LAUNCHLESS_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    model = Blocks().cuda().eval()
    wrapped = launchless.wrap(model, kernels="compiled")
    generator = torch.Generator().manual_seed(5)
    with torch.inference_mode():
        first = _until_decided(wrapped, lambda: wrapped(_fresh(generator)))
    assert first["kernels"] == "compiled" and first["program"] == "compiled", first
    # on a GPU Inductor's format comes first (the shorter compile) and is swapped in; its package follows
    assert first["program_format"] == "artifact" and "package_pending" in first, first
    deadline = time.monotonic() + COMPILE_S
    while wrapped.graph_info()["compiled_kernels"][0]["package_pending"] and time.monotonic() < deadline:
        time.sleep(0.1)
    first = wrapped.graph_info()["compiled_kernels"][0]
    assert not first["package_pending"], first
    packaged = not first["unpackaged"]  # the package kept: another process reads it with no Inductor imported
    # else only because PyTorch's loader crashed on its package here (a torch build whose loader faults on every
    # package): Inductor's format then, and the rest must hold all the same
    assert packaged or "ended with signal" in first["unpackaged"], first["unpackaged"]
    if not packaged:  # a probe package checked on the GPU too: where it crashed, the machine's record is written
        recorded = list(tmp_path.rglob("package-loader-*.json"))
        assert bool(recorded) is ("a two-layer probe package crashed it too" in first["unpackaged"]), recorded
    env = _tests_env()
    done = subprocess.run(
        [sys.executable, "-c", SECOND_PROCESS], env=env, capture_output=True, text=True, timeout=COMPILE_S
    )
    assert done.returncode == 0, done.stderr[-3000:]
    second = json.loads(done.stdout.strip().splitlines()[-1])
    row = second["row"]
    assert row is not None and row["program"] == "found on disk", second
    assert row["kernels"] == "compiled", row["reason"]
    assert row["compile_s"] is None and not row["compile_phases"], row  # nothing compiled here
    assert row["read_s"] is not None, row  # read from disk beside the calls
    assert second["accurate"], second
    assert second["inductor_imported"] is not packaged, second  # a package is read by PyTorch's C++ loader
    _exits_cleanly(env)  # a third exits while it reads the program from disk
    print(
        f"second process: compiled kernels decided {second['seconds']:.2f} s after its first call, at call "
        f"{second['calls']} (the program read in {row['read_s']:.2f} s beside the calls)"
    )
    if not packaged:
        pytest.xfail(f"the package read without Inductor is not tried on this machine: {first['unpackaged']}")
