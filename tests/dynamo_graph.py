"""The FX graph and example inputs Dynamo hands to a backend, for CPU tests of what a backend reads off it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import fx


def dynamo_graph(fn: Callable[..., Any], *inputs: Any) -> tuple[fx.GraphModule, list]:
    """The first graph Dynamo makes of ``fn(*inputs)`` (its inputs' order is Dynamo's, not the function's)."""
    seen = []

    def record(gm, example_inputs):
        seen.append((gm, list(example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=record)(*inputs)
    return seen[0]
