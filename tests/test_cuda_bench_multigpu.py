"""The multigpu bench suite on two GPUs: NCCL groups of one and two ranks for the first tensor-parallel workload of the
zoo and DDP resnet18, eager and launchless; every row measured, compared on every rank, and scaled."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from launchless.apps.bench.multigpu import run_multigpu

pytestmark = pytest.mark.cuda


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_tensor_parallel_and_ddp_rows_on_two_gpus(tmp_path: Path) -> None:
    from launchless.apps.zoo.tensor_parallel import TP_WORKLOADS

    names = [TP_WORKLOADS[0], "ddp:resnet18"]
    modes = ["eager", "launchless"]
    paths = run_multigpu(
        names, modes, world_sizes=[1, 2], out_dir=tmp_path, iters=20, timeout_s=600, gpus=[0, 1], device="cuda"
    )
    doc = json.loads(paths["json"].read_text())
    assert doc["environment"]["backend"] == "nccl" and len(doc["environment"]["gpus"]) == 2
    rows = doc["rows"]
    assert [(r["workload"], r["world_size"], r["mode"]) for r in rows] == [
        (w, n, m) for w in names for n in (1, 2) for m in modes
    ]
    for row in rows:
        assert row["status"] == "ok", row
        assert row["median_ms"] > 0 and row["waited_ms"] > 0 and 0 < row["first_call_s"] < row["warmup_s"]
        correctness = row["correctness"]
        assert len(correctness["ranks"]) == row["world_size"]
        if row["mode"] == "eager":
            assert correctness["status"] == "reference"
        else:
            assert correctness["status"] in ("bit-identical", "differs")
            assert correctness["max_abs_diff"] == max(correctness["ranks"]) and correctness["max_abs_diff"] < 1e-2
        assert (row["scaling_efficiency"] is None) == (row["world_size"] == 1)
        if row["world_size"] == 2:
            assert row["scaling_efficiency"] > 0
    graphed = {(r["workload"], r["world_size"]): r["graphs"] for r in rows if r["mode"] == "launchless"}
    assert "runtime" in graphed[(names[0], 2)] and "level" in graphed[("ddp:resnet18", 2)]
    md = paths["md"].read_text()
    assert "## Tensor-parallel inference" in md and "## DDP training" in md
    assert paths["png"].read_bytes().startswith(b"\x89PNG")
