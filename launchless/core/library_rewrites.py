"""Library functions that stop at the host once per element, rewritten to stop once per call.

A graph replays GPU work; it cannot remove a forward's host work. Some library functions spend nearly all of a
model's time there: torchvision's ``paste_masks_in_image`` (every Mask R-CNN's last step) reads each detection's box
from the GPU with a dozen ``int(tensor)`` and ``max(tensor, 0)`` -- each a wait for the GPU -- before launching three
kernels for it; at a hundred detections that is some 1300 waits, most of the model's time, and splits every graph
around it (under ``torch.compile`` too: each read is a graph break). The rewrite reads all the boxes in one copy and
launches the same kernels with the same arguments: the same values by construction, without the waits. SSD and
SSDlite mask each class's scores in turn (a wait per class and tensor: some 180 for COCO's classes), and
``batched_nms`` over many boxes finds each class's with a ``torch.where`` (a wait per class): both find them for
every class at once. Keypoint R-CNN reads two heatmap sizes per detection with ``.item()``: read at once too.
RetinaNet and FCOS mask each feature level's scores and find where they are (two waits a level, ten over five
levels): every level's are found by one ``nonzero``. Every R-CNN's multi-scale RoIAlign finds each level's boxes
with a ``torch.where`` (a wait per level, for the box head and again for the mask or keypoint head): one sort.

"By construction" is still proven: the first call of a rewrite in a process (per device type and dtype) runs the
library's own function as well and compares the two bit for bit; a difference (a library release that changed the
function) or an error drops the rewrite for good, with one WARNING, and the library's result is the call's. A
rewrite runs only inside a call of a wrapped model (``active()``, a context variable, so other threads and code
outside launchless call the library's function untouched), never while a stream captures (the library's function
meets the capture as it would; a rewrite's proof is never taken inside one); ``install`` puts the dispatching
function in place of the library's where the library's modules are imported, and only where the function is the one
it rewrites (its signature unchanged).

Under ``torch.compile`` the rewrite is what Dynamo meets: the launchless backend installs the rewrites of the library
functions the compiled code's modules call (``install_for``, from the modules of each FX graph it is handed, before
Dynamo traces the code after that graph's break) and lets code that Dynamo traces call them (``under_compile``): the
call becomes one graph break, where the rewrite runs eagerly, proven as above -- where the library's function breaks
the graph at each of its waits. Once installed so, that holds for every ``torch.compile`` in the process, whichever
backend (the values are the library's, proven); ``torch.export`` and TorchScript keep the library's function.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import inspect
import logging
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils import _pytree as pytree

from ..errors import one_line
from .status import Label
from .verify import identical

logger = logging.getLogger("launchless")

_ACTIVE: contextvars.ContextVar[bool] = contextvars.ContextVar("launchless_library_rewrites", default=False)


class RewriteState(Label):
    """Where a rewrite stands in this process, per device type and dtype it ran on."""

    UNPROVEN = "unproven"  # not run yet: its first call runs the library's function too, and compares
    PROVEN = "proven"  # bit-identical to the library's function on its first call
    DROPPED = "dropped"  # differed or raised: the library's function runs from then on


@dataclasses.dataclass
class Rewrite:
    """One library function, where its callers find it, and what replaces it inside wrapped calls."""

    name: str  # as the log and graph_info() say it: ``torchvision paste_masks_in_image``
    module: str  # the module whose attribute the model's code calls
    attribute: str  # dotted for a method: ``SSD.postprocess_detections``
    parameters: tuple[str, ...]  # the library function's parameters: another signature is another function
    rewritten: Callable[..., Any]
    callers: tuple[str, ...]  # modules of the classes that call it: a model with one of them as a submodule uses it
    states: dict[tuple[str, torch.dtype], RewriteState] = dataclasses.field(default_factory=dict)
    reasons: dict[tuple[str, torch.dtype], str] = dataclasses.field(default_factory=dict)
    calls: int = 0  # calls that ran the rewrite
    under_compile: Callable[..., Any] | None = None  # set by the compiler backend: code Dynamo traces runs the rewrite


def _paste_masks_in_image(masks: torch.Tensor, boxes: torch.Tensor, img_shape: Any, padding: int = 1) -> torch.Tensor:
    """torchvision's ``paste_masks_in_image`` with the boxes read in one copy: per detection the same interpolation,
    the same zero image and the same slice copy as ``paste_mask_in_image`` (written straight into the stacked
    result, which ``torch.stack`` would copy them into), each bound computed from the same integers the library's
    ``int(tensor)``, ``max`` and ``min`` reach one wait at a time."""
    from torchvision.models.detection import roi_heads

    padded, scale = roi_heads.expand_masks(masks, padding=padding)
    boxes = roi_heads.expand_boxes(boxes, scale).to(dtype=torch.int64)
    im_h, im_w = img_shape
    out = padded.new_zeros((len(padded), 1, im_h, im_w))
    for i, (x0, y0, x1, y1) in enumerate(boxes.tolist()):  # the one wait for the GPU
        w, h = max(x1 - x0 + 1, 1), max(y1 - y0 + 1, 1)
        mask = F.interpolate(padded[i][0].expand((1, 1, -1, -1)), size=(h, w), mode="bilinear", align_corners=False)
        left, right, top, bottom = max(x0, 0), min(x1 + 1, im_w), max(y0, 0), min(y1 + 1, im_h)
        out[i, 0, top:bottom, left:right] = mask[0][0][top - y0 : bottom - y0, left - x0 : right - x0]
    return out


def _ssd_postprocess_detections(
    self: Any, head_outputs: dict[str, torch.Tensor], image_anchors: list[torch.Tensor], image_shapes: list[Any]
) -> list[dict[str, torch.Tensor]]:
    """torchvision's ``SSD.postprocess_detections`` with the boxes above the score threshold found for every class
    at once: its loop over the classes masks each class's scores (``score[score > threshold]``, a wait for the GPU
    per class and per tensor so indexed: some 180 for COCO's 91 classes); here one ``nonzero`` over all classes, in
    the same order, and the counts per class in one copy, then per class the same gathers, ``topk`` and labels on
    the same values."""
    from torchvision.models.detection import _utils as det_utils
    from torchvision.ops import boxes as box_ops

    bbox_regression = head_outputs["bbox_regression"]
    pred_scores = F.softmax(head_outputs["cls_logits"], dim=-1)
    num_classes = pred_scores.size(-1)
    device = pred_scores.device
    detections: list[dict[str, torch.Tensor]] = []
    for boxes, scores, anchors, image_shape in zip(
        bbox_regression,
        pred_scores,
        image_anchors,
        image_shapes,
        strict=False,  # as the library zips them
    ):
        boxes = self.box_coder.decode_single(boxes, anchors)
        boxes = box_ops.clip_boxes_to_image(boxes, image_shape)
        above = (scores[:, 1:] > self.score_thresh).t()  # per class (but the background), per anchor
        found = above.nonzero()[:, 1]  # the anchors above, class by class, each class's in ascending order
        counts = above.sum(dim=1).tolist()  # the one copy: how many of each class
        image_boxes, image_scores, image_labels = [], [], []
        start = 0
        for label, count in zip(range(1, num_classes), counts, strict=True):
            keep_idxs = found[start : start + count]
            start += count
            score = scores[:, label][keep_idxs]
            box = boxes[keep_idxs]
            num_topk = det_utils._topk_min(score, self.topk_candidates, 0)
            score, idxs = score.topk(num_topk)
            box = box[idxs]
            image_boxes.append(box)
            image_scores.append(score)
            image_labels.append(torch.full_like(score, fill_value=label, dtype=torch.int64, device=device))
        all_boxes = torch.cat(image_boxes, dim=0)
        all_scores = torch.cat(image_scores, dim=0)
        all_labels = torch.cat(image_labels, dim=0)
        keep = box_ops.batched_nms(all_boxes, all_scores, all_labels, self.nms_thresh)
        keep = keep[: self.detections_per_img]
        detections.append({"boxes": all_boxes[keep], "scores": all_scores[keep], "labels": all_labels[keep]})
    return detections


def _batched_nms_vanilla(
    boxes: torch.Tensor, scores: torch.Tensor, idxs: torch.Tensor, iou_threshold: float
) -> torch.Tensor:
    """torchvision's per-class ``batched_nms`` (taken for many boxes) with each class's boxes found in one stable
    sort instead of a ``torch.where(idxs == class)`` -- a wait for the GPU -- per class: the same indices in the
    same ascending order, then the same ``nms`` per class (which reads its own result on the host)."""
    from torchvision.ops import boxes as box_ops

    keep_mask = torch.zeros_like(scores, dtype=torch.bool)
    _, counts = torch.unique(idxs, return_counts=True)  # sorted, as the library's loop takes the classes
    order = torch.sort(idxs, stable=True).indices  # grouped by class, each class's indices ascending
    start = 0
    for count in counts.tolist():  # the one copy
        curr_indices = order[start : start + count]
        start += count
        curr_keep_indices = box_ops.nms(boxes[curr_indices], scores[curr_indices], iou_threshold)
        keep_mask[curr_indices[curr_keep_indices]] = True
    keep_indices = torch.where(keep_mask)[0]
    return keep_indices[scores[keep_indices].sort(descending=True)[1]]


def _heatmaps_to_keypoints(maps: torch.Tensor, rois: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """torchvision's ``heatmaps_to_keypoints`` (Keypoint R-CNN) with every box's heatmap size read in one copy: the
    library reads two per detection with ``.item()``; then per detection the same interpolation, argmax and writes
    on the same values."""
    offset_x = rois[:, 0]
    offset_y = rois[:, 1]
    widths = (rois[:, 2] - rois[:, 0]).clamp(min=1)
    heights = (rois[:, 3] - rois[:, 1]).clamp(min=1)
    sizes = torch.stack([widths.ceil(), heights.ceil()], dim=1).tolist()  # the one copy
    num_keypoints = maps.shape[1]
    xy_preds = torch.zeros((len(rois), 3, num_keypoints), dtype=torch.float32, device=maps.device)
    end_scores = torch.zeros((len(rois), num_keypoints), dtype=torch.float32, device=maps.device)
    for i, (width_ceil, height_ceil) in enumerate(sizes):
        roi_map_width, roi_map_height = int(width_ceil), int(height_ceil)
        width_correction = widths[i] / roi_map_width
        height_correction = heights[i] / roi_map_height
        roi_map = F.interpolate(
            maps[i][:, None], size=(roi_map_height, roi_map_width), mode="bicubic", align_corners=False
        )[:, 0]
        w = roi_map.shape[2]
        pos = roi_map.reshape(num_keypoints, -1).argmax(dim=1)
        x_int = pos % w
        y_int = torch.div(pos - x_int, w, rounding_mode="floor")
        x = (x_int.float() + 0.5) * width_correction
        y = (y_int.float() + 0.5) * height_correction
        xy_preds[i, 0, :] = x + offset_x[i]
        xy_preds[i, 1, :] = y + offset_y[i]
        xy_preds[i, 2, :] = 1
        end_scores[i, :] = roi_map[torch.arange(num_keypoints, device=roi_map.device), y_int, x_int]
    return xy_preds.permute(0, 2, 1), end_scores


def _above_threshold(levels: list[torch.Tensor], threshold: float) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per level of flattened scores, the scores above ``threshold`` and where they are (``torch.where``'s
    indices, ascending): what the library's ``scores[scores > threshold]`` and ``torch.where(keep)[0]`` give, a
    wait for the GPU each, found for every level by one ``nonzero`` over all of them (the counts per level read
    once the GPU is idle)."""
    masks = [scores > threshold for scores in levels]
    counts = torch.stack([mask.sum() for mask in masks])
    found = torch.cat(masks).nonzero()[:, 0]  # the one wait: every level's positions, level by level, ascending
    kept, start, offset = [], 0, 0
    for scores, count in zip(levels, counts.tolist(), strict=True):
        where = found[start : start + count] - offset
        kept.append((scores[where], where))
        start, offset = start + count, offset + scores.numel()
    return kept


