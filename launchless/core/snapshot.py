"""State that one run of a captured function changes in place, saved and restored in place (addresses must not move).

A graph that writes state -- a training step its parameters and optimizer state, a decode step its KV cache -- is
verified by running it twice from the same state, once eager and once as a replay, and comparing what each produced.
Its warm-up runs, too, change the state, which must be put back before the real run. Restoring copies values back
into the same tensors, so a captured graph keeps reading the right memory, and the CUDA RNG offset is restored so
dropout draws the same numbers.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


class RngState:
    """The states of the host's and the CUDA generators, put back by ``rewind``.

    A forward that draws random numbers (a vocoder's noise, a duration predictor's) draws the same numbers in a
    graph as in eager only from the same generator state. Runs that are compared (an eager run and a replay) all
    start from one state, and the runs that capture, verify and time a graph leave the generators where the call
    found them, so the call's own result draws what eager would have drawn and the next call continues from there.
    Only host-side state is saved and set: nothing waits for the GPU."""

    def __init__(self) -> None:
        self.host = torch.get_rng_state()  # a forward may draw on the host and copy the draws over (VITS's noise)
        self.states = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else []

    def rewind(self) -> None:
        torch.set_rng_state(self.host)
        if self.states:
            torch.cuda.set_rng_state_all(self.states)


class Snapshot:
    """Values of ``tensors`` and of the ``.grad`` of ``params`` (which gradient accumulation reads),
    plus scheduler state and the RNG state, restorable in place."""

    def __init__(
        self,
        tensors: Iterable[torch.Tensor],
        device: torch.device | None = None,
        params: Iterable[torch.Tensor] = (),
    ) -> None:
        self.tensors = list(tensors)
        self.values = [t.detach().clone() for t in self.tensors]
        self.params = list(params)
        self.grads = [p.grad for p in self.params]
        self.grad_values = [None if g is None else g.detach().clone() for g in self.grads]
        self.schedulers: list[Any] = []
        self.scheduler_states: list[dict] = []
        self.rng = torch.cuda.get_rng_state(device) if device is not None else None
        self.device = device

    def add_schedulers(self, schedulers: Iterable[Any]) -> None:
        """Schedulers are known only once the step ran; their state must not have changed since."""
        for s in schedulers:
            self.schedulers.append(s)
            self.scheduler_states.append(s.state_dict())

    def add_tensors(self, tensors: Iterable[torch.Tensor]) -> None:
        """State found only by running the step (a GradScaler's scale); unchanged since, as capture runs nothing."""
        for t in tensors:
            self.tensors.append(t)
            self.values.append(t.detach().clone())

    def restore(self) -> None:
        self.load([*self.values, *self.grad_values])
        for s, state in zip(self.schedulers, self.scheduler_states, strict=True):
            s.load_state_dict(state)
        if self.rng is not None:
            torch.cuda.set_rng_state(self.rng, self.device)

    def load(self, values: list[torch.Tensor | None]) -> None:
        """Put ``values`` (from ``current()``) back into the same tensors; ``.grad`` gets its saved tensor."""
        n = len(self.tensors)
        with torch.no_grad():
            for t, v in zip(self.tensors, values[:n], strict=True):
                t.copy_(v)
            for p, g, v in zip(self.params, self.grads, values[n:], strict=True):
                p.grad = g
                if g is not None and v is not None:
                    g.copy_(v)
                elif g is not None:
                    g.zero_()

    def live(self) -> list[torch.Tensor]:
        """The state tensors themselves (not copies), laid out like ``current()``."""
        grads = [torch.zeros_like(p) if p.grad is None else p.grad.detach() for p in self.params]
        return [*(t.detach() for t in self.tensors), *grads]

    def current(self) -> list[torch.Tensor]:
        """State values now; a missing gradient reads as zeros (the next backward writes the same into both)."""
        grads = [torch.zeros_like(p) if p.grad is None else p.grad.detach().clone() for p in self.params]
        return [*(t.detach().clone() for t in self.tensors), *grads]
