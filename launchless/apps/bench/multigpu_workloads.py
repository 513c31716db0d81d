"""What `launchless bench --suite multigpu` measures: its two parts, their workloads and modes.

Two kinds of workload, told apart by their prefix:

- ``tp:<name>``: tensor-parallel inference. ``<name>`` is one of ``launchless.apps.zoo.tensor_parallel``'s
  ``TP_WORKLOADS``, or ``tp:package.module:function`` for a model of one's own: the function takes the keywords
  ``mesh`` (a ``DeviceMesh``, or None for the unsharded model) and ``device`` and returns ``(model, args, kwargs)``
  like ``build_tp``. World size 1 runs the unsharded model (``mesh=None``): the single-GPU baseline tensor
  parallelism has to beat, without DTensor's bookkeeping.
- ``ddp:<name>``: DistributedDataParallel training steps of an image classifier, batch 1 per rank, SGD with
  momentum. ``ddp:resnet18`` is timm's resnet18 (10 classes, 3x224x224); ``ddp:package.module:function`` is one's
  own: the function takes the keywords ``device``, ``batch`` and ``seed`` and returns ``(model, (images, labels))``
  (every rank passes its own seed; DDP starts all of them from rank 0's weights).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

from .multigpu_report import DDP_TRAINING, TP_INFERENCE
from .workloads import part_by_prefix, prefixed_builder

if TYPE_CHECKING:
    import torch

TP_MODES = ("eager", "compile", "reduce-overhead", "launchless", "launchless-compile")
DDP_MODES = ("eager", "reduce-overhead", "launchless")
MODES = tuple(dict.fromkeys((*TP_MODES, *DDP_MODES)))
DDP_RESNET18 = "ddp:resnet18"

TpBuilder = Callable[..., tuple["torch.nn.Module", tuple, dict]]
DdpBuilder = Callable[..., tuple["torch.nn.Module", tuple["torch.Tensor", "torch.Tensor"]]]


def part_of(workload: str) -> str:
    """``tp-inference`` or ``ddp-training``, from the workload's prefix."""
    parts = {"tp:": (TP_INFERENCE, "tensor-parallel"), "ddp:": (DDP_TRAINING, "DDP training")}
    return part_by_prefix(workload, suite="multigpu", parts=parts)


def modes_of(workload: str) -> tuple[str, ...]:
    return TP_MODES if part_of(workload) == TP_INFERENCE else DDP_MODES


def tp_builder(workload: str) -> TpBuilder:
    """``builder(mesh=, device=) -> (model, args, kwargs)`` for a ``tp:`` workload."""
    from ..zoo.tensor_parallel import TP_WORKLOADS, build_tp

    known = {name: functools.partial(build_tp, name) for name in TP_WORKLOADS}
    return prefixed_builder(workload, prefix="tp:", what="tensor-parallel", known=known)


def resnet18_classifier(
    *, device: torch.device, batch: int, seed: int
) -> tuple[torch.nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """timm's resnet18 with 10 classes and one seeded batch of 3x224x224 images with labels."""
    import timm
    import torch

    torch.manual_seed(seed)
    model = timm.create_model("resnet18", num_classes=10).to(device)
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(batch, 3, 224, 224, generator=generator).to(device)
    labels = torch.randint(10, (batch,), generator=generator).to(device)
    return model, (images, labels)


DDP_WORKLOADS: dict[str, DdpBuilder] = {DDP_RESNET18: resnet18_classifier}


def ddp_builder(workload: str) -> DdpBuilder:
    """``builder(device=, batch=, seed=) -> (model, (images, labels))`` for a ``ddp:`` workload."""
    return prefixed_builder(workload, prefix="ddp:", what="DDP", known=DDP_WORKLOADS)


def check_workload(workload: str) -> None:
    """Raises UnknownWorkload unless ``workload`` names a builder this worker can load."""
    if part_of(workload) == TP_INFERENCE:
        tp_builder(workload)
    else:
        ddp_builder(workload)


def default_workloads() -> list[str]:
    """Every tensor-parallel workload of the zoo, then DDP resnet18."""
    from ..zoo.tensor_parallel import TP_WORKLOADS

    return [*TP_WORKLOADS, DDP_RESNET18]