def _dense_postprocess_detections(
    model: Any,
    head_outputs: dict[str, list[torch.Tensor]],
    anchors: list[list[torch.Tensor]],
    image_shapes: list[tuple[int, int]],
    *,
    centerness: bool,
) -> list[dict[str, torch.Tensor]]:
    """torchvision's ``RetinaNet.postprocess_detections`` (``centerness`` False) and ``FCOS``'s (True: scores the
    square root of class and centerness probabilities, boxes decoded by ``decode``) with every level's scores above
    the threshold found at once (``_above_threshold``: one wait where the library waits twice per level); then per
    level the same ``topk``, labels, box decoding and clipping, and the same ``batched_nms``, on the same values."""
    from torchvision.models.detection import _utils as det_utils
    from torchvision.ops import boxes as box_ops

    detections: list[dict[str, torch.Tensor]] = []
    for index, image_shape in enumerate(image_shapes):
        regressions = [br[index] for br in head_outputs["bbox_regression"]]
        logits = [cl[index] for cl in head_outputs["cls_logits"]]
        if centerness:
            ctrness = [bc[index] for bc in head_outputs["bbox_ctrness"]]
            levels = [
                torch.sqrt(torch.sigmoid(lg) * torch.sigmoid(c)).flatten()
                for lg, c in zip(logits, ctrness, strict=False)
            ]
        else:
            levels = [torch.sigmoid(lg).flatten() for lg in logits]
        image_boxes, image_scores, image_labels = [], [], []
        for (scores, where), regression, logit, level_anchors in zip(
            _above_threshold(levels, model.score_thresh), regressions, logits, anchors[index], strict=False
        ):
            num_classes = logit.shape[-1]
            num_topk = det_utils._topk_min(where, model.topk_candidates, 0)
            scores, idxs = scores.topk(num_topk)
            where = where[idxs]
            anchor_idxs = torch.div(where, num_classes, rounding_mode="floor")
            labels = where % num_classes
            decode = model.box_coder.decode if centerness else model.box_coder.decode_single
            boxes = decode(regression[anchor_idxs], level_anchors[anchor_idxs])
            image_boxes.append(box_ops.clip_boxes_to_image(boxes, image_shape))
            image_scores.append(scores)
            image_labels.append(labels)
        all_boxes = torch.cat(image_boxes, dim=0)
        all_scores = torch.cat(image_scores, dim=0)
        all_labels = torch.cat(image_labels, dim=0)
        keep = box_ops.batched_nms(all_boxes, all_scores, all_labels, model.nms_thresh)
        keep = keep[: model.detections_per_img]
        detections.append({"boxes": all_boxes[keep], "scores": all_scores[keep], "labels": all_labels[keep]})
    return detections


