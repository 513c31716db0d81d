"""Is the training state a captured step reads still the one in use? Checked before every replay.

A whole-step graph reads and writes the tensors it found when it was captured: the parameters, their
gradients, the optimizer's state (momentum, Adam's moments and step counters, the learning-rate tensor) and a
GradScaler's scale. Resuming a checkpoint replaces them -- ``optimizer.load_state_dict`` builds new state
dicts and new ``param_groups``, ``optimizer.state.clear()`` drops them, ``add_param_group`` adds parameters
the graph never updates, ``load_state_dict(assign=True)`` or ``.to()`` relocate the parameters -- and a graph
replayed after that would update the old tensors while training goes on with the new ones: wrong weights,
no error. ``TrainingState`` notices each of these cheaply (object identities, lengths, a spot check of state
tensors, the relocation counter) and names what changed; the graph cache then drops the graphs and the step
is captured again from the state now in use.

Not stale: ``model.load_state_dict(sd)`` and ``scaler.load_state_dict(sd)`` copy into the same tensors (the
graph reads the new values), and schedulers run eager after each replay, so loading their state needs nothing.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import torch

from ..core.relocation import RelocationWatch, spread


def _state_slots(optimizer: torch.optim.Optimizer) -> list[tuple[Any, str, int]]:
    """(parameter, state key, id of the tensor there) for every tensor of the optimizer's state."""
    return [
        (p, key, id(v))
        for p, state in optimizer.state.items()
        for key, v in state.items()
        if isinstance(v, torch.Tensor)
    ]


_PARAMS = operator.itemgetter("params")
_REQUIRES_GRAD = operator.attrgetter("requires_grad")


def _held_id(held: dict | None, key: str) -> int | None:
    """The identity of the tensor at ``key`` of one parameter's state (None when that state is gone)."""
    return None if held is None else id(held.get(key))


def _held(held: dict | None, key: str) -> Any:
    """The tensor at ``key`` of one parameter's state, or None."""
    return None if held is None else held.get(key)


def _scaler_tensors(scaler: torch.amp.GradScaler | None) -> tuple:
    """The GradScaler's tensors whose identities ``_scaler_fields`` takes."""
    if scaler is None:
        return ()
    return getattr(scaler, "_scale", None), getattr(scaler, "_growth_tracker", None)


def _scaler_fields(scaler: torch.amp.GradScaler | None) -> tuple:
    """What a captured ``scaler.update()`` baked in: its tensors' identities and its Python-number factors."""
    if scaler is None or not scaler.is_enabled():
        return ()
    return (
        id(getattr(scaler, "_scale", None)),
        id(getattr(scaler, "_growth_tracker", None)),
        scaler.get_growth_factor(),
        scaler.get_backoff_factor(),
        scaler.get_growth_interval(),
    )


class TrainingState:
    """The graph cache's validity check for a training step (``core.cache.Guard``)."""

    def __init__(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None
    ) -> None:
        self.model, self.optimizer, self.scaler = model, optimizer, scaler
        self._watch = RelocationWatch(model)
        self._armed = False
        self._identities_held: tuple | None = None

    def arm(self, leaves: Sequence[Any] = ()) -> None:
        optimizer = self.optimizer
        self._watch.moved()  # follow the parameters as they are now
        slots = _state_slots(optimizer)
        spot = [slots[i] for i in spread(len(slots))]  # up to 8 (parameter, key, id), spread over the state
        self._spot_params = [p for p, _, _ in spot]
        self._spot_keys = [key for _, key, _ in spot]
        every = list(self.model.parameters())
        self._trainable = [every[i] for i in spread(len(every))]
        self._fingerprint = self._now()
        # the objects whose identities the fingerprint holds, kept alive while it is armed: a freed object's id()
        # can be taken by a new one (a state tensor deleted, then made again between two steps) and would read as
        # unchanged. Let go of as soon as a change is found, so a replaced state is not held beside the new one.
        self._identities_held = (
            optimizer.state,
            optimizer.param_groups,
            tuple(optimizer.param_groups),
            tuple(map(_held, map(optimizer.state.get, self._spot_params), self._spot_keys)),
            _scaler_tensors(self.scaler),
        )
        self._armed = True

    def _now(self) -> tuple:
        """What the graphs depend on, as one tuple compared in C: identities, lengths, flags."""
        optimizer = self.optimizer
        state, groups = optimizer.state, optimizer.param_groups
        return (
            id(state),
            id(groups),
            len(state),
            tuple(map(id, groups)),
            tuple(map(len, map(_PARAMS, groups))),
            tuple(map(_held_id, map(state.get, self._spot_params), self._spot_keys)),
            _scaler_fields(self.scaler) if self.scaler is not None else (),
            tuple(map(_REQUIRES_GRAD, self._trainable)),
        )

    def stale(self, leaves: Sequence[Any] = ()) -> str | None:
        """What changed since the graphs were captured, or None. Cheap: identities and lengths first."""
        if not self._armed:
            return None
        why = self._why()
        if why is not None:
            self._armed = False  # the graphs go; the next one kept arms the check again
            self._identities_held = None
        return why

    def _why(self) -> str | None:
        now = self._now()
        if now == self._fingerprint:
            return None if self._watch.stale() is None else _RELOCATED
        was = self._fingerprint
        if now[:2] != was[:2]:
            return "the optimizer's state was replaced (optimizer.load_state_dict: a checkpoint resumed?)"
        if now[2] != was[2]:
            return "the optimizer's state was cleared or grew (optimizer.state.clear(), new parameters stepped)"
        if now[3] != was[3]:
            return "the optimizer's param_groups changed (add_param_group, or groups replaced)"
        if now[4] != was[4]:
            return "parameters were added to or removed from an optimizer param group"
        if now[5] != was[5]:
            return "tensors of the optimizer's state were replaced"
        if now[6] != was[6]:
            return "the GradScaler's tensors or its growth/backoff settings changed"
        return "parameters were frozen or unfrozen"


_RELOCATED = (
    "the model's parameters were relocated (.to(), load_state_dict(assign=True), a swapped submodule or "
    "parameter), or its forward hooks changed"
)
