"""Training state that one step changes, saved and restored in place (addresses must not move).

Verification runs the step twice from the same state -- once eager, once as a replay -- and
compares what each produced: parameters, buffers (BatchNorm statistics), optimizer state and the
step's outputs. Restoring copies values back into the same tensors, so a captured graph keeps
reading the right memory, and the CUDA RNG offset is restored so dropout draws the same numbers.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    found = [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    return found + [g["lr"] for g in optimizer.param_groups if isinstance(g["lr"], torch.Tensor)]


def state_tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every tensor a training step updates in place: parameters, buffers, optimizer state."""
    return [*model.parameters(), *model.buffers(), *_optimizer_tensors(optimizer)]


class Snapshot:
    """Values of ``tensors`` plus scheduler state and the RNG state, restorable in place."""

    def __init__(self, tensors: Iterable[torch.Tensor], device: torch.device | None = None) -> None:
        self.tensors = list(tensors)
        self.values = [t.detach().clone() for t in self.tensors]
        self.schedulers: list[Any] = []
        self.scheduler_states: list[dict] = []
        self.rng = torch.cuda.get_rng_state(device) if device is not None else None
        self.device = device

    def add_schedulers(self, schedulers: Iterable[Any]) -> None:
        """Schedulers are known only once the step ran; their state must not have changed since."""
        for s in schedulers:
            self.schedulers.append(s)
            self.scheduler_states.append(s.state_dict())

    def restore(self) -> None:
        with torch.no_grad():
            for t, v in zip(self.tensors, self.values, strict=True):
                t.copy_(v)
        for s, state in zip(self.schedulers, self.scheduler_states, strict=True):
            s.load_state_dict(state)
        if self.rng is not None:
            torch.cuda.set_rng_state(self.rng, self.device)

    def current(self) -> list[torch.Tensor]:
        return [t.detach().clone() for t in self.tensors]
