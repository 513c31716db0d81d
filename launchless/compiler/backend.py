"""``torch.compile(model, backend="launchless")``: Inductor's kernels, launchless's graphs.

For each FX graph Dynamo hands over, Inductor compiles without its own CUDA graphs
(``triton.cudagraphs=False``); launchless then captures the compiled callable per input signature
with its own capture primitive. Parameters and buffers (inputs Dynamo marks as static addresses) are
read in place -- no placeholder, no copy, their addresses checked with one C call per replay -- and
the other inputs are copied into placeholders. Each graph is verified against the compiled callable
before it is trusted. Graph breaks give several FX graphs; each is handled on its own. A graph that
cannot be captured (a host sync, a CPU tensor) or that needs autograd (training) runs compiled,
without a CUDA graph, with one log line naming why.
"""

from __future__ import annotations

import logging
import operator
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx

from .. import capture as _capture
from ..blockers import classify_message, locate_exception
from ..signature import Signature, UnhashableInput, flatten_inputs, signature_of
from ..verify import verify

log = logging.getLogger("launchless")
_ptrs_equal = torch._C._tensors_data_ptrs_at_indices_equal
Compiler = Callable[[fx.GraphModule, list], Callable[..., Any]]


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


class CompiledGraphs:
    """One compiled FX graph and its CUDA graphs, one per input signature (LRU, ``max_graphs``)."""

    def __init__(
        self,
        compiled: Callable[..., Any],
        static: frozenset[int],
        *,
        name: str,
        capture_after: int = 2,
        max_graphs: int = 8,
        verify_mode: str = "on",
    ) -> None:
        self.compiled, self.static, self.name = compiled, static, name
        self.capture_after, self.max_graphs, self.verify_mode = capture_after, max_graphs, verify_mode
        self._graphs: OrderedDict[Signature, tuple[_capture.CapturedGraph, list[int]]] = OrderedDict()
        self._seen: dict[Signature, int] = {}
        self._refused: dict[Signature, str] = {}
        self._reports: dict[Signature, Any] = {}
        self._logged: set[str] = set()
        self._pool: Any = None
        self._lock = threading.Lock()
        order = sorted(static)
        self._pick_static = operator.itemgetter(*order) if len(order) > 1 else None
        self._static_order = order
        self._static_index = list(range(len(order)))

    def __call__(self, *args: Any) -> Any:
        flat = flatten_inputs(args, {})
        try:
            sig = signature_of(flat)
        except UnhashableInput as exc:
            self._log_once(f"launchless: {self.name} runs without a CUDA graph: {exc}")
            return self.compiled(*args)
        entry = self._graphs.get(sig)
        if entry is not None:
            graph, ptrs = entry
            if self._static_unmoved(args, ptrs):
                self._graphs.move_to_end(sig)
                return graph.replay_cloned(flat.leaves)
            self._graphs.clear()  # a parameter moved (.to(), load_state_dict(assign=True)): capture again
            self._seen.clear()
            self._log_once(f"launchless: {self.name}: parameters moved; its graphs are captured again")
        if sig in self._refused:
            return self.compiled(*args)
        self._seen[sig] = count = self._seen.get(sig, 0) + 1
        if count < self.capture_after:
            return self.compiled(*args)  # the first call compiles and autotunes; capture comes after
        return self._capture(sig, flat, args)

    def _static_leaves(self, args: Sequence[Any]) -> list:
        if self._pick_static is not None:
            return list(self._pick_static(args))
        return [args[i] for i in self._static_order]

    def _static_unmoved(self, args: Sequence[Any], ptrs: list[int]) -> bool:
        return not ptrs or _ptrs_equal(self._static_leaves(args), ptrs, self._static_index)

    def _capture(self, sig: Signature, flat: Any, args: Sequence[Any]) -> Any:
        tensors = [x for x in flat.leaves if isinstance(x, torch.Tensor)]
        devices = {t.device for t in tensors if t.is_cuda}
        if len(devices) != 1 or any(not t.is_cuda for t in tensors):
            return self._refuse(sig, args, "its inputs are not all on one CUDA device (nothing to capture)")
        device = devices.pop()
        with self._lock, _capture.CAPTURE_LOCK:
            if self._pool is None:
                self._pool = _capture.new_pool()
            try:
                graph = _capture.capture(
                    self.compiled, flat, device=device, pool=self._pool, warmup=1, static=self.static
                )
            except _capture.CaptureFailed as fail:
                if fail.stage == "capture":
                    self._pool = None
                return self._refuse(sig, args, _reason(fail))
            report = verify(graph, self.compiled, flat, mode=self.verify_mode, keep=self.static)
            self._reports[sig] = report
            if not report.passed:
                del graph
                if not self._graphs:
                    self._pool = None
                return self._refuse(sig, args, f"verification failed ({report.status}: {report.detail})")
            ptrs = [t.data_ptr() for t in self._static_leaves(args)]
            self._graphs[sig] = (graph, ptrs)
            self._seen.pop(sig, None)
            while len(self._graphs) > self.max_graphs:
                self._graphs.popitem(last=False)
                self._log_once(f"launchless: {self.name}: more than max_graphs={self.max_graphs} shapes; evicting")
            return graph.replay_cloned(flat.leaves)

    def _refuse(self, sig: Signature, args: Sequence[Any], why: str) -> Any:
        self._refused[sig] = why
        self._log_once(f"launchless: {self.name} {sig.describe()} runs without a CUDA graph: {why}")
        return self.compiled(*args)

    def _log_once(self, message: str) -> None:
        if message not in self._logged:
            self._logged.add(message)
            log.info(message)

    def graph_info(self) -> dict:
        return {
            "name": self.name,
            "static_inputs": len(self.static),
            "graphs": [
                {"signature": s.describe(), "replays": g.replays, "verification": self._reports[s].status}
                for s, (g, _) in self._graphs.items()
            ],
            "fallbacks": [{"signature": s.describe(), "reason": r} for s, r in self._refused.items()],
        }


def _reason(fail: _capture.CaptureFailed) -> str:
    cause = fail.cause
    text = str(cause or fail).strip()
    kind = classify_message(text) if cause is not None else "capture error"
    where = locate_exception(cause) if cause is not None else None
    return f"{kind}: {text.splitlines()[0] if text else kind}" + (f" at {where}" if where else "")


_counter = 0
_registry: weakref.WeakSet[CompiledGraphs] = weakref.WeakSet()  # for explain(): what each graph does


def make_backend(inner: Compiler = inductor_without_graphs, **options: Any) -> Callable[..., Any]:
    """A Dynamo backend; ``options`` go to ``CompiledGraphs`` (capture_after, max_graphs, verify_mode)."""

    def backend(gm: fx.GraphModule, example_inputs: list) -> Callable[..., Any]:
        global _counter
        _counter += 1
        name = f"graph {_counter}"
        compiled = inner(gm, example_inputs)
        tensors = [t for t in example_inputs if isinstance(t, torch.Tensor)]
        if not any(t.is_cuda for t in tensors):
            log.info("launchless: %s has no CUDA input; it runs compiled, without a CUDA graph", name)
            return compiled
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            log.info(
                "launchless: %s needs autograd (training); it runs compiled, without a CUDA graph "
                "(capture whole training steps with launchless.graphed_step)",
                name,
            )
            return compiled
        graphs = CompiledGraphs(compiled, static_input_indices(gm, example_inputs), name=name, **options)
        _registry.add(graphs)
        return graphs

    return backend


launchless_backend = make_backend()
