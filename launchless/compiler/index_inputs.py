"""Float inputs that a graph reads as addresses, which verification must not fill with random values.

roi_align's boxes carry their image's batch index as a float, and a float cast to an integer can index
another tensor. Random probes there make eager and the graph read out of bounds: on a small feature map that
is garbage (eager differs from itself), on a large one a fault that kills the CUDA context -- no later call
of the process can recover (R-CNN with a ResNet-50 FPN did so). Such inputs are probed from the call's own
values instead (``verify.make_probes``'s ``from_call``). The runtime, which has no graph, follows its inputs
through a warm-up run instead (``index_trace``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import fx

from ..core.index_trace import ROI_OPS, is_integer_dtype

_INT_METHODS = {"long", "int", "short", "char", "byte"}
_CASTS = {"to", "type", "_to_copy", "convert_element_type"}  # Dynamo's methods, aten and prims ops


def _op_name(node: fx.Node) -> str:
    target = node.target
    return target if isinstance(target, str) else getattr(target, "__name__", None) or str(target)


def _value(node: Any) -> Any:
    return node.meta.get("example_value", node.meta.get("val")) if isinstance(node, fx.Node) else None


def _float_to_int_cast(node: fx.Node) -> fx.Node | None:
    """The floating tensor a cast to an integer dtype reads, if ``node`` is one."""
    if not node.args or not isinstance(node.args[0], fx.Node):
        return None
    name = _op_name(node).split(".")[0]  # "_to_copy.default" -> "_to_copy"
    to_int = (node.op == "call_method" and name in _INT_METHODS) or (
        name in _CASTS and any(is_integer_dtype(a) for a in (*node.args[1:], *node.kwargs.values()))
    )
    if not to_int:
        return None
    source = _value(node.args[0])
    is_float = not isinstance(source, torch.Tensor) or source.is_floating_point()  # unknown: the safe side
    return node.args[0] if is_float else None


def _sinks(gm: fx.GraphModule) -> list[fx.Node]:
    """The nodes whose values are read as addresses: roi ops' boxes and floats cast to integers."""
    found = []
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method"):
            continue
        if _op_name(node).split(".")[0] in ROI_OPS:  # roi_align, roi_align.default (the aten graph's overload)
            rois = node.args[1] if len(node.args) > 1 else node.kwargs.get("rois", node.kwargs.get("boxes"))
            if isinstance(rois, fx.Node):
                found.append(rois)
        elif (source := _float_to_int_cast(node)) is not None:
            found.append(source)
    return found


def index_like_inputs(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> frozenset[int]:
    """Positions of the floating tensor inputs from which a value read as an address is computed."""
    reaching: set[fx.Node] = set()
    stack = _sinks(gm)
    while stack:
        node = stack.pop()
        if node not in reaching:
            reaching.add(node)
            stack.extend(node.all_input_nodes)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    return frozenset(
        i
        for i, (node, value) in enumerate(zip(placeholders, example_inputs, strict=False))
        if node in reaching and isinstance(value, torch.Tensor) and value.is_floating_point()
    )
