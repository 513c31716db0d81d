"""Detectors whose post-processing waits for the GPU per detection or per class, eager against ``launchless.wrap``
("auto") on the GPU, where the wrapped call runs torchvision's functions rewritten to wait once
(``core/library_rewrites``): Mask R-CNN's mask paste, Keypoint R-CNN's heatmap sizes, SSD's and SSDlite's
per-class score masks and batched_nms, RetinaNet's and FCOS's per-level score masks.

    PYTHONPATH=. python benchmarks/detector_host_reads.py OUT_JSON

Random weights, batch 1, six fresh real-looking 320x416 images (the cuda tests' ``real_looking_image``), both grad
modes: every wrapped call's result compared bit for bit with eager's on the same image, then the wall time of a call
waited for (synchronized before and after), median of 12 calls, eager and wrapped interleaved twice. The markdown and
chart of ``benchmarks/results/*-maskrcnn-paste.*`` were made from what it wrote for the Mask R-CNNs.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torchvision

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_cuda_fresh_inputs import real_looking_image

import launchless as ll
from launchless.core.verify import identical

MODELS = (
    "maskrcnn_resnet50_fpn",
    "maskrcnn_resnet50_fpn_v2",
    "keypointrcnn_resnet50_fpn",
    "ssdlite320_mobilenet_v3_large",
    "ssd300_vgg16",
    "retinanet_resnet50_fpn",
    "fcos_resnet50_fpn",
)
CALLS = 12


def waited_ms(fn, images: list[torch.Tensor]) -> float:
    times = []
    for call in range(CALLS):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn([images[call % len(images)]])
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main(out: str) -> None:
    record = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "torchvision": torchvision.__version__}
    for name in MODELS:
        torch.manual_seed(0)
        model = getattr(torchvision.models.detection, name)(weights=None, weights_backbone=None).cuda().eval()
        wrapped = ll.wrap(model)
        generator = torch.Generator().manual_seed(1)
        images = [real_looking_image(generator) for _ in range(6)]
        for grad_mode in (torch.no_grad, torch.inference_mode):
            with grad_mode():
                same = all(identical(wrapped([image]), model([image])) for image in images)
                detections = [len(model([image])[0]["boxes"]) for image in images[:3]]
                eager = [waited_ms(model, images), None]
                launchless = [waited_ms(wrapped, images), None]
                eager[1], launchless[1] = waited_ms(model, images), waited_ms(wrapped, images)
            record[f"{name}/{grad_mode.__name__}"] = {
                "identical": same,
                "detections": detections,
                "eager_ms": eager,
                "launchless_ms": launchless,
                "library_rewrites": wrapped.graph_info()["library_rewrites"],
            }
            print(name, grad_mode.__name__, record[f"{name}/{grad_mode.__name__}"], flush=True)
    Path(out).write_text(json.dumps(record, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
