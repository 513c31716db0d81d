"""Notice, without the caller's help, when a model's parameters or buffers move.

A graph reads fixed addresses. ``.to()``/``.half()``/``.cuda()`` (``Module._apply``),
``load_state_dict(assign=True)``, swapping a submodule (as quantisation does) or replacing a
parameter leave the old addresses behind, and replaying would read freed or stale memory. In-place
updates (``load_state_dict`` without ``assign``, optimiser steps) keep addresses, so graphs stay valid.

Checking every parameter's address on every call costs ~0.1 µs per tensor -- 15-25 µs for a
resnet or BERT, more than the rest of a replay. So the default check is event-driven plus a spot
check, a few hundred nanoseconds in all:
- a process-wide counter is bumped by ``Module._apply`` (wrapped once, transparently) and by
  PyTorch's global parameter/buffer/module registration hooks (``setattr``, ``register_*``,
  ``load_state_dict(assign=True)``, module swaps) on a watched module, and the watches that follow that module
  are told which it was; when it moved, each named module's own tensors (identity, address) and submodules are
  compared with what it held (a forward that sets one of its modules again every call, as Switch Transformers'
  router does, costs that module's check, not a walk of the tree); anything else, every tensor is compared.
  Forward hooks registered or removed tell only the watches whose modules hold them, which then compare those
  modules' hooks: a forward that builds a container of its own layers or registers and removes a hook every
  call (transformers' decoders do both) costs a few microseconds, not a walk of the module tree;
- the storage addresses of up to 8 tensors spread over the model are compared on every call.
``address_check="full"`` compares every tensor's identity and address on every call instead; it
also catches what no event announces: ``p.data = x`` or ``torch.utils.swap_tensors`` on a single
tensor outside the spot check, or writes straight into ``module._parameters``.
"""

from __future__ import annotations

import functools
import itertools
import operator
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.nn.modules import module as _module

_epoch = 0  # moves at every event below
_structure = 0  # moves at the events that can relocate tensors or change the tree of a module that is watched
_unattributed = 0  # moves at such events that name no module: every watch then compares all it follows
_watched: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()  # every module some RelocationWatch follows
_watches: weakref.WeakSet[RelocationWatch] = weakref.WeakSet()  # told which of their modules' hooks changed
_GLOBAL = object()  # "the global forward hooks changed"
_installed = False
_install_lock = threading.Lock()
_not_none = functools.partial(operator.is_not, None)


def addressed(tensors: list) -> list:
    """The tensors whose addresses tell where the data is: a DTensor's own ``data_ptr()`` is always 0 (a wrapper
    without storage), so its local shard stands for it."""
    return [t._local_tensor if isinstance(getattr(t, "_local_tensor", None), torch.Tensor) else t for t in tensors]


def _ptrs_equal_python(tensors: list, ptrs: list, indices: list) -> bool:
    """``torch._C._tensors_data_ptrs_at_indices_equal`` where a build lacks it (CPU wheels up to torch 2.13)."""
    return all(tensors[i].data_ptr() == ptrs[i] for i in indices)


ptrs_equal = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", _ptrs_equal_python)
"""``ptrs_equal(tensors, ptrs, indices)``: every ``tensors[i]`` still at ``ptrs[i]`` (one C++ call where there)."""
_SPOT = 8
_is_compiling = torch.compiler.is_compiling


def _bump(*_: object) -> None:
    """Count a possible change: a forward hook registered or removed -- except while Dynamo traces: model code
    that registers modules in its forward (``self.layers[:n]`` builds a ModuleList each call) would make the
    counter a guarded global that changes every call, so torch.compile would recompile each call until its limit
    and then run eager. Code outside the compiled forward (``.to()``, ``load_state_dict``, swaps) is counted as
    before."""
    global _epoch
    if _is_compiling():
        return
    _epoch += 1


def _bump_structure(module: object = None, *_: object) -> None:
    """Count a possible relocation or change of a module tree (``_apply``, a parameter, buffer or submodule
    registered). ``_epoch`` moves at every such event; ``_structure`` only when it concerns a module a
    ``RelocationWatch`` follows, and the watches that follow it are told which. Many forwards build a container of
    their own modules every call (``ModuleList(self.layers[:n])`` in transformers' decoders), register and remove
    hooks (to collect router logits), or set one of their own modules again (Switch Transformers' router:
    ``self.classifier = self.classifier.to(self.dtype)``, every call): such a call must not cost a walk of the
    module tree."""
    global _structure, _unattributed
    if _is_compiling():
        return
    if module is None:
        _structure += 1
        _unattributed += 1
    elif module in _watched:
        _structure += 1
        for watch in list(_watches):
            watch.structure_touched(module)
    _bump()


