"""Model zoo: real architectures with random weights and matching example inputs.

Benchmarks, ``launchless demo``, GPU tests and the conformance matrix need realistic graphs (convs,
attention, detection post-processing, KV caches, diffusion blocks) without network access, so
nothing here downloads weights, configs or tokenizers. timm / torchvision / transformers / diffusers
are imported lazily inside the builders, so ``import launchless.apps.zoo`` needs only torch; install
them with ``pip install 'launchless[zoo]'``. Every workload has a task (``tasks()``); the builders
live in ``_vision`` (timm, torchvision), ``_transformers``, ``_diffusers`` and ``_grace*`` (GraCE's
workloads: model code of our own where the original's package is not one of these -- ``_grace_ocean`` for pyhpc's
ocean models, ``_grace_dalle2`` for DALLE2, ``_grace_xlnet`` for XLNet's host-built encoding), the entries in
``_registry``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_map

from ._common import TASKS, _Spec
from ._common import Builder as Builder
from ._common import Inputs as Inputs
from ._registry import _REGISTRY

__all__ = ["TASKS", "Workload", "available", "build", "names", "tasks"]


@dataclass(frozen=True, eq=False)
class Workload:
    """A built model plus example inputs, ready for ``model(*args, **kwargs)``."""

    name: str
    model: torch.nn.Module = field(repr=False)
    args: tuple
    kwargs: dict
    family: str
    task: str
    _make: Callable[[], Inputs] = field(repr=False)

    def inputs(self) -> Inputs:
        """Fresh inputs of the same shapes/dtypes/device with new random values (replay checks need them)."""
        return self._make()


class _UnknownWorkloadError(KeyError, ValueError):
    """Catchable as KeyError (a registry lookup) or ValueError (a bad argument)."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


# --- public API ----------------------------------------------------------------------------------


def names() -> list[str]:
    """All registered workload names, in registration order."""
    return list(_REGISTRY)


def tasks() -> dict[str, list[str]]:
    """Task -> its workload names (registration order), for every task in ``TASKS`` that has any."""
    by_task: dict[str, list[str]] = {}
    for name, spec in _REGISTRY.items():
        by_task.setdefault(spec.task, []).append(name)
    return {task: by_task[task] for task in TASKS if task in by_task}


def _spec(name: str) -> _Spec:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise _UnknownWorkloadError(f"unknown workload {name!r}; valid names: {', '.join(_REGISTRY)}") from None


def available(name: str) -> bool:
    """True when the package ``name`` needs imports cleanly (unknown names raise)."""
    package = _spec(name).package
    try:
        importlib.import_module(package)
    except Exception:  # a broken install (e.g. torchvision ops mismatch) is as unusable as a missing one
        return False
    return True


def build(
    name: str,
    *,
    batch: int = 1,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> Workload:
    """Build workload ``name`` with random weights: reproducible per ``seed``, on any ``device``.

    Weights and inputs are created on the CPU in fp32 and then moved, so the same seed gives the
    same values on every device; ``dtype`` applies to parameters and float inputs only.
    """
    spec = _spec(name)
    try:
        importlib.import_module(spec.package)  # before seeding, so a first import can't shift the RNG
    except ImportError as e:
        raise ImportError(f"workload {name!r} needs {spec.package!r}: pip install 'launchless[zoo]' ({e})") from e
    torch.manual_seed(seed)
    model, make_cpu = spec.builder(batch)
    model = model.to(device=device, dtype=dtype).eval()

    def convert(x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        return x.to(device=device, dtype=dtype) if x.is_floating_point() else x.to(device=device)

    def make() -> Inputs:
        return tree_map(convert, make_cpu())

    args, kwargs = make()
    return Workload(name=name, model=model, args=args, kwargs=kwargs, family=spec.family, task=spec.task, _make=make)