def _retinanet_postprocess_detections(
    self: Any, head_outputs: dict[str, list[torch.Tensor]], anchors: list[list[torch.Tensor]], image_shapes: list[Any]
) -> list[dict[str, torch.Tensor]]:
    return _dense_postprocess_detections(self, head_outputs, anchors, image_shapes, centerness=False)


def _fcos_postprocess_detections(
    self: Any, head_outputs: dict[str, list[torch.Tensor]], anchors: list[list[torch.Tensor]], image_shapes: list[Any]
) -> list[dict[str, torch.Tensor]]:
    return _dense_postprocess_detections(self, head_outputs, anchors, image_shapes, centerness=True)


def _multiscale_roi_align(
    x_filtered: list[torch.Tensor],
    boxes: list[torch.Tensor],
    output_size: Sequence[int],
    sampling_ratio: int,
    scales: list[float] | None,
    mapper: Any,
) -> torch.Tensor:
    """torchvision's ``_multiscale_roi_align`` (every R-CNN's box, mask and keypoint pooling) with each feature
    level's boxes found in one stable sort instead of a ``torch.where(levels == level)`` -- a wait for the GPU -- per
    level: the same indices in the same ascending order (a level outside the pyramid, from a box of no real area,
    sorts after all of them, as the library's loop never takes it), then the same ``roi_align`` per level and the
    same writes into the zeroed result."""
    from torchvision.ops import poolers

    if scales is None or mapper is None:
        raise ValueError("scales and mapper should not be None")
    num_levels = len(x_filtered)
    rois = poolers._convert_to_roi_format(boxes)
    if num_levels == 1:
        return poolers.roi_align(
            x_filtered[0], rois, output_size=output_size, spatial_scale=scales[0], sampling_ratio=sampling_ratio
        )
    levels = mapper(boxes)
    inside = (levels >= 0) & (levels < num_levels)
    key = torch.where(inside, levels, torch.full_like(levels, num_levels))
    order = torch.sort(key, stable=True).indices  # level by level, each level's boxes ascending
    pyramid = torch.arange(num_levels, device=key.device)
    counts = (key.unsqueeze(0) == pyramid.unsqueeze(1)).sum(dim=1).tolist()  # the one copy (bincount waits twice)
    dtype, device = x_filtered[0].dtype, x_filtered[0].device
    result = torch.zeros((len(rois), x_filtered[0].shape[1], *output_size), dtype=dtype, device=device)
    start = 0
    for per_level_feature, scale, count in zip(x_filtered, scales, counts, strict=False):
        idx_in_level = order[start : start + count]
        start += count
        result_idx_in_level = poolers.roi_align(
            per_level_feature,
            rois[idx_in_level],
            output_size=output_size,
            spatial_scale=scale,
            sampling_ratio=sampling_ratio,
        )
        result[idx_in_level] = result_idx_in_level.to(result.dtype)
    return result


