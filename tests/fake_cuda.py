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
    except RuntimeError as exc:  # torch.AcceleratorError is one
        if "not linked with support for cuda" in str(exc):
            pytest.skip("this torch build cannot make fake CUDA tensors (CPU wheels up to torch 2.13; 2.14's can)")
        if any(words in str(exc) for words in NO_DRIVER):
            # a CUDA build on a machine without a GPU: a constant folded onto the fake device runs for real
            pytest.skip(f"a CUDA build of torch without a GPU driver here: {str(exc).splitlines()[0]}")
        raise


NO_DRIVER = ("Found no NVIDIA driver", "CUDA driver version is insufficient")
