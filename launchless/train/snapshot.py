"""The training state one step changes: parameters, buffers (BatchNorm statistics) and optimizer state, saved and
restored in place by ``core.snapshot.Snapshot`` around verification."""

from __future__ import annotations

import torch

from ..core.snapshot import Snapshot

__all__ = ["Snapshot", "state_tensors"]


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    found = [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    return found + [g["lr"] for g in optimizer.param_groups if isinstance(g["lr"], torch.Tensor)]


def state_tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every tensor a training step updates in place: parameters, buffers, optimizer state."""
    return [*model.parameters(), *model.buffers(), *_optimizer_tensors(optimizer)]
