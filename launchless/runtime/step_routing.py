"""The model's forward sent to the decode steps' graphs while ``generate()`` runs.

``generate()`` calls the model (its ``__call__`` and hooks stay the way in) once for the prompt and once per new
token. For as long as a generation decodes, the instance's ``forward`` is shadowed by one that counts the calls and
hands each to ``DecodeSteps.step``: the first forward of a decoding is the prompt's (it runs eager), every later one a
decode step. The shadow goes when the generation returns or raises, and an instance's own forward is put back.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch

from ..core.compiled_programs import ROUTING
from .decode_steps import DecodeSteps


class StepRouting:
    """Routes one model's forward to its decode steps (see the module docstring)."""

    def __init__(self, steps: DecodeSteps) -> None:
        self.steps = steps
        self._forwards = [0]  # forwards of the routed model in this decoding: the first is the prompt's

    @contextlib.contextmanager
    def routed(self, model: torch.nn.Module, cache: Any, keyword: str) -> Iterator[None]:
        """The model's forward sent through the decode steps while the block runs: calling the model (its
        ``__call__`` and hooks stay the way in) runs a decode step through the graphs. An instance's own forward is
        put back after."""
        own = model.__dict__.get("forward")
        forward = own or type(model).forward.__get__(model)
        calls = self._forwards = [0]  # the first forward is the prefill (``prefill_next`` starts over)

        @functools.wraps(forward)  # generate() reads the forward's parameters
        def step(*step_args: Any, **step_kwargs: Any) -> Any:
            calls[0] += 1
            return self.steps.step(forward, cache, keyword, calls[0] == 1, step_args, step_kwargs)

        setattr(step, ROUTING, True)  # a compile of the decode step sends the model without it
        model.forward = step
        try:
            yield
        finally:
            if own is None:
                del model.__dict__["forward"]
            else:
                model.forward = own

    def prefill_next(self) -> None:
        """The next forward of the routed model is a prompt's (a second decoding of the same call): it runs eager."""
        self._forwards[0] = 0
