"""CPU tests of `launchless bench --suite multigpu`: real torchrun groups on gloo at world sizes 1 and 2 with a tiny
tensor-parallel MLP and a tiny DDP classifier (the builders below, loaded by the workers as
``tp:test_bench_multigpu:tiny_tp`` and ``ddp:test_bench_multigpu:tiny_classifier``), groups that crash or hang,
and the report from synthetic rows. Expected ratios are recomputed here from the medians, never copied from the
code's output."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from launchless.apps import cli
from launchless.apps.bench import multigpu, multigpu_report, report
from launchless.apps.bench.multigpu_worker import gathered_row

TINY_TP = "tp:test_bench_multigpu:tiny_tp"
TINY_DDP = "ddp:test_bench_multigpu:tiny_classifier"
CRASHING_TP = "tp:test_bench_multigpu:crashing_tp"
HANGING_TP = "tp:test_bench_multigpu:hanging_tp"
ROW_FIELDS = {
    "workload",
    "part",
    "mode",
    "world_size",
    "status",
    "reason",
    "median_ms",
    "min_ms",
    "waited_ms",
    "calls",
    "first_call_s",
    "warmup_s",
    "correctness",
    "scaling_efficiency",
    "graphs",
    "wall_s",
}


# --- builders the workers load by name ------------------------------------------------------------------------


class TinyMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(16, 64)
        self.down = nn.Linear(64, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


def tiny_tp(*, mesh, device) -> tuple[nn.Module, tuple, dict]:
    """The MLP, column-wise then row-wise over ``mesh`` (its output all-reduced), on one seeded input."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.manual_seed(0)
    model = TinyMLP().to(device).eval()
    if mesh is not None:
        parallelize_module(model, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    x = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(1)).to(device)
    return model, (x,), {}


def tiny_classifier(*, device, batch: int, seed: int) -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 10)).to(device)
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(batch, 3, 8, 8, generator=generator).to(device)
    return model, (images, torch.randint(10, (batch,), generator=generator).to(device))


def crashing_tp(*, mesh, device) -> tuple[nn.Module, tuple, dict]:
    """Rank 1 dies outright, as a segfault or an out-of-memory kill would end it."""
    if torch.distributed.get_rank() == 1:
        os._exit(3)
    return tiny_tp(mesh=mesh, device=device)


def hanging_tp(*, mesh, device) -> tuple[nn.Module, tuple, dict]:
    """Every rank notes its pid; rank 1 then stalls, so rank 0 waits in the forward's all-reduce."""
    with open(os.environ["HANGING_PIDS"], "a") as f:
        f.write(f"{os.getpid()}\n")
    if torch.distributed.get_rank() == 1:
        time.sleep(60)
    return tiny_tp(mesh=mesh, device=device)


@pytest.fixture
def importable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The workers can import this module (torchrun starts them with the runner's environment)."""
    here = str(Path(__file__).parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p))


# --- the suite, end to end ------------------------------------------------------------------------------------


