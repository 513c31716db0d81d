"""Aten graphs whose node values are fake CUDA tensors: GPU graphs to analyse on a machine without a GPU."""

from __future__ import annotations

import pytest
import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import ShapeEnv


def trace_on_fake_cuda(fn, *shapes) -> fx.GraphModule:
    """An aten graph of ``fn`` on fake CUDA inputs of ``shapes``; skips where the torch build cannot fake CUDA."""
    try:
        with FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv()):
            inputs = [torch.empty(s, device="cuda") for s in shapes]
            return make_fx(fn, tracing_mode="real")(*inputs)
    except RuntimeError as exc:
        if "not linked with support for cuda" not in str(exc):
            raise
        pytest.skip("this torch build cannot make fake CUDA tensors (CPU wheels up to torch 2.13; 2.14's can)")
