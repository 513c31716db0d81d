"""Whether an operation's output shape follows from its inputs' shapes alone, proven by PyTorch's own shape functions.

A graph (and an operation run eager between two graphs) is only safe to replay when every shape it produces is the
one it produced at capture. PyTorch tags some operations whose output shape depends on the values they read
(``nonzero``, ``unique``, ``masked_select``), but the tags are not enough to decide:

- composite operations carry no tag of their own. Under ``torch.inference_mode()`` a dispatch mode sees
  ``aten::where(condition)`` itself, not the ``nonzero`` it decomposes into under ``torch.no_grad()`` (autograd's
  dispatch key, where composites decompose, is skipped), so a tag check gives one verdict per grad mode;
- operations of other libraries carry none at all (``torchvision::nms`` returns as many boxes as survive).

Running the operation on fake tensors (shapes, dtypes and devices without data) through its registered shape
function decides both: a composite decomposes there, and a library's fake implementation that returns a
data-dependent size raises. An operation with no shape function is not proven, so it is treated as
data-dependent. A primitive ``aten`` operation whose shape function refuses the inputs its kernel accepts
(``_grouped_mm``'s asks for bfloat16; the CUDA kernel also takes float32) is judged by its tags, which PyTorch keeps
complete for its own primitives.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import torch
from torch.utils import _pytree as pytree

from ..errors import one_line
from .composites import is_composite

DATA_DEPENDENT_SHAPE = "its output's shape depends on the values it reads"
HOST_VALUE = "it hands a value it read to the host"


def data_dependence(func: Any, args: tuple, kwargs: dict) -> str:
    """Empty when ``func(*args, **kwargs)``'s output shapes follow from its inputs' shapes (proven on fake tensors,
    or by the tags of a primitive ``aten`` operation, which the caller checks first); otherwise why not. Runs no
    kernel and allocates no device memory, so it may run while a stream captures. PyTorch's own log line for a shape
    function that raises is held back: the refusal is the answer here."""
    from torch._subclasses.fake_tensor import (
        DataDependentOutputException,
        DynamicOutputShapeException,
        FakeTensorMode,
        UnsupportedOperatorException,
    )

    fake_log = logging.getLogger("torch._subclasses.fake_tensor")
    level = fake_log.level
    fake_log.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a library's fake implementation may warn about its own API
            with FakeTensorMode(allow_fallback_kernels=False) as mode:
                fake_args, fake_kwargs = pytree.tree_map_only(torch.Tensor, mode.from_tensor, (args, kwargs))
                func(*fake_args, **fake_kwargs)
    except DynamicOutputShapeException:
        return DATA_DEPENDENT_SHAPE
    except DataDependentOutputException:
        return HOST_VALUE
    except UnsupportedOperatorException:
        return "its library registers no shape function for it: its output's shape may depend on its values"
    except Exception as exc:  # a shape function that refuses these inputs proves nothing
        if getattr(func, "namespace", None) == "aten" and not is_composite(func):
            return ""  # its tags, checked before, say its shape follows from shapes
        return f"its output's shape could not be derived from its inputs' shapes ({one_line(exc)})"
    finally:
        fake_log.setLevel(level)
    return ""
