"""GPU tests with a fresh input on every call, as users call: detectors fed a new image each call must never crash
where eager works, in either grad mode, and every call's result must be eager's on that same input.

An R-CNN's proposal step filters boxes (``torch.where(mask)``, ``torchvision::nms``): how many survive depends on the
image. Under ``inference_mode`` a dispatch mode sees ``where(mask)`` whole (untagged) and ``nms`` carries no tag;
taken for operations whose shape follows from shapes, they were run eager between graphs, and the third call raised
("torchvision::nms returned (332,) on replay, (338,) when captured"). They are proven on fake tensors now; and a
replay whose operation between graphs returns another shape still runs eager, once told."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

import launchless as ll
from launchless import CaptureError
from launchless.core import junctions
from launchless.core.verify import identical

pytestmark = pytest.mark.cuda
torchvision = pytest.importorskip("torchvision")

GRAD_MODES = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}
CALLS = 8


def real_looking_image(generator: torch.Generator, height: int = 320, width: int = 416) -> torch.Tensor:
    """A smooth field with blobs and edges in [0, 1] (white noise gives a detector nothing to find), new each call."""
    coarse = torch.rand(1, 3, height // 16, width // 16, generator=generator)
    image = torch.nn.functional.interpolate(coarse, size=(height, width), mode="bilinear", align_corners=False)[0]
    for _ in range(4):  # rectangles of one colour: edges and corners
        top, left = (int(v) for v in torch.randint(0, min(height, width) // 2, (2,), generator=generator))
        size = int(torch.randint(16, min(height, width) // 2, (1,), generator=generator))
        image[:, top : top + size, left : left + size] = torch.rand(3, 1, 1, generator=generator)
    return image.clamp(0, 1).cuda()


def _detector(name: str) -> nn.Module:
    torch.manual_seed(0)
    builder = getattr(torchvision.models.detection, name)
    return builder(weights=None, weights_backbone=None).cuda().eval()


DETECTORS = ["fasterrcnn_mobilenet_v3_large_320_fpn", "fasterrcnn_resnet50_fpn_v2", "maskrcnn_resnet50_fpn"]


@pytest.mark.parametrize("grad_mode", list(GRAD_MODES))
@pytest.mark.parametrize("name", DETECTORS)
def test_a_detector_fed_a_fresh_image_each_call_returns_eagers_result_in_auto(name: str, grad_mode: str) -> None:
    model = _detector(name)
    fast = ll.wrap(model)  # "auto"
    generator = torch.Generator().manual_seed(1)
    with GRAD_MODES[grad_mode]():
        for call in range(CALLS):
            image = real_looking_image(generator)
            expected = model([image])
            got = fast([image])
            assert identical(got, expected), f"call {call}: the wrapped detector's result is not eager's"
    info = fast.graph_info()
    split = info.get("split") or {}
    assert not any(row.get("region_split") for row in info["graphs"]), info["graphs"]  # nothing between graphs
    decisions = split.get("signatures") or []
    assert decisions, info  # refused whole, the detector was split by submodule and the split decided
    for decision in decisions:  # a split kept is one whose pieces replay; one dropped says why (not faster)
        if decision["status"] == "verified":
            assert any(piece["replays"] for piece in split["pieces"]), split["pieces"]
        else:
            assert decision["detail"], decision


@pytest.mark.parametrize("name", ["fasterrcnn_mobilenet_v3_large_320_fpn"])
def test_the_one_graph_asked_for_names_the_same_blocker_in_both_grad_modes(name: str) -> None:
    model = _detector(name)
    generator = torch.Generator().manual_seed(2)
    messages = {}
    for grad_mode, context in GRAD_MODES.items():
        fast = ll.wrap(model, cuda_graph=True)
        with context(), pytest.raises(CaptureError) as raised:
            fast.capture_graph([real_looking_image(generator)])
        messages[grad_mode] = str(raised.value)
    for message in messages.values():
        assert "aten.nonzero" in message and "boxes.py" in message, messages
    assert "returned" not in messages["inference_mode"], messages  # no junction replay ever ran


@pytest.mark.parametrize("grad_mode", list(GRAD_MODES))
def test_cuda_graph_true_on_a_detector_fed_a_fresh_image_each_call(grad_mode: str) -> None:
    """True graphs from the first call: a detector that cannot be one graph runs its verified split (or, where no
    split is faster, raises at once, naming why) -- never a crash after calls that worked, never another result."""
    model = _detector("fasterrcnn_mobilenet_v3_large_320_fpn")
    fast = ll.wrap(model, cuda_graph=True)
    generator = torch.Generator().manual_seed(3)
    with GRAD_MODES[grad_mode]():
        image = real_looking_image(generator)
        try:
            got = fast([image])
        except CaptureError as refused:
            assert "tried and dropped" in str(refused), refused
            return
        assert identical(got, model([image]))
        for call in range(1, CALLS):
            image = real_looking_image(generator)
            assert identical(fast([image]), model([image])), f"call {call}: not eager's result"
    (decision,) = fast.graph_info()["split"]["signatures"]
    assert decision["status"] == "verified", decision


class _Proposals(nn.Module):
    """Layers, then boxes filtered by NMS (how many survive depends on the values), then more layers."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.before = nn.Sequential(*(nn.Linear(4, 4) for _ in range(6)))
        self.after = nn.Sequential(*(nn.Linear(4, 4) for _ in range(6)))

    def forward(self, boxes: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        boxes = self.before(boxes).abs().cumsum(-1) * 10
        keep = torchvision.ops.nms(boxes, scores, 0.3)
        return self.after(boxes[keep]).sum(0)


@pytest.mark.parametrize("grad_mode", list(GRAD_MODES))
def test_a_junction_that_returns_another_shape_at_replay_runs_that_call_eager(grad_mode, monkeypatch, caplog) -> None:
    """The last line of defence: an operation taken for a junction (here the proof is switched off) whose output's
    shape changes at a replay. The call is eager's, the chain goes, one log line; no later call raises."""
    monkeypatch.setattr(junctions, "data_dependence", lambda func, args, kwargs: "")
    model = _Proposals().cuda().eval()
    fast = ll.wrap(model, capture_after=1)
    generator = torch.Generator(device="cuda").manual_seed(3)
    with GRAD_MODES[grad_mode](), caplog.at_level(logging.INFO, logger="launchless"):
        for call in range(CALLS):
            boxes = torch.rand(64, 4, device="cuda", generator=generator)
            scores = torch.rand(64, device="cuda", generator=generator)
            assert identical(fast(boxes, scores), model(boxes, scores)), f"call {call}"
    said = [m for m in (r.getMessage() for r in caplog.records) if "on replay" in m and "when captured" in m]
    assert len(said) <= 1, said


class _SplitBySizes(nn.Module):
    """A deformable-attention pattern: feature-map sizes in an integer tensor split the flattened sequence. Read on
    the host, the sizes refuse the whole graph; random sizes (a verification probe) do not add up, and eager raises
    on them -- which must refuse a graph, never fail the caller's call."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.project = nn.Sequential(*(nn.Linear(16, 16) for _ in range(6)))
        self.out = nn.Sequential(*(nn.Linear(16, 16) for _ in range(6)))

    def forward(self, sequence: torch.Tensor, shapes: torch.Tensor) -> torch.Tensor:
        parts = self.project(sequence).split([h * w for h, w in shapes.tolist()], dim=1)
        return self.out(torch.cat([part.cumsum(1) * (level + 1) for level, part in enumerate(parts)], dim=1))


@pytest.mark.parametrize("grad_mode", list(GRAD_MODES))
def test_sizes_a_probe_cannot_draw_at_random_never_fail_the_call(grad_mode: str) -> None:
    model = _SplitBySizes().cuda().eval()
    fast = ll.wrap(model)
    shapes = torch.tensor([[20, 26], [10, 13], [5, 7]], device="cuda")  # 520 + 130 + 35
    generator = torch.Generator(device="cuda").manual_seed(4)
    with GRAD_MODES[grad_mode]():
        for call in range(CALLS):
            sequence = torch.randn(2, 685, 16, device="cuda", generator=generator)
            assert identical(fast(sequence, shapes), model(sequence, shapes)), f"call {call}"
    split = fast.graph_info()["split"]
    assert split is not None and split["signatures"], split


DETR_LIKE = ["hf:rt-detr", "hf:rt-detr-v2", "hf:d-fine"]


@pytest.mark.parametrize("grad_mode", list(GRAD_MODES))
@pytest.mark.parametrize("name", DETR_LIKE)
def test_detr_like_detectors_fed_fresh_images_return_eagers_result(name: str, grad_mode: str) -> None:
    from launchless.apps import zoo

    workload = zoo.build(name, device="cuda")
    model = workload.model
    fast = ll.wrap(model)
    with GRAD_MODES[grad_mode]():
        for call in range(CALLS):
            args, kwargs = workload.inputs()  # new values each call
            assert identical(fast(*args, **kwargs), model(*args, **kwargs)), f"call {call}"


@pytest.mark.parametrize("grad_mode", list(GRAD_MODES))
def test_deformable_detr_fed_fresh_images_returns_eagers_result(grad_mode: str) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.DeformableDetrConfig(
        use_timm_backbone=False,
        use_pretrained_backbone=False,
        backbone_config=transformers.ResNetConfig(
            embedding_size=16,
            hidden_sizes=[16, 32, 64, 128],
            depths=[1, 1, 1, 1],
            out_features=["stage2", "stage3", "stage4"],
        ),
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        num_queries=20,
    )
    torch.manual_seed(0)
    model = transformers.DeformableDetrForObjectDetection(config).cuda().eval()
    fast = ll.wrap(model)
    generator = torch.Generator().manual_seed(5)
    with GRAD_MODES[grad_mode]():
        for call in range(CALLS):
            pixels = real_looking_image(generator)[None]
            assert identical(fast(pixel_values=pixels), model(pixel_values=pixels)), f"call {call}"


@pytest.mark.parametrize("grad_mode", list(GRAD_MODES))
def test_mask_rcnn_pastes_its_masks_through_the_rewrite_proven_on_the_gpu(grad_mode: str) -> None:
    """Mask R-CNN's paste of each detection's mask waits for the GPU a dozen times a detection, and its box and
    mask heads' RoIAlign once per feature level; inside the wrapped call it reads the boxes once and sorts the
    levels once, proven bit-identical to torchvision's functions on their first call on the GPU; every fresh
    image's result is still the model's own."""
    from launchless.core import library_rewrites

    model = _detector("maskrcnn_resnet50_fpn")
    fast = ll.wrap(model)
    (paste,) = [r for r in library_rewrites.REWRITES if r.name == "torchvision paste_masks_in_image"]
    calls_before = paste.calls
    generator = torch.Generator().manual_seed(3)
    pasted = 0
    with GRAD_MODES[grad_mode]():
        for call in range(4):
            image = real_looking_image(generator)
            expected = model([image])
            got = fast([image])
            assert identical(got, expected), call
            pasted += len(expected[0]["masks"]) > 0
    assert pasted, "no detection: nothing was pasted"
    info = fast.graph_info()["library_rewrites"]["torchvision paste_masks_in_image"]
    assert info["states"] == {"cuda torch.float32": "proven"}, info
    assert paste.calls - calls_before >= 4  # every call pastes (and capture, verification and timing run it too)
    pooling = fast.graph_info()["library_rewrites"]["torchvision multi-scale RoIAlign"]  # the box and mask heads'
    assert pooling["states"] == {"cuda torch.float32": "proven"} and pooling["calls"] >= 8, pooling


@pytest.mark.parametrize("grad_mode", list(GRAD_MODES))
def test_ssdlite_finds_every_classs_boxes_at_once_proven_on_the_gpu(grad_mode: str) -> None:
    """SSDlite masks each of its 90 classes' scores in turn (a wait for the GPU each) and its per-class batched_nms
    finds each class with a torch.where: inside the wrapped call both find all classes at once, proven bit-identical
    on the GPU; every fresh image's detections are the model's own."""
    from launchless.core import library_rewrites

    model = _detector("ssdlite320_mobilenet_v3_large")
    fast = ll.wrap(model)
    generator = torch.Generator().manual_seed(4)
    with GRAD_MODES[grad_mode]():
        for call in range(4):
            image = real_looking_image(generator, height=320, width=320)
            expected = model([image])
            got = fast([image])
            assert identical(got, expected), call
            assert len(expected[0]["boxes"]) > 0
    info = fast.graph_info()["library_rewrites"]
    ssd = "torchvision SSD.postprocess_detections"
    assert ssd in {rewrite.name for rewrite in library_rewrites.REWRITES}
    assert info[ssd]["states"] == {"cuda torch.float32": "proven"}, info


@pytest.mark.parametrize("grad_mode", list(GRAD_MODES))
def test_ssdlite_compiled_by_the_backend_meets_its_rewrites_proven_on_the_gpu(grad_mode: str, monkeypatch) -> None:
    """Under torch.compile(backend="launchless") Dynamo meets the rewrites (one graph break each, run eagerly, proven
    on their first call on the GPU) instead of torchvision's per-class masks (a graph break and a wait each): every
    fresh image's detections are those of the same compiled model with torchvision's own function at that break."""
    from launchless.core import library_rewrites
    from launchless.core.library_rewrites import RewriteState

    rewrites = {r.name: r for r in library_rewrites.REWRITES}
    ssd = rewrites["torchvision SSD.postprocess_detections"]
    key = ("cuda", torch.float32)
    monkeypatch.setattr(ssd, "states", dict(ssd.states))  # restored after: the states are the process's
    model = _detector("ssdlite320_mobilenet_v3_large")
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="launchless")
    generator = torch.Generator().manual_seed(6)
    try:
        with GRAD_MODES[grad_mode]():
            for call in range(4):
                image = real_looking_image(generator, height=320, width=320)
                calls = ssd.calls
                got = compiled([image])
                assert ssd.calls == calls + 1 and ssd.states[key] is RewriteState.PROVEN, (call, ssd.states)
                ssd.states[key] = RewriteState.DROPPED  # the same compiled code, torchvision's function at the break
                want = compiled([image])
                ssd.states[key] = RewriteState.PROVEN
                assert len(want[0]["boxes"]) > 0 and identical(got, want), call
    finally:
        torch._dynamo.reset()


@pytest.mark.parametrize("grad_mode", list(GRAD_MODES))
@pytest.mark.parametrize("name", ["retinanet_resnet50_fpn", "fcos_resnet50_fpn"])
def test_dense_detectors_find_every_levels_scores_at_once_proven_on_the_gpu(name: str, grad_mode: str) -> None:
    """RetinaNet and FCOS mask each level's scores and find where they are (two waits for the GPU a level): inside
    the wrapped call all levels' at once, proven bit-identical on the GPU; every fresh image's detections are the
    model's own (a score threshold of 0: random weights score below the default)."""
    torch.manual_seed(0)
    builder = getattr(torchvision.models.detection, name)
    model = builder(weights=None, weights_backbone=None, score_thresh=0.0).cuda().eval()
    fast = ll.wrap(model)
    generator = torch.Generator().manual_seed(8)
    with GRAD_MODES[grad_mode]():
        for call in range(4):
            image = real_looking_image(generator)
            expected = model([image])
            assert len(expected[0]["boxes"]) > 0
            assert identical(fast([image]), expected), call
    kind = "RetinaNet" if name.startswith("retinanet") else "FCOS"
    info = fast.graph_info()["library_rewrites"][f"torchvision {kind}.postprocess_detections"]
    assert info["states"] == {"cuda torch.float32": "proven"}, info


@pytest.mark.parametrize("grad_mode", list(GRAD_MODES))
def test_keypoint_rcnn_reads_its_heatmap_sizes_at_once_proven_on_the_gpu(grad_mode: str) -> None:
    """Keypoint R-CNN reads two heatmap sizes per detection with .item(): inside the wrapped call all at once,
    proven bit-identical on the GPU; every fresh image's keypoints are the model's own."""
    torch.manual_seed(0)
    model = (
        torchvision.models.detection.keypointrcnn_resnet50_fpn(
            weights=None, weights_backbone=None, box_score_thresh=0.0
        )
        .cuda()
        .eval()
    )
    fast = ll.wrap(model)
    generator = torch.Generator().manual_seed(5)
    with GRAD_MODES[grad_mode]():
        for call in range(4):
            image = real_looking_image(generator)
            expected = model([image])
            assert len(expected[0]["keypoints"]) > 0
            assert identical(fast([image]), expected), call
    info = fast.graph_info()["library_rewrites"]["torchvision heatmaps_to_keypoints"]
    assert info["states"] == {"cuda torch.float32": "proven"}, info
