"""Library functions rewritten to wait for the GPU once per call: the same values as the library's function (the
first call in a process proves it, bit for bit), only inside wrapped calls, and dropped with one WARNING where they
differ. On the CPU the waits are host reads all the same (``aten::_local_scalar_dense``), counted here."""

from __future__ import annotations

import logging
from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

torchvision = pytest.importorskip("torchvision")

from torchvision.models.detection import roi_heads  # noqa: E402
from torchvision.models.detection import transform as detection_transform  # noqa: E402

import launchless  # noqa: E402
from launchless.core import library_rewrites  # noqa: E402
from launchless.core.library_rewrites import RewriteState  # noqa: E402

REWRITES = {rewrite.name: rewrite for rewrite in library_rewrites.REWRITES}
PASTE = REWRITES["torchvision paste_masks_in_image"]
# the submodule of every R-CNN that calls paste_masks_in_image
MASK_RCNN_TRANSFORM = detection_transform.GeneralizedRCNNTransform(32, 64, [0.5] * 3, [0.2] * 3)
READS = {"aten._local_scalar_dense.default", "aten.item.default", "aten.is_nonzero.default"}


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


def _detections(n: int, seed: int, *, size: tuple[int, int] = (48, 64)) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask probabilities and boxes as Mask R-CNN hands them over (clipped to the image: the paste then reaches a
    little past its edges), some of no extent, some at the image's edges, a few the same."""
    g = torch.Generator().manual_seed(seed)
    masks = torch.rand(n, 1, 28, 28, generator=g)
    h, w = size
    corners = torch.rand(n, 2, generator=g) * torch.tensor([float(w), float(h)])
    extents = torch.rand(n, 2, generator=g) * torch.tensor([w / 2.0, h / 2.0])
    extents[: n // 8] = 0  # boxes of no extent
    boxes = torch.cat([corners, corners + extents], dim=1)
    boxes[n // 8 : n // 4, :2] = 0  # at the top left corner
    boxes[n // 4 : n // 3] = boxes[:1]  # the same as the first
    return masks, torchvision.ops.clip_boxes_to_image(boxes, size)


@pytest.mark.parametrize("n", [0, 1, 37])
def test_the_rewrite_pastes_the_masks_the_library_pastes_bit_for_bit(n: int) -> None:
    for seed in range(3):
        masks, boxes = _detections(n, seed)
        want = roi_heads.paste_masks_in_image(masks, boxes, (48, 64))
        got = library_rewrites._paste_masks_in_image(masks, boxes, (48, 64))
        assert got.shape == want.shape and got.dtype == want.dtype
        assert torch.equal(got, want), (n, seed)


def test_the_rewrite_reads_the_host_once_where_the_library_reads_a_dozen_times_a_detection() -> None:
    masks, boxes = _detections(40, 0)
    with _Ops() as library:
        roi_heads.paste_masks_in_image(masks, boxes, (48, 64))
    with _Ops() as rewritten:
        library_rewrites._paste_masks_in_image(masks, boxes, (48, 64))
    assert sum(library.ops[op] for op in READS) >= 10 * 40, library.ops
    assert sum(rewritten.ops[op] for op in READS) == 0, rewritten.ops
    assert sum(rewritten.ops.values()) < sum(library.ops.values()) / 3


@pytest.fixture
def fresh_states(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test proves the rewrite anew (the states are the process's)."""
    monkeypatch.setattr(PASTE, "states", {})
    monkeypatch.setattr(PASTE, "reasons", {})
    monkeypatch.setattr(PASTE, "calls", 0)


def test_outside_a_wrapped_call_the_library_function_runs_untouched(fresh_states, monkeypatch) -> None:
    library_rewrites.install(MASK_RCNN_TRANSFORM)
    assert detection_transform.paste_masks_in_image.__wrapped__ is roi_heads.paste_masks_in_image
    ran: list[str] = []
    monkeypatch.setattr(PASTE, "rewritten", lambda *a, **k: ran.append("rewrite"))
    masks, boxes = _detections(5, 1)
    out = detection_transform.paste_masks_in_image(masks, boxes, (48, 64))
    assert torch.equal(out, roi_heads.paste_masks_in_image(masks, boxes, (48, 64))) and ran == []
    assert PASTE.states == {}


def test_the_first_call_proves_the_rewrite_and_later_calls_run_it_alone(fresh_states, monkeypatch) -> None:
    library_rewrites.install(MASK_RCNN_TRANSFORM)
    library: list[int] = []
    original = detection_transform.paste_masks_in_image.__wrapped__
    monkeypatch.setattr(roi_heads, "paste_masks_in_image", original)
    counted = library_rewrites._dispatching(PASTE, lambda *a, **k: library.append(1) or original(*a, **k))
    with library_rewrites.active():
        for seed in range(3):
            masks, boxes = _detections(9, seed)
            assert torch.equal(counted(masks, boxes, (48, 64)), original(masks, boxes, (48, 64)))
    assert library == [1]  # the library's function ran on the first call only, beside the rewrite
    assert PASTE.states == {("cpu", torch.float32): RewriteState.PROVEN} and PASTE.calls == 3


def test_a_rewrite_that_differs_is_dropped_with_one_warning_and_the_librarys_result_stands(
    fresh_states, monkeypatch, caplog
) -> None:
    library_rewrites.install(MASK_RCNN_TRANSFORM)
    original = detection_transform.paste_masks_in_image.__wrapped__
    monkeypatch.setattr(PASTE, "rewritten", lambda *a, **k: original(*a, **k) + 1e-6)
    dispatch = library_rewrites._dispatching(PASTE, original)
    with caplog.at_level(logging.WARNING, logger="launchless"), library_rewrites.active():
        for seed in range(3):
            masks, boxes = _detections(6, seed)
            assert torch.equal(dispatch(masks, boxes, (48, 64)), original(masks, boxes, (48, 64)))
    lines = [r.getMessage() for r in caplog.records if "rewrite of torchvision paste_masks_in_image" in r.getMessage()]
    assert len(lines) == 1 and "its result differs from the library's" in lines[0], lines
    assert PASTE.states == {("cpu", torch.float32): RewriteState.DROPPED} and PASTE.calls == 0


def test_a_function_of_another_signature_is_left_alone(monkeypatch) -> None:
    def paste_masks_in_image(masks, boxes, img_shape, padding=1, *, new=None): ...

    monkeypatch.setattr(detection_transform, "paste_masks_in_image", paste_masks_in_image)
    assert PASTE not in library_rewrites.install(MASK_RCNN_TRANSFORM)
    assert library_rewrites.install(torch.nn.Linear(2, 2)) == []  # a model that never calls it
    assert detection_transform.paste_masks_in_image is paste_masks_in_image


def _the_models_detections_on_fresh_images(
    model: torch.nn.Module, wrapped: torch.nn.Module, *, size: tuple[int, int], found: str
) -> list[torch.Tensor]:
    """Two fresh images per grad mode: the wrapper's detections are the model's bit for bit (and it finds some
    ``found``); the last call's images."""
    g = torch.Generator().manual_seed(1)
    for grad_mode in (torch.no_grad, torch.inference_mode):
        with grad_mode():
            for _ in range(2):
                images = [torch.rand(3, *size, generator=g)]
                want, got = model(images), wrapped(images)
                assert len(want[0][found]) > 0
                assert all(torch.equal(got[0][k], want[0][k]) for k in want[0]), grad_mode
    return images


@pytest.mark.zoo
def test_a_wrapped_mask_rcnn_returns_the_models_masks_with_the_rewrite_proven(fresh_states) -> None:
    """Fresh images each call, both grad modes: the wrapper's detections are the model's; the rewrite ran."""
    torch.manual_seed(0)
    model = torchvision.models.detection.maskrcnn_resnet50_fpn(
        weights=None, weights_backbone=None, min_size=160, max_size=224, box_score_thresh=0.0
    ).eval()
    wrapped = launchless.wrap(model)
    _the_models_detections_on_fresh_images(model, wrapped, size=(150, 200), found="masks")
    info = wrapped.graph_info()["library_rewrites"]["torchvision paste_masks_in_image"]
    assert info["states"] == {"cpu torch.float32": "proven"} and info["calls"] == 4, info


class _MaskIndexing(TorchDispatchMode):
    """Counts indexing by a boolean mask (on the GPU a wait: how many elements it keeps is read on the host) and
    ``torch.where(mask)`` (``nonzero``), as a dispatch mode sees them."""

    def __init__(self) -> None:
        super().__init__()
        self.waits = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.index.Tensor:
            self.waits += any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1])
        elif func in (torch.ops.aten.nonzero.default, torch.ops.aten.where.default):
            self.waits += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("n", [0, 1, 300])
def test_batched_nms_per_class_keeps_the_librarys_boxes_in_its_order(n: int) -> None:
    from torchvision.ops import boxes as box_ops

    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        corners = torch.rand(n, 2, generator=g) * 100
        boxes = torch.cat([corners, corners + 1 + torch.rand(n, 2, generator=g) * 40], dim=1)
        scores = torch.rand(n, generator=g).round(decimals=2)  # ties
        idxs = torch.randint(0, 12, (n,), generator=g)  # classes in no order, some absent
        want = box_ops._batched_nms_vanilla(boxes, scores, idxs, 0.5)
        got = library_rewrites._batched_nms_vanilla(boxes, scores, idxs, 0.5)
        assert torch.equal(got, want), (n, seed)
        with _MaskIndexing() as library:
            box_ops._batched_nms_vanilla(boxes, scores, idxs, 0.5)
        with _MaskIndexing() as rewritten:
            library_rewrites._batched_nms_vanilla(boxes, scores, idxs, 0.5)
        assert rewritten.waits <= 1 and library.waits >= len(idxs.unique()), (library.waits, rewritten.waits)


@pytest.mark.zoo
def test_a_wrapped_ssdlite_returns_the_models_detections_with_its_rewrites_proven(fresh_states, monkeypatch) -> None:
    """SSDlite's post-processing masks each of 90 classes' scores (a wait each on the GPU): inside the wrapped call
    the classes' boxes are found at once; fresh images, both grad modes, every detection the model's own."""
    ssd, nms = REWRITES["torchvision SSD.postprocess_detections"], REWRITES["torchvision batched_nms per class"]
    for rewrite in (ssd, nms):
        monkeypatch.setattr(rewrite, "states", {})
        monkeypatch.setattr(rewrite, "calls", 0)
    torch.manual_seed(0)
    model = torchvision.models.detection.ssdlite320_mobilenet_v3_large(
        weights=None, weights_backbone=None, score_thresh=0.0
    ).eval()
    wrapped = launchless.wrap(model)
    images = _the_models_detections_on_fresh_images(model, wrapped, size=(320, 320), found="boxes")
    info = wrapped.graph_info()["library_rewrites"]
    assert info[ssd.name]["states"] == {"cpu torch.float32": "proven"} and info[ssd.name]["calls"] == 4, info
    assert info[nms.name]["states"] == {"cpu torch.float32": "proven"} and info[nms.name]["calls"] >= 4, info
    with torch.no_grad(), _MaskIndexing() as library:
        model(images)
    with torch.no_grad(), _MaskIndexing() as rewritten:
        wrapped(images)
    assert library.waits >= 2 * 90 and rewritten.waits <= 10, (library.waits, rewritten.waits)


@pytest.mark.parametrize("n", [0, 1, 23])
def test_keypoints_are_read_from_the_librarys_heatmaps_bit_for_bit(n: int) -> None:
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        maps = torch.randn(n, 17, 56, 56, generator=g)
        corners = torch.rand(n, 2, generator=g) * 200
        rois = torch.cat([corners, corners + torch.rand(n, 2, generator=g) * 120], dim=1)  # some under a pixel
        want = roi_heads.heatmaps_to_keypoints(maps, rois)
        got = library_rewrites._heatmaps_to_keypoints(maps, rois)
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True)), (n, seed)
        with _Ops() as library:
            roi_heads.heatmaps_to_keypoints(maps, rois)
        with _Ops() as rewritten:
            library_rewrites._heatmaps_to_keypoints(maps, rois)
        assert sum(library.ops[op] for op in READS) == 2 * n and sum(rewritten.ops[op] for op in READS) == 0


def _graphs_handed_over(model: torch.nn.Module, images: list[torch.Tensor], *, rewrites: bool) -> int:
    """How many FX graphs ``torch.compile`` hands the launchless backend for one call of ``model`` (the
    backend's own graph handling left out: each graph runs as Dynamo traced it)."""
    from launchless.compiler.backend import make_backend

    handed: list[int] = []

    def inner(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        handed.append(1)
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=make_backend(inner, library_rewrites=rewrites))
    with torch.no_grad():
        compiled(images)
    torch._dynamo.reset()
    return len(handed)


class _SaysWhetherCompiling(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + (1.0 if library_rewrites._compiling() else 0.0)


def test_the_rewrites_know_torch_compile_from_torch_export() -> None:
    """Code traced for ``torch.compile`` runs the rewrites at a graph break; code ``torch.export`` traces runs the
    library's function as traced. (Dynamo up to torch 2.13 folds ``torch.compiler.is_exporting()`` to True under
    ``torch.compile`` too: read so, every compiled detector would run the library's waits.)"""
    module, x = _SaysWhetherCompiling(), torch.zeros(2)
    assert module(x).tolist() == [0.0, 0.0]
    torch._dynamo.reset()
    try:
        assert torch.compile(module, backend="eager")(x).tolist() == [1.0, 1.0]
    finally:
        torch._dynamo.reset()
    exported = torch.export.export(module, (x,))
    assert exported.module()(x).tolist() == [0.0, 0.0]


@pytest.mark.zoo
def test_a_compiled_ssdlite_meets_its_rewrites_at_one_graph_break_each_proven(monkeypatch) -> None:
    """Under ``torch.compile(backend="launchless")`` Dynamo meets the rewrites: SSDlite's post-processing runs
    eagerly at one graph break (the library's breaks the graph at every class's mask), proven on its first call;
    fresh images, both grad modes, every detection the model's own; the model called as itself, outside the
    compiled code, still runs the library's functions."""
    from launchless.compiler.backend import make_backend

    ssd, nms = REWRITES["torchvision SSD.postprocess_detections"], REWRITES["torchvision batched_nms per class"]
    for rewrite in (ssd, nms):
        monkeypatch.setattr(rewrite, "states", {})
        monkeypatch.setattr(rewrite, "reasons", {})
        monkeypatch.setattr(rewrite, "calls", 0)
        monkeypatch.setattr(rewrite, "under_compile", None)
    torch.manual_seed(0)
    model = torchvision.models.detection.ssdlite320_mobilenet_v3_large(
        weights=None, weights_backbone=None, num_classes=8, score_thresh=0.0
    ).eval()
    images = [torch.rand(3, 320, 320, generator=torch.Generator().manual_seed(7))]
    without, with_rewrites = (_graphs_handed_over(model, images, rewrites=r) for r in (False, True))
    assert with_rewrites < without, (with_rewrites, without)
    monkeypatch.setattr(ssd, "calls", 0)
    compiled = torch.compile(model, backend=make_backend(lambda gm, example_inputs: gm.forward))
    try:
        images = _the_models_detections_on_fresh_images(model, compiled, size=(320, 320), found="boxes")
    finally:
        torch._dynamo.reset()
    assert ssd.states == {("cpu", torch.float32): RewriteState.PROVEN} and ssd.calls == 4, (ssd.states, ssd.calls)
    assert nms.states == {("cpu", torch.float32): RewriteState.PROVEN}, nms.states
    with torch.no_grad(), _MaskIndexing() as library:
        model(images)
    assert ssd.calls == 4 and library.waits >= 2 * 7, (ssd.calls, library.waits)


def _dense_head_outputs(seed: int, *, centerness: bool) -> tuple[dict, list, list]:
    """A RetinaNet's or FCOS's head outputs over five levels for two images, as ``postprocess_detections`` gets
    them: one level with no score above the threshold, one with every score above it, some scores the same."""
    g = torch.Generator().manual_seed(seed)
    sizes, classes = [48, 24, 12, 6, 3], 5
    logits = [torch.randn(2, n, classes, generator=g) * 3 for n in sizes]
    logits[1][:] = -12.0  # nothing above the threshold
    logits[3][:] = 8.0  # everything above it
    logits[0][:, :4] = logits[0][:, 4:8]  # ties
    outputs = {"cls_logits": logits, "bbox_regression": [torch.randn(2, n, 4, generator=g) for n in sizes]}
    if centerness:
        outputs["bbox_ctrness"] = [torch.randn(2, n, 1, generator=g) for n in sizes]
    corners = [torch.rand(n, 2, generator=g) * 200 for n in sizes]
    level_anchors = [
        torch.cat([c, c + 8 + torch.rand(n, 2, generator=g) * 60], dim=1) for c, n in zip(corners, sizes, strict=True)
    ]
    return outputs, [level_anchors, level_anchors], [(240, 260), (220, 250)]


@pytest.mark.parametrize("kind", ["retinanet", "fcos"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dense_detectors_keep_the_librarys_detections_finding_every_levels_scores_at_once(kind: str, seed: int) -> None:
    """RetinaNet's and FCOS's post-processing mask each level's scores and find where they are (two waits a level):
    the rewrite finds all levels' at once, and every box, score and label is the library's, bit for bit."""
    from torchvision.models.detection import _utils as det_utils
    from torchvision.models.detection import fcos, retinanet

    centerness = kind == "fcos"
    library = (fcos.FCOS if centerness else retinanet.RetinaNet).postprocess_detections
    library = getattr(library, "__wrapped__", library)  # torchvision's own, where a test installed the rewrite
    rewritten = REWRITES[f"torchvision {'FCOS' if centerness else 'RetinaNet'}.postprocess_detections"].rewritten
    coder = det_utils.BoxLinearCoder(normalize_by_size=True) if centerness else det_utils.BoxCoder((1.0, 1.0, 1.0, 1.0))
    model = type("Detector", (), {})()
    model.score_thresh, model.nms_thresh, model.detections_per_img, model.topk_candidates = 0.05, 0.5, 30, 40
    model.box_coder = coder
    outputs, anchors, shapes = _dense_head_outputs(seed, centerness=centerness)
    with _MaskIndexing() as waits_library:
        want = library(model, outputs, anchors, shapes)
    with _MaskIndexing() as waits_rewritten:
        got = rewritten(model, outputs, anchors, shapes)
    assert all(len(w["boxes"]) > 0 for w in want)
    for w, r in zip(want, got, strict=True):
        assert w.keys() == r.keys() and all(torch.equal(w[k], r[k]) and w[k].dtype == r[k].dtype for k in w), kind
    assert waits_library.waits >= 2 * 2 * 5 and waits_rewritten.waits <= 2 * 2, (
        waits_library.waits,
        waits_rewritten.waits,
    )


@pytest.mark.zoo
def test_explain_names_the_library_functions_a_compiled_model_calls_rewritten(monkeypatch) -> None:
    """``launchless.explain`` says which library functions the model's compiled code called rewritten, and where
    each stands."""
    ssd = REWRITES["torchvision SSD.postprocess_detections"]
    monkeypatch.setattr(ssd, "states", {})
    monkeypatch.setattr(ssd, "under_compile", None)
    torch.manual_seed(0)
    model = torchvision.models.detection.ssdlite320_mobilenet_v3_large(
        weights=None, weights_backbone=None, num_classes=8
    ).eval()
    explanation = launchless.explain(
        model, [torch.rand(3, 320, 320)], calls=2, backend_options={"inner": lambda gm, example_inputs: gm.forward}
    )
    torch._dynamo.reset()
    assert explanation.library_rewrites[ssd.name]["states"] == {"cpu torch.float32": "proven"}, explanation
    assert "torchvision SSD.postprocess_detections rewritten: cpu torch.float32 proven" in str(explanation)
    assert "paste_masks" not in str(explanation)  # SSDlite never calls it


def _pyramid(seed: int, *, boxes: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Four FPN levels of two images and boxes over them of every size (some of no area, one NaN: neither lands on
    a level the library's loop takes, so their rows stay zero)."""
    g = torch.Generator().manual_seed(seed)
    features = [torch.randn(2, 8, 64 // 2**k, 64 // 2**k, generator=g) for k in range(4)]
    per_image = []
    for _ in range(2):
        corners = torch.rand(boxes, 2, generator=g) * 200
        extents = torch.rand(boxes, 2, generator=g) ** 3 * 250
        extents[: boxes // 10] = 0
        b = torch.cat([corners, corners + extents], dim=1)
        if boxes:
            b[-1] = float("nan")
        per_image.append(b)
    return features, per_image


@pytest.mark.parametrize("boxes", [0, 1, 60])
def test_multiscale_roi_align_pools_the_librarys_values_finding_every_levels_boxes_at_once(boxes: int) -> None:
    """Every R-CNN's RoIAlign over the FPN levels finds each level's boxes with a torch.where (a wait a level, for
    each head): the rewrite sorts them once, and pools the library's values bit for bit."""
    from torchvision.ops import poolers

    library = getattr(poolers._multiscale_roi_align, "__wrapped__", poolers._multiscale_roi_align)
    for seed in range(3):
        features, per_image = _pyramid(seed, boxes=boxes)
        scales, mapper = poolers._setup_scales(features, [(256, 256), (256, 256)], 224, 4)  # the pooler's defaults
        arguments = (features, per_image, (7, 7), 2, scales, mapper)
        with _MaskIndexing() as waits_library:
            want = library(*arguments)
        with _MaskIndexing() as waits_rewritten:
            got = library_rewrites._multiscale_roi_align(*arguments)
        assert torch.equal(got, want) and got.dtype == want.dtype, seed
        assert waits_library.waits == 4 and waits_rewritten.waits == 0, (waits_library.waits, waits_rewritten.waits)


@pytest.mark.zoo
@pytest.mark.parametrize(
    ("builder", "settings", "name"),
    [  # random weights score below the default thresholds: every box kept
        ("retinanet_resnet50_fpn", {"score_thresh": 0.0}, "torchvision RetinaNet.postprocess_detections"),
        ("fasterrcnn_resnet50_fpn", {"box_score_thresh": 0.0}, "torchvision multi-scale RoIAlign"),
    ],
)
def test_a_wrapped_detector_returns_the_models_detections_with_its_rewrite_proven(
    builder: str, settings: dict, name: str, monkeypatch
) -> None:
    """Fresh images each call, both grad modes: the wrapped detector's detections are the model's, its
    post-processing (RetinaNet) or multi-scale RoIAlign (Faster R-CNN) rewritten and proven."""
    rewrite = REWRITES[name]
    monkeypatch.setattr(rewrite, "states", {})
    monkeypatch.setattr(rewrite, "calls", 0)
    torch.manual_seed(0)
    model = getattr(torchvision.models.detection, builder)(
        weights=None, weights_backbone=None, min_size=160, max_size=224, **settings
    ).eval()
    wrapped = launchless.wrap(model)
    _the_models_detections_on_fresh_images(model, wrapped, size=(150, 200), found="boxes")
    info = wrapped.graph_info()["library_rewrites"][name]
    assert info["states"] == {"cpu torch.float32": "proven"} and info["calls"] == 4, info
