"""CPU tests for launchless.apps.zoo: registry, errors, reproducibility and input shapes (no big forwards)."""

from __future__ import annotations

import dataclasses
import socket
import sys
from collections.abc import Mapping

import pytest
import torch
from torch.utils._pytree import tree_leaves

from launchless.apps import zoo

EXPECTED = [
    "timm:resnet18",
    "timm:mobilenetv3_small_100",
    "timm:efficientnet_b0",
    "timm:convnext_atto",
    "timm:vit_tiny_patch16_224",
    "timm:resnet50",
    "hf:bert-base",
    "hf:gpt2",
    "hf:t5-small",
    "hf:xlnet-base",
    "tv:fasterrcnn_mobilenet_v3_large_fpn",
]


def _all_eval(model: torch.nn.Module) -> bool:
    return not any(m.training for m in model.modules())


def test_names_lists_every_workload() -> None:
    assert set(EXPECTED) <= set(zoo.names())
    assert len(zoo.names()) == len(set(zoo.names()))


@pytest.mark.parametrize("call", [zoo.build, zoo.available])
def test_unknown_name_lists_valid_names(call) -> None:
    with pytest.raises(KeyError) as info:
        call("timm:nope")
    assert isinstance(info.value, ValueError)
    msg = str(info.value)
    assert "timm:nope" in msg
    assert all(n in msg for n in zoo.names())


def test_missing_package_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = dataclasses.replace(zoo._REGISTRY["timm:resnet18"], package="launchless_no_such_pkg")
    monkeypatch.setitem(zoo._REGISTRY, "fake:model", fake)
    assert not zoo.available("fake:model")
    with pytest.raises(ImportError, match=r"pip install 'launchless\[zoo\]'") as info:
        zoo.build("fake:model")
    assert "launchless_no_such_pkg" in str(info.value)


@pytest.mark.zoo
@pytest.mark.parametrize("batch", [1, 2])
def test_timm_resnet18_builds(batch: int) -> None:
    pytest.importorskip("timm")
    assert zoo.available("timm:resnet18")
    w = zoo.build("timm:resnet18", batch=batch)
    assert (w.name, w.family, w.kwargs) == ("timm:resnet18", "timm", {})
    assert _all_eval(w.model)
    (x,) = w.args
    assert x.shape == (batch, 3, 224, 224) and x.dtype == torch.float32 and x.device.type == "cpu"
    (y,), kw = w.inputs()
    assert kw == {} and y.shape == x.shape and y.dtype == x.dtype
    assert not torch.equal(x, y)
    if batch == 1:
        with torch.no_grad():
            assert w.model(*w.args, **w.kwargs).shape == (1, 1000)


@pytest.mark.zoo
def test_build_is_reproducible_per_seed() -> None:
    pytest.importorskip("timm")
    a, b, c = (zoo.build("timm:resnet18", seed=s) for s in (0, 0, 1))
    sa, sb, sc = (w.model.state_dict() for w in (a, b, c))
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert torch.equal(a.args[0], b.args[0])
    assert not torch.equal(sa["conv1.weight"], sc["conv1.weight"])
    assert not torch.equal(a.args[0], c.args[0])


@pytest.mark.zoo
def test_dtype_applies_to_params_and_float_inputs() -> None:
    pytest.importorskip("timm")
    w = zoo.build("timm:mobilenetv3_small_100", dtype=torch.bfloat16)
    assert {p.dtype for p in w.model.parameters()} == {torch.bfloat16}
    assert w.args[0].dtype == torch.bfloat16 and w.inputs()[0][0].dtype == torch.bfloat16


@pytest.mark.zoo
def test_gpt2_inputs_and_tensor_only_outputs() -> None:
    pytest.importorskip("transformers")
    w = zoo.build("hf:gpt2", batch=2)
    assert w.family == "transformers" and w.args == () and _all_eval(w.model)
    assert w.model.config._attn_implementation == "sdpa"
    ids = w.kwargs["input_ids"]
    vocab = w.model.config.vocab_size
    assert ids.shape == (2, 64) and ids.dtype == torch.long
    assert int(ids.min()) >= 0 and int(ids.max()) < vocab
    assert w.kwargs["use_cache"] is False
    _, kw = w.inputs()
    assert kw["input_ids"].shape == ids.shape and not torch.equal(kw["input_ids"], ids)
    with torch.no_grad():
        out = w.model(*w.args, **w.kwargs)
    leaves = tree_leaves(out)
    assert leaves and all(isinstance(t, torch.Tensor) for t in leaves)
    assert out.logits.shape == (2, 64, vocab)


