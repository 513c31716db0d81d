"""GPU checks of the benchmark's measurement: rows, kernel floor and correctness (`python -m pytest -m cuda`)."""

from __future__ import annotations

import time

import pytest
import torch

from launchless.apps.bench import workloads
from launchless.apps.bench.measure import measure
from launchless.timing import cuda_latency, cuda_time

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("mode", ["eager", "hand-graph", "launchless"])
def test_inference_rows(mode: str) -> None:
    pytest.importorskip("timm")
    row = measure(workloads.get("timm:resnet18"), mode, iters=20)
    print(row)
    assert row["status"] == "ok" and row["calls"] == 20 and 0 < row["min_ms"] <= row["median_ms"]
    assert row["first_call_ms"] > 0 and row["peak_mem_mb"] > 0
    assert row["kernel_floor_ms"] is not None and 0 < row["kernel_floor_ms"] < 3 * row["median_ms"]
    expected = "reference" if mode == "eager" else "bit-identical"
    assert row["correctness"]["status"] == expected
    # eager launches every kernel itself; a replay launches none of its kernels and copies the 1x3x224x224 input in
    assert row["graph_coverage"] == pytest.approx(0.0 if mode == "eager" else 1.0, abs=0.02)
    assert row["copy_bytes"] >= (0 if mode == "eager" else 3 * 224 * 224 * 4)
    assert ("compile_s" in row) is False  # none of these modes compiles
    assert row["latency_ms"] >= 0.9 * row["median_ms"]  # a waited-for call never hides work the other shows


class _Noisy(torch.nn.Module):
    """A forward that draws random numbers at every call, as a diffusion step draws its noise."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x + torch.randn_like(x))


@pytest.mark.parametrize("mode", ["hand-graph", "launchless"])
def test_a_forward_that_draws_random_numbers_is_compared_from_the_same_generator_state(monkeypatch, mode) -> None:
    """The reference and the compared call start from one generator state: a replay draws what eager draws from it,
    so a graph of a noisy forward reads bit-identical, not as far off as two draws of noise."""
    from types import SimpleNamespace

    from launchless.apps.bench import measure as measuring

    built = SimpleNamespace(model=_Noisy().cuda().eval(), args=(torch.randn(8, 64, device="cuda"),), kwargs={})
    monkeypatch.setattr(measuring, "_build", lambda w: built)
    row = measure(workloads.BenchWorkload("test:noisy", "test:noisy"), mode, iters=5)
    assert row["status"] == "ok", row
    assert row["correctness"] == {"status": "bit-identical", "max_abs_diff": 0.0}, row


@pytest.mark.parametrize("mode", ["compile", "reduce-overhead", "launchless-compile"])
def test_the_modes_that_compile_draw_a_noisy_forwards_numbers_as_eager_does(monkeypatch, mode) -> None:
    """Inductor's own generator would draw other noise from the same seed (a difference of the noise's size, about
    4 here); with eager's generator and kernels the compiled forward is eager's up to Inductor's rounding."""
    from types import SimpleNamespace

    import torch._inductor.config as inductor_config

    from launchless.apps.bench import measure as measuring

    torch._dynamo.reset()
    monkeypatch.setattr(inductor_config, "fallback_random", inductor_config.fallback_random)  # restored after
    built = SimpleNamespace(model=_Noisy().cuda().eval(), args=(torch.randn(8, 64, device="cuda"),), kwargs={})
    monkeypatch.setattr(measuring, "_build", lambda w: built)
    row = measure(workloads.BenchWorkload("test:noisy", "test:noisy"), mode, iters=5)
    assert row["status"] == "ok", row
    assert row["correctness"]["max_abs_diff"] < 1e-4, row


def test_latency_shows_the_host_work_that_back_to_back_calls_hide() -> None:
    """A call that works on the host for half as long as its kernel runs: back to back the host work hides behind
    the previous kernel; waited for, it is on the clock."""
    kernel = lambda: torch.cuda._sleep(2_000_000)  # noqa: E731
    gpu_ms = cuda_time(kernel, iters=20).median_ms
    host_s = gpu_ms / 2 / 1e3

    def call() -> None:
        time.sleep(host_s)
        kernel()

    back_to_back = cuda_time(call, iters=30).median_ms
    waited = cuda_latency(call, iters=30).median_ms
    print(f"kernel {gpu_ms:.3f} ms, back to back {back_to_back:.3f} ms, waited for {waited:.3f} ms")
    assert back_to_back == pytest.approx(gpu_ms, rel=0.15)
    assert waited - back_to_back > 0.7 * host_s * 1e3


