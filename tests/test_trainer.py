"""Tests for `launchless train`: the tiny data set, the loaders, the trainer and the command (CPU), and one GPU run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from launchless.apps.cli import main
from launchless.apps.trainer.data import loaders, make_tiny_imagefolder
from launchless.errors import ConfigError

timm = pytest.importorskip("timm")
pytest.importorskip("torchvision")

from launchless.apps.trainer.trainer import train  # noqa: E402

pytestmark = pytest.mark.zoo


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_imagefolder(tmp_path_factory.mktemp("tiny"), classes=3, per_class=16, size=32, seed=0)


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*.png"))}


def _run(data: Path, out: Path, **kwargs) -> dict:
    options = {"epochs": 3, "batch": 16, "lr": None, "amp": "off", "cuda_graph": False, "size": 32, "workers": 0}
    options.update(kwargs)
    options.setdefault("device", "cpu")
    return train("timm:resnet18", data, out=out, seed=0, **options)


# ---- data -------------------------------------------------------------------------------------------


def test_tiny_imagefolder_layout_and_determinism(tmp_path: Path) -> None:
    root = make_tiny_imagefolder(tmp_path / "a", classes=4, per_class=6, size=24, seed=3)
    assert root == tmp_path / "a"
    for split, count in (("train", 6), ("val", 3)):
        classes = sorted(d.name for d in (root / split).iterdir())
        assert classes == ["class_00", "class_01", "class_02", "class_03"]
        for c in classes:
            assert len(list((root / split / c).glob("*.png"))) == count
    from PIL import Image

    with Image.open(next((root / "train" / "class_00").glob("*.png"))) as image:
        assert image.size == (24, 24) and image.mode == "RGB"
    same = make_tiny_imagefolder(tmp_path / "b", classes=4, per_class=6, size=24, seed=3)
    other = make_tiny_imagefolder(tmp_path / "c", classes=4, per_class=6, size=24, seed=4)
    assert _files(root) == _files(same)
    assert _files(root).keys() == _files(other).keys() and _files(root) != _files(other)


def test_loaders_fixed_train_batches_and_class_count(tmp_path: Path) -> None:
    root = make_tiny_imagefolder(tmp_path, classes=3, per_class=10, size=32)  # 30 train, 15 val images
    train_loader, val_loader, n = loaders(root, batch=8, size=32, workers=0, pin_memory=False)
    assert n == 3
    epoch1 = [(x.shape, y) for x, y in train_loader]
    assert [tuple(shape) for shape, _ in epoch1] == [(8, 3, 32, 32)] * 3  # 30 // 8 full batches, 6 images dropped
    assert [len(y) for _, y in val_loader] == [8, 7]  # validation keeps every image
    labels = torch.cat([y for _, y in val_loader])
    assert sorted(set(labels.tolist())) == [0, 1, 2]
    epoch2 = [y.tolist() for _, y in train_loader]
    again = [y.tolist() for _, y in loaders(root, batch=8, size=32, workers=0, pin_memory=False)[0]]
    assert again == [y.tolist() for _, y in epoch1]  # shuffling is seeded
    assert epoch2 != again  # and reshuffles every epoch
    x, _ = next(iter(loaders(root, batch=4, size=20, workers=0, pin_memory=False)[0]))
    assert x.shape == (4, 3, 20, 20)  # resized and cropped to the requested size


# ---- the trainer ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runs(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict, Path]]:
    """Three CPU runs with seed 0: twice plain, once with cuda_graph=True (which runs eager on the CPU)."""
    result = {}
    for name, graph in (("a", False), ("b", False), ("graph", True)):
        out = tmp_path_factory.mktemp(f"run-{name}")
        result[name] = (_run(tiny, out, cuda_graph=graph), out)
    return result


def test_train_returns_metrics_and_writes_outputs(runs) -> None:
    metrics, out = runs["a"]
    assert set(metrics) >= {"epochs", "total_wall_s", "final_train_loss", "final_val_acc", "graph_level", "device"}
    assert metrics["device"] == "cpu" and metrics["graph_level"] is None
    assert [e["epoch"] for e in metrics["epochs"]] == [1, 2, 3]
    for e in metrics["epochs"]:
        assert {"train_loss", "train_acc", "val_loss", "val_acc", "wall_s", "lr"} <= set(e)
        assert 0.0 <= e["train_acc"] <= 1.0 and 0.0 <= e["val_acc"] <= 1.0 and e["wall_s"] > 0
        assert e["steps"] == 3  # 48 images, batch 16
    lrs = [e["lr"] for e in metrics["epochs"]]
    assert lrs[0] == pytest.approx(0.05) and lrs[0] > lrs[1] > lrs[2] > 0  # cosine, stepped per epoch
    assert metrics["final_train_loss"] == metrics["epochs"][-1]["train_loss"]
    assert metrics["final_val_acc"] == metrics["epochs"][-1]["val_acc"]
    assert metrics["total_wall_s"] >= sum(e["wall_s"] for e in metrics["epochs"])
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["epochs"] == metrics["epochs"] and saved["args"]["model"] == "timm:resnet18"


def test_checkpoint_loads_into_a_fresh_model(runs) -> None:
    _, out = runs["a"]
    ckpt = torch.load(out / "checkpoint.pt", weights_only=True)
    assert ckpt["epoch"] == 3 and ckpt["args"]["epochs"] == 3 and ckpt["args"]["optimizer"] == "sgd"
    assert ckpt["classes"] == ["class_00", "class_01", "class_02"]
    fresh = timm.create_model("resnet18", pretrained=False, num_classes=3)
    assert any(not torch.equal(v, ckpt["model"][k]) for k, v in fresh.state_dict().items())
    fresh.load_state_dict(ckpt["model"])
    for k, v in fresh.state_dict().items():
        assert torch.equal(v, ckpt["model"][k]), k
    opt = torch.optim.SGD(fresh.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    opt.load_state_dict(ckpt["optimizer"])
    assert len(opt.state) == len(list(fresh.parameters()))  # momentum buffers came back


def test_trainer_learns(runs) -> None:
    metrics, _ = runs["a"]
    losses = [e["train_loss"] for e in metrics["epochs"]]
    assert metrics["final_train_loss"] < losses[0], losses
    assert metrics["final_val_acc"] > 1 / 3, metrics["epochs"]  # above chance on 3 classes


def test_same_seed_same_losses_on_cpu(runs) -> None:
    a, b = runs["a"][0]["epochs"], runs["b"][0]["epochs"]
    for key in ("train_loss", "train_acc", "val_loss", "val_acc"):
        assert [e[key] for e in a] == [e[key] for e in b], key


def test_cuda_graph_on_cpu_trains_eager(runs, caplog: pytest.LogCaptureFixture) -> None:
    metrics, out = runs["graph"]
    assert metrics["graph_level"] == "eager"
    assert [e["train_loss"] for e in metrics["epochs"]] == [e["train_loss"] for e in runs["a"][0]["epochs"]]
    info = json.loads((out / "metrics.json").read_text())["graph_info"]
    assert "not all on a CUDA device" in info["eager_reason"]


def test_fp16_uses_a_grad_scaler_and_trains(tiny: Path, tmp_path: Path) -> None:
    metrics = train("test_resnet", tiny, 1, 16, 0.05, "fp16", True, tmp_path, 32, 0, 0, optimizer="adamw", device="cpu")
    assert metrics["graph_level"] == "eager" and torch.isfinite(torch.tensor(metrics["final_train_loss"]))


# ---- bad input --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"amp": "fp32"}, "pass one of: bf16 | fp16 | off"),
        ({"optimizer": "lion"}, "pass one of: sgd | adamw"),
        ({"epochs": 0}, "--epochs 1 or more"),
        ({"model": "resnet_18"}, "timm.list_models"),
        ({"model": "tv:resnet18"}, "timm models only"),
        ({"data": "missing"}, "does not exist"),
        ({"data": "empty"}, "no train/ sub-folder"),
        ({"batch": 64}, "lower --batch to at most 48"),
    ],
)
def test_bad_input_names_the_fix(tiny: Path, tmp_path: Path, change: dict, needle: str) -> None:
    (tmp_path / "empty").mkdir()
    change = dict(change)
    data = {"missing": tmp_path / "missing", "empty": tmp_path / "empty"}.get(change.pop("data", ""), tiny)
    model = change.pop("model", "timm:resnet18")
    with pytest.raises(ConfigError) as info:
        train(model, data, out=tmp_path / "out", workers=0, device="cpu", **{"batch": 16, **change})
    assert needle in str(info.value)
    if needle in ("does not exist", "no train/ sub-folder"):
        assert "ImageFolder" in str(info.value) and "--tiny-data" in str(info.value)
    assert not (tmp_path / "out").exists()


def test_unknown_model_suggests_close_names(tiny: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"did you mean .*resnet18"):
        train("resnet_18", tiny, out=tmp_path, device="cpu")


# ---- the command ------------------------------------------------------------------------------------


def test_cli_train_tiny_data(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli"
    assert main(["train", "--tiny-data", "--epochs", "1", "--out", str(out)]) == 0
    assert (out / "checkpoint.pt").is_file() and (out / "tiny-data" / "train" / "class_00").is_dir()
    saved = json.loads((out / "metrics.json").read_text())
    assert len(saved["epochs"]) == 1 and saved["args"]["size"] == 32
    text = capsys.readouterr().out
    assert "epoch 1/1" in text and "val acc" in text and "total wall time" in text


def test_cli_train_needs_data(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["train"])
    assert info.value.code == 2
    assert "--data DIR" in capsys.readouterr().err


def test_cli_train_bad_data_exits_2_naming_the_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--data", str(tmp_path / "nope"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "--tiny-data" in err


# ---- on the GPU ---------------------------------------------------------------------------------------


@pytest.mark.cuda
def test_on_the_gpu_cuda_graph_captures_the_whole_step_and_trains_like_eager(tiny: Path, tmp_path: Path) -> None:
    runs = {
        graph: _run(tiny, tmp_path / str(graph), cuda_graph=graph, device="cuda", epochs=2) for graph in (False, True)
    }
    assert runs[False]["graph_level"] is None and runs[True]["graph_level"] == "whole-step graph"
    info = json.loads((tmp_path / "True" / "metrics.json").read_text())["graph_info"]
    (graph,) = info["graphs"]
    assert graph["verification"]["passed"] and graph["replays"] > 0  # checked against an eager step at capture
    for graph_mode in (False, True):  # the same fused SGD kernel in both modes: only the graph differs
        groups = torch.load(tmp_path / str(graph_mode) / "checkpoint.pt", weights_only=False)["optimizer"]
        assert all(g["fused"] for g in groups["param_groups"])
    eager_losses = [e["train_loss"] for e in runs[False]["epochs"]]
    graph_losses = [e["train_loss"] for e in runs[True]["epochs"]]
    assert eager_losses[0] == pytest.approx(graph_losses[0], rel=1e-3)  # first epoch: ulp-level differences only