@pytest.mark.zoo
def test_torchvision_detector_inputs() -> None:
    pytest.importorskip("torchvision")
    w = zoo.build("tv:fasterrcnn_mobilenet_v3_large_fpn", batch=2)
    assert w.family == "torchvision" and _all_eval(w.model)
    (images,) = w.args
    assert isinstance(images, list) and len(images) == 2
    assert all(im.shape == (3, 320, 320) and im.min() >= 0 and im.max() <= 1 for im in images)


@pytest.mark.zoo
@pytest.mark.parametrize("name", [n for n in EXPECTED if n.startswith("timm:")])
def test_every_timm_workload_builds(name: str) -> None:
    pytest.importorskip("timm")
    w = zoo.build(name)
    assert w.family == "timm" and _all_eval(w.model) and w.args[0].shape == (1, 3, 224, 224)


# name -> (expected tensor kwargs as {key: (shape, fill or None for random ids)}, expected flag kwargs)
HF_INPUTS = {
    "hf:bert-base": (
        {"input_ids": ((1, 128), None), "attention_mask": ((1, 128), 1), "token_type_ids": ((1, 128), 0)},
        {},
    ),
    "hf:t5-small": (
        {"input_ids": ((1, 64), None), "decoder_input_ids": ((1, 64), None)},
        {"use_cache": False},
    ),
    "hf:xlnet-base": ({"input_ids": ((1, 64), None)}, {"use_mems": False}),
}


@pytest.mark.zoo
@pytest.mark.parametrize("name", list(HF_INPUTS))
def test_hf_workload_inputs(name: str) -> None:
    pytest.importorskip("transformers")
    w = zoo.build(name)
    tensors, flags = HF_INPUTS[name]
    assert w.family == "transformers" and w.args == () and _all_eval(w.model)
    assert set(w.kwargs) == set(tensors) | set(flags)
    assert {k: w.kwargs[k] for k in flags} == flags
    vocab = w.model.config.vocab_size
    for key, (shape, fill) in tensors.items():
        t = w.kwargs[key]
        assert t.shape == shape and t.dtype == torch.long, key
        if fill is None:
            assert int(t.min()) >= 0 and int(t.max()) < vocab, key
        else:
            assert bool((t == fill).all()), key
    if name == "hf:t5-small":
        cfg = w.model.config
        assert (cfg.d_model, cfg.d_ff, cfg.num_layers, cfg.num_heads, vocab) == (512, 2048, 6, 8, 32128)
    if name == "hf:xlnet-base":
        assert w.model.config.use_mems_eval is False


# --- tasks and the full registry ------------------------------------------------------------------

# Floors per task: the conformance matrix counts on at least this many of each.
TASK_FLOORS = {
    "classification": 20,
    "detection": 10,
    "instance-segmentation": 2,
    "semantic-segmentation": 6,
    "keypoints": 1,
    "video": 5,
    "optical-flow": 2,
    "encoder": 7,
    "decoder": 9,
    "encoder-decoder": 5,
    "vision": 7,
    "audio": 3,
    "diffusion": 3,
    "recommendation": 1,
    "scientific": 1,
}

ORIGINAL_TASKS = {
    "timm:resnet18": "classification",
    "timm:mobilenetv3_small_100": "classification",
    "timm:efficientnet_b0": "classification",
    "timm:convnext_atto": "classification",
    "timm:vit_tiny_patch16_224": "classification",
    "timm:resnet50": "classification",
    "hf:bert-base": "encoder",
    "hf:gpt2": "decoder",
    "hf:t5-small": "encoder-decoder",
    "hf:xlnet-base": "encoder",
    "tv:fasterrcnn_mobilenet_v3_large_fpn": "detection",
    "tv:fasterrcnn_resnet50_fpn": "detection",
    "tv:retinanet_resnet50_fpn": "detection",
    "tv:fcos_resnet50_fpn": "detection",
    "tv:maskrcnn_resnet50_fpn": "instance-segmentation",
    "tv:ssdlite320_mobilenet_v3_large": "detection",
    "tv:raft_small": "optical-flow",
    "hf:mistral-tiny": "decoder",
    "hf:rt-detr": "detection",
    "hf:mask2former": "semantic-segmentation",
}

# Called with explicit flags that drop caches / mems: they keep that behaviour (benchmarks rely on it).
NO_CACHE = {"hf:gpt2", "hf:mistral-tiny", "hf:t5-small"}
PREFIX_FAMILY = {
    "timm": "timm",
    "tv": "torchvision",
    "hf": "transformers",
    "diffusers": "diffusers",
    "grace": "grace",
}