def _tracing() -> bool:
    """Whether TorchScript or ONNX export traces the call (torchvision then takes its traceable path)."""
    return bool(torch.jit.is_scripting() or torch._C._get_tracing_state())


REWRITES: tuple[Rewrite, ...] = (
    Rewrite(
        name="torchvision paste_masks_in_image",
        module="torchvision.models.detection.transform",
        attribute="paste_masks_in_image",
        parameters=("masks", "boxes", "img_shape", "padding"),
        rewritten=_paste_masks_in_image,
        callers=(  # GeneralizedRCNNTransform.postprocess; under torch.compile the mask head may be all it sees
            "torchvision.models.detection.transform",
            "torchvision.models.detection.mask_rcnn",
        ),
    ),
    Rewrite(
        name="torchvision heatmaps_to_keypoints",
        module="torchvision.models.detection.roi_heads",
        attribute="heatmaps_to_keypoints",
        parameters=("maps", "rois"),
        rewritten=_heatmaps_to_keypoints,
        callers=(  # RoIHeads' keypoint branch; under torch.compile its keypoint head may be all it sees
            "torchvision.models.detection.roi_heads",
            "torchvision.models.detection.keypoint_rcnn",
        ),
    ),
    Rewrite(
        name="torchvision SSD.postprocess_detections",
        module="torchvision.models.detection.ssd",
        attribute="SSD.postprocess_detections",
        parameters=("self", "head_outputs", "image_anchors", "image_shapes"),
        rewritten=_ssd_postprocess_detections,
        callers=("torchvision.models.detection.ssd", "torchvision.models.detection.ssdlite"),  # SSD and SSDlite
    ),
    Rewrite(
        name="torchvision RetinaNet.postprocess_detections",
        module="torchvision.models.detection.retinanet",
        attribute="RetinaNet.postprocess_detections",
        parameters=("self", "head_outputs", "anchors", "image_shapes"),
        rewritten=_retinanet_postprocess_detections,
        callers=("torchvision.models.detection.retinanet",),  # RetinaNet and its heads
    ),
    Rewrite(
        name="torchvision FCOS.postprocess_detections",
        module="torchvision.models.detection.fcos",
        attribute="FCOS.postprocess_detections",
        parameters=("self", "head_outputs", "anchors", "image_shapes"),
        rewritten=_fcos_postprocess_detections,
        callers=("torchvision.models.detection.fcos",),  # FCOS and its heads
    ),
    Rewrite(
        name="torchvision multi-scale RoIAlign",
        module="torchvision.ops.poolers",
        attribute="_multiscale_roi_align",
        parameters=("x_filtered", "boxes", "output_size", "sampling_ratio", "scales", "mapper"),
        rewritten=_multiscale_roi_align,
        callers=(  # MultiScaleRoIAlign, every R-CNN's; under torch.compile its forward holds no operation of its
            # own, and the region proposals, traced before it, name the model
            "torchvision.ops.poolers",
            *(f"torchvision.models.detection.{name}" for name in ("rpn", "faster_rcnn", "mask_rcnn", "keypoint_rcnn")),
        ),
    ),
    Rewrite(
        name="torchvision batched_nms per class",
        module="torchvision.ops.boxes",
        attribute="_batched_nms_vanilla",
        parameters=("boxes", "scores", "idxs", "iou_threshold"),
        rewritten=_batched_nms_vanilla,
        callers=tuple(  # the detectors whose post-processing calls batched_nms
            f"torchvision.models.detection.{name}"
            for name in ("ssd", "ssdlite", "roi_heads", "rpn", "retinanet", "fcos")
        ),
    ),
)
_LOCK = threading.Lock()


