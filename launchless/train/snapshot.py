"""The training state one step changes: parameters, buffers (BatchNorm statistics) and optimizer state, saved and
restored in place by ``core.snapshot.Snapshot`` around verification."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

import torch

from ..core.snapshot import Snapshot
from ..core.storage import storage_address

__all__ = ["Snapshot", "state_labels", "state_tensors"]


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    found = [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    return found + [g["lr"] for g in optimizer.param_groups if isinstance(g["lr"], torch.Tensor)]


def state_tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every tensor a training step updates in place: parameters, buffers, optimizer state."""
    return [*model.parameters(), *model.buffers(), *_optimizer_tensors(optimizer)]


def state_labels(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    saved: Snapshot,
    *,
    writers: Mapping[int, str] | None = None,
) -> Callable[[int], str]:
    """What the ``i``-th tensor of ``saved.live()`` is, as a reader finds it in the model or the optimizer: a failed
    verification names the state where the replay differs most (the names are looked up then, not per capture).
    A tensor of neither is named by the operation that wrote it (``writers``, by ``id``) and by what it is a view
    of, where it shares a named tensor's memory."""

    @functools.cache
    def names() -> tuple[dict[int, str], dict[int, str]]:
        parameters = {id(p): name for name, p in model.named_parameters(remove_duplicate=False)}
        found: dict[int, str] = {}
        for name, p in model.named_parameters():
            found.setdefault(id(p), f"parameter {name}")
        for name, b in model.named_buffers():
            found.setdefault(id(b), f"buffer {name}")
        for p, state in optimizer.state.items():
            for key, value in state.items():
                if isinstance(value, torch.Tensor):
                    found.setdefault(id(value), f"optimizer state {key!r} of {parameters.get(id(p), 'a parameter')}")
        return parameters, found

    def label(i: int) -> str:
        parameters, found = names()
        if i < len(saved.tensors):
            t = saved.tensors[i]
            if id(t) in found:
                return found[id(t)]
            what = f"a {str(t.dtype).removeprefix('torch.')}{list(t.shape)} tensor the step writes"
            if writers and id(t) in writers:
                what += f" (by {writers[id(t)]})"
            owner = next((found[id(o)] for o in saved.tensors if id(o) in found and _shares_memory(o, t)), None)
            return what + (f", a view of {owner}" if owner else "")
        return f"the gradient of {parameters.get(id(saved.params[i - len(saved.tensors)]), 'a parameter')}"

    return label


def _shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.device == b.device and storage_address(a) == storage_address(b) is not None
