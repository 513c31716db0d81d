"""``torch.compile(model, backend="launchless")``: Inductor's kernels, launchless's graphs.

For each FX graph Dynamo hands over, Inductor compiles without its own CUDA graphs
(``triton.cudagraphs=False``); launchless then captures the compiled callable per input signature
with its own capture primitive (``compiled_graphs.CompiledGraphs``: parameters read in place, the
other inputs copied in or pointed at, each graph verified and its fastest variant kept). A graph
that holds host tensors next to CUDA ones gets CGCT before it is compiled, so the rewritten graph is
the only one Inductor compiles. Graph breaks give several FX graphs; each is handled on its own. A
graph that cannot be captured (a host sync, a CPU tensor) or that needs autograd (training) runs
compiled, without a CUDA graph, with one log line naming why.
"""

from __future__ import annotations

import logging
import re
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx
from torch.utils import _pytree as pytree

from ..core import relocation
from .cgct import try_rewrite
from .compiled_graphs import CompiledGraphs, Compiler
from .decisions import DecisionCache, graph_hash
from .index_inputs import index_like_inputs

log = logging.getLogger("launchless")


def inductor_without_graphs(gm: fx.GraphModule, example_inputs: list) -> Callable[..., Any]:
    from torch._inductor.compile_fx import compile_fx

    return compile_fx(gm, example_inputs, config_patches={"triton.cudagraphs": False})


def static_input_indices(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> frozenset[int]:
    """Inputs whose address is fixed for the life of the model: parameters and buffers."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    static = set()
    for i, (node, value) in enumerate(zip(placeholders, example_inputs, strict=False)):
        marked = node.meta.get("tensor_dict", {}).get("_dynamo_static_input_type")
        if isinstance(value, torch.nn.Parameter) or marked or getattr(value, "_dynamo_static_input_type", None):
            static.add(i)
    return frozenset(static)


_REGISTERED = re.compile(r"_(parameters|buffers)_")  # in Dynamo's input name of a parameter or buffer


def input_names(gm: fx.GraphModule) -> list[str]:
    """Each input's name as Dynamo derives it from its source: ``L_self_modules_fc_parameters_weight_`` for a
    parameter, ``L_self_buffers_shift_`` for a buffer, ``L_self_modules_head_anchors_0_`` for an attribute."""
    return [str(n.target) for n in gm.graph.nodes if n.op == "placeholder"]


def tensor_attribute_indices(
    names: Sequence[str], example_inputs: Sequence[Any], static: frozenset[int]
) -> frozenset[int]:
    """Static inputs that are plain module tensor attributes, not parameters or buffers: no registration hook
    sees them replaced, so their addresses are checked on every call. Told apart by Dynamo's input names
    (the source is not handed to backends); an input without a name counts as an attribute (the safe side)."""
    return frozenset(
        i
        for i in static
        if not isinstance(example_inputs[i], torch.nn.Parameter)
        and not (i < len(names) and _REGISTERED.search(names[i]))
    )


def holds_host_tensors(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> bool:
    """CUDA tensors and host tensors in one graph: its capture would stop at the first host-to-device copy."""
    values = [*example_inputs, *(n.meta.get("example_value", n.meta.get("val")) for n in gm.graph.nodes)]
    devices = {t.device.type for v in values for t in pytree.tree_leaves(v) if isinstance(t, torch.Tensor)}
    return "cuda" in devices and "cpu" in devices


def _compile_or_rescue(
    name: str, gm: fx.GraphModule, example_inputs: list, inner: Compiler, cgct: bool
) -> Callable[..., Any]:
    """Compile; a graph Inductor rejects (e.g. "found two different devices cuda:0, cpu") gets one CGCT
    attempt, then runs as the plain FX graph -- a compile error must not stop the user's model."""
    try:
        return inner(gm, example_inputs)
    except Exception as exc:
        error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    if cgct:
        result = try_rewrite(gm, example_inputs, static_input_indices(gm, example_inputs), inner)
        if result.compiled is not None:
            rewrites = "; ".join(a.describe() for a in result.report.applied)
            log.info("launchless: %s did not compile (%s); CGCT rewrote it and it compiled: %s", name, error, rewrites)
            return result.compiled
        error += f"; CGCT: {result.why_not}"
    log.info("launchless: %s did not compile (%s); it runs as the plain FX graph, without a CUDA graph", name, error)
    return gm.forward


_counter = 0
_registry: weakref.WeakSet[CompiledGraphs] = weakref.WeakSet()  # for explain(): what each graph does


def make_backend(
    inner: Compiler = inductor_without_graphs,
    *,
    cache_dir: str | None = None,
    reprofile: bool = False,
    cgct: bool = True,
    **options: Any,
) -> Callable[..., Any]:
    """A Dynamo backend. ``options`` go to ``CompiledGraphs`` (capture_after, max_graphs, verify_mode,
    selective, indirection); decisions are cached in ``cache_dir`` (default: ``decisions.default_cache_dir``)
    and measured again with ``reprofile=True``."""
    cache = DecisionCache(cache_dir, reprofile=reprofile)
    # the relocation hooks (global module registration hooks) go in now, before Dynamo traces anything: Dynamo
    # guards on that hook dict when a forward builds a ModuleList (``self.layers[:n]``), so hooks installed at
    # the first capture would fail that guard and recompile every such graph once (Mistral: two graphs)
    relocation.epoch()

    def backend(gm: fx.GraphModule, example_inputs: list) -> Callable[..., Any]:
        global _counter
        _counter += 1
        name = f"graph {_counter}"
        tensors = [t for t in example_inputs if isinstance(t, torch.Tensor)]
        if not any(t.is_cuda for t in tensors):
            log.info("launchless: %s has no CUDA input; it runs compiled, without a CUDA graph", name)
            return _compile_or_rescue(name, gm, example_inputs, inner, cgct)
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            log.info(
                "launchless: %s needs autograd (training); it runs compiled, without a CUDA graph "
                "(capture whole training steps with launchless.graphed_step)",
                name,
            )
            return _compile_or_rescue(name, gm, example_inputs, inner, cgct)
        static = static_input_indices(gm, example_inputs)
        early = (
            try_rewrite(gm, example_inputs, static, inner) if cgct and holds_host_tensors(gm, example_inputs) else None
        )
        if early is not None and early.compiled is not None:
            compiled = early.compiled
        else:  # CGCT is tried once: not again should the compiler reject the graph
            compiled = _compile_or_rescue(name, gm, example_inputs, inner, cgct and early is None)
        names = input_names(gm)
        graphs = CompiledGraphs(
            compiled,
            static,
            name=name,
            cache=cache,
            graph_key=graph_hash(gm),
            attributes=tensor_attribute_indices(names, example_inputs, static),
            input_names=names,
            index_inputs=index_like_inputs(gm, example_inputs),
            **options,
        )
        if early is not None:
            graphs.adopt_cgct(early, lambda: _compile_or_rescue(name, gm, example_inputs, inner, False))
        elif cgct:
            graphs.source = (gm, list(example_inputs), inner)
        _registry.add(graphs)
        return graphs

    return backend


launchless_backend = make_backend()