def _bumping(owner: object, name: str, bump: Callable[[], None] = _bump) -> None:
    """Make ``owner.name`` count a possible change before it runs (once, however often installed)."""
    original = getattr(owner, name)
    if getattr(original, "_launchless_bumps", False):
        return

    @functools.wraps(original)
    def bumped(*args: object, **kwargs: object) -> object:
        bump(*args[:1])  # the module it concerns, where there is one
        return original(*args, **kwargs)

    bumped._launchless_bumps = True  # type: ignore[attr-defined]
    setattr(owner, name, bumped)


def _hook_registered(module: object = None, *_: object) -> None:
    """A forward hook is being registered on ``module``: the watches that follow it are told."""
    _bump()
    for watch in list(_watches):
        watch.hooks_touched(module)


def _global_hook_registered(*_: object) -> None:
    """A global forward hook is being registered: every watch is told."""
    _hook_registered(_GLOBAL)


def _hook_removed(handle: object = None, *_: object) -> None:
    """A hook handle is being removed: the watches whose modules (or the global hooks) hold its dict are told."""
    _bump()
    ref = getattr(handle, "hooks_dict_ref", None)
    hooks_dict = ref() if ref is not None else None
    if hooks_dict is None:
        return
    for watch in list(_watches):
        watch.dict_touched(hooks_dict)


def _install() -> None:
    """Hook the events that relocate tensors or change what a forward runs; idempotent and process-wide.

    Forward hooks are part of what a graph recorded: one added or removed after a capture must not be
    ignored by the replay, so registering one (per module or global) and removing any hook count as events."""
    global _installed
    with _install_lock:
        if _installed:
            return
        _module.register_module_parameter_registration_hook(_bump_structure)
        _module.register_module_buffer_registration_hook(_bump_structure)
        _module.register_module_module_registration_hook(_bump_structure)
        _bumping(torch.nn.Module, "_apply", _bump_structure)
        for name in ("register_forward_hook", "register_forward_pre_hook"):
            _bumping(torch.nn.Module, name, _hook_registered)
        for name in ("register_module_forward_hook", "register_module_forward_pre_hook"):
            _bumping(_module, name, _global_hook_registered)
        _bumping(torch.utils.hooks.RemovableHandle, "remove", _hook_removed)
        _installed = True


def _hooks(modules: Sequence[torch.nn.Module]) -> tuple:
    """Which forward hooks would run: each module's and the global ones (handle ids are never reused)."""
    mine = tuple((tuple(m._forward_pre_hooks), tuple(m._forward_hooks)) for m in modules)
    return mine, tuple(_module._global_forward_pre_hooks), tuple(_module._global_forward_hooks)


def epoch() -> int:
    """The process-wide relocation counter: it moves when any module's tensors may have moved."""
    if not _installed:
        _install()
    return _epoch


def _holds(module: torch.nn.Module) -> tuple:
    """What ``module`` holds itself: its parameters and buffers (each one's identity and address) and its
    submodules (identity), by name."""
    return (
        tuple((name, id(t), _address(t)) for name, t in module._parameters.items()),
        tuple((name, id(t), _address(t)) for name, t in module._buffers.items()),
        tuple((name, id(m)) for name, m in module._modules.items()),
    )


def _address(tensor: torch.Tensor | None) -> int:
    return 0 if tensor is None else addressed([tensor])[0].data_ptr()


def spread(n: int, k: int = _SPOT) -> list[int]:
    """Up to ``k`` indices evenly spread over ``range(n)``, first and last included: what a spot check reads."""
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)}) if n > 1 else list(range(n))


