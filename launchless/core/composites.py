"""Operations made of others (``CompositeImplicitAutograd``) as a dispatch mode sees them.

Under ``torch.no_grad()`` such an operation decomposes at autograd's dispatch key, before a dispatch mode sees it:
the mode sees its parts (``type_as``: the ``_to_copy`` that moves a host tensor). Under ``torch.inference_mode()``
autograd's key is skipped and the mode sees it whole. A mode that reads operations -- a host copy, a float cast to
an integer, the operation a capture failed in -- would read other things per grad mode; ``run_decomposed`` lets it
see the parts in both, running the kernels eager runs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import _pytree as pytree


def is_composite(func: object) -> bool:
    """An operation made of others (``where(condition)`` of ``nonzero``). A dispatch mode sees it whole under
    ``torch.inference_mode()``, where autograd's dispatch key -- at which composites decompose -- is skipped, and
    its parts under ``torch.no_grad()``."""
    name = getattr(func, "name", None)
    return callable(name) and torch._C._dispatch_has_kernel_for_dispatch_key(name(), "CompositeImplicitAutograd")


def has_kernel_of_its_own(func: Any, devices: set[str]) -> bool:
    """Whether an operation made of others has a kernel of its own for a device among ``devices`` (``cuda``:
    ``_fused_rms_norm``'s fused kernel): there eager runs that kernel, in both grad modes, not the parts."""
    name = func.name()
    keys = [_BACKEND_KEYS.get(d) for d in devices]  # another device: taken to have one (the op is left whole)
    return any(key is None or torch._C._dispatch_has_kernel_for_dispatch_key(name, key) for key in keys)


_BACKEND_KEYS = {"cpu": "CPU", "cuda": "CUDA", "meta": "Meta"}


def run_decomposed(mode: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    """``func`` run as the operations it is made of, each seen by the dispatch ``mode`` (from inside its
    ``__torch_dispatch__``), as under ``torch.no_grad()``; NotImplemented for an operation that eager does not run
    as its parts (not made of others, or with a kernel of its own for these tensors' device). A mode that looks at
    each operation (a host copy, a blocker) so reads the same operations in both grad modes, and the kernels that
    run are eager's: the C++ composite's parts, not those of the Python decomposition ``OpOverload.decompose``
    prefers where torch registers one (``matmul``, ``lstm``, the ``upsample`` family), which could round otherwise."""
    if not is_composite(func):
        return NotImplemented
    devices = {t.device.type for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
    if has_kernel_of_its_own(func, devices):
        return NotImplemented
    with mode:
        return func._op_dk(torch._C.DispatchKey.CompositeImplicitAutograd, *args, **kwargs)
