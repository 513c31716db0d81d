"""Output containers a graph can hand back: transformers' caches and dataclasses, flattened like ModelOutput.

A graph's outputs are fixed buffers that the next replay overwrites, so every replay hands back copies, and
verification compares eager's and the graph's outputs leaf by leaf. Both need to see every tensor inside
what the forward returns. ``torch.utils._pytree`` sees into tuples, lists, dicts, namedtuples and the classes
registered with it (transformers registers its ``ModelOutput``). Two kinds of object are not registered and
are common in outputs:

- transformers' ``Cache`` objects (``DynamicCache``, ``EncoderDecoderCache``, ``StaticCache``, model-specific
  ``*Cache`` classes and the layer objects they hold), returned by default by decoders and encoder-decoders;
- dataclasses of the user's own.

``see_into(outputs)`` registers those it finds with pytree, with a flatten that lists the object's attributes
(or dataclass fields) in order and an unflatten that rebuilds a new object of the class without calling its
constructor -- as ``ModelOutput`` is rebuilt -- so a copy holds fresh tensors and the same plain values. The
plain values an object holds (ints, flags, devices) can only depend on shapes and non-tensor inputs inside a
capturable forward (reading a tensor's value would have synchronised, which a capture refuses), so they are
the same on every replay of one signature. Registration is process-wide and idempotent; a class pytree already
knows is left alone. Objects of any other class stay opaque, and a capture returning one is refused by name.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Iterable
from typing import Any

from torch.utils import _pytree as pytree

_lock = threading.Lock()
_registered: set[type] = set()


@functools.lru_cache(maxsize=1024)
def is_cache(cls: type) -> bool:
    """A transformers cache class (a ``Cache`` subclass, or a ``*Cache`` class of a transformers module), or one
    of the classes ``transformers.cache_utils`` builds caches from (its layers)."""
    module = getattr(cls, "__module__", "") or ""
    if not module.startswith("transformers"):
        return False
    if module.endswith("cache_utils") or cls.__name__.endswith("Cache"):
        return True
    return any(base.__name__ == "Cache" and base.__module__.startswith("transformers") for base in cls.__mro__)


def _seeable(value: Any) -> bool:
    cls = type(value)
    if cls in pytree.SUPPORTED_NODES:
        return False
    return is_cache(cls) or (dataclasses.is_dataclass(value) and not isinstance(value, type))


def _names(obj: Any) -> tuple[str, ...]:
    """Every attribute the object holds (a dataclass's ``__post_init__`` may add some); fields where it has
    no ``__dict__`` (``slots=True``)."""
    if hasattr(obj, "__dict__"):
        return tuple(vars(obj))
    return tuple(f.name for f in dataclasses.fields(obj))


def _flatten(obj: Any) -> tuple[list[Any], tuple[str, ...]]:
    names = _names(obj)
    return [getattr(obj, name) for name in names], names


def _unflatten_for(cls: type):
    def unflatten(values: Iterable[Any], names: tuple[str, ...]) -> Any:
        new = cls.__new__(cls)
        for name, value in zip(names, values, strict=True):
            object.__setattr__(new, name, value)  # frozen dataclasses and __setattr__ overrides alike
        return new

    return unflatten


def _register(cls: type) -> None:
    with _lock:
        if cls in _registered or cls in pytree.SUPPORTED_NODES:
            return
        pytree.register_pytree_node(
            cls,
            _flatten,
            _unflatten_for(cls),
            serialized_type_name=f"{cls.__module__}.{cls.__qualname__}",
        )
        _registered.add(cls)


def see_into(outputs: Any) -> list[str]:
    """Register every cache and dataclass found in ``outputs`` (nested ones too) with pytree; returns the names
    of the classes registered now."""
    added: list[str] = []
    while True:
        found = {type(leaf) for leaf in pytree.tree_leaves(outputs) if _seeable(leaf)}
        if not found:
            return added
        for cls in found:
            _register(cls)
            added.append(cls.__qualname__)
