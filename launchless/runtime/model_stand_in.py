"""A wrapper that stands in for the model it holds: what the caller does with the model works on the wrapper.

The caller swaps ``wrap(model)`` in for ``model``: attribute reads, ``state_dict()`` keys and loading, the module
names that parameter names are built from, copies and pickles must all behave as the model's, or the swap would
break checkpoints and code that reads the model. What the wrapper adds is process state (graphs, pools, locks,
counters): copies and pickles leave it behind, and the copy makes its own.
"""

from __future__ import annotations

from typing import Any, ClassVar, cast

import torch

from . import state_keys


class ModelStandIn(torch.nn.Module):
    """The model's API on a wrapper that holds it as its child ``model``.

    ``_runtime_state``: the attributes ``_init_runtime`` makes, never copied or pickled (made again instead).
    """

    _runtime_state: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        state_keys.install(self)

    def _init_runtime(self) -> None:
        """The wrapper's process state, made at construction and again in every copy."""

    def __getstate__(self) -> dict:
        """Copies and pickles carry the model and the options, never graphs, pools or locks."""
        return {k: v for k, v in self.__dict__.items() if k not in self._runtime_state}

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self._init_runtime()

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["model"], name)

    @property
    def __launchless_model__(self) -> torch.nn.Module:
        """The wrapped model (what ``dry_run`` and ``explain`` look into)."""
        return cast(torch.nn.Module, self._modules["model"])

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        """Straight to the model, so missing/unexpected keys are reported with the model's own names."""
        return self.model.load_state_dict(state_dict, strict=strict, assign=assign)

    def named_modules(self, memo: set | None = None, prefix: str = "", remove_duplicate: bool = True):
        """The model's modules under the wrapper's own name: parameter names match state_dict keys."""
        memo = set() if memo is None else memo
        if self not in memo:
            if remove_duplicate:
                memo.add(self)
            yield prefix, self
        yield from self.model.named_modules(memo, prefix, remove_duplicate)
