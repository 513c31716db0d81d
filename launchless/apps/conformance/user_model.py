"""``launchless verify MODEL``: MODEL is a zoo workload name, or ``package.module:function`` of the user's own.

The function takes no arguments and returns ``(model, inputs)``: ``inputs`` is a tuple of positional arguments,
an ``(args, kwargs)`` pair, or a function of no arguments returning either (called for fresh inputs: the
check compares the graph with eager on a second set). The model is moved to the GPU and put in eval mode.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_map

from ...diagnose.source import locate_exception
from ...errors import one_line
from .. import zoo
from .check import Inputs


class ModelSpecError(ValueError):
    """MODEL names neither a zoo workload nor a ``module:function`` that gives a model and its inputs."""


def _as_inputs(value: Any) -> Inputs:
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], tuple) and isinstance(value[1], dict):
        return value
    if isinstance(value, tuple):
        return value, {}
    if isinstance(value, torch.Tensor):
        return (value,), {}
    raise ModelSpecError(
        f"the inputs must be a tuple of arguments or an (args, kwargs) pair, got {type(value).__name__}"
    )


def load(spec: str, *, device: str = "cuda") -> tuple[torch.nn.Module, Callable[[], Inputs], str]:
    """(model, fresh-inputs factory, task) for ``spec`` on ``device``."""
    if spec in zoo.names():
        from .worker import task_of

        workload = zoo.build(spec, device=device)
        return workload.model, workload.inputs, task_of(spec)
    module_name, sep, function_name = spec.partition(":")
    if not sep or not module_name or not function_name:
        raise ModelSpecError(
            f"{spec!r} is not a zoo workload (see `launchless demo --list`) nor package.module:function returning "
            "(model, inputs)"
        )
    try:
        function = getattr(importlib.import_module(module_name), function_name)
    except (ImportError, AttributeError) as exc:
        raise ModelSpecError(f"cannot load {spec!r}: {exc}") from exc
    try:
        returned = function()
    except Exception as exc:  # the user's own code: its error and where it raised, not a traceback of ours
        where = locate_exception(exc)
        raise ModelSpecError(
            f"{spec} raised {one_line(exc)}{f' at {where}' if where else ''}; it is called with no arguments and "
            "must return (model, inputs)"
        ) from exc
    if not (isinstance(returned, (tuple, list)) and len(returned) == 2):
        raise ModelSpecError(f"{spec} returned {type(returned).__name__} where a pair (model, inputs) was expected")
    model, inputs = returned
    if not isinstance(model, torch.nn.Module):
        raise ModelSpecError(f"{spec} returned {type(model).__name__} where a torch.nn.Module was expected")
    model = model.to(device).eval()

    def move(value: Any) -> Any:
        return value.to(device) if isinstance(value, torch.Tensor) else value

    def make() -> Inputs:
        return tree_map(move, _as_inputs(inputs() if callable(inputs) else inputs))

    return model, make, "user"