class RelocationWatch:
    """Answers "did anything the graphs read move since the last call?" cheaply, on every call."""

    def __init__(self, model: torch.nn.Module, full: bool = False) -> None:
        _install()
        self._model = model
        self._full = full
        self._snapshot()

    def _snapshot(self) -> None:
        self._epoch, self._structure, self._unattributed = _epoch, _structure, _unattributed
        self._modules = list(self._model.modules())
        self._holding = {id(m): _holds(m) for m in self._modules}
        self._reshaped: set[torch.nn.Module] = set()  # its modules named by a structure event since the snapshot
        _watched.update(self._modules)
        _watches.add(self)
        self._hook_ids = _hooks(self._modules)
        self._hooks_of = {id(m): hooks for m, hooks in zip(self._modules, self._hook_ids[0], strict=True)}
        self._owners = {id(m._forward_hooks): m for m in self._modules} | {
            id(m._forward_pre_hooks): m for m in self._modules
        }
        self._touched: set[Any] = set()  # modules (or _GLOBAL) whose forward hooks changed since the snapshot
        self._dicts = [d for m in self._modules for d in (m._parameters, m._buffers) if d]
        self._tensors = list(filter(_not_none, itertools.chain.from_iterable(map(dict.values, self._dicts))))
        self._ids = tuple(map(id, self._tensors))
        self._sharded = any(hasattr(t, "_local_tensor") for t in self._tensors)  # DTensors: read their shards
        located = addressed(self._tensors) if self._sharded else self._tensors
        self._ptrs = [t.data_ptr() for t in located]
        self._indices = list(range(len(self._tensors)))
        n = len(self._tensors)
        self._spot = [located[i] for i in spread(n)]
        self._spot_ptrs = [t.data_ptr() for t in self._spot]
        self._spot_indices = list(range(len(self._spot)))
        cuda = [t.device for t in self._tensors if t.is_cuda]
        self.cuda_device: torch.device | None = cuda[0] if cuda else None

    def _unchanged_full(self) -> bool:
        current = list(filter(_not_none, itertools.chain.from_iterable(map(dict.values, self._dicts))))
        located = addressed(current) if self._sharded else current
        return tuple(map(id, current)) == self._ids and ptrs_equal(located, self._ptrs, self._indices)

    def moved(self) -> bool:
        """True once after parameters or buffers were relocated (or forward hooks added or removed); the watch then
        follows the new ones."""
        if self._epoch == _epoch and (
            self._unchanged_full() if self._full else ptrs_equal(self._spot, self._spot_ptrs, self._spot_indices)
        ):
            return False
        if self._structure_kept() and self._hooks_unchanged() and self._tensors_unchanged():
            # events elsewhere, hooks that came and went inside a forward, modules set again as they were
            self._epoch, self._structure = _epoch, _structure
            return False
        old_ids, old_ptrs, old_hooks = self._ids, self._ptrs, self._hook_ids
        self._snapshot()
        return self._ids != old_ids or self._ptrs != old_ptrs or self._hook_ids != old_hooks

    def structure_touched(self, module: torch.nn.Module) -> None:
        """A structure event (``_apply``, a registration) concerns ``module``."""
        if id(module) in self._holding:
            self._reshaped.add(module)

    def _structure_kept(self) -> bool:
        """The structure events since the snapshot left this watch's modules holding what they held: none, or each
        named its module and that module holds the same tensors at the same addresses and the same submodules (a
        module set again to itself, ``.to()`` to the dtype it has); only those modules are read."""
        if self._structure == _structure:
            return True
        if self._unattributed != _unattributed:
            return False
        if any(_holds(m) != self._holding[id(m)] for m in self._reshaped):
            return False
        self._reshaped.clear()
        return True

    def hooks_touched(self, module: object) -> None:
        """A forward hook is being registered on ``module`` (``_GLOBAL``: a global one)."""
        if module is _GLOBAL or id(module) in self._hooks_of:
            self._touched.add(module)

    def dict_touched(self, hooks_dict: object) -> None:
        """A hook was removed from ``hooks_dict``: one of this watch's modules', the global ones', or neither."""
        owner = self._owners.get(id(hooks_dict))
        if owner is not None:
            self._touched.add(owner)
        elif hooks_dict is _module._global_forward_hooks or hooks_dict is _module._global_forward_pre_hooks:
            self._touched.add(_GLOBAL)

    def _hooks_unchanged(self) -> bool:
        """The forward hooks of the modules touched since the snapshot are those it saw (hooks registered and
        removed inside one forward leave them so); only those modules are read."""
        for touched in self._touched:
            if touched is _GLOBAL:
                now = (tuple(_module._global_forward_pre_hooks), tuple(_module._global_forward_hooks))
                if now != self._hook_ids[1:]:
                    return False
            elif (tuple(touched._forward_pre_hooks), tuple(touched._forward_hooks)) != self._hooks_of[id(touched)]:
                return False
        self._touched.clear()
        return True

    def _tensors_unchanged(self) -> bool:
        return self._unchanged_full() if self._full else ptrs_equal(self._spot, self._spot_ptrs, self._spot_indices)

    # ---- the graph cache's validity check (``cache.Guard``) --------------------------------------------
    def arm(self, leaves: object = ()) -> None:
        """Watched from construction on: a capture reads the parameters where the last check saw them."""

    def stale(self, leaves: object = ()) -> str | None:
        if not self.moved():
            return None
        return (
            "parameters or buffers were relocated (.to(), .half(), load_state_dict(assign=True), a swapped "
            "submodule or parameter), or forward hooks were added or removed"
        )

    def requires_grad(self) -> bool:
        return any(t.requires_grad for t in self._tensors)


