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
rows and the memory pool are the core's (``core.cache.GraphCache``).
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
from ..core.buckets import check_buckets
from ..core.cache import GraphCache, Refusal
from ..core.compiled_programs import SpareCompiler
from ..core.junctions import JunctionShapeChanged, SegmentedGraph
from ..core.pool import SHARED
from ..core.relocation import RelocationWatch
from ..core.signature import FlatInputs, Signature, UnhashableInput, flatten_inputs, signature_of
from ..core.status import Admission, SplitStatus, Stage
from ..errors import ConfigError
from ..options import KERNELS, KernelsMode, VerifyMode, check_choice, check_int, check_number, check_verify
from . import state_keys
from .batch_buckets import AUTO, BatchBucketing, BucketPlan
from .capture_flow import CaptureFlow, add_note
from .compiled_kernels import CompiledKernels
from .decode_graphs import DecodeGraphs
from .split import SPLITTABLE, ModelSplit

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
    {"_cache", "_watch", "_flow", "_eager_reasons", "_model_split", "_bucketing", "_decode", "_compiled"}
)


def _check_mode(cuda_graph: Any) -> Mode:
    if cuda_graph is True or cuda_graph is False or (isinstance(cuda_graph, str) and cuda_graph == "auto"):
        return cast(Mode, cuda_graph)
    raise ConfigError(
        f"cuda_graph={cuda_graph!r} is not accepted; use False (eager), True (capture at the first call of each "
        "input signature) or 'auto' (capture once it repeats)"
    )


