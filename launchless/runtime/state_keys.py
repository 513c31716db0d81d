"""A wrapped model saves and loads the model's own state_dict keys -- also inside a parent module.

``GraphedModule`` holds the model as its child ``model`` (so ``.to()``, ``.train()`` and friends
reach it), which would put a ``model.`` segment in every key, as ``torch.compile``'s ``_orig_mod.``
does. These two hooks take it out on save and put it back on load, metadata included, so a
checkpoint moves freely between the wrapped and the plain model.
"""

from __future__ import annotations

from typing import Any

import torch

CHILD = "model"


def _rename(mapping: dict, old: str, new: str, *, keep: str | None = None) -> None:
    """Move keys starting with ``old`` to start with ``new`` instead, preserving order of the rest."""
    for key in [k for k in mapping if k.startswith(old) and (keep is None or not k.startswith(keep))]:
        mapping[new + key[len(old) :]] = mapping.pop(key)


def _meta_names(prefix: str) -> tuple[str, str]:
    """Metadata is keyed by module path without the trailing dot: the wrapper's own and its child's."""
    own = prefix[:-1]
    return own, f"{prefix}{CHILD}"


def strip_child(module: torch.nn.Module, state_dict: dict, prefix: str, local_metadata: Any) -> None:
    _rename(state_dict, f"{prefix}{CHILD}.", prefix)
    meta = getattr(state_dict, "_metadata", None)
    if meta is not None:
        own, child = _meta_names(prefix)
        if child in meta:
            meta[own] = meta.pop(child)
        _rename(meta, f"{child}.", prefix)


def add_child(module: torch.nn.Module, state_dict: dict, prefix: str, local_metadata: Any, *_: Any) -> None:
    _rename(state_dict, prefix, f"{prefix}{CHILD}.", keep=f"{prefix}{CHILD}.")
    meta = getattr(state_dict, "_metadata", None)
    if meta is not None:
        own, child = _meta_names(prefix)
        for key in [k for k in meta if k.startswith(prefix) and not k.startswith(child)]:
            meta.setdefault(f"{prefix}{CHILD}.{key[len(prefix) :]}", meta[key])
        if own in meta:
            meta.setdefault(child, meta[own])


def install(module: torch.nn.Module) -> None:
    module.register_state_dict_post_hook(strip_child)
    module.register_load_state_dict_pre_hook(add_child)