@contextlib.contextmanager
def active() -> Iterator[None]:
    """The rewrites in force for the calls made inside (a wrapped model's forward)."""
    token = _ACTIVE.set(True)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def install(model: torch.nn.Module) -> list[Rewrite]:
    """The rewrites of the library functions ``model`` calls -- a submodule of the class whose module calls the
    function (Mask R-CNN's ``GeneralizedRCNNTransform``) -- each put in place of the library function where the
    function there is the one rewritten (idempotent)."""
    return install_for({type(m).__module__ for m in model.modules()})


def install_for(modules: set[str], *, compiled: bool = False) -> list[Rewrite]:
    """The rewrites of the library functions that classes of ``modules`` (module names) call, installed as
    ``install`` does; ``compiled``: code that ``torch.compile`` traces runs them too (the compiler backend's)."""
    installed = []
    with _LOCK:
        for rewrite in REWRITES:
            if not modules.intersection(rewrite.callers):
                continue
            *path, name = rewrite.attribute.split(".")
            owner = functools.reduce(lambda o, part: getattr(o, part, None), path, sys.modules.get(rewrite.module))
            current = getattr(owner, name, None) if owner is not None else None
            if current is None:
                continue
            if getattr(current, "__launchless_rewrite__", None) is not rewrite:
                try:
                    parameters = tuple(inspect.signature(current).parameters)
                except (TypeError, ValueError):
                    continue
                if parameters != rewrite.parameters:
                    continue  # another function than the one rewritten: left alone
                current = _dispatching(rewrite, current)
                setattr(owner, name, current)
            if compiled and rewrite.under_compile is None:
                rewrite.under_compile = _eager_under_compile(current)
                logger.info(
                    "launchless: inside code torch.compile traces, %s waits for the GPU once per call (rewritten: "
                    "one graph break where the library's function breaks the graph at each wait; proven bit for bit "
                    "on its first call)",
                    rewrite.name,
                )
            installed.append(rewrite)
    return installed


