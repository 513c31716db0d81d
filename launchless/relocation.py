"""Notice, without the caller's help, when a model's parameters or buffers move.

A graph reads fixed addresses. ``.to()``/``.half()`` (``param.data = ...`` under the hood),
``load_state_dict(assign=True)``, swapping a submodule (as quantisation does) or replacing a
parameter leave the old addresses behind, and replaying would read freed or stale memory. In-place
updates (``load_state_dict`` without ``assign``, optimiser steps) keep addresses, so graphs stay valid.

Two cheap checks run on every call:
- the storage address of every parameter and buffer, compared in one C++ call;
- a process-wide counter bumped by PyTorch's global parameter/buffer/module registration hooks,
  which catches objects replaced through ``setattr`` (their old objects, which we hold, would
  otherwise still show the old addresses). When it moves, the model is walked again.
``Module._apply`` replaces buffer objects without a hook; that is caught by the parameters of the same
module moving, and for modules that own buffers but no parameters by comparing those buffers'
identities too (usually none). Under ``torch.__future__.set_overwrite_module_params_on_conversion``
parameters are replaced the same way, so identities are compared for all of them.
"""

from __future__ import annotations

import itertools
import threading

import torch
from torch.nn.modules import module as _module

_epoch = 0
_hooks_installed = False
_install_lock = threading.Lock()


def _bump(*_: object) -> None:
    global _epoch
    _epoch += 1


def _install_hooks() -> None:
    global _hooks_installed
    with _install_lock:
        if not _hooks_installed:
            _module.register_module_parameter_registration_hook(_bump)
            _module.register_module_buffer_registration_hook(_bump)
            _module.register_module_module_registration_hook(_bump)
            _hooks_installed = True


def _state_tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    dicts = [d for m in model.modules() for d in (m._parameters, m._buffers)]
    return [t for t in itertools.chain.from_iterable(d.values() for d in dicts) if t is not None]


def _identities(dicts: list[dict]) -> tuple[int, ...]:
    return tuple(map(id, itertools.chain.from_iterable(map(dict.values, dicts))))


_ptrs_equal = torch._C._tensors_data_ptrs_at_indices_equal


class RelocationWatch:
    """Answers "did anything the graphs read move since the last call?" in a few microseconds."""

    def __init__(self, model: torch.nn.Module) -> None:
        _install_hooks()
        self._model = model
        self._snapshot()

    def _snapshot(self) -> None:
        self._epoch = _epoch
        self._tensors = _state_tensors(self._model)
        self._ids = tuple(map(id, self._tensors))
        self._ptrs = [t.data_ptr() for t in self._tensors]
        self._indices = list(range(len(self._tensors)))
        modules = list(self._model.modules())
        self._bare_buffers = [m._buffers for m in modules if m._buffers and not m._parameters]
        self._bare_ids = _identities(self._bare_buffers)
        cuda = [t.device for t in self._tensors if t.is_cuda]
        self.cuda_device: torch.device | None = cuda[0] if cuda else None

    def moved(self) -> bool:
        """True once after parameters or buffers were relocated; the watch then follows the new ones."""
        if (
            self._epoch == _epoch
            and _ptrs_equal(self._tensors, self._ptrs, self._indices)
            and (not self._bare_buffers or _identities(self._bare_buffers) == self._bare_ids)
            and not torch.__future__.get_overwrite_module_params_on_conversion()
        ):
            return False
        old_ids, old_ptrs = self._ids, self._ptrs
        self._snapshot()
        return self._ids != old_ids or self._ptrs != old_ptrs

    def requires_grad(self) -> bool:
        return any(t.requires_grad for t in self._tensors)
