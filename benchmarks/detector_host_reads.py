"""Detectors whose post-processing waits for the GPU per detection or per class, eager against ``launchless.wrap``
("auto") on the GPU, where the wrapped call runs torchvision's functions rewritten to wait once
(``core/library_rewrites``): Mask R-CNN's mask paste, Keypoint R-CNN's heatmap sizes, SSD's and SSDlite's
per-class score masks and batched_nms, RetinaNet's and FCOS's per-level score masks.

    PYTHONPATH=. python benchmarks/detector_host_reads.py OUT_JSON           # measure; OUT.md and OUT.png beside
    python benchmarks/detector_host_reads.py --render OUT_JSON               # the markdown and chart again

Random weights, batch 1, six fresh real-looking 320x416 images (the cuda tests' ``real_looking_image``), both grad
modes: every wrapped call's result compared bit for bit with eager's on the same image, then the wall time of a call
waited for (synchronized before and after), median of 12 calls, eager and wrapped interleaved twice. RetinaNet and
FCOS score every anchor below their default threshold with random weights (no detection, nothing to post-process):
they run with a threshold of 0, as a trained model that finds objects would post-process its candidates.
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
# with random weights RetinaNet and FCOS score every anchor below their default threshold: nothing to post-process
OPTIONS = {"retinanet_resnet50_fpn": {"score_thresh": 0.0}, "fcos_resnet50_fpn": {"score_thresh": 0.0}}
METHOD = (
    "wall time of a call waited for (torch.cuda.synchronize before and after), median of 12 calls over 6 fresh "
    "real-looking 320x416 images, eager and launchless.wrap (auto) interleaved twice (eager, wrap, eager, wrap), "
    "random weights, batch 1"
)


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
    record: dict = {
        "date": time.strftime("%Y-%m-%d"),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "method": METHOD,
        "options": OPTIONS,
    }
    for name in MODELS:
        torch.manual_seed(0)
        builder = getattr(torchvision.models.detection, name)
        model = builder(weights=None, weights_backbone=None, **OPTIONS.get(name, {})).cuda().eval()
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
    render(Path(out))


def render(path: Path) -> None:
    """``path``'s markdown table and chart beside it (same name, .md and .png)."""
    record = json.loads(path.read_text())
    rows = [(key.split("/")[0], key.split("/")[1], row) for key, row in record.items() if "/" in key]
    lines = [
        "# Detectors whose post-processing waits for the GPU, read once",
        "",
        f"{record.get('date', '')} · GPU {record['gpu']} · torch {record['torch']} · "
        f"torchvision {record['torchvision']}",
        "",
        '`launchless.wrap(model)` ("auto") against the model itself. Inside the wrapped call torchvision\'s functions '
        "that wait for the GPU once per detection, class or level run rewritten to wait once, each proven "
        "bit-identical to torchvision's on its first call on the GPU. Method: "
        + record.get("method", METHOD)
        + (f"; options {record['options']}" if record.get("options") else "")
        + ".",
        "",
        "| workload | grad mode | eager ms | launchless ms | speed-up | identical (6 fresh images) | detections "
        "(3 images) | rewrites proven (calls in the row) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    counted: dict[str, int] = {}  # a rewrite's calls are the process's: each row's are those since the row before
    for name, mode, row in rows:
        eager, fast = statistics.mean(row["eager_ms"]), statistics.mean(row["launchless_ms"])
        called = {}
        for rewrite, info in row["library_rewrites"].items():
            called[rewrite] = info["calls"] - counted.get(rewrite, 0)
            counted[rewrite] = info["calls"]
        proven = ", ".join(f"{rewrite.removeprefix('torchvision ')} ({n})" for rewrite, n in called.items() if n)
        lines.append(
            f"| `tv:{name}` | {mode} | {eager:.2f} | {fast:.2f} | {eager / fast:.2f}x | "
            f"{'yes' if row['identical'] else '**no**'} | {row['detections']} | {proven or 'none'} |"
        )
    lines += ["", f"![eager against launchless per model and grad mode]({path.with_suffix('.png').name})", ""]
    path.with_suffix(".md").write_text("\n".join(lines))

    from launchless.apps.bench.charts import BarPanel, bar_panels, chart_title

    times = {"eager": [statistics.mean(row["eager_ms"]) for *_, row in rows]}
    times["launchless.wrap (auto)"] = [statistics.mean(row["launchless_ms"]) for *_, row in rows]
    panel = BarPanel(
        title="ms per call, waited for (lower is faster)",
        ylabel="ms",
        groups=[f"{name}\n{mode}" for name, mode, _ in rows],
        modes=list(times),
        value=lambda group, mode: times[mode][group],
    )
    title = chart_title("Detectors whose post-processing waits for the GPU, batch 1", record)
    bar_panels(path.with_suffix(".png"), [panel], title=title, group_width=0.9)


if __name__ == "__main__":
    if sys.argv[1] == "--render":
        render(Path(sys.argv[2]))
    else:
        main(sys.argv[1])