def _eager_under_compile(dispatch: Callable[..., Any]) -> Callable[..., Any]:
    """``dispatch`` as code compiled by ``torch.compile`` calls it: never traced (one graph break), run eagerly
    with the rewrites in force."""

    def run(*args: Any, **kwargs: Any) -> Any:
        with active():
            return dispatch(*args, **kwargs)

    return torch.compiler.disable(run)


def _compiling() -> bool:
    """Whether Dynamo traces the call for ``torch.compile`` (not for ``torch.export``, which takes no graph
    break: the library's function, as traced).

    The flag ``torch.export`` sets is read, not ``torch.compiler.is_exporting()``: Dynamo up to torch 2.13 folds
    that call to True while it traces for ``torch.compile`` too, which would keep every compiled model off the
    rewrites."""
    flag = getattr(torch.compiler, "_is_exporting_flag", None)
    exporting = torch.compiler.is_exporting() if flag is None else flag
    return torch.compiler.is_compiling() and not exporting


def _dispatching(rewrite: Rewrite, original: Callable[..., Any]) -> Callable[..., Any]:
    """The library function inside wrapped calls rewritten (proven on its first call), elsewhere itself."""

    def dispatch(*args: Any, **kwargs: Any) -> Any:
        if _compiling():  # read as constants while Dynamo traces: the rewrite at one graph break, or the library's
            under_compile = rewrite.under_compile
            return under_compile(*args, **kwargs) if under_compile is not None else original(*args, **kwargs)
        if not _ACTIVE.get() or _tracing():
            return original(*args, **kwargs)
        tensor = next((t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)), None)
        if tensor is not None and tensor.is_cuda and torch.cuda.is_current_stream_capturing():
            return original(*args, **kwargs)  # while a stream captures, what blocks the capture is the library's
        key = (tensor.device.type, tensor.dtype) if tensor is not None else ("", torch.float32)
        state = rewrite.states.get(key, RewriteState.UNPROVEN)
        if state is RewriteState.PROVEN:
            rewrite.calls += 1
            return rewrite.rewritten(*args, **kwargs)
        if state is RewriteState.DROPPED:
            return original(*args, **kwargs)
        want = original(*args, **kwargs)
        try:
            got = rewrite.rewritten(*args, **kwargs)
            same = identical(got, want)
            why = "" if same else "its result differs from the library's"
        except Exception as exc:  # whatever the rewrite raises, the library's result stands
            why = f"it raised {one_line(exc)}"
        if why:
            rewrite.states[key], rewrite.reasons[key] = RewriteState.DROPPED, why
            logger.warning(
                "launchless: the rewrite of %s (one read of the GPU per call instead of one per element) is dropped "
                "on %s %s: %s; the library's own function runs from now on",
                rewrite.name,
                key[0],
                key[1],
                why,
            )
            return want
        rewrite.states[key] = RewriteState.PROVEN
        rewrite.calls += 1
        return want

    dispatch.__launchless_rewrite__ = rewrite  # type: ignore[attr-defined]
    dispatch.__wrapped__ = original  # type: ignore[attr-defined]
    dispatch.__name__ = getattr(original, "__name__", rewrite.attribute)
    dispatch.__doc__ = getattr(original, "__doc__", None)
    return dispatch


def info(rewrites: list[Rewrite]) -> dict[str, Any]:
    """For ``graph_info()["library_rewrites"]``: per rewrite its state per device type and dtype, calls, reasons."""
    return {
        rewrite.name: {
            "states": {f"{device} {dtype}".strip(): str(state) for (device, dtype), state in rewrite.states.items()},
            "calls": rewrite.calls,
            "dropped_because": {f"{d} {t}".strip(): why for (d, t), why in rewrite.reasons.items()},
        }
        for rewrite in rewrites
    }
