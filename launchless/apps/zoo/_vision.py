"""Builders for timm and torchvision models (imported lazily, inside each builder)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ._common import Inputs

Built = tuple[torch.nn.Module, Callable[[], Inputs]]


def _timm(arch: str, batch: int, size: int = 224) -> Built:
    import timm

    model = timm.create_model(arch, pretrained=False)
    return model, lambda: ((torch.randn(batch, 3, size, size),), {})


def _tv_detector(arch: str, batch: int, size: int = 320) -> Built:
    """A torchvision detection model (detection, masks, keypoints): a list of CHW images in [0, 1]."""
    from torchvision.models import detection

    model = getattr(detection, arch)(weights=None, weights_backbone=None)
    return model, lambda: (([torch.rand(3, size, size) for _ in range(batch)],), {})


def _tv_segmentation(arch: str, batch: int, size: int = 256) -> Built:
    """A torchvision semantic segmentation model; it returns ``{"out": (B, 21, H, W)}``."""
    from torchvision.models import segmentation

    model = getattr(segmentation, arch)(weights=None, weights_backbone=None)
    return model, lambda: ((torch.rand(batch, 3, size, size),), {})


def _tv_video(arch: str, batch: int, frames: int = 8, size: int = 112) -> Built:
    """A torchvision video classifier on a (B, 3, T, H, W) clip."""
    from torchvision.models import video

    model = getattr(video, arch)(weights=None)
    return model, lambda: ((torch.rand(batch, 3, frames, size, size),), {})


def _raft(batch: int, size: int = 128, arch: str = "raft_small") -> Built:
    """RAFT optical flow between two frames; it returns the flow of every refinement iteration."""
    from torchvision.models import optical_flow

    model = getattr(optical_flow, arch)(weights=None)
    return model, lambda: ((torch.rand(batch, 3, size, size), torch.rand(batch, 3, size, size)), {})
