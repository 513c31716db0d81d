"""The benchmark's workloads: one small entry each, on top of ``launchless.apps.zoo``.

A training workload runs a whole step -- forward, cross-entropy on random labels, backward,
optimizer -- on one fixed batch; an inference workload runs the zoo model's forward.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

QUICK = "quick"  # meant to finish within 3 minutes on an H200 with all five modes
STANDARD = "standard"
TRAINING = "training"  # the per-step training comparison: SGD, AdamW, bf16, a scheduled BERT fine-tune
COMPILER = "compiler"  # torch.compile backends: the inference workloads plus models blocked by host copies
KERNELS = "kernels"  # compiled kernels without the compile wait: every mode, and when the compiled graph swaps in
# training tasks on a zoo model's own call, as PyTorch's benchmark runners train it (``training.RunnersLoss``)
MEAN_OF_OUTPUTS = "mean-of-outputs"  # the mean of its outputs is the loss (TorchBench's models)
MODEL_LOSS = "model-loss"  # random labels for its input ids; the model's own loss (the Hugging Face suite)
GRACE = "grace"  # GraCE's workloads, in the configurations PyTorch's benchmark runners give them
SUITES = (QUICK, STANDARD, TRAINING, COMPILER, KERNELS, GRACE)


@dataclass(frozen=True)
class BenchWorkload:
    name: str
    zoo: str
    kind: str = "inference"  # "inference" | "training"
    batch: int = 1
    optimizer: str = "sgd"  # training only: "sgd" (momentum 0.9) | "adamw" | "adam" (capturable, foreach)
    amp: str | None = None  # training only: "bf16" autocast
    # training only: "image-classification", "sequence-classification" (BERT, seq tokens), MEAN_OF_OUTPUTS, MODEL_LOSS
    task: str = "image-classification"
    seq: int = 128
    suites: tuple[str, ...] = (STANDARD,)
    origin: str = ""  # where the workload and its configuration come from (GraCE's own, or a stand-in and why)
    dtype: str = "float32"  # the parameters' and floating inputs' dtype (a torch dtype's name)

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)


_ALL = [
    BenchWorkload("timm:resnet18", "timm:resnet18", suites=(QUICK, STANDARD, COMPILER, KERNELS)),
    BenchWorkload("timm:mobilenetv3_small_100", "timm:mobilenetv3_small_100", suites=(STANDARD, COMPILER)),
    BenchWorkload("timm:efficientnet_b0", "timm:efficientnet_b0", suites=(STANDARD, COMPILER, KERNELS)),
    BenchWorkload("timm:convnext_atto", "timm:convnext_atto", suites=(STANDARD, COMPILER)),
    BenchWorkload("timm:vit_tiny_patch16_224", "timm:vit_tiny_patch16_224", suites=(STANDARD, COMPILER)),
    BenchWorkload("timm:resnet50@b8", "timm:resnet50", batch=8, suites=(STANDARD, COMPILER)),
    BenchWorkload("hf:bert-base", "hf:bert-base", suites=(STANDARD, COMPILER)),
    BenchWorkload("hf:gpt2", "hf:gpt2", suites=(STANDARD, COMPILER, KERNELS)),
    BenchWorkload("hf:t5-small", "hf:t5-small", suites=(STANDARD, COMPILER, KERNELS)),
    BenchWorkload("hf:xlnet-base", "hf:xlnet-base", suites=(STANDARD, COMPILER)),
    BenchWorkload(
        "tv:fasterrcnn_mobilenet_v3_large_fpn", "tv:fasterrcnn_mobilenet_v3_large_fpn", suites=(STANDARD, COMPILER)
    ),
    BenchWorkload("train:resnet18", "timm:resnet18", kind="training", suites=(QUICK, STANDARD, TRAINING, KERNELS)),
    BenchWorkload("train:mobilenetv3_small_100", "timm:mobilenetv3_small_100", kind="training", suites=()),
    BenchWorkload("train:resnet50@b8", "timm:resnet50", kind="training", batch=8, suites=()),
    BenchWorkload(
        "train:mobilenetv3_small_100-adamw",
        "timm:mobilenetv3_small_100",
        kind="training",
        optimizer="adamw",
        suites=(STANDARD, TRAINING),
    ),
    BenchWorkload(
        "train:resnet50@b8-bf16", "timm:resnet50", kind="training", batch=8, amp="bf16", suites=(STANDARD, TRAINING)
    ),
    BenchWorkload(  # BERT-base fine-tuning: AdamW with a linear-warmup schedule stepped every step
        "train:bert-base@b8",
        "hf:bert-base",
        kind="training",
        batch=8,
        optimizer="adamw",
        task="sequence-classification",
        suites=(TRAINING,),
    ),
]
MASK_RCNN = "tv:maskrcnn_resnet50_fpn"
# the torchvision detectors GraCE's headroom is measured on (batch 1), as the compiler and grace suites name them
DETECTORS = (
    *(f"tv:{name}_resnet50_fpn" for name in ("fasterrcnn", "maskrcnn", "keypointrcnn", "retinanet", "fcos")),
    "tv:ssdlite320_mobilenet_v3_large",
)
_ALL += [  # plain capture fails on a host->device copy in each (DESIGN.md): CGCT's cases
    BenchWorkload(
        name,
        name,
        suites=(COMPILER, GRACE) if name == MASK_RCNN else (COMPILER,),
        origin=(
            "GraCE's own model: TorchBench's vision_maskrcnn is torchvision's maskrcnn_resnet50_fpn at batch 1 "
            "(there on a COCO image with trained weights, here on a random image and weights)"
            if name == MASK_RCNN
            else ""
        ),
    )
    for name in (
        "tv:fasterrcnn_resnet50_fpn",
        "tv:retinanet_resnet50_fpn",
        "tv:fcos_resnet50_fpn",
        "tv:maskrcnn_resnet50_fpn",
        "tv:keypointrcnn_resnet50_fpn",
        "tv:ssdlite320_mobilenet_v3_large",
        "tv:raft_small",
        "hf:mistral-tiny",
        "hf:rt-detr",
        "hf:mask2former",
    )
]


def _grace(name: str, zoo_name: str, *, origin: str, **settings: Any) -> BenchWorkload:
    """A workload of the grace suite, saying where it comes from."""
    return BenchWorkload(name, zoo_name, suites=(GRACE,), origin=origin, **settings)


def _grace_trained(name: str, zoo_name: str, *, batch: int, task: str, origin: str) -> BenchWorkload:
    """A grace training workload, trained as PyTorch's benchmark runners train: Adam, the runners' loss (``task``)."""
    return _grace(name, zoo_name, kind="training", batch=batch, optimizer="adam", task=task, origin=origin)


_ALL += [  # GraCE's evaluation names these; batch sizes and lengths as PyTorch's benchmark runners set them
    _grace(
        "grace:xlnet@b8",
        "grace:xlnet",
        batch=8,
        origin="GraCE's own (XLNet inference): XLNetLMHeadModel's default config, batch 8 of 512 tokens, its "
        "positional encoding built on the host at every call as transformers 4.x built it",
    ),
    _grace(
        "grace:deep-recommender@b256",
        "grace:deep-recommender",
        batch=256,
        origin="GraCE's own (Deep Recommender inference): TorchBench's nvidia_deeprecommender, 197951 items by "
        "512-512-1024, batch 256 (a 203 MB input a call), as model code of our own",
    ),
    _grace(
        "grace:clip@b32",
        "grace:clip",
        batch=32,
        origin="GraCE's own (MMC: TorchBench's torch_multimodal_clip): CLIP ViT-B/32 at batch 32, as model code of "
        "our own with the host tensors torchmultimodal has (its causal mask, the row index picking each text's "
        "last token)",
    ),
    _grace(
        "grace:ocean-equation-of-state",
        "grace:ocean-equation-of-state",
        dtype="float64",
        origin="stand-in for GraCE's EOS (TorchBench's pyhpc_equation_of_state): a float64 polynomial of the same "
        "shape, about 300 elementwise operations over pyhpc's default grid of 204 x 204 x 26 points (one kernel "
        "once compiled, where GraCE turns the graph off)",
    ),
    _grace(
        "grace:ocean-turbulence",
        "grace:ocean-turbulence",
        dtype="float64",
        origin="stand-in for GraCE's TKE (TorchBench's pyhpc_turbulent_kinetic_energy), of the same shape as model "
        "code of our own: an implicit vertical solve looped over 26 depth levels and superbee advection along three "
        "axes on pyhpc's default 204 x 204 x 26 float64 grid, small constants made on the device at every call",
    ),
    _grace(
        "grace:ocean-isoneutral-mixing",
        "grace:ocean-isoneutral-mixing",
        dtype="float64",
        origin="stand-in: TorchBench's pyhpc_isoneutral_mixing (a member of the suite GraCE draws from, of the "
        "EOS and TKE family), of the same shape as model code of our own: tapered density slopes at three faces of "
        "every cell on pyhpc's default 204 x 204 x 26 float64 grid, written into the tensors the call passes in "
        "(an input a graph must not leave stale), constants made on the device at every call, 260 MB of inputs",
    ),
    _grace(
        "grace:dalle2@b1",
        "grace:dalle2",
        batch=1,
        origin="stand-in for GraCE's DALLE2 (TorchBench's DALLE2_pytorch, whose package and CLIP weights the zoo "
        "does not install), as model code of our own in its configuration: CLIP ViT-B/32's text encoder, a 6-layer "
        "diffusion prior of width 512, a two-stage U-Net decoder (width 128 at 128 pixels, 16 at 256), one "
        "sampling step each, batch 1 of 256 token ids -- hundreds of small kernels a call",
    ),
    _grace(
        "grace:speech-transformer@b10",
        "grace:speech-transformer",
        batch=10,
        origin="GraCE's own (Speech Transformer: TorchBench's speech_transformer), as model code of our own: 6+6 "
        "layers of width 512 on a minibatch shaped as TorchBench's first (10 utterances of up to 204 x 320 "
        "features, up to 21 tokens), its per-row padding mask and target unpadding kept; inference (GraCE's mode "
        "is not stated in what we read)",
    ),
    _grace_trained(
        "grace:speech-transformer-train@b10",
        "grace:speech-transformer",
        batch=10,
        task=MEAN_OF_OUTPUTS,
        origin="GraCE's own model, training (a mode we infer): as grace:speech-transformer@b10, trained as "
        "PyTorch's runner trains TorchBench's models (the mean of its outputs, Adam at 0.01)",
    ),
    _grace(
        "grace:blenderbot-small@b64",
        "grace:blenderbot-small",
        batch=64,
        origin="GraCE's own (BlenderbotSmall for conditional generation): the default config, batch 64 of 128 "
        "tokens, inference (which mode GraCE ran it in is not stated in what we read)",
    ),
    _grace_trained(
        "grace:xlnet-train@b8",
        "grace:xlnet",
        batch=8,
        task=MODEL_LOSS,
        origin="GraCE's own model, training (that GraCE trained it is our reading of its XLNet-I's inference "
        "mark): as grace:xlnet@b8, its own loss on random labels, Adam at 0.01 as PyTorch's runners train",
    ),
    _grace_trained(
        "grace:deep-recommender-train@b256",
        "grace:deep-recommender",
        batch=256,
        task=MEAN_OF_OUTPUTS,
        origin="GraCE's own model, training (a variant we infer): as grace:deep-recommender@b256, the mean of its "
        "output the loss and Adam at 0.01, as PyTorch's runners train TorchBench's models",
    ),
    _grace_trained(
        "grace:mt5-train@b16",
        "grace:mt5",
        batch=16,
        task=MODEL_LOSS,
        origin="GraCE's own (MT5 for conditional generation, training): mt5-small's default config, untied "
        "embeddings as transformers 4.x had them, batch 16 of 128 tokens, its own loss, Adam at 0.01",
    ),
    _grace_trained(
        "grace:speaker-encoder-train@b64",
        "grace:speaker-encoder",
        batch=64,
        task=MEAN_OF_OUTPUTS,
        origin="stand-in: TorchBench's tts_angular (a member of the suite GraCE draws from), its speaker encoder "
        "trained on 64 utterances of 50 x 40 mel frames as PyTorch's runner trains it -- which turns graphs off "
        "for it (speed-up 0.05 to 1.05): a graph that may not pay",
    ),
    _grace(
        "grace:lcnet_050@b256",
        "timm:lcnet_050",
        batch=256,
        origin="stand-in: lcnet_050, a member of the TIMM suite GraCE draws from, at that suite's batch 256 of "
        "224-pixel images: narrow channels, short kernels",
    ),
    _grace(
        "grace:mobilebert@b128",
        "grace:mobilebert",
        batch=128,
        origin="stand-in: MobileBertForMaskedLM of the Hugging Face suite GraCE draws from (batch 128 of 128 "
        "tokens): thousands of small kernels a call",
    ),
]
WORKLOADS: dict[str, BenchWorkload] = {w.name: w for w in _ALL}


class UnknownWorkload(ValueError):
    pass


def get(name: str) -> BenchWorkload:
    try:
        return WORKLOADS[name]
    except KeyError:
        raise UnknownWorkload(f"unknown workload {name!r}; choose from: {', '.join(WORKLOADS)}") from None


def suite(name: str) -> list[BenchWorkload]:
    if name not in SUITES:
        raise UnknownWorkload(f"unknown suite {name!r}; choose from: {', '.join(SUITES)}")
    return [w for w in _ALL if name in w.suites]


def part_by_prefix(workload: str, *, suite: str, parts: Mapping[str, tuple[str, str]]) -> str:
    """The part of a suite whose workloads are named by prefix (``parts``: prefix -> (part, what its workloads
    are)); UnknownWorkload names the prefixes."""
    for prefix, (part, _) in parts.items():
        if workload.startswith(prefix):
            return part
    (first, (_, what)), *others = parts.items()
    known = [f"{what} ones start with {first!r}", *(f"{what} ones with {prefix!r}" for prefix, (_, what) in others)]
    raise UnknownWorkload(f"unknown {suite} workload {workload!r}: {', '.join(known)}")


def prefixed_builder(workload: str, *, prefix: str, what: str, known: Mapping[str, Callable[..., Any]]) -> Callable:
    """The builder of a prefixed workload: the function ``<prefix>package.module:function`` names (a model of one's
    own), else the suite's own of that name in ``known``; UnknownWorkload names the choices."""
    module_name, sep, function_name = workload.removeprefix(prefix).partition(":")
    if sep:
        try:
            return getattr(importlib.import_module(module_name), function_name)
        except (ImportError, AttributeError) as exc:
            raise UnknownWorkload(f"cannot load the builder {workload.removeprefix(prefix)!r}: {exc}") from exc
    if workload not in known:
        raise UnknownWorkload(
            f"unknown {what} workload {workload!r}; choose from: {', '.join(known)} or {prefix}package.module:function"
        )
    return known[workload]