def test_the_suite_runs_end_to_end_on_cpu_with_gloo(tmp_path: Path, importable: None) -> None:
    argv = ["bench", "--suite", "multigpu", "--workloads", TINY_TP, TINY_DDP, "--modes", "eager", "launchless"]
    argv += ["--world-sizes", "1", "2", "--iters", "5", "--timeout", "60", "--out", str(tmp_path)]
    assert cli.main(argv) == 0
    doc = json.loads((tmp_path / "multigpu.json").read_text())
    assert doc["suite"] == "multigpu"
    assert doc["environment"]["backend"] == "gloo" and doc["environment"]["world_sizes"] == [1, 2]
    assert doc["environment"]["torch"] == torch.__version__
    rows = doc["rows"]
    expected = [(w, n, m) for w in (TINY_TP, TINY_DDP) for n in (1, 2) for m in ("eager", "launchless")]
    assert [(r["workload"], r["world_size"], r["mode"]) for r in rows] == expected
    by_key = {(r["workload"], r["world_size"], r["mode"]): r for r in rows}
    for row in rows:
        assert set(row) == ROW_FIELDS and row["status"] == "ok", row
        assert row["part"] == ("tp-inference" if row["workload"] == TINY_TP else "ddp-training")
        assert row["median_ms"] > 0 and row["waited_ms"] > 0 and row["calls"] == 5
        assert 0 < row["first_call_s"] < row["warmup_s"]
        assert len(row["correctness"]["ranks"]) == row["world_size"]  # every rank compared, gathered on rank 0
        if row["mode"] == "eager":
            assert row["correctness"]["status"] == "reference"
        else:  # on the CPU launchless runs eager: every rank's output / parameters equal eager's bit for bit
            assert row["correctness"] == {
                "status": "bit-identical",
                "max_abs_diff": 0.0,
                "ranks": [0.0] * row["world_size"],
            }
        alone = by_key[(row["workload"], 1, row["mode"])]
        if row["world_size"] == 1:
            assert row["scaling_efficiency"] is None
        else:
            assert row["scaling_efficiency"] == pytest.approx(alone["median_ms"] / row["median_ms"])
    assert by_key[(TINY_TP, 2, "launchless")]["graphs"]["runtime"] == "eager"  # wrap's runtime summary
    assert by_key[(TINY_DDP, 2, "launchless")]["graphs"]["level"] == "eager"  # graphed_step's level
    assert by_key[(TINY_TP, 2, "eager")]["graphs"] is None

    md = (tmp_path / "multigpu.md").read_text()
    assert "## Tensor-parallel inference" in md and "## DDP training" in md and "device cpu (gloo)" in md
    assert f"| `{TINY_TP}` | 2 | launchless |" in md and "= on 2 ranks" in md
    assert f"- `{TINY_DDP}` at world size 2: launchless — over reduce-overhead; its step takes" in md
    assert "- none: every workload ran in every mode at every world size" in md

    png = (tmp_path / "multigpu.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ranks die with their launcher through prctl")