class GraphedModule(torch.nn.Module):
    """A model that replays a verified CUDA graph per input signature and keeps the model's API."""

    _refusal_level = logging.INFO  # a piece of a split leaves its refusals to the split's report

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
        super().__init__()
        self.model = model
        self.cuda_graph = mode
        self.capture_after, self.max_graphs, self.warmup = capture_after, max_graphs, warmup
        self.verify, self.tolerance_ulps, self.outputs = verify, float(tolerance_ulps), outputs
        self.address_check, self.memory_pool, self.kernels = address_check, memory_pool, kernels
        self.batch_buckets = batch_buckets if batch_buckets is None or batch_buckets == AUTO else list(batch_buckets)
        state_keys.install(self)
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
            target=_target_of(weakref.ref(self)),  # weakly: a cycle would keep graphs until a collection
            name=self._name(),
            mode=self.cuda_graph,
            warmup=self.warmup,
            verify=self.verify,
            tolerance_ulps=self.tolerance_ulps,
            outputs=self.outputs,
        )
        self._eager_reasons: dict[str, int] = {}
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
        self._bucketing = (  # calls padded to a few batch sizes, where the rows are proven not to interact
            None
            if self.batch_buckets is None
            else BatchBucketing(self.batch_buckets, name=self._name(), tolerance_ulps=self.tolerance_ulps)
        )
        self._decode: DecodeGraphs | None = None  # generate()'s decode steps, made at its first call
        self._compiled = (  # Inductor's programs compiled beside the calls, swapped in once proven
            CompiledKernels(
                model=self.model, name=self._name(), cache=self._cache, warmup=self.warmup, verify=self.verify
            )
            if self.kernels == "compiled"
            else None
        )

    def __getstate__(self) -> dict:
        """Copies and pickles carry the model and the options, never graphs, pools or locks."""
        return {k: v for k, v in self.__dict__.items() if k not in _RUNTIME_STATE}

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self._init_runtime()

    # ---- pass-through -------------------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["model"], name)

    @property
    def __launchless_model__(self) -> torch.nn.Module:
        """The wrapped model (what ``dry_run`` and ``explain`` look into)."""
        return cast(torch.nn.Module, self._modules["model"])

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        """Straight to the model, so missing/unexpected keys are reported with the model's own names."""
        return self.model.load_state_dict(state_dict, strict=strict, assign=assign)

    def named_modules(self, memo: set | None = None, prefix: str = "", remove_duplicate: bool = True):
        """The model's modules under the wrapper's own name: parameter names match state_dict keys."""
        memo = set() if memo is None else memo
        if self not in memo:
            if remove_duplicate:
                memo.add(self)
            yield prefix, self
        yield from self.model.named_modules(memo, prefix, remove_duplicate)

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
            self._decode = DecodeGraphs(
                model,
                name=self._name(),
                explicit=self.cuda_graph is True,
                capture_after=self.capture_after,
                max_graphs=self.max_graphs,
                warmup=self.warmup,
                verify=self.verify,
                tolerance_ulps=self.tolerance_ulps,
                kernels=self.kernels,
                spare=self._decode_spare(model),
            )
        return self._decode.generate(model, args, kwargs)

    def _decode_spare(self, model: torch.nn.Module) -> SpareCompiler | None:
        """The compiler process for the first decode step's compile: the wrapper's, where no forward's compile took
        it, else one started now -- it loads while the first generations decode through eager-kernel graphs, so
        that the decode step's compile begins with its export rather than with imports (seconds for a
        transformers model)."""
        if self.kernels != "compiled":
            return None
        spare = None if self._compiled is None else self._compiled.take_spare()
        return spare if spare is not None else SpareCompiler(model)

    # ---- the call -----------------------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        model: Any = self._modules["model"]  # not self.model: nn.Module.__getattr__ is slow on the replay path
        if self.cuda_graph is False:
            return model(*args, **kwargs)
        if model.training:
            return self._eager(
                "the model is in training mode; call .eval() to replay graphs (wrap() captures inference; "
                "graphed_step captures training steps)",
                args,
                kwargs,
            )
        cache = self._cache
        cache.validate(())  # every call: the grad-mode check below reads the parameters the watch follows
        flat = flatten_inputs(args, kwargs)
        if torch.is_grad_enabled() and (self._watch.requires_grad() or _any_requires_grad(flat.leaves)):
            return self._eager(
                "grad mode is on and autograd would record this call; graphs replay under "
                "torch.no_grad() or torch.inference_mode()",
                args,
                kwargs,
            )
        try:
            sig = signature_of(flat)
        except UnhashableInput as exc:
            return self._eager(str(exc), args, kwargs)
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
                except JunctionShapeChanged as exc:
                    return self._shape_changed(sig, flat, exc)
        admission = cache.admit(sig) if self.cuda_graph == "auto" else self._admit_now(sig)
        if admission is Admission.CAPTURE:
            return self._capture_and_run(sig, flat, explicit=False)
        if admission is Admission.REFUSED:
            if self._model_split.has(sig):
                return self._run_split(sig, flat)
            error = self._refused_error(sig)
            if error is not None:
                raise error
        return self._run_eager(args, kwargs)

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
            if not bucketing.proven(plan, self._target()):
                return _OWN_SIGNATURE
            bucketing.count(plan)
            try:
                if graph.aliases:  # an output that is an input: it must be the padded input, as the graph returns it
                    return plan.take_rows(self._replay(graph, plan.padded_flat().leaves))
                return plan.take_rows(self._replay(graph, plan.flat.leaves, rows=plan.rows))
            except JunctionShapeChanged as exc:
                return self._shape_changed(plan.signature, plan.flat, exc, split=False)
        admission = cache.admit(plan.signature) if self.cuda_graph == "auto" else self._admit_now(plan.signature)
        if admission is Admission.CAPTURE:
            if not bucketing.proven(plan, self._target()):
                return _OWN_SIGNATURE
            bucketing.count(plan)
            padded = plan.padded_flat()
            return plan.take_rows(self._capture_and_run(plan.signature, padded, explicit=False, compile_kernels=False))
        if admission is Admission.REFUSED:
            error = self._refused_error(plan.signature)
            if error is not None:
                raise error
        return self._run_eager(args, kwargs)

    def _admit_now(self, sig: Signature) -> Admission:
        """``cuda_graph=True``: every signature is captured at its first call (a refused one raises again, unless
        its split runs or it ran out of memory: that is tried again at every call, and raises while it lasts)."""
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

    # ---- capture, verification, refusal ---------------------------------------------------------
    def _capture_and_run(
        self, sig: Signature, flat: FlatInputs, *, explicit: bool, compile_kernels: bool = True
    ) -> Any:
        """Capture, prove and judge ``sig``'s graph (``capture_flow``), then keep and replay it, or refuse it.
        ``compile_kernels``: with ``kernels="compiled"``, a whole graph kept starts the compile of its forward (a
        batch bucket's graph replays eager's kernels)."""
        captured = self._flow.capture(sig, flat, explicit=explicit)
        if captured.refusal is not None:
            return self._refuse(sig, flat, captured.refusal, explicit, level=captured.level)
        graph = cast(_capture.CapturedGraph, captured.graph)
        self._cache.keep(sig, graph, captured.report, flat.leaves)
        if graph.junctions:
            self._flow.log_chain(sig, graph)
        elif self._compiled is not None and compile_kernels:
            self._compiled.start(sig, self.model, flat)
        try:
            return self._replay(graph, flat.leaves)
        except JunctionShapeChanged as exc:
            return self._shape_changed(sig, flat, exc)

    def _shape_changed(self, sig: Signature, flat: FlatInputs, exc: JunctionShapeChanged, *, split: bool = True) -> Any:
        """A chain's junction returned another shape than at its capture: its shape depends on the values after all.
        Nothing was handed out; the chain goes, and this signature runs as a refused one does from now on (split by
        submodule where allowed, else eager), this call included. One log line. ``split``: False for a batch
        bucket's signature, whose call runs eager as given."""
        self._cache.forget(sig)
        refusal = Refusal(
            Stage.CAPTURE,
            "an operation run eager between graphs returned a data-dependent shape",
            f"launchless: {self._name()} {sig.describe()}: {exc}. Its graphs are dropped and this input signature "
            "runs without them",
        )
        self._cache.refuse(sig, refusal)
        if split and self._flow.splits and not self._flow.collective:
            return self._run_split(sig, flat, refusal)
        args, kwargs = flat.rebuild(flat.leaves)
        return self._run_eager(args, kwargs)

    def _refuse(
        self, sig: Signature, flat: FlatInputs, refusal: Refusal, explicit: bool, *, level: int = logging.INFO
    ) -> Any:
        self._cache.refuse(sig, refusal, log_line=False)
        # a forward with collectives is not split: a rank could split where another does not
        splittable = (
            refusal.stage in SPLITTABLE and not refusal.transient and self._flow.splits and not self._flow.collective
        )
        if explicit:  # capture_graph(): this one graph or the error, with what a call would run instead
            if splittable:
                add_note(refusal.error, self._split_note(sig, flat, refusal))
            raise _explicit_error(refusal)
        if splittable:
            return self._run_split(sig, flat, refusal)
        if self.cuda_graph is True:
            raise _explicit_error(refusal)
        retry = self._cache.retry_in(sig)
        self._cache.log_once(
            f"refuse:{refusal.stage}:{refusal.reason}:{refusal.source}",
            min(level, self._refusal_level) if level <= logging.INFO else level,
            f"{refusal.message}. Running eager for this input signature"
            + (f"; trying again in {retry} calls." if retry is not None else "."),
        )
        args, kwargs = flat.rebuild(flat.leaves)
        return self._run_eager(args, kwargs)

    # ---- splits by submodule ----------------------------------------------------------------------------
    def _run_split(self, sig: Signature, flat: FlatInputs, refusal: Refusal | None = None) -> Any:
        """A signature refused whole: its forward runs through the captured submodules, searched and decided at
        its first call (``split.ModelSplit``). Where the split was dropped: eager under "auto"; under
        ``cuda_graph=True`` the refusal is raised, naming why the split was dropped too."""
        args, kwargs = flat.rebuild(flat.leaves)
        with self._cache.lock:  # the split routes the model's submodules while it runs: one call at a time
            decided = self._model_split.has(sig)
            outcome = self._model_split.outcome(
                sig,
                flat,
                refusal,
                verify_mode=self.verify,
                tolerance_ulps=self.tolerance_ulps,
                capture_after=self.capture_after,
                describe=Signature.describe,
                strict=self.cuda_graph is True,
            )
            if outcome.status is SplitStatus.VERIFIED:
                return self._model_split.run(args, kwargs)
        error = self._refused_error(sig)
        if error is not None:
            if not decided:
                add_note(error, f" A split by submodule was tried and dropped: {outcome.detail}.")
            raise error
        return self._run_eager(args, kwargs)

    def _refused_error(self, sig: Signature) -> Exception | None:
        """What a refused signature raises under ``cuda_graph=True``: its refusal's error, unless its split by
        submodule runs (verified and faster) or the refusal came after its graph was kept (an operation run eager
        between graphs returned another shape at replay: such a signature runs as "auto" runs it)."""
        if self.cuda_graph is not True or self._model_split.verified(sig):
            return None
        refusal = self._cache.refusal(sig)
        return None if refusal is None else refusal.error

    def _split_note(self, sig: Signature, flat: FlatInputs, refusal: Refusal) -> str:
        """What a call would run instead of the one graph capture_graph() asked for: graphs around operations,
        else a split by submodule."""
        return self._flow.chain_note(flat) or self._model_split.note(
            sig, flat, refusal, verify_mode=self.verify, tolerance_ulps=self.tolerance_ulps
        )

    def _eager(self, reason: str, args: tuple, kwargs: dict) -> Any:
        """A call the caller could graph by changing how it calls (grad mode, training mode, an input): eager,
        with one WARNING per reason."""
        self._eager_reasons[reason] = self._eager_reasons.get(reason, 0) + 1
        self._cache.log_once(f"eager:{reason}", logging.WARNING, f"launchless: {self._name()} runs eager: {reason}")
        return self._run_eager(args, kwargs)

    def _run_eager(self, args: tuple, kwargs: dict) -> Any:
        """The model's forward without a graph."""
        return self._target()(*args, **kwargs)

    def _target(self) -> Any:
        """What is captured, verified and run eager: the model (a piece of a split: its submodule's own forward,
        not ``module.__call__``, which the split routes to the piece)."""
        return self._modules["model"]

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
        flat = flatten_inputs(args, kwargs)
        sig = signature_of(flat)
        self._cache.validate(flat.leaves)  # as every call does: the watch follows relocated parameters first
        if self._cache.get(sig) is None:
            self._cache.forget_refusal(sig)
            with torch.no_grad() if torch.is_grad_enabled() else contextlib.nullcontext():
                self._capture_and_run(sig, flat, explicit=True)
        return self._row(sig, self._cache.graphs[sig])

    # ---- reporting ------------------------------------------------------------------------------
    def _row(self, sig: Signature, graph: _capture.CapturedGraph) -> dict:
        report = self._cache.reports.get(sig)
        row = {
            "signature": sig.describe(),
            "replays": graph.replays,
            "capture_ms": round(graph.capture_ms, 3),
            "pool_growth_bytes": graph.pool_growth,
            "input_bytes": graph.input_bytes,
            "verification": report.as_dict() if report else None,
        }
        if graph.junctions:  # a region split: graphs with operations run eager between them
            fail, speed = graph.split_from, graph.speed
            row["region_split"] = {
                "graphs": len(cast(SegmentedGraph, graph.graph).graphs),
                "eager_ops": [j.row() for j in graph.junctions],
                "reason": fail.site.name if fail and fail.site else None,
                "source": fail.site.source if fail and fail.site else None,
                "eager_ms": speed.eager_ms,
                "graphs_ms": speed.candidate_ms,
                "eager_back_to_back_ms": speed.eager_back_to_back_ms,
                "graphs_back_to_back_ms": speed.candidate_back_to_back_ms,
                "speedup": round(speed.speedup, 3),
            }
        elif graph.speed is not None:  # a whole graph "auto" timed against eager before keeping it
            row["speed"] = graph.speed.row()
        return row

    def graph_info(self) -> dict:
        """Captured signatures with replay count, capture time, memory and verification; eager fallbacks."""
        cache = self._cache
        return {
            "mode": self.cuda_graph,
            **cache.summary(),
            "graphs": cache.rows(self._row),
            "pool_bytes": cache.pool.bytes(),  # memory_pool="shared": the whole pool, every sharing model's graphs
            "memory_pool": self.memory_pool,
            "fallbacks": cache.fallbacks(lambda sig: sig.describe()),
            "eager_calls": dict(self._eager_reasons),
            # a forward refused whole runs through captured submodules: the pieces, what runs eager, the decisions
            "split": self._model_split.info(lambda sig: sig.describe()),
            "batch_buckets": None if self._bucketing is None else self._bucketing.info(),
            "decode": None if self._decode is None else self._decode.info(),  # generate()'s decode steps
            # kernels="compiled": per signature, Inductor's program compiling, swapped in, or why eager's stay
            "compiled_kernels": None if self._compiled is None else self._compiled.info(lambda sig: sig.describe()),
        }


def _explicit_error(refusal: Refusal | None) -> Exception:
    """The error a refused signature raises where a graph was asked for explicitly: every refusal recorded for a
    signature carries one (the casts tell the type checker so; nothing is checked at run time)."""
    return cast(Exception, cast(Refusal, refusal).error)


def _target_of(wrapped: weakref.ref) -> Any:
    """What the wrapper captures and runs eager, read through a weak reference (the flow is the wrapper's own)."""

    def target() -> Any:
        return cast(GraphedModule, wrapped())._target()

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
    piece.__dict__["_target"] = piece._flow.target = lambda: forward
    piece._flow.splits = False  # a piece refused whole runs eager inside its split
    piece._flow.judged = False  # the split is timed whole
    piece._refusal_level = logging.DEBUG
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