def picker(indices: list[int]) -> Callable[[Sequence[Any]], list]:
    """A fast ``lambda seq: [seq[i] for i in indices]`` (operator.itemgetter, always returning a list)."""
    if not indices:
        return lambda seq: []
    if len(indices) == 1:
        (i,) = indices
        return lambda seq: [seq[i]]
    get = operator.itemgetter(*indices)
    return lambda seq: list(get(seq))


def _through_shards(pick: Callable[[Sequence[Any]], list]) -> Callable[[Sequence[Any]], list]:
    """``pick`` with every DTensor replaced by its local shard (``addressed``); applied once, at the first arm."""
    if getattr(pick, "through_shards", False):
        return pick

    def located(seq: Sequence[Any]) -> list:
        return addressed(pick(seq))

    located.through_shards = True  # type: ignore[attr-defined]
    return located


class InputAddresses:
    """The graph cache's validity check for inputs a graph reads in place, where they are: a compiled graph's
    parameters and buffers, handed to it as inputs on every call.

    As ``RelocationWatch`` does for a module: a spot check of 8 per call, all of them after any event that can
    move them. Plain module attributes (``always``: no event announces their replacement) are compared on every
    call. After a failed check, ``moved`` holds the positions that moved, for the policy to act on.
    """

    def __init__(
        self, positions: Sequence[int], *, always: frozenset[int] = frozenset(), describe: Callable[[list], str] = str
    ) -> None:
        self.order = sorted(positions)
        self._pick = picker(self.order)
        self._index = list(range(len(self.order)))
        always_at = [k for k, i in enumerate(self.order) if i in always]
        self._always_at = always_at
        self._pick_always = picker([self.order[k] for k in always_at])
        self._always_index = list(range(len(always_at)))
        self._spot_at = spread(len(self.order))
        self._pick_spot = picker([self.order[k] for k in self._spot_at])
        self._spot_index = list(range(len(self._spot_at)))
        self._describe = describe
        self._ptrs: list[int] | None = None  # armed: the addresses the graphs read
        self._epoch = -1
        self.moved: list[int] = []

    def arm(self, leaves: Sequence[Any]) -> None:
        if any(hasattr(t, "_local_tensor") for t in self._pick(leaves)):  # DTensors: their shards' addresses
            self._pick, self._pick_always, self._pick_spot = (
                _through_shards(self._pick),
                _through_shards(self._pick_always),
                _through_shards(self._pick_spot),
            )
        self._ptrs = [t.data_ptr() for t in self._pick(leaves)]
        self._always_ptrs = [self._ptrs[k] for k in self._always_at]
        self._spot_ptrs = [self._ptrs[k] for k in self._spot_at]
        self._epoch = epoch()

    def stale(self, leaves: Sequence[Any]) -> str | None:
        if self._ptrs is None or not self.order:
            return None
        if self._always_at and not ptrs_equal(self._pick_always(leaves), self._always_ptrs, self._always_index):
            return self._moved(leaves)
        if self._epoch == _epoch:
            return (
                None if ptrs_equal(self._pick_spot(leaves), self._spot_ptrs, self._spot_index) else self._moved(leaves)
            )
        if ptrs_equal(self._pick(leaves), self._ptrs, self._index):
            self._epoch = _epoch
            return None
        return self._moved(leaves)

    def _moved(self, leaves: Sequence[Any]) -> str:
        now = [t.data_ptr() for t in self._pick(leaves)]
        self.moved = [i for i, a, b in zip(self.order, now, self._ptrs, strict=True) if a != b]
        self._ptrs = None  # disarmed: the graphs are dropped, the next one kept arms it again
        return f"{self._describe(self.moved)} moved"
