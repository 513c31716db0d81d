"""GraphedModule: the inference policy over the graph core -- which calls replay, which capture, which run eager.

Modes: ``False`` runs eager; ``True`` captures at the first sight of a signature and fails loud (a forward
that cannot be captured raises: a wrong capture would silently return wrong values); ``"auto"`` captures
once a signature has been seen ``capture_after`` times, keeps its graph only when it is faster than eager
(timed at capture), and otherwise runs eager with one log line per reason. Calls in grad mode or with the
model in training mode run eager with one WARNING (the caller can change either): graphs here are for
inference under ``torch.no_grad()`` or ``torch.inference_mode()``
(training capture is ``graphed_step``).

The key is the call's input signature; the graph is the model's forward captured on static copies of the
inputs. Counting, limits, refusals, the relocation check before every replay, log-once, ``graph_info()``
rows and the memory pool are the core's (``core.cache.GraphCache``). A signature's capture, proof and speed
judgement are ``capture_flow``'s; what a call runs where no graph replays (eager, a split by submodule, the refusal's
error) is ``fallbacks``'; the model's API on the wrapper (attributes, ``state_dict``, copies) is ``model_stand_in``'s.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import weakref
from collections.abc import Sequence
from typing import Any, Literal, cast

import torch

from ..core import capture as _capture
from ..core import library_rewrites
from ..core.buckets import check_buckets
from ..core.cache import GraphCache
from ..core.junctions import JunctionChanged
from ..core.pool import SHARED
from ..core.relocation import RelocationWatch
from ..core.signature import FlatInputs, Signature, UnhashableInput, flatten_inputs, signature_of
from ..core.status import Admission
from ..errors import ConfigError
from ..options import KERNELS, KernelsMode, VerifyMode, check_choice, check_int, check_number, check_verify
from .batch_buckets import AUTO, BatchBucketing, BucketPlan
from .capture_flow import CaptureFlow, graph_row
from .compiled_kernels import CompiledKernels
from .decode_graphs import DecodeGraphs
from .decode_steps import DecodeSteps
from .eager_lane import EagerLane
from .fallbacks import Fallbacks
from .model_stand_in import ModelStandIn
from .split import ModelSplit

Mode = bool | Literal["auto"]
_OWN_SIGNATURE = object()  # a bucketed call that must go its own way after all
OUTPUTS = {"clone": "copies the next replay cannot overwrite", "static": "the graph's own buffers, overwritten"}
MEMORY_POOLS = {
    "own": "the model's graphs share one memory pool of their own",
    "shared": "one memory pool for the graphs of every model wrapped so, replayed one at a time",
}
ADDRESS_CHECKS = {
    "events": "relocation events plus a spot check of 8 tensors per call",
    "full": "every parameter and buffer on every call",
}
# process state: never copied or pickled
_RUNTIME_STATE = frozenset(
    {
        "_cache",
        "_watch",
        "_flow",
        "_fallbacks",
        "_model_split",
        "_bucketing",
        "_decode",
        "_compiled",
        "_rewrites",
        "_lane",
    }
)


def _check_mode(cuda_graph: Any) -> Mode:
    if cuda_graph is True or cuda_graph is False or (isinstance(cuda_graph, str) and cuda_graph == "auto"):
        return cast(Mode, cuda_graph)
    raise ConfigError(
        f"cuda_graph={cuda_graph!r} is not accepted; use False (eager), True (capture at the first call of each "
        "input signature) or 'auto' (capture once it repeats)"
    )


class GraphedModule(ModelStandIn):
    """A model that replays a verified CUDA graph per input signature and keeps the model's API."""

    _runtime_state = _RUNTIME_STATE

    def __init__(
        self,
        model: torch.nn.Module,
        cuda_graph: Mode = "auto",
        *,
        capture_after: int = 3,
        max_graphs: int = 8,
        warmup: int = 3,
        verify: VerifyMode = "on",
        tolerance_ulps: float = 64.0,
        outputs: Literal["clone", "static"] = "clone",
        address_check: Literal["events", "full"] = "events",
        batch_buckets: Sequence[int] | Literal["auto"] | None = None,
        memory_pool: Literal["own", "shared"] = "own",
        kernels: KernelsMode = "eager",
    ) -> None:
        mode = _check_mode(cuda_graph)
        if batch_buckets is not None and not (isinstance(batch_buckets, str) and batch_buckets == AUTO):
            check_buckets(batch_buckets)
        check_int("capture_after", capture_after, minimum=1)
        check_int("max_graphs", max_graphs, minimum=1)
        check_int("warmup", warmup, minimum=1)
        check_verify(verify)
        check_number("tolerance_ulps", tolerance_ulps, minimum=0)
        check_choice("outputs", outputs, OUTPUTS)
        check_choice("address_check", address_check, ADDRESS_CHECKS)
        check_choice("memory_pool", memory_pool, MEMORY_POOLS)
        check_choice("kernels", kernels, KERNELS)
        if memory_pool == "shared" and outputs == "static":
            raise ConfigError(
                "memory_pool='shared' needs outputs='clone': another model's replay would overwrite the graph's own "
                "output buffers that outputs='static' hands out; use outputs='clone', or memory_pool='own'"
            )
        super().__init__(model)
        self.cuda_graph = mode
        self.capture_after, self.max_graphs, self.warmup = capture_after, max_graphs, warmup
        self.verify, self.tolerance_ulps, self.outputs = verify, float(tolerance_ulps), outputs
        self.address_check, self.memory_pool, self.kernels = address_check, memory_pool, kernels
        self.batch_buckets = batch_buckets if batch_buckets is None or batch_buckets == AUTO else list(batch_buckets)
        self._init_runtime()

    def _init_runtime(self) -> None:
        """The graph cache, the relocation watch and the counters: process state, never copied or pickled."""
        self._watch = RelocationWatch(self.model, full=self.address_check == "full")
        self._cache: GraphCache[_capture.CapturedGraph] = GraphCache(
            name=self._name(),
            capture_after=self.capture_after,
            max_graphs=self.max_graphs,
            guards=[self._watch],
            on_invalidate=_on_invalidate(weakref.ref(self)),  # weakly: a cycle would keep graphs until a collection
            pool=SHARED if self.memory_pool == "shared" else None,
        )
        self._flow = CaptureFlow(  # capture, verification and the speed judgement of each signature's graph
            cache=self._cache,
            watch=self._watch,
            target=_model_of(weakref.ref(self)),  # weakly: a cycle would keep graphs until a collection
            name=self._name(),
            mode=self.cuda_graph,
            warmup=self.warmup,
            verify=self.verify,
            tolerance_ulps=self.tolerance_ulps,
            outputs=self.outputs,
        )
        options = {
            "max_graphs": self.max_graphs,
            "warmup": self.warmup,
            "verify": self.verify,
            "tolerance_ulps": self.tolerance_ulps,
            "address_check": self.address_check,
            "memory_pool": self.memory_pool,
        }
        self._model_split = ModelSplit(  # the forward run as captured submodules, once refused whole
            self.model,
            name=self._name(),
            make_piece=functools.partial(_make_piece, options=options),
            log_once=self._cache.log_once,
        )
        self._fallbacks = Fallbacks(  # what a call runs where no graph replays, and how a refusal is taken
            cache=self._cache,
            flow=self._flow,
            split=self._model_split,
            name=self._name(),
            strict=self.cuda_graph is True,
            verify=self.verify,
            tolerance_ulps=self.tolerance_ulps,
            capture_after=self.capture_after,
        )
        self._bucketing = (  # calls padded to a few batch sizes, where the rows are proven not to interact
            None
            if self.batch_buckets is None
            else BatchBucketing(self.batch_buckets, name=self._name(), tolerance_ulps=self.tolerance_ulps)
        )
        self._decode: DecodeGraphs | None = None  # generate()'s decode steps, made at its first call
        self._lane = EagerLane()  # most calls of a model refused for good go straight to it
        # library functions that wait for the GPU once per element, run inside this model's calls reading it once
        self._rewrites = [] if self.cuda_graph is False else library_rewrites.install(self.model)
        self._compiled = (  # Inductor's programs compiled beside the calls, swapped in once proven
            CompiledKernels(
                model=self.model, name=self._name(), cache=self._cache, warmup=self.warmup, verify=self.verify
            )
            if self.kernels == "compiled"
            else None
        )

    def extra_repr(self) -> str:
        return f"cuda_graph={self.cuda_graph!r}, graphs={len(self._cache.graphs)}, max_graphs={self.max_graphs}"

    # ---- generate() ---------------------------------------------------------------------------------
    def generate(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped transformers model's ``generate()``, its decode steps replayed as CUDA graphs on a static KV
        cache (see ``decode_graphs``); plain ``generate()`` under ``cuda_graph=False`` or off the GPU."""
        model: Any = self._modules["model"]  # a transformers model: its generate() is not nn.Module's
        self._cache.validate(())  # a model moved since (to the GPU, say): the watch looks again at where it is
        if self.cuda_graph is False or self._watch.cuda_device is None:
            if self.cuda_graph is not False:
                self._cache.log_once(
                    "generate:no-cuda",
                    logging.INFO,
                    f"launchless: {self._name()} has no parameters on a CUDA device; generate() runs as it is",
                )
            return model.generate(*args, **kwargs)
        if self._decode is None:
            steps = DecodeSteps(
                model,
                name=self._name(),
                explicit=self.cuda_graph is True,
                capture_after=self.capture_after,
                max_graphs=self.max_graphs,
                warmup=self.warmup,
                verify=self.verify,
                tolerance_ulps=self.tolerance_ulps,
                kernels=self.kernels,
                spare=None if self._compiled is None else self._compiled.decode_spare(model),
            )
            self._decode = DecodeGraphs(steps=steps)
        return self._decode.generate(model, args, kwargs)

    # ---- the call -----------------------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self._rewrites:  # the model's code calls a library function rewritten to wait for the GPU once
            with library_rewrites.active():
                return self._call(args, kwargs)
        return self._call(args, kwargs)

    def _call(self, args: tuple, kwargs: dict[str, Any]) -> Any:
        model: Any = self._modules["model"]  # not self.model: nn.Module.__getattr__ is slow on the replay path
        if self.cuda_graph is False:
            return model(*args, **kwargs)
        if model.training:
            return self._fallbacks.eager_because(
                "the model is in training mode; call .eval() to replay graphs (wrap() captures inference; "
                "graphed_step captures training steps)",
                args,
                kwargs,
            )
        if not torch.is_grad_enabled() and self._lane.bypass():  # what eager runs (a piece: its module's own forward)
            return self._fallbacks.eager(args, kwargs)
        cache = self._cache
        cache.validate(())  # every call: the grad-mode check below reads the parameters the watch follows
        flat = flatten_inputs(args, kwargs)
        if torch.is_grad_enabled() and (self._watch.requires_grad() or _any_requires_grad(flat.leaves)):
            return self._fallbacks.eager_because(
                "grad mode is on and autograd would record this call; graphs replay under "
                "torch.no_grad() or torch.inference_mode()",
                args,
                kwargs,
            )
        streak = self._lane.full_call()
        try:
            sig = signature_of(flat)
        except UnhashableInput as exc:
            return self._fallbacks.eager_because(str(exc), args, kwargs)
        if self._bucketing is not None and self._watch.cuda_device is not None:
            plan = self._bucketing.plan(flat, sig)
            if plan is not None:
                out = self._bucketed(plan, args, kwargs)
                if out is not _OWN_SIGNATURE:
                    return out
        graph = cache.get(sig)
        if graph is not None:
            if graph.host_sources is not None and graph.host_sources.changed():
                cache.drop_all("a host tensor copied into a graph as a constant was written or replaced")
            else:
                if self._compiled is not None and self._compiled.pending:  # between two calls: swapped once proven
                    graph = self._compiled.swap(sig, flat, graph, model)
                try:
                    return self._replay(graph, flat.leaves)
                except JunctionChanged as exc:
                    return self._fallbacks.junction_changed(sig, flat, exc)
        admission = self._admit(sig)
        if admission is Admission.CAPTURE:
            return self._capture_and_run(sig, flat, explicit=False)
        if admission is Admission.REFUSED:
            out = self._fallbacks.refused(sig, flat, args, kwargs)
            if self._eager_for_good():
                self._lane.eager_for_good(streak)
            return out
        return self._fallbacks.eager(args, kwargs)

    def _eager_for_good(self) -> bool:
        """Whether a refused call leaves the model with nothing but eager to run: under "auto" (``cuda_graph=True``
        raises for a refused signature), no graph held, no split running, no refusal waiting to be tried again, no
        batch buckets (a bucket's graph may serve calls of a refused size)."""
        return (
            self.cuda_graph == "auto"
            and self._bucketing is None
            and not self._cache.graphs
            and not self._cache.waits_to_retry()
            and not self._model_split.runs_any()
        )

    def _bucketed(self, plan: BucketPlan, args: tuple, kwargs: dict) -> Any:
        """A call through its batch bucket: the bucket's graph replayed with the call's rows written into the first
        rows of its input buffers, and the call's rows of its outputs taken back; eager on the call as given while
        the bucket's signature waits or is refused. ``_OWN_SIGNATURE`` when the call must go its own way (padding
        not proven safe for this model).

        The buffers' other rows keep rows of earlier calls (or of the padded call captured): real inputs, which the
        proof showed cannot reach the call's rows."""
        cache, bucketing = self._cache, cast(BatchBucketing, self._bucketing)  # called only with buckets set
        graph = cache.get(plan.signature)
        if graph is not None and not (graph.host_sources is not None and graph.host_sources.changed()):
            # graphs around operations, captured by a call of the bucket's own size: their operations (a value read
            # on the host) would see the padding rows, so a padded call does not replay them
            if graph.junctions or not bucketing.proven(plan, self._flow.target()):
                return _OWN_SIGNATURE
            bucketing.count(plan)
            if graph.aliases:  # an output that is an input: it must be the padded input, as the graph returns it
                return plan.take_rows(self._replay(graph, plan.padded_flat().leaves))
            return plan.take_rows(self._replay(graph, plan.flat.leaves, rows=plan.rows))
        admission = self._admit(plan.signature)
        if admission is Admission.CAPTURE:
            if not bucketing.proven(plan, self._flow.target()):
                return _OWN_SIGNATURE
            bucketing.count(plan)
            padded = plan.padded_flat()
            captured = self._capture_and_run(
                plan.signature, padded, explicit=False, compile_kernels=False, around_operations=False
            )
            return plan.take_rows(captured)
        if admission is Admission.REFUSED:
            return self._fallbacks.refused(plan.signature, plan.flat, args, kwargs, split=False)
        return self._fallbacks.eager(args, kwargs)

    def _admit(self, sig: Signature) -> Admission:
        """Whether a call without a graph captures one: under "auto" the cache counts the signature's calls;
        ``cuda_graph=True`` captures every signature at its first call (a refused one raises again, unless its split
        runs or it ran out of memory: that is tried again at every call, and raises while it lasts)."""
        if self.cuda_graph == "auto":
            return self._cache.admit(sig)
        refusal = self._cache.refusal(sig)
        if refusal is None or refusal.transient:
            return Admission.CAPTURE
        return Admission.REFUSED

    def _replay(self, graph: _capture.CapturedGraph, leaves: list, *, rows: int | None = None) -> Any:
        """``rows``: the leaves fill only the first rows of the graph's input buffers (a batch bucket). Static
        buffers and the pool's memory are shared: replays into one pool take its lock, and a replay on another
        stream than the last waits for it."""
        pool = self._cache.pool
        with pool.lock:
            pool.order(graph.device_index)
            if self.outputs == "clone":
                return graph.replay_cloned(leaves, rows=rows)
            return graph.replay(leaves, rows=rows)

    def _capture_and_run(
        self,
        sig: Signature,
        flat: FlatInputs,
        *,
        explicit: bool,
        compile_kernels: bool = True,
        around_operations: bool = True,
    ) -> Any:
        """Capture, prove and judge ``sig``'s graph (``capture_flow``), then keep and replay it, or refuse it
        (``fallbacks``). ``compile_kernels``: with ``kernels="compiled"``, a whole graph kept starts the compile of
        its forward (a batch bucket's graph replays eager's kernels). ``around_operations``: whether the forward may
        replay as graphs around operations run eager (a batch bucket's may not: such an operation, or a value read
        on the host, would see the padding rows, which the call's own eager run never does)."""
        captured = self._flow.capture(sig, flat, explicit=explicit, around_operations=around_operations)
        if captured.refusal is not None:
            return self._fallbacks.refuse(sig, flat, captured.refusal, explicit=explicit, level=captured.level)
        graph = cast(_capture.CapturedGraph, captured.graph)
        self._cache.keep(sig, graph, captured.report, flat.leaves)
        if graph.junctions:
            self._flow.log_chain(sig, graph)
        elif self._compiled is not None and compile_kernels:
            self._compiled.start(sig, self.model, flat)
        try:
            return self._replay(graph, flat.leaves)
        except JunctionChanged as exc:
            return self._fallbacks.junction_changed(sig, flat, exc)

    def _name(self) -> str:
        return f"{type(self.model).__name__}.forward"

    # ---- release and explicit capture ------------------------------------------------------------
    def release_graphs(self) -> None:
        """Free every graph, its static buffers and the memory pool; later calls capture again."""
        self._cache.drop_all()
        self._model_split.drop()
        if self._compiled is not None:
            self._compiled.cancel("release_graphs() was called")
        if not self._cache.pool.shared:
            self._cache.pool.last_stream = None
        if torch.cuda.is_initialized():
            torch.cuda.empty_cache()

    def capture_graph(self, *args: Any, **kwargs: Any) -> dict:
        """Capture (and verify) the graph for this input signature now, so no request pays for it.

        Raises CaptureError / VerificationError in every mode: the capture was asked for explicitly.
        """
        if self.cuda_graph is False:
            raise ConfigError("capture_graph() needs graphs on: wrap with cuda_graph=True or 'auto'")
        if self.model.training:
            raise ConfigError("capture_graph() captures inference graphs: call .eval() on the model first")
        self._lane.close()  # the graph captured here replays from the next call on
        flat = flatten_inputs(args, kwargs)
        sig = signature_of(flat)
        self._cache.validate(flat.leaves)  # as every call does: the watch follows relocated parameters first
        if self._cache.get(sig) is None:
            self._cache.forget_refusal(sig)
            with torch.no_grad() if torch.is_grad_enabled() else contextlib.nullcontext():
                self._capture_and_run(sig, flat, explicit=True)
        return graph_row(self._cache, sig, self._cache.graphs[sig])

    # ---- reporting ------------------------------------------------------------------------------
    def graph_info(self) -> dict:
        """Captured signatures with replay count, capture time, memory and verification; eager fallbacks."""
        cache = self._cache
        return {
            "mode": self.cuda_graph,
            **cache.summary(),
            "graphs": cache.rows(functools.partial(graph_row, cache)),
            "pool_bytes": cache.pool.bytes(),  # memory_pool="shared": the whole pool, every sharing model's graphs
            "memory_pool": self.memory_pool,
            "fallbacks": cache.fallbacks(lambda sig: sig.describe()),
            "eager_calls": dict(self._fallbacks.eager_reasons),
            # a forward refused whole runs through captured submodules: the pieces, what runs eager, the decisions
            "split": self._model_split.info(lambda sig: sig.describe()),
            "batch_buckets": None if self._bucketing is None else self._bucketing.info(),
            "decode": None if self._decode is None else self._decode.info(),  # generate()'s decode steps
            # kernels="compiled": per signature, Inductor's program compiling, swapped in, or why eager's stay
            "compiled_kernels": None if self._compiled is None else self._compiled.info(lambda sig: sig.describe()),
            # library functions run inside the calls rewritten to wait for the GPU once (proven on their first call)
            "library_rewrites": library_rewrites.info(self._rewrites),
            # refused for good: most calls go straight to the model (the lane), one in a few takes the full path
            "eager_lane": self._lane.info(),
        }


def _model_of(wrapped: weakref.ref) -> Any:
    """What the wrapper captures and runs eager, read through a weak reference (the flow is the wrapper's own): the
    model (a piece of a split: its submodule's own forward, set by ``_make_piece``, not ``module.__call__``, which
    the split routes to the piece)."""

    def target() -> Any:
        return cast(GraphedModule, wrapped())._modules["model"]

    return target


def _on_invalidate(wrapped: weakref.ref) -> Any:
    """What goes with the graphs when a validity check drops them: the split, and any compile in flight (its
    program would be loaded onto the weights the dropped graphs read)."""

    def dropped(why: str) -> None:
        module = wrapped()
        if module is not None:
            module._model_split.drop()
            if module._compiled is not None:
                module._compiled.cancel(why)

    return dropped


def _make_piece(module: torch.nn.Module, *, options: dict[str, Any]) -> GraphedModule:
    """One submodule's graph cache for a split: captured at its first call, verified, quiet about its own refusals
    (the split reports them), calling the submodule's own forward (the split routes its calls here)."""
    piece = GraphedModule(module, "auto", capture_after=1, outputs="clone", **options)
    forward = _own_forward(module)
    piece._flow.target = lambda: forward
    piece._flow.splits = False  # a piece refused whole runs eager inside its split
    piece._flow.judged = False  # the split is timed whole
    piece._fallbacks.level = logging.DEBUG
    return piece


def _own_forward(module: torch.nn.Module) -> Any:
    """The submodule's forward as it is now (an instance's own ``forward`` included), called without going
    through ``module.__call__``, which the split routes to the piece."""
    return module.__dict__.get("forward") or type(module).forward.__get__(module)


def _any_requires_grad(leaves: list) -> bool:
    return any(isinstance(x, torch.Tensor) and x.requires_grad for x in leaves)


def wrap(
    model: torch.nn.Module,
    cuda_graph: Mode = "auto",
    *,
    capture_after: int = 3,
    max_graphs: int = 8,
    warmup: int = 3,
    verify: VerifyMode = "on",
    tolerance_ulps: float = 64.0,
    outputs: Literal["clone", "static"] = "clone",
    address_check: Literal["events", "full"] = "events",
    batch_buckets: Sequence[int] | Literal["auto"] | None = None,
    memory_pool: Literal["own", "shared"] = "own",
    kernels: KernelsMode = "eager",
) -> GraphedModule:
    """Wrap ``model`` so inference replays verified CUDA graphs, one per input signature.

    cuda_graph: False (eager), True (capture at first sight; raise if the forward cannot be captured)
        or "auto" (capture once a signature repeats, and keep the graph only if it is faster than eager, timed
        against it at capture; otherwise eager with one log line).
    capture_after=3: calls of one signature before "auto" captures it.
    max_graphs=8: graphs kept; least recently used evicted (one warning line). Under "auto", once an evicted
        signature comes back (more in use than max_graphs), nothing more is evicted and the others run eager.
    warmup=3: eager runs on the capture stream before capturing.
    verify="on" | "strict" | "off": prove each graph against eager on two probes before use.
    tolerance_ulps=64: rounding bound for named eager-noise / capture-path differences.
    outputs="clone" | "static": copies, or the graph's own buffers (overwritten by the next replay).
    address_check="events" | "full": how parameter relocation is noticed (see ``launchless.core.relocation``).
    batch_buckets=[1, 2, 4, 8, ...]: pad a call's batch (the first dimension its tensor inputs share) up to the
        next of these sizes and replay that size's graph, once the model is proven to keep rows apart (see
        ``batch_buckets``); "auto": the powers of two that hold the sizes seen; None: a graph per batch size.
    memory_pool="own" | "shared": the model's graphs in a memory pool of their own, or in one pool with the graphs
        of every model wrapped with "shared" (they reuse each other's intermediate memory: the pool holds about what
        the largest needs, not the sum; their replays take turns). "shared" needs outputs="clone".
    kernels="eager" | "compiled": the graphs replay eager's kernels; or (``"compiled"``) they do until Inductor's
        program of the same forward, compiled beside the calls in a child process, is proven as accurate as eager
        against float64 and faster: its graph then replaces the eager-kernel graph, between two calls.
    """
    if isinstance(model, GraphedModule):
        raise ConfigError("this model is already wrapped by launchless; use its .model to wrap again")
    if not isinstance(model, torch.nn.Module):
        raise ConfigError(f"wrap() takes a torch.nn.Module, got {type(model).__name__}; wrap the module itself")
    return GraphedModule(
        model,
        cuda_graph,
        capture_after=capture_after,
        max_graphs=max_graphs,
        warmup=warmup,
        verify=verify,
        tolerance_ulps=tolerance_ulps,
        outputs=outputs,
        address_check=address_check,
        batch_buckets=batch_buckets,
        memory_pool=memory_pool,
        kernels=kernels,
    )


__all__ = ["GraphedModule", "wrap"]
