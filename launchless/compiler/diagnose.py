"""What blocks capture in an FX graph, node by node, with the user's source line.

The runtime finds a blocker by failing a capture; the compiler path sees the whole graph first. On an
aten-level graph whose nodes carry ``meta["val"]`` (fake tensors with devices) the blockers are:
- host syncs (``_local_scalar_dense``: ``.item()``, ``float(t)``) and data-dependent shapes (``nonzero``);
- copies between the host and the device (``_to_copy``/``copy_`` across devices), marked rewritable
  when the host side is built from constants only -- GraCE's CGCT case: construct it on the GPU, or
  move the copy to compile time;
- other CPU computation in a GPU graph (it would run once, at capture, and be frozen);
- in-place writes into graph inputs, and RNG-state reads or writes.
Source lines come from ``meta["stack_trace"]``, which Dynamo records for every node.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torch import fx

from ..diagnose.blockers import COPY, DATA_DEPENDENT, DATA_DEPENDENT_OPS, HOST_SYNC, syncs_with_the_host

CPU_NODE = "CPU computation"
INPUT_MUTATION = "input mutation"
RNG_STATE = "RNG state"
_COPIES = {"_to_copy", "copy_", "copy", "to"}
_CONSTRUCTORS = {
    "arange",
    "full",
    "zeros",
    "ones",
    "empty",
    "scalar_tensor",
    "lift_fresh_copy",
    "tensor",
    "linspace",
    "eye",
    "new_full",
    "new_zeros",
    "new_ones",
    "new_empty",
    "clone",
    "_to_copy",
}
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>\S+)')


@dataclass(frozen=True)
class GraphBlocker:
    """One node that stops capture of its graph, with where the user asked for it."""

    kind: str
    node: str
    target: str
    source: str | None = None
    rewritable: bool = False  # a host->device copy of constants: CGCT can build it on the device instead

    def describe(self) -> str:
        where = f" at {self.source}" if self.source else ""
        fix = " (rewritable: build it on the device)" if self.rewritable else ""
        return f"{self.kind}: {self.target} ({self.node}){where}{fix}"


def source_line(node: fx.Node) -> str | None:
    """``file:line in fn: code`` of the innermost frame in the node's recorded stack trace."""
    trace = node.meta.get("stack_trace") or ""
    lines = trace.rstrip().splitlines()
    for i in range(len(lines) - 1, -1, -1):
        match = _FRAME.search(lines[i])
        if match:
            code = lines[i + 1].strip() if i + 1 < len(lines) else ""
            return f"{match['file']}:{match['line']} in {match['fn']}" + (f": `{code}`" if code else "")
    return None


def _name(node: fx.Node) -> str:
    target = node.target
    packet = getattr(target, "_opname", None) or getattr(target, "__name__", str(target))
    return str(packet).split(".")[0]


def _devices(value: object) -> set[str]:
    values = value if isinstance(value, (list, tuple)) else [value]
    return {v.device.type for v in values if isinstance(v, torch.Tensor)}


def _host_constant(node: fx.Node, seen: dict[fx.Node, bool]) -> bool:
    """True when ``node`` is computed from constructors and constants only, never from a graph input."""
    if node in seen:
        return seen[node]
    if node.op == "placeholder":
        result = False
    elif node.op == "get_attr":
        result = True
    elif node.op == "call_function" and _name(node) in _CONSTRUCTORS | {
        "add",
        "mul",
        "sub",
        "div",
        "view",
        "reshape",
        "expand",
        "unsqueeze",
    }:
        result = all(_host_constant(a, seen) for a in node.all_input_nodes)
    else:
        result = False
    seen[node] = result
    return result


def diagnose(gm: fx.GraphModule) -> list[GraphBlocker]:
    """The nodes of ``gm`` that a CUDA-graph capture of it could not record, in graph order."""
    graph_devices = set().union(*(_devices(n.meta.get("val")) for n in gm.graph.nodes))
    on_gpu = "cuda" in graph_devices
    inputs = {n for n in gm.graph.nodes if n.op == "placeholder"}
    constants: dict[fx.Node, bool] = {}
    found: list[GraphBlocker] = []

    def add(kind: str, node: fx.Node, rewritable: bool = False) -> None:
        found.append(GraphBlocker(kind, node.name, str(node.target), source_line(node), rewritable))

    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        name = _name(node)
        out = _devices(node.meta.get("val"))
        args_dev = (
            set().union(*(_devices(a.meta.get("val")) for a in node.all_input_nodes)) if node.all_input_nodes else set()
        )
        if syncs_with_the_host(name, node.args, node.kwargs):
            add(HOST_SYNC, node)
        elif name in DATA_DEPENDENT_OPS:
            add(DATA_DEPENDENT, node)
        elif "rng_state" in name or name in ("seed", "manual_seed"):
            add(RNG_STATE, node)
        elif name in _COPIES and len(out | args_dev) > 1:
            add(COPY, node, rewritable=all(_host_constant(a, constants) for a in node.all_input_nodes))
        elif on_gpu and out == {"cpu"} and not all(_name(u) in _COPIES for u in node.users):
            add(CPU_NODE, node)
        if name.endswith("_") and node.args and node.args[0] in inputs:
            add(INPUT_MUTATION, node)
    return found
