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

import dataclasses
import logging
import os
import re
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import fx
from torch.utils import _pytree as pytree

from ..core import relocation
from ..core.library_rewrites import install_for
from ..errors import ConfigError, one_line
from ..options import VerifyMode, check_bool, check_int, check_known, check_verify
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


def calling_modules(gm: fx.GraphModule) -> set[str]:
    """The modules of the classes whose forwards the FX graph holds code of (Dynamo's ``nn_module_stack``, a class
    or its qualified name): the library code the rest of the compiled model calls is theirs."""
    modules = set()
    for node in gm.graph.nodes:
        for entry in (node.meta.get("nn_module_stack") or {}).values():
            kind = entry[1] if isinstance(entry, tuple) and len(entry) > 1 else None  # (path, class) as torch keeps it
            if isinstance(kind, str):
                modules.add(kind.rsplit(".", 1)[0])
            elif isinstance(kind, type):
                modules.add(kind.__module__)
    return modules


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
        error = one_line(exc)
    if cgct:
        result = try_rewrite(gm, example_inputs, static_input_indices(gm, example_inputs), inner)
        if result.compiled is not None:
            rewrites = "; ".join(a.describe() for a in result.report.applied)
            log.info("launchless: %s did not compile (%s); CGCT rewrote it and it compiled: %s", name, error, rewrites)
            return result.compiled
        error += f"; CGCT: {result.why_not}"
    log.info("launchless: %s did not compile (%s); it runs as the plain FX graph, without a CUDA graph", name, error)
    return gm.forward


@dataclasses.dataclass(frozen=True)
class BackendOptions:
    """What ``make_backend(...)`` and ``torch.compile(..., backend="launchless", options={...})`` accept.

    capture_after=2: calls of one input signature before its graph is captured (the first call compiles and
        autotunes).
    max_graphs=8: graphs kept per compiled FX graph; least recently used evicted.
    verify="on" | "strict" | "off": prove each graph against the compiled function on two probes before use.
    selective=True: per graph, keep the fastest of no graph / graph / graph + pointer indirection, measured once
        and cached on disk.
    indirection=True: pointer indirection (inputs read where the caller keeps them instead of copied in).
    cgct=True: rewrite host copies and host constants that keep a graph from being captured.
    cache_dir=None: where decisions are cached (default ``~/.cache/launchless/decisions`` or
        ``$LAUNCHLESS_CACHE_DIR``).
    reprofile=False: measure again instead of using cached decisions.
    library_rewrites=True: library functions that wait for the GPU once per element (torchvision's mask paste,
        SSD's per-class masks, ...) are called by the compiled code rewritten to wait once per call, at one graph
        break each, proven bit for bit on their first call (``core.library_rewrites``).
    """

    capture_after: int = 2
    max_graphs: int = 8
    verify: VerifyMode = "on"
    selective: bool = True
    indirection: bool = True
    cgct: bool = True
    cache_dir: str | None = None
    reprofile: bool = False
    library_rewrites: bool = True

    def __post_init__(self) -> None:
        check_int("capture_after", self.capture_after, minimum=1)
        check_int("max_graphs", self.max_graphs, minimum=1)
        check_verify(self.verify)
        for name in ("selective", "indirection", "cgct", "reprofile", "library_rewrites"):
            check_bool(name, getattr(self, name))
        if self.cache_dir is not None and not isinstance(self.cache_dir, (str, os.PathLike)):
            raise ConfigError(f"cache_dir={self.cache_dir!r} is not accepted; pass a directory path or None")

    def updated(self, options: Mapping[str, Any] | None) -> BackendOptions:
        """These options with ``torch.compile(..., options=...)``'s on top, checked like the rest."""
        if not options:
            return self
        if not isinstance(options, Mapping):
            raise ConfigError(f"options={options!r} is not accepted; pass a dict of launchless backend options")
        check_known("the launchless backend", options, {f.name: f for f in dataclasses.fields(self)})
        return dataclasses.replace(self, **options)


_counter = 0
_registry: weakref.WeakSet[CompiledGraphs] = weakref.WeakSet()  # for explain(): what each graph does


