"""Input signature -> cache key.

A graph records addresses, shapes and the kernels chosen for them, so everything that could make
eager take another path is part of the key: the tree structure of the inputs, each tensor's shape,
stride, dtype, device and requires_grad, every non-tensor value (with its type: ``1`` and ``True``
are different keys), and the autocast state. The common case -- tensors and scalars passed
positionally or by keyword -- skips ``torch.utils._pytree``, whose flattening would be most of the
per-call cost.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import Any, NamedTuple

import torch
from torch.utils import _pytree as pytree

from .output_tree import is_cache

Tensor = torch.Tensor


class TensorSpec(NamedTuple):
    """What a graph's static buffer for one tensor input must match."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    requires_grad: bool

    def __str__(self) -> str:
        dims = "x".join(map(str, self.shape)) or "scalar"
        grad = ", requires_grad" if self.requires_grad else ""
        return f"{str(self.dtype).removeprefix('torch.')}[{dims}]@{self.device}{grad}"


class Signature(NamedTuple):
    """A cache key: input structure, per-leaf specs and the autocast context."""

    structure: Hashable
    leaves: tuple
    context: tuple

    def describe(self) -> str:
        parts = [_describe_value(leaf) if leaf[0] == "value" else str(TensorSpec(*leaf)) for leaf in self.leaves]
        ctx = f", autocast={self.context[1]}" if self.context[0] else ""
        return f"({', '.join(parts)}{ctx})"


def _describe_value(leaf: tuple) -> str:
    value = float.fromhex(leaf[2]) if leaf[1] is float else leaf[2]
    return f"{leaf[1].__name__}={value!r}"


class UnhashableInput(TypeError):
    """A non-tensor input cannot be part of a cache key (or is an object the forward changes in place)."""


_PLAIN_VALUES = frozenset({bool, int, float, str, type(None), torch.dtype, torch.device})


def _is_cache_object(value: Any) -> bool:
    return is_cache(type(value))


class FlatInputs(NamedTuple):
    """Inputs flattened to leaves, with what is needed to rebuild (args, kwargs) from new leaves."""

    leaves: list
    structure: Hashable
    rebuild: Callable[[list], tuple[tuple, dict]]


def _rebuild_fast(nargs: int, keys: tuple[str, ...]) -> Callable[[list], tuple[tuple, dict]]:
    def rebuild(leaves: list) -> tuple[tuple, dict]:
        return tuple(leaves[:nargs]), dict(zip(keys, leaves[nargs:], strict=True))

    return rebuild


_FLAT_TYPES = (Tensor, bool, int, float, str, type(None))


def _flat_leaf(value: Any) -> bool:
    return isinstance(value, _FLAT_TYPES)


def flatten_inputs(args: tuple, kwargs: dict) -> FlatInputs:
    """Flatten ``(args, kwargs)``; calls passing only tensors and scalars skip pytree (most of the cost)."""
    if all(map(_flat_leaf, args)) and all(map(_flat_leaf, kwargs.values())):
        keys = tuple(kwargs)
        return FlatInputs([*args, *kwargs.values()], ("fast", len(args), keys), _rebuild_fast(len(args), keys))
    leaves, spec = pytree.tree_flatten((args, kwargs), is_leaf=_is_cache_object)

    def rebuild(new_leaves: list) -> tuple[tuple, dict]:
        return pytree.tree_unflatten(new_leaves, spec)

    return FlatInputs(leaves, spec, rebuild)


def tensor_spec(t: Tensor) -> TensorSpec:
    return TensorSpec(t.shape, t.stride(), t.dtype, t.device, t.requires_grad)


def _leaf_key(leaf: Any) -> Any:
    """A plain tuple (the same fields as TensorSpec: building a NamedTuple per call costs more)."""
    if isinstance(leaf, Tensor):
        return (leaf.shape, leaf.stride(), leaf.dtype, leaf.device, leaf.requires_grad)
    if type(leaf) not in _PLAIN_VALUES and _is_cache_object(leaf):
        raise UnhashableInput(
            f"a transformers cache ({type(leaf).__name__}) is passed in, and the forward updates it in place; a "
            "replay works on the graph's own copies and would leave your cache behind, so calls with a cache "
            "passed in run eager (calls without one, such as the prefill, are captured)"
        )
    try:
        hash(leaf)
    except TypeError as exc:
        raise UnhashableInput(
            f"a non-tensor input of type {type(leaf).__name__} is not hashable, so it cannot be part of "
            "a graph's cache key; pass it as a tensor, or as a hashable value (tuple, number, string)"
        ) from exc
    if type(leaf) is float:  # -0.0 == 0.0 and nan != nan, but a graph bakes in the exact bits
        return ("value", float, leaf.hex())
    return ("value", type(leaf), leaf)


_cublas_tf32 = torch._C._get_cublas_allow_tf32
_cudnn_tf32 = torch._C._get_cudnn_allow_tf32


def autocast_context(device_type: str = "cuda") -> tuple:
    """Autocast and the TF32 switches change which kernels run; a graph keeps the ones it captured."""
    tf32 = (_cublas_tf32(), _cudnn_tf32())
    if torch.is_autocast_enabled(device_type):
        return (True, torch.get_autocast_dtype(device_type), *tf32)
    return (False, None, *tf32)


def signature_of(flat: FlatInputs) -> Signature:
    return Signature(flat.structure, tuple(map(_leaf_key, flat.leaves)), autocast_context())


def signature_of_leaves(structure: Any, leaves: Iterable[Any]) -> Signature:
    """A signature over chosen leaves: the compiler path leaves out parameters, which Dynamo guards itself."""
    return Signature(structure, tuple(map(_leaf_key, leaves)), autocast_context())


def positional_rebuilder(count: int) -> Callable[[list], tuple[tuple, dict]]:
    """``rebuild`` for a FlatInputs whose leaves are exactly ``count`` positional arguments."""
    return _rebuild_fast(count, ())
