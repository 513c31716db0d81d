"""`launchless train --gpus N` on the CPU: the command starts itself again as a torchrun group of two gloo processes,
which train one DistributedDataParallel model on their shares of the data; the loaders' shares; and the mistakes
refused before any process starts."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from launchless.apps.cli import main
from launchless.apps.trainer import distributed
from launchless.apps.trainer.data import loaders, make_tiny_imagefolder
from launchless.errors import ConfigError

timm = pytest.importorskip("timm")
pytest.importorskip("torchvision")

pytestmark = pytest.mark.zoo

MODEL = "test_resnet"  # timm's smallest ResNet: the group's run takes seconds on two cores
EPOCHS, BATCH = 2, 16  # the tiny set: 192 training images, 96 per process, 6 steps per epoch


@pytest.fixture(scope="module")
def group_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, Path]:
    """One `--gpus 2 --cuda-graph` run through the command line, as a user starts it; CUDA hidden, so that it is
    a gloo group on any machine."""
    out = tmp_path_factory.mktemp("ddp") / "out"
    argv = ["train", "--gpus", "2", "--tiny-data", "--cuda-graph", "--model", MODEL, "--epochs", str(EPOCHS)]
    argv += ["--batch", str(BATCH), "--workers", "0", "--out", str(out)]
    done = subprocess.run(
        [sys.executable, "-m", "launchless.apps.cli", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done, out


def test_two_processes_train_and_rank_0_alone_reports_and_writes(group_run) -> None:
    done, out = group_run
    assert "no CUDA device here: --gpus 2 runs 2 CPU processes (gloo)" in done.stdout
    assert done.stdout.count("epoch 1/2  train loss") == 1 and done.stdout.count("total wall time") == 1
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint.pt", "metrics.json", "tiny-data"]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["args"]["world_size"] == 2 and metrics["device"] == "cpu"
    assert [e["epoch"] for e in metrics["epochs"]] == [1, 2]
    for epoch in metrics["epochs"]:
        assert epoch["steps"] == 192 // 2 // BATCH  # each process steps through its own half
        assert epoch["step_ms"] > 0 and 0 <= epoch["train_acc"] <= 1 and 0 <= epoch["val_acc"] <= 1
    assert metrics["graph_level"] == "eager"  # on the CPU graphed_step trains eager, and says why
    assert "gloo" in metrics["graph_info"]["eager_reason"]


def test_the_replicas_end_identical_and_the_checkpoint_holds_them(group_run) -> None:
    _, out = group_run
    metrics = json.loads((out / "metrics.json").read_text())
    ckpt = torch.load(out / "checkpoint.pt", weights_only=True)
    assert ckpt["epoch"] == EPOCHS and ckpt["args"]["world_size"] == 2
    model = timm.create_model(MODEL, pretrained=False, num_classes=3)
    model.load_state_dict(ckpt["model"])  # saved unwrapped: no DistributedDataParallel "module." prefix
    saved = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    assert metrics["parameters_sha256"] == [saved, saved]  # both ranks' parameters, bit for bit
    torch.manual_seed(0)
    untrained = timm.create_model(MODEL, pretrained=False, num_classes=3)
    assert any(not torch.equal(a, b) for a, b in zip(untrained.parameters(), model.parameters(), strict=True))


def test_each_process_gets_its_own_share_reshuffled_every_epoch(tmp_path: Path) -> None:
    root = make_tiny_imagefolder(tmp_path, classes=3, per_class=10, size=8)  # 30 training images

    def shares(epoch: int) -> list[list[int]]:
        result = []
        for rank in (0, 1):
            train_loader = loaders(root, batch=4, size=8, workers=0, rank=rank, world_size=2)[0]
            assert len(train_loader) == 3  # 15 images per process, batches of 4, the partial one dropped
            train_loader.sampler.set_epoch(epoch)
            result.append(list(train_loader.sampler))
        return result

    first, second = shares(0), shares(1)
    for epoch in (first, second):
        assert len(epoch[0]) == len(epoch[1]) == 15
        assert not set(epoch[0]) & set(epoch[1]) and set(epoch[0]) | set(epoch[1]) == set(range(30))
    assert first != second
    with pytest.raises(ConfigError, match=r"15 per process over 2 processes.*at most 15"):
        loaders(root, batch=16, size=8, workers=0, rank=0, world_size=2)


# ---- refused before any process starts ------------------------------------------------------------------------


@pytest.fixture
def no_relaunch(monkeypatch: pytest.MonkeyPatch) -> None:
    """A mistake missed would replace the test process with torchrun: fail instead."""

    def refuse(**kwargs) -> None:
        raise AssertionError(f"torchrun was started: {kwargs}")

    monkeypatch.setattr(distributed, "relaunch", refuse)


@pytest.mark.parametrize("count", ["0", "-1", "two"])
def test_gpus_needs_a_count_of_one_or_more(count: str, no_relaunch: None, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["train", "--tiny-data", "--gpus", count])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "argument --gpus" in err and f"got '{count}'" in err and "1 or more" in err


def test_more_gpus_than_visible_names_the_fix(
    monkeypatch: pytest.MonkeyPatch, no_relaunch: None, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    with pytest.raises(SystemExit) as exc:
        main(["train", "--tiny-data", "--gpus", "3"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--gpus 3: only 2 GPU(s) visible here (CUDA_VISIBLE_DEVICES=4,5); pass --gpus 2 or fewer" in err


@pytest.mark.parametrize(
    ("options", "needle"),
    [(["--model", "resnet_18"], "unknown timm model"), (["--epochs", "0"], "--epochs 1 or more")],
)
def test_bad_options_are_refused_once_before_the_group_starts(
    options: list[str], needle: str, tmp_path: Path, no_relaunch: None, capsys: pytest.CaptureFixture
) -> None:
    assert main(["train", "--tiny-data", "--gpus", "2", "--out", str(tmp_path / "out"), *options]) == 2
    assert needle in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_missing_data_is_refused_before_the_group_starts(
    tmp_path: Path, no_relaunch: None, capsys: pytest.CaptureFixture
) -> None:
    assert main(["train", "--data", str(tmp_path / "nope"), "--gpus", "2"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_in_a_torchrun_group_gpus_must_match_its_processes(
    monkeypatch: pytest.MonkeyPatch, no_relaunch: None, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(SystemExit) as exc:
        main(["train", "--tiny-data", "--gpus", "3"])
    assert exc.value.code == 2
    assert "torchrun has started the processes already; leave --gpus out (or pass --gpus 2)" in capsys.readouterr().err