def test_a_group_that_crashes_or_hangs_costs_one_workload_and_its_ranks_die_with_it(
    tmp_path: Path, importable: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    pids = tmp_path / "hanging-pids"
    monkeypatch.setenv("HANGING_PIDS", str(pids))
    names = [CRASHING_TP, TINY_TP, HANGING_TP, TINY_DDP]
    paths = multigpu.run_multigpu(
        names, ["eager"], world_sizes=[2], out_dir=tmp_path / "out", iters=3, timeout_s=20, device="cpu"
    )
    rows = json.loads(paths["json"].read_text())["rows"]
    assert [(r["workload"], r["status"]) for r in rows] == [
        (CRASHING_TP, "error"),
        (TINY_TP, "ok"),
        (HANGING_TP, "error"),
        (TINY_DDP, "ok"),
    ]
    assert "the worker exited with code" in rows[0]["reason"] and "worker-w2-eager.log" in rows[0]["reason"]
    assert "timed out after 20 s" in rows[2]["reason"]
    assert set(rows[0]) == ROW_FIELDS and rows[0]["median_ms"] is None
    assert rows[3]["median_ms"] > 0
    hung = [int(pid) for pid in pids.read_text().split()]
    assert len(hung) == 2
    deadline = time.monotonic() + 10
    while not all(_ended(pid) for pid in hung) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert all(_ended(pid) for pid in hung), "a rank of the killed group is still running"
    md = paths["md"].read_text()
    assert f"- `{HANGING_TP}` · eager · world size 2: timed out after 20 s" in md


def _ended(pid: int) -> bool:
    """Gone, or a zombie nobody has reaped yet."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


# --- rows, ratios and report from synthetic rows ---------------------------------------------------------------


def test_rank_results_are_gathered_into_one_row() -> None:
    timing = {"median_ms": 2.0, "min_ms": 1.9, "waited_ms": 2.5, "calls": 5, "first_call_s": 0.3, "warmup_s": 0.9}
    same = {**timing, "correctness": {"status": "bit-identical", "max_abs_diff": 0.0}}
    differs = {**timing, "median_ms": 9.0, "correctness": {"status": "differs", "max_abs_diff": 3e-6}}
    row = gathered_row(TINY_TP, "launchless", 2, [(same, None), (differs, None)])
    assert row["median_ms"] == 2.0  # rank 0's time
    assert row["correctness"] == {"status": "differs", "max_abs_diff": 3e-6, "ranks": [0.0, 3e-6]}
    both = gathered_row(TINY_TP, "launchless", 2, [(same, None), (same, None)])
    assert both["correctness"]["status"] == "bit-identical"
    failed = gathered_row(TINY_TP, "launchless", 2, [(same, None), (None, "RuntimeError: out of memory")])
    assert failed["status"] == "error" and failed["reason"] == "rank 1: RuntimeError: out of memory"
    assert failed["median_ms"] is None and set(failed) == ROW_FIELDS


def _row(workload: str, mode: str, world_size: int, median: float | None, status: str = "ok") -> dict:
    part = "tp-inference" if workload.startswith("tp:") else "ddp-training"
    return {
        "workload": workload,
        "part": part,
        "mode": mode,
        "world_size": world_size,
        "status": status,
        "reason": None if status == "ok" else "the worker exited with code 1",
        "median_ms": median,
        "waited_ms": median,
        "first_call_s": 1.5 if status == "ok" else None,
        "warmup_s": 4.25 if status == "ok" else None,
        "correctness": {
            "status": "reference" if mode == "eager" else "differs",
            "max_abs_diff": 1e-6,
            "ranks": [0, 1e-6],
        },
        "graphs": None,
    }


# ms per call: (workload, world size) -> mode -> median; None = an error row
MEDIANS = {
    ("tp:bert", 1): {"eager": 8.0, "reduce-overhead": 3.0, "launchless": 2.5, "launchless-compile": 2.0},
    ("tp:bert", 2): {"eager": 6.0, "reduce-overhead": 2.4, "launchless": 1.6, "launchless-compile": 2.0},
    ("tp:llama", 1): {"eager": 9.0, "reduce-overhead": 4.0, "launchless": 3.0, "launchless-compile": None},
    ("tp:llama", 2): {"eager": 7.0, "reduce-overhead": 3.3, "launchless": None, "launchless-compile": 3.0},
    ("ddp:resnet18", 1): {"eager": 5.0, "reduce-overhead": 3.0, "launchless": 2.0},
    ("ddp:resnet18", 2): {"eager": 6.0, "reduce-overhead": 3.6, "launchless": 2.5},
}


def _rows() -> list[dict]:
    return [
        _row(workload, mode, world, median, "ok" if median is not None else "error")
        for (workload, world), per_mode in MEDIANS.items()
        for mode, median in per_mode.items()
    ]


def test_scaling_efficiency_is_world_size_ones_median_over_this_one() -> None:
    rows = {(r["workload"], r["mode"], r["world_size"]): r for r in multigpu_report.with_scaling(_rows())}
    assert rows[("ddp:resnet18", "launchless", 2)]["scaling_efficiency"] == pytest.approx(2.0 / 2.5)
    assert rows[("tp:bert", "launchless", 2)]["scaling_efficiency"] == pytest.approx(2.5 / 1.6)
    assert rows[("tp:bert", "launchless", 1)]["scaling_efficiency"] is None  # the baseline itself
    assert rows[("tp:llama", "launchless", 2)]["scaling_efficiency"] is None  # an error row
    assert rows[("tp:llama", "launchless-compile", 2)]["scaling_efficiency"] is None  # no world-1 row to scale from


def test_the_report_compares_modes_at_the_same_world_size(tmp_path: Path) -> None:
    environment = {"date": "2026-12-01T00:00:00+00:00", "gpu": "NVIDIA H200", "torch": "2.14.1", "device": "cuda"}
    environment.update(backend="nccl", gpus={"0": "NVIDIA H200", "1": "NVIDIA H200"}, world_sizes=[1, 2])
    paths = report.write_all(tmp_path, environment, multigpu_report.SUITE, multigpu_report.with_scaling(_rows()))
    summary = json.loads(paths["json"].read_text())["summary"]
    bert, llama = 2.4 / min(1.6, 2.0), 3.3 / 3.0  # the faster launchless mode over reduce-overhead at world size 2
    tp = summary["tp-inference"]
    assert tp["world_size"] == 2
    assert tp["best_launchless_vs_reduce_overhead"] == pytest.approx({"tp:bert": bert, "tp:llama": llama})
    assert tp["geomean_best_launchless_vs_reduce_overhead"] == pytest.approx(math.sqrt(bert * llama))
    ddp = summary["ddp-training"]["per_workload"]["ddp:resnet18"]
    assert ddp == pytest.approx({"launchless_vs_reduce_overhead": 3.6 / 2.5, "launchless_step_vs_world_1": 2.5 / 2.0})

    md = paths["md"].read_text()
    assert "GPUs 0: NVIDIA H200, 1: NVIDIA H200" in md
    # tp:bert launchless at TP=2: 1.6 ms, 6.0 / 1.6 over eager, 2.4 / 1.6 over reduce-overhead, 2.5 / 1.6 scaling
    assert (
        "| `tp:bert` | 2 | launchless | 1.60 | 1.60 | 3.75× | 1.50× | 1.56 | 1.5 / 4.25 | ≠ 1.0e-06 (2 ranks) | — |"
        in md
    )
    assert "| `tp:llama` | 2 | launchless | error |" in md
    assert f"over reduce-overhead, {math.sqrt(bert * llama):.2f}× (geometric mean over 2:" in md
    assert "`ddp:resnet18` at world size 2: launchless 1.44× over reduce-overhead; its step takes 1.25× its" in md
    assert "(scaling efficiency 0.80)" in md
    assert "- `tp:llama` · launchless · world size 2: the worker exited with code 1" in md
    assert paths["png"].read_bytes().startswith(b"\x89PNG")


def test_the_multigpu_command_line_refuses_what_cannot_run(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = [
        (["--workloads", "bert"], "start with 'tp:'"),
        (["--workloads", "ddp:resnet99"], "unknown DDP workload 'ddp:resnet99'"),
        (["--workloads", "tp:no_such_module:build"], "cannot load the builder"),
        (["--modes", "hand-graph"], "unknown mode(s) hand-graph"),
        (["--world-sizes", "0"], "each must be 1 or more"),
        (["--balance-from", "bench.json"], "--balance-from deals single-GPU workloads"),
    ]
    for extra, message in bad:
        with pytest.raises(SystemExit) as exc:
            cli.main(["bench", "--suite", "multigpu", "--workloads", TINY_DDP, *extra])
        assert exc.value.code == 2 and message in capsys.readouterr().err
    monkeypatch.setattr(multigpu, "device_type", lambda: "cuda")
    monkeypatch.setattr("torch.cuda.device_count", lambda: 1)
    monkeypatch.setattr("torch.cuda.get_device_name", lambda i: "NVIDIA H200")
    with pytest.raises(SystemExit):
        cli.main(["bench", "--suite", "multigpu", "--workloads", TINY_DDP, "--world-sizes", "1", "2"])
    assert "world size 2 needs 2 GPUs and --gpus gives 1" in capsys.readouterr().err


def test_the_multigpu_list_names_the_parts_and_modes(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "--suite", "multigpu", "--list"]) == 0
    listed = capsys.readouterr().out
    assert "ddp:resnet18" in listed and "tp:package.module:function" in listed
    assert "modes: eager, compile, reduce-overhead, launchless, launchless-compile" in listed
