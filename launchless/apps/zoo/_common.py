"""Types shared by the zoo's builders and registry (no model library imported here)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

Inputs = tuple[tuple, dict]
# A builder takes the batch size and returns (fp32 CPU model in eval mode, factory of fp32 CPU inputs).
Builder = Callable[[int], tuple[torch.nn.Module, Callable[[], Inputs]]]

# What a workload does; a conformance run groups its results by these.
TASKS = (
    "classification",
    "detection",
    "instance-segmentation",
    "semantic-segmentation",
    "keypoints",
    "video",
    "optical-flow",
    "encoder",
    "decoder",
    "encoder-decoder",
    "vision",
    "audio",
    "diffusion",
    "recommendation",
    "scientific",
)


@dataclass(frozen=True)
class _Spec:
    family: str  # the package family: timm, torchvision, transformers, diffusers; grace: GraCE's workloads
    package: str  # import name whose absence makes the workload unavailable
    builder: Builder
    task: str  # one of TASKS

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"unknown task {self.task!r}; valid tasks: {', '.join(TASKS)}")