def test_whole_step_hand_graph_matches_eager_training() -> None:
    pytest.importorskip("timm")
    row = measure(workloads.get("train:resnet18"), "hand-graph", iters=20)
    print(row)
    assert row["status"] == "ok" and row["kernel_floor_ms"] is not None
    assert row["correctness"]["status"] in ("bit-identical", "differs")
    assert row["correctness"]["max_abs_diff"] < 1e-3  # same state trajectory as eager, up to backward atomics
    row = measure(workloads.get("train:resnet18"), "launchless", iters=20)  # graphed_step
    print(row)
    assert row["status"] == "ok" and row["correctness"]["max_abs_diff"] < 1e-3


def test_bert_fine_tuning_step_with_scheduler_in_every_graph_mode() -> None:
    pytest.importorskip("transformers")
    w = workloads.get("train:bert-base@b8")
    for mode in ("hand-graph", "launchless"):
        row = measure(w, mode, iters=10)
        print(row)
        assert row["status"] == "ok" and row["correctness"]["max_abs_diff"] < 1e-3, row


def test_launchless_compile_row_says_what_the_backend_did_with_the_graphs() -> None:
    pytest.importorskip("timm")
    row = measure(workloads.get("timm:resnet18"), "launchless-compile", iters=20)
    print(row)
    assert row["status"] == "ok" and row["correctness"]["status"] in ("bit-identical", "differs")
    graphs = row["graphs"]
    assert graphs["dynamo_graphs"] == 1 and graphs["graph_breaks"] == 0 and not graphs["refused"]
    assert sum(graphs["variants"].values()) == 1 and graphs["replays"] > 0


@pytest.mark.parametrize("gpus", [None, [0, 1]], ids=["one-gpu", "two-gpus"])
def test_the_suite_runs_each_mode_in_workers_and_writes_the_report(tmp_path, gpus) -> None:
    """The runner end to end: worker processes on the GPU(s), rows back, JSON/markdown/PNG written."""
    import json

    import torch

    from launchless.apps.bench.runner import measure_suite

    pytest.importorskip("timm")
    if gpus and torch.cuda.device_count() < len(gpus):
        pytest.skip(f"needs {len(gpus)} GPUs")
    names = ["timm:resnet18", "timm:mobilenetv3_small_100"]  # two parts with --gpus 0 1
    measure_suite("quick", names, ["eager", "launchless"], out_dir=tmp_path, iters=10, timeout_s=300, gpus=gpus)
    report = json.loads((tmp_path / "bench.json").read_text())
    rows = {(r["workload"], r["mode"]): r for r in report["rows"]}
    assert set(rows) == {(n, m) for n in names for m in ("eager", "launchless")}
    assert all(r["status"] == "ok" for r in rows.values())
    assert all(rows[(n, "launchless")]["correctness"]["status"] == "bit-identical" for n in names)
    assert (tmp_path / "bench.md").exists() and (tmp_path / "bench.png").exists()


@pytest.mark.parametrize("workload", ["grace:ocean-equation-of-state", "train:resnet18"])
def test_the_race_times_pytorchs_modes_and_the_graph_path_in_one_process_in_rotating_rounds(workload: str) -> None:
    """compile, reduce-overhead and launchless's graph path (the backend for inference, graphed_step for a training
    step) prepared in one process and timed round by round: each mode's median of its rounds."""
    from launchless.apps.bench.measure import RACE_ROUNDS, race_contestants

    if workload.startswith("train:"):
        pytest.importorskip("timm")
    w = workloads.get(workload)
    row = measure(w, "raced", iters=RACE_ROUNDS * 10)
    print(row)
    contestants = race_contestants(w.kind)
    assert row["status"] == "ok" and set(row["raced_ms"]) == set(contestants) == set(row["raced_rounds_ms"])
    for mode in contestants:
        rounds = row["raced_rounds_ms"][mode]
        assert len(rounds) == RACE_ROUNDS and all(t > 0 for t in rounds)
        assert row["raced_ms"][mode] == pytest.approx(sorted(rounds)[RACE_ROUNDS // 2], abs=1e-5)
    assert row["raced_calls_per_round"] == 10