def test_tasks_cover_every_workload_once() -> None:
    assert "tasks" in zoo.__all__ and "TASKS" in zoo.__all__
    by_task = zoo.tasks()
    assert list(by_task) == [t for t in zoo.TASKS if t in by_task]  # in TASKS order
    assert set(by_task) == set(TASK_FLOORS) == set(zoo.TASKS)
    listed = [n for group in by_task.values() for n in group]
    assert sorted(listed) == sorted(zoo.names()) and len(listed) == len(set(listed))
    assert len(by_task) >= 12 and len(listed) >= 85
    for task, floor in TASK_FLOORS.items():
        assert len(by_task[task]) >= floor, (task, by_task[task])
    for task, group in by_task.items():
        assert all(zoo._REGISTRY[n].task == task for n in group)


def test_original_workloads_keep_names_order_and_get_tasks() -> None:
    assert zoo.names()[: len(ORIGINAL_TASKS)] == list(ORIGINAL_TASKS)
    assert {n: zoo._REGISTRY[n].task for n in ORIGINAL_TASKS} == ORIGINAL_TASKS


def test_names_follow_their_family() -> None:
    for name in zoo.names():
        prefix, _, short = name.partition(":")
        spec = zoo._REGISTRY[name]
        assert short and spec.family == PREFIX_FAMILY[prefix], name
        assert spec.task in zoo.TASKS, name
    diffusion = [zoo._REGISTRY[n] for n in zoo.tasks()["diffusion"]]
    assert all(spec.package == "diffusers" for spec in diffusion if spec.family == "diffusers")
    assert {spec.family for spec in diffusion} == {"diffusers", "grace"}  # GraCE's DALLE2 stand-in is plain torch


def test_unknown_task_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown task 'nope'"):
        dataclasses.replace(zoo._REGISTRY["timm:resnet18"], task="nope")


def test_missing_diffusers_makes_diffusion_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "diffusers", None)  # import diffusers now raises ImportError
    from_diffusers = [n for n in zoo.tasks()["diffusion"] if zoo._REGISTRY[n].family == "diffusers"]
    assert from_diffusers and not any(zoo.available(n) for n in from_diffusers)
    assert zoo.available("grace:dalle2")  # needs torch alone
    with pytest.raises(ImportError, match="needs 'diffusers'"):
        zoo.build(from_diffusers[0])


@pytest.mark.zoo
def test_workload_carries_its_task() -> None:
    pytest.importorskip("timm")
    w = zoo.build("timm:resnet18")
    assert (w.task, w.family) == ("classification", "timm")


def _tensors(obj: object):
    """Tensors in an output: nested tuples / lists / dicts (model outputs are dicts) and dataclasses."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, Mapping):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, list | tuple):
        for v in obj:
            yield from _tensors(v)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from _tensors(getattr(obj, f.name))


def _no_network(*args, **kwargs):
    raise AssertionError("a zoo builder tried to open a network connection")


@pytest.mark.zoo
@pytest.mark.parametrize("name", zoo.names())
def test_every_workload_builds_and_runs(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Random weights only: builds offline at batch 1 and one CPU forward gives finite float outputs."""
    if not zoo.available(name):
        pytest.skip(f"{zoo._REGISTRY[name].package} is not installed")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(socket.socket, "connect", _no_network)
    spec = zoo._REGISTRY[name]
    w = zoo.build(name)
    assert (w.name, w.task, w.family) == (name, spec.task, spec.family)
    assert _all_eval(w.model)
    assert all(p.device.type == "cpu" and p.dtype == torch.float32 for p in w.model.parameters())

    given = list(_tensors((w.args, w.kwargs)))
    fresh = list(_tensors(w.inputs()))
    assert given and [(t.shape, t.dtype) for t in given] == [(t.shape, t.dtype) for t in fresh]
    if spec.family == "transformers":
        cfg = w.model.config
        vocab = getattr(cfg, "vocab_size", None) or getattr(getattr(cfg, "text_config", None), "vocab_size", None)
        for key, ids in w.kwargs.items():
            if key.endswith("input_ids"):
                assert int(ids.min()) >= 0 and int(ids.max()) < vocab, key

    with torch.no_grad():
        out = w.model(*w.args, **w.kwargs)
    floats = [t for t in _tensors(out) if t.is_floating_point()]
    assert floats, f"{name}: no float tensor in the output"
    assert all(bool(torch.isfinite(t).all()) for t in floats), f"{name}: non-finite output"
    if spec.task != "detection":  # random-weight detectors may keep no box above their score threshold
        assert any(t.numel() for t in floats), f"{name}: only empty outputs"
    if spec.task in ("decoder", "encoder-decoder") and name not in NO_CACHE:
        from transformers import Cache

        assert any(isinstance(v, Cache) for v in out.values()), f"{name}: no cache returned by default"
