"""The vision populations: every torchvision builder, one model per timm module, the zoo's diffusers models.

torchvision: ``list_models()`` with ``weights=None`` (and no backbone weights), each task fed as it is used:
normalised images for classifiers and segmenters, lists of [0, 1] images for detectors, clips for video models,
frame pairs for optical flow. timm: per model module, the smallest architecture that builds, found by trying the
names that say they are small (atto ... small) on ``meta`` and counting parameters.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

from . import inputs
from .candidate import Built, Candidate, Inputs, Library

BATCH = 2
DETECTOR_IMAGES = 2
DETECTOR_SIZE = (320, 416)
SEGMENTATION_SIZE = (320, 416)
FLOW_SIZE = (128, 160)
CLASSIFIER_SIZE = 224
HUGE_PARAMETERS = 300_000_000  # CPU checks build models past this on ``meta``
SMALL_WORDS = ("atto", "femto", "pico", "nano", "tiny", "small", "xs", "s")
TIMM_TRIES = 3


def _tv_task(name: str) -> str:
    import torchvision.models as tvm

    for module, task in (
        (tvm.detection, "detection"),
        (tvm.segmentation, "semantic-segmentation"),
        (tvm.video, "video"),
        (tvm.optical_flow, "optical-flow"),
    ):
        if name in tvm.list_models(module=module):
            return task
    return "classification"


def _video_shape(name: str) -> tuple[int, int]:
    """(frames, side) a torchvision video model is built for: the side its weights' own transforms crop to
    (112 for the ResNet-3D family, 224 for the multiscale ViTs, Swin3D and S3D, whose last pooling needs it)."""
    import torchvision.models as tvm

    try:
        crop = next(iter(tvm.get_model_weights(name))).transforms().crop_size
        return 16, int(crop[0])
    except Exception:  # a builder with no weights enum: the Kinetics clips' common side
        return 16, 112


def _tv_inputs(name: str, task: str, generator: torch.Generator, device: Any) -> Inputs:
    if task == "detection":
        images = inputs.image_list(generator, DETECTOR_IMAGES, *DETECTOR_SIZE)
        return ([image.to(device) for image in images],), {}
    if task == "semantic-segmentation":
        return (inputs.normalized_images(generator, BATCH, 3, *SEGMENTATION_SIZE).to(device),), {}
    if task == "video":
        frames, side = _video_shape(name)
        return (inputs.video_clip(generator, 1, frames, side).to(device),), {}
    if task == "optical-flow":
        first, second = inputs.image_pair(generator, 1, *FLOW_SIZE)
        return (first.to(device), second.to(device)), {}
    size = 299 if "inception" in name else CLASSIFIER_SIZE
    return (inputs.normalized_images(generator, BATCH, 3, size, size).to(device),), {}


def build_torchvision(name: str, task: str, device: str = "cpu") -> Built:
    import torchvision.models as tvm

    kwargs: dict[str, Any] = {"weights": None}
    if task in ("detection", "semantic-segmentation"):
        kwargs["weights_backbone"] = None
    if name.startswith("quantized_"):
        kwargs["quantize"] = False  # the float model with its quantization stubs: the quantized one runs on CPU only
    with torch.device(device):
        model = tvm.get_model(name, **kwargs)
    return Built(model.eval(), partial(_tv_inputs, name, task), name)


def torchvision_candidates() -> list[Candidate]:
    """Every builder of ``torchvision.models.list_models()``."""
    import torchvision.models as tvm

    huge = ("vit_h", "vit_l", "swin3d_b")  # regnet_y_32gf / 128gf: their init copies data, so not on meta
    found = []
    for name in tvm.list_models():
        task = _tv_task(name)
        found.append(
            Candidate(
                Library.TORCHVISION, name, task, partial(build_torchvision, name, task), huge=name.startswith(huge)
            )
        )
    return found


def _smallness(name: str) -> tuple[int, int]:
    """Order timm names so that the ones saying they are small come first (then the shortest)."""
    parts = name.replace(".", "_").split("_")
    rank = next((i for i, word in enumerate(SMALL_WORDS) if word in parts or any(p.endswith(word) for p in parts)), 99)
    return rank, len(name)


def _timm_input(arch: str, generator: torch.Generator, device: Any) -> Inputs:
    import timm

    _, height, width = (
        timm.models.get_pretrained_cfg(arch).input_size
        if timm.models.get_pretrained_cfg(arch)
        else (
            3,
            CLASSIFIER_SIZE,
            CLASSIFIER_SIZE,
        )
    )
    return (inputs.normalized_images(generator, BATCH, 3, height, width).to(device),), {}


def smallest_timm(module: str) -> str:
    """The architecture of ``module`` with the fewest parameters among the first small-named ones that build --
    counted on ``meta``, or on the CPU where an init reads values back (``.tolist()`` of a drop-path schedule, as
    some timm releases do), which ``meta`` cannot."""
    import timm

    sizes: dict[str, int] = {}
    for arch in sorted(timm.list_models(module=module), key=_smallness):
        model = None
        for device in ("meta", "cpu"):
            try:
                with torch.device(device):
                    model = timm.create_model(arch, pretrained=False)
                break
            except Exception:
                continue
        if model is None:
            continue
        sizes[arch] = sum(p.numel() for p in model.parameters())
        if len(sizes) >= TIMM_TRIES:
            break
    if not sizes:
        raise RuntimeError(f"no architecture of timm.models.{module} builds")
    return min(sizes, key=sizes.__getitem__)


def build_timm(module: str, device: str = "cpu") -> Built:
    import timm

    arch = smallest_timm(module)
    with torch.device(device):
        model = timm.create_model(arch, pretrained=False)
    return Built(model.eval(), partial(_timm_input, arch), arch)


def timm_candidates() -> list[Candidate]:
    """One candidate per timm model module (``timm.list_modules()``)."""
    import timm

    return [
        Candidate(Library.TIMM, module, "classification", partial(build_timm, module))
        for module in timm.list_modules()
        if timm.list_models(module=module)
    ]


def _diffusers_inputs(make_cpu: Any, generator: torch.Generator, device: Any) -> Inputs:
    """The zoo's input factory draws from the global generator: seed it from the caller's, on a forked state."""
    from torch.utils._pytree import tree_map

    seed = int(torch.randint(2**62, (1,), generator=generator))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        made = make_cpu()
    return tree_map(lambda x: x.to(device) if isinstance(x, torch.Tensor) else x, made)


def build_diffusers(name: str, device: str = "cpu") -> Built:
    from ..zoo._registry import _REGISTRY

    with torch.device(device):
        model, make_cpu = _REGISTRY[name].builder(BATCH)
    return Built(model.eval(), partial(_diffusers_inputs, make_cpu), name)


def diffusers_candidates() -> list[Candidate]:
    """The diffusers models of the zoo (UNets, VAE, DiT, PixArt, SD3, Flux; small configs)."""
    from ..zoo._registry import _REGISTRY

    return [
        Candidate(Library.DIFFUSERS, name.split(":", 1)[1], "diffusion", partial(build_diffusers, name))
        for name, spec in _REGISTRY.items()
        if spec.family == "diffusers"
    ]