def make_backend(
    inner: Compiler = inductor_without_graphs,
    *,
    capture_after: int = 2,
    max_graphs: int = 8,
    verify: VerifyMode = "on",
    selective: bool = True,
    indirection: bool = True,
    cgct: bool = True,
    cache_dir: str | None = None,
    reprofile: bool = False,
    library_rewrites: bool = True,
) -> Callable[..., Any]:
    """A Dynamo backend with these options (see ``BackendOptions``); ``torch.compile(..., options={...})`` given
    to the backend it returns overrides them for that compile."""
    defaults = BackendOptions(
        capture_after=capture_after,
        max_graphs=max_graphs,
        verify=verify,
        selective=selective,
        indirection=indirection,
        cgct=cgct,
        cache_dir=cache_dir,
        reprofile=reprofile,
        library_rewrites=library_rewrites,
    )
    caches: dict[tuple[str | None, bool], DecisionCache] = {}
    # the relocation hooks (global module registration hooks) go in now, before Dynamo traces anything: Dynamo
    # guards on that hook dict when a forward builds a ModuleList (``self.layers[:n]``), so hooks installed at
    # the first capture would fail that guard and recompile every such graph once (Mistral: two graphs)
    relocation.epoch()

    def decision_cache(opts: BackendOptions) -> DecisionCache:
        key = (None if opts.cache_dir is None else os.fspath(opts.cache_dir), opts.reprofile)
        if key not in caches:
            caches[key] = DecisionCache(key[0], reprofile=opts.reprofile)
        return caches[key]

    def backend(
        gm: fx.GraphModule, example_inputs: list, *, options: Mapping[str, Any] | None = None, mode: str | None = None
    ) -> Callable[..., Any]:
        if mode not in (None, "default"):
            raise ConfigError(
                f"torch.compile(mode={mode!r}) does not apply to the launchless backend (it captures its own "
                "graphs); leave mode out and pass launchless's options as options={...}"
            )
        opts = defaults.updated(options)
        if opts.library_rewrites:  # before Dynamo traces the code after this graph's break, where they are called
            install_for(calling_modules(gm), compiled=True)
        global _counter
        _counter += 1
        name = f"graph {_counter}"
        tensors = [t for t in example_inputs if isinstance(t, torch.Tensor)]
        if not any(t.is_cuda for t in tensors):
            log.info("launchless: %s has no CUDA input; it runs compiled, without a CUDA graph", name)
            return _compile_or_rescue(name, gm, example_inputs, inner, opts.cgct)
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            log.warning(
                "launchless: %s was compiled in grad mode with parameters that require grad (training); it runs "
                "compiled, without a CUDA graph. Call the model under torch.no_grad() or torch.inference_mode() "
                "for inference graphs, or capture whole training steps with launchless.graphed_step",
                name,
            )
            return _compile_or_rescue(name, gm, example_inputs, inner, opts.cgct)
        static = static_input_indices(gm, example_inputs)
        early = (
            try_rewrite(gm, example_inputs, static, inner)
            if opts.cgct and holds_host_tensors(gm, example_inputs)
            else None
        )
        if early is not None and early.compiled is not None:
            compiled = early.compiled
        else:  # CGCT is tried once: not again should the compiler reject the graph
            compiled = _compile_or_rescue(name, gm, example_inputs, inner, opts.cgct and early is None)
        names = input_names(gm)
        graphs = CompiledGraphs(
            compiled,
            static,
            name=name,
            capture_after=opts.capture_after,
            max_graphs=opts.max_graphs,
            verify=opts.verify,
            selective=opts.selective,
            indirection=opts.indirection,
            cache=decision_cache(opts),
            graph_key=graph_hash(gm),
            attributes=tensor_attribute_indices(names, example_inputs, static),
            input_names=names,
            index_inputs=index_like_inputs(gm, example_inputs),
            fixed_signature=fixed_signature(gm),
        )
        if early is not None:
            graphs.adopt_cgct(early, lambda: _compile_or_rescue(name, gm, example_inputs, inner, False))
        elif opts.cgct:
            graphs.source = (gm, list(example_inputs), inner)
        _registry.add(graphs)
        return graphs

    return backend


def fixed_signature(gm: fx.GraphModule) -> bool:
    """Whether Dynamo's guards pin every input of ``gm`` as a signature would: tensors only, none of symbolic size
    or strides (a graph compiled for dynamic shapes takes its sizes as inputs, and tensors of symbolic shape)."""
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        value = node.meta.get("example_value", node.meta.get("val"))
        if not isinstance(value, torch.Tensor):
            return False
        if any(isinstance(n, torch.SymInt) for n in (*value.shape, *value.stride())):
            return False
    return True


def graph_info() -> list[dict[str, Any]]:
    """``graph_info()`` of every FX graph the launchless backend compiled that is still alive, in compile order:
    per input signature the variant kept, its verification and replays, and the signatures refused with why.
    (``launchless.explain(model, *inputs)`` compiles one model and says what each of its graphs does.)"""
    graphs = sorted(_registry, key=lambda g: int(g.name.rsplit(" ", 1)[-1]))  # named "graph <n>" in compile order
    return [g.graph_info() for g in graphs]


launchless_backend = make_backend()
