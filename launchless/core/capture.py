"""The capture primitive: the one module that touches ``torch.cuda.CUDAGraph``.

Warm-up runs on a side stream that is also the capture stream. cuBLAS's workspaces are the exception to
"warm up, then capture": PyTorch keeps one per (handle, stream) in a process-wide map that anyone may empty, so a
graph must not keep the one its warm-up made -- each capture makes its own, in its graph's pool (``workspaces``).
Capture uses ``capture_error_mode="thread_local"``: in the default global mode a DataLoader pin-memory thread
calling ``cudaHostAlloc`` both invalidates the capture and is corrupted by it. All graphs of one
wrapped model share one memory pool. Random ops are graph-safe: PyTorch registers every CUDA
generator a capture uses and advances its offset on each replay.

A failed capture must not poison the process: the capture is always ended, the stream context is
always left, the default generator leaves capture mode, and the failed ``CUDAGraph`` object is
reset but kept alive (PyTorch's allocator may still hold a raw pointer to it). Its pool must not be
captured into again (see ``_abandon``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils import _pytree as pytree

from .capture_path import pretend_capturing
from .collectives import CollectiveTrace, distributed, wait_outputs
from .fft_plans import holds_plans
from .host_constants import HostCopies, HostSources, recording, replaying
from .index_trace import IndexTrace
from .junctions import (
    MAX_JUNCTION_OPS,
    Junction,
    NotAJunction,
    SegmentedGraph,
    SegmentingMode,
    Site,
    operation_name,
)
from .output_aliases import fill_aliases, find_input_aliases
from .output_copies import IMMUTABLE_OUTPUTS, make_cloner
from .output_tree import see_into
from .signature import FlatInputs
from .status import Stage
from .streams import side_stream
from .workspaces import clear_blas_workspaces, own_blas_workspaces

CAPTURE_LOCK = threading.RLock()
_failed_graphs: list[torch.cuda.CUDAGraph] = []


class CaptureFailed(Exception):
    """Internal: carries the original exception of a failed warm-up or capture."""

    def __init__(self, stage: Stage, cause: BaseException | None, message: str) -> None:
        super().__init__(message)
        self.stage = stage
        self.cause = cause
        self.site: Site | None = None  # the operation the capture failed in, where that is known
        self.no_junction = ""  # why the forward could not be captured around that operation
        self.collective_groups: list[Any] = []  # the forward's collectives' groups, when the warm-up found them


def out_of_memory(exc: BaseException | None) -> bool:
    """Whether ``exc`` says the GPU ran out of memory: a passing condition, unlike a blocker in the forward
    (another model's graphs freed, a smaller batch), so the signature is tried again later."""
    if exc is None:
        return False
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()


def _static_like(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A buffer the graph reads, on ``device``, with the example's strides when it is dense.

    Always a normal tensor, also under ``torch.inference_mode()``: an inference tensor has no version counter
    (the check for a forward writing its input reads it) and may not be written outside inference mode -- the
    graph must replay under ``no_grad`` and ``inference_mode`` alike, with inputs made under either."""
    with torch.inference_mode(False):
        out = torch.empty_like(t, device=device, requires_grad=t.requires_grad)
        with torch.no_grad():
            out.copy_(t)
    return out


@contextlib.contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """No cyclic garbage collection while a stream captures. A collection can run at any Python allocation;
    when the garbage it frees holds a ``CUDAGraph`` (a graph left in a reference cycle by earlier code), its
    destructor calls ``cudaGraphExecDestroy``, which is not permitted while this thread captures: PyTorch only
    warns, but the capture is invalidated ("operation failed due to a previous error during capture") and a
    sound forward looks uncapturable. (PyTorch's ``torch.cuda.graph`` ran ``gc.collect()`` before capturing up to
    2.8 for the same reason; not collecting at all during the capture costs nothing.)"""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@contextlib.contextmanager
def _capture_autocast() -> Iterator[None]:
    """Autocast's weight-cast cache would hand the graph casts made (and freed) outside it."""
    if not torch.is_autocast_enabled("cuda"):
        yield
        return
    torch.clear_autocast_cache()
    with torch.autocast("cuda", dtype=torch.get_autocast_dtype("cuda"), cache_enabled=False):
        yield


def _end_pool_allocation(device: torch.device, pool: Any) -> None:
    end = getattr(torch._C, "_cuda_endAllocateToPool", None) or getattr(
        torch._C, "_cuda_endAllocateCurrentStreamToPool", None
    )
    if end is not None:
        with contextlib.suppress(Exception):
            end(device.index if device.index is not None else torch.cuda.current_device(), pool)


class CapturedGraph:
    """One forward captured for one input signature: static inputs, the graph, static outputs."""

    def __init__(
        self,
        graph: torch.cuda.CUDAGraph | SegmentedGraph,  # a chain of graphs for a region split
        static_leaves: list,
        tensor_slots: list[int],
        outputs: Any,
        capture_ms: float,
        pool_growth: int,
        device_index: int = 0,  # the capture device: replays on another stream are ordered there
        host_slots: frozenset[int] = frozenset(),  # inputs that come from host memory (their signature says so)
    ) -> None:
        self.graph = graph
        self.device_index = device_index
        self.static_leaves = static_leaves
        self.tensor_slots = tensor_slots
        self.slot_buffers = [(i, static_leaves[i]) for i in tensor_slots if i not in host_slots]
        self.host_buffers = [(i, static_leaves[i]) for i in tensor_slots if i in host_slots]
        self.outputs = outputs
        self.aliases = find_input_aliases(outputs, static_leaves)  # outputs that are (views of) inputs
        self._clone = make_cloner(outputs, frozenset(a.position for a in self.aliases))
        self.capture_ms = capture_ms
        self.pool_growth = pool_growth  # what the capture added to PyTorch's reserved memory: the pool's share
        # the static input buffers, allocated outside the pool and held as long as the graph
        self.input_bytes = sum(
            static.numel() * static.element_size() for _, static in (*self.slot_buffers, *self.host_buffers)
        )
        self.replays = 0
        self.index_inputs: frozenset[int] = frozenset()  # float inputs read as addresses (capture's trace)
        self.host_constants: HostCopies = HostCopies()
        self.host_sources: HostSources | None = None  # host tensors its constants came from, still alive
        self.written: tuple[int, ...] = ()  # inputs the forward writes in place: copied back after every replay
        self.junctions: tuple[Junction, ...] = ()  # operations run eager between the graphs of a chain
        self.split_from: CaptureFailed | None = None  # why the forward was not captured as one graph
        self.speed: Any = None  # a chain's timing against eager (the policy's ``SpeedVerdict``)
        self.collective_groups: list[Any] = []  # process groups its collectives run over (``collectives``)
        # devices whose cuFFT plan cache held plans at capture: the graph may read them (``fft_plans``)
        self.plan_devices: tuple[int, ...] = ()

    @property
    def held_bytes(self) -> int:
        """The device memory this graph keeps for its life: its share of the pool and its input buffers."""
        return self.pool_growth + self.input_bytes

    def load(self, leaves: list, *, rows: int | None = None) -> None:
        """Copy new inputs into the static buffers, in one multi-tensor launch where there are several; a static
        buffer passed back in is not copied. A host input is copied before the call returns, as eager's own
        ``.to(device)`` does: a caller may refill its (pinned) buffer right after the call. ``rows``: the inputs
        fill only that many first rows of each buffer (a call padded to a batch bucket; see ``batching``)."""
        if rows is None:
            pairs = [(static, leaves[i]) for i, static in self.slot_buffers if leaves[i] is not static]
            host = [(static, leaves[i]) for i, static in self.host_buffers]
        else:
            pairs = [(static[:rows], leaves[i]) for i, static in self.slot_buffers]
            host = [(static[:rows], leaves[i]) for i, static in self.host_buffers]
        if len(pairs) > 1 and not torch.is_grad_enabled():  # _foreach_copy_ has no autograd formula
            dsts, srcs = zip(*pairs, strict=True)
            torch._foreach_copy_(list(dsts), list(srcs), non_blocking=True)
        else:
            for static, src in pairs:
                static.copy_(src, non_blocking=True)
        for static, src in host:
            static.copy_(src)  # blocking: the host buffer may be reused as soon as the call returns

    def replay(self, leaves: list, *, rows: int | None = None) -> Any:
        """Replay on new inputs and return the graph's own output buffers (overwritten next replay)."""
        self.load(leaves, rows=rows)
        self.graph.replay()
        self.replays += 1
        if self.written:  # the replay path: no call at all for the forwards that write nothing
            self.write_back(leaves, rows=rows)
        return self.outputs

    def replay_cloned(self, leaves: list, *, rows: int | None = None) -> Any:
        """Replay and return copies of the outputs that the next replay cannot overwrite."""
        self.load(leaves, rows=rows)
        self.graph.replay()
        self.replays += 1
        if self.written:  # the replay path: no call at all for the forwards that write nothing
            self.write_back(leaves, rows=rows)
        return self.fresh_outputs(leaves)

    def write_back(self, leaves: list, *, rows: int | None = None) -> None:
        """The inputs the forward writes in place get what the replay wrote into their static copies, as eager
        leaves them in the caller's tensors (``rows``: only the call's rows of a padded bucket)."""
        for i in self.written:
            static, target = self.static_leaves[i], leaves[i]
            if target is not static:
                target.copy_(static if rows is None else static[:rows])

    def fresh_outputs(self, leaves: list) -> Any:
        """Copies of the output buffers; an output that is (a view of) an input is that input of ``leaves``,
        as in eager (see ``output_aliases``)."""
        if not self.aliases:
            return self._clone()
        return self._clone(lambda new: fill_aliases(self.aliases, leaves, new))


def _check_outputs(outputs: Any) -> None:
    see_into(outputs)  # caches and dataclasses: their tensors are copied and verified like any output's
    for leaf in pytree.tree_leaves(outputs):
        if not isinstance(leaf, (torch.Tensor, *IMMUTABLE_OUTPUTS)):
            raise CaptureFailed(
                Stage.OUTPUTS,
                None,
                f"the forward returns an object of type {type(leaf).__name__} that launchless cannot look "
                "into; its tensors would be overwritten by the next replay. Return tensors in tuples, lists, "
                "dicts, namedtuples, dataclasses, transformers outputs and caches, or register the class with "
                "torch.utils._pytree.register_pytree_node",
            )


def _versions(static_leaves: list, slots: list[int]) -> list[int]:
    return [static_leaves[i]._version for i in slots]


def _storage(t: torch.Tensor) -> tuple[torch.device, int]:
    return t.device, t.untyped_storage().data_ptr()


def _written_slots(
    leaves: list,
    slots: list[int],
    before: list[int],
    after: list[int],
    write_back: bool,
    host: frozenset[int] = frozenset(),
) -> tuple[int, ...]:
    """The inputs the warm-up wrote in place (their static copies' versions moved), where the graph can write them
    back; raises ``CaptureFailed`` where it cannot. ``host``: the slots of CPU tensors passed to a GPU graph."""
    written = tuple(i for i, old, new in zip(slots, before, after, strict=True) if old != new)
    if not written:
        return written
    if any(i in host for i in written):
        raise CaptureFailed(
            Stage.INPUT_MUTATION,
            None,
            "the forward writes in place into a CPU tensor it was given; a graph replays GPU work only, so the "
            "write would happen once, at capture. Pass the tensor on the GPU, or avoid the in-place op",
        )
    if not write_back:
        raise CaptureFailed(
            Stage.INPUT_MUTATION,
            None,
            "the forward writes into its own input in place; a graph would change its static copy, not your "
            "tensor. Clone the input inside forward (x = x.clone()) or avoid the in-place op",
        )
    storages = [_storage(leaves[i]) for i in slots]
    for i in written:
        mine = _storage(leaves[i])
        if mine[1] and sum(storage == mine for storage in storages) > 1:
            raise CaptureFailed(
                Stage.INPUT_MUTATION,
                None,
                "the forward writes in place into an input that shares memory with another input; eager's write "
                "changes both, a graph's separate copies of them would not. Pass separate tensors (x.clone()) or "
                "avoid the in-place op",
            )
    return written


def capture(
    fn: Callable[..., Any],
    flat: FlatInputs,
    *,
    device: torch.device,
    pool: Any,
    warmup: int = 3,
    stream: torch.cuda.Stream | None = None,
    static: frozenset[int] = frozenset(),
    keep_graph: bool = False,
    trace_indices: bool = False,
    junction_pool: Callable[[], Any] | None = None,
    write_back: bool = False,
) -> CapturedGraph:
    """Warm up ``fn`` on a side stream, capture it there, and return the replayable graph.

    ``stream``: capture on this stream (training passes the stream its eager warm-up steps ran on);
    by default the device's ``side_stream``. ``static``: indices of leaves the graph reads in place (parameters and
    buffers handed over by the compiler): no placeholder, no copy; the caller checks their addresses.
    ``keep_graph``: keep the graph's template (for pointer indirection) next to its instance.
    ``trace_indices``: the first warm-up run finds the float inputs read as addresses (``index_trace``), for
    verification to probe from the call's own values (``CapturedGraph.index_inputs``).
    ``junction_pool``: a forward that fails to capture inside an operation that can run eager between two graphs
    (``junctions``) is captured again as a chain of graphs around it, into a new pool this returns (the pool of
    a failed capture must not be captured into again); ``CapturedGraph.junctions`` lists those operations.
    ``write_back``: a forward that writes into its own inputs in place is captured, and every replay copies what
    it wrote back into the caller's tensors (``CapturedGraph.written``; verification compares them like outputs);
    without it such a forward is refused. An input written in place that shares memory with another input is
    refused either way: eager's write changes the other input too, the graph's static copies do not.
    Raises ``CaptureFailed`` with the original exception; the process stays usable either way.
    """
    with CAPTURE_LOCK, torch.cuda.device(device):
        static_leaves = [
            _static_like(x, device) if isinstance(x, torch.Tensor) and i not in static else x
            for i, x in enumerate(flat.leaves)
        ]
        slots = [i for i, x in enumerate(static_leaves) if isinstance(x, torch.Tensor) and i not in static]
        args, kwargs = flat.rebuild(static_leaves)
        caller = torch.cuda.current_stream(device)
        stream = stream or side_stream(device)
        stream.wait_stream(caller)
        try:
            before = _versions(static_leaves, slots)
            with torch.cuda.stream(stream), _capture_autocast():
                traced = bool(trace_indices and warmup)  # the first warm-up run is the traced one
                index_inputs = _traced_warmup(fn, args, kwargs, static_leaves) if traced else frozenset()
                copies = HostCopies()
                trace = CollectiveTrace() if distributed() else contextlib.nullcontext()
                try:
                    for k in range(warmup - traced):
                        if k == warmup - traced - 1:  # the last one records the host-to-device copies (and collectives)
                            with trace:
                                copies = _recorded_warmup(fn, args, kwargs)
                        else:
                            fn(*args, **kwargs)
                except Exception as exc:
                    raise CaptureFailed(Stage.WARM_UP, exc, f"the forward failed during warm-up: {exc}") from exc
            groups = trace.groups if isinstance(trace, CollectiveTrace) else []
            try:
                host = frozenset(i for i in slots if flat.leaves[i].device.type == "cpu" and device.type != "cpu")
                after = _versions(static_leaves, slots)
                written = _written_slots(flat.leaves, slots, before, after, write_back, host)
                torch.cuda.synchronize(device)
                reserved = torch.cuda.memory_reserved(device)
                generator = torch.cuda.default_generators[device.index if device.index is not None else 0]
                start = time.perf_counter()
                run = _Run(fn, args, kwargs, copies, device, stream, generator, keep_graph, collective=bool(groups))
                # graphs around operations run eager: a rank could need them where another does not (see collectives)
                graph, outputs, first_failure = _capture_with_junctions(run, pool, None if groups else junction_pool)
            except CaptureFailed as fail:
                fail.collective_groups = groups
                raise
        finally:
            # whatever happened, the caller's stream goes on after the side stream's work: the static buffers (made
            # on the caller's stream) are freed when a failed capture drops them, and the caller's next tensors may
            # get their memory while warm-up kernels that write them are still queued on the side stream (a forward
            # writing its input, with the GPU busy, wrote into the call's eager result)
            caller.wait_stream(stream)
        capture_ms = (time.perf_counter() - start) * 1e3
        _check_outputs(outputs)
        growth = torch.cuda.memory_reserved(device) - reserved
        captured = CapturedGraph(
            graph, static_leaves, slots, outputs, capture_ms, growth, torch.cuda.current_device(), host_slots=host
        )
        captured.index_inputs = index_inputs
        captured.written = written
        captured.collective_groups = groups
        if device.type == "cuda" and holds_plans(captured.device_index):
            captured.plan_devices = (captured.device_index,)
        if isinstance(graph, SegmentedGraph):
            captured.junctions = tuple(graph.junctions)
            captured.split_from = first_failure
        captured.host_constants = copies  # the device tensors the graph's host constants are copied from
        sources = HostSources(copies)
        captured.host_sources = sources if sources else None  # None: the replay path tests an attribute only
        return captured


@dataclasses.dataclass
class _Run:
    """What one capture attempt needs: the forward and its arguments, the recorded host copies, where."""

    fn: Callable[..., Any]
    args: tuple
    kwargs: dict
    copies: HostCopies
    device: torch.device
    stream: torch.cuda.Stream
    generator: torch.Generator
    keep_graph: bool
    collective: bool = False  # the forward runs collectives: their asynchronous outputs are waited for inside

    def forward(self) -> Any:
        if self.copies:
            with replaying(self.copies) as replayer:
                outputs = self.fn(*self.args, **self.kwargs)
            replayer.check_all_used()
        else:
            outputs = self.fn(*self.args, **self.kwargs)
        return wait_outputs(outputs) if self.collective else outputs


def _capture_with_junctions(
    run: _Run, pool: Any, junction_pool: Callable[[], Any] | None
) -> tuple[Any, Any, CaptureFailed | None]:
    """Capture ``run`` as one graph; where that fails inside an operation that can run eager between graphs
    (and ``junction_pool`` allows it), as a chain around every call of it. Returns the graph or chain, the
    outputs, and the first failure when a chain was needed. Raises the first failure when no chain works."""
    try:
        graph, outputs = _capture_once(run, pool)
        return graph, outputs, None
    except CaptureFailed as fail:
        if junction_pool is None or fail.stage != Stage.CAPTURE or fail.cause is None or out_of_memory(fail.cause):
            raise
        first = fail
    junction_ops: frozenset[Any] = frozenset()
    while True:  # the first attempt only finds the operation: the plain capture did not watch operations
        try:
            chain, outputs = _capture_chain(run, junction_pool(), junction_ops)
            return chain, outputs, first
        except CaptureFailed as fail:
            site = fail.site
            if site is None or not site.eligible or site.op in junction_ops or len(junction_ops) >= MAX_JUNCTION_OPS:
                first.site = first.site or site
                first.no_junction = fail.no_junction or _why_no_junction(site, junction_ops)
                raise first from None
            first.site = first.site or site
            junction_ops = junction_ops | {site.op}


def _why_no_junction(site: Site | None, junction_ops: frozenset[Any]) -> str:
    """Why no chain was kept; where graphs around earlier operations were tried, which operation stopped them."""
    if junction_ops and site is not None and site.op not in junction_ops:
        tried = ", ".join(sorted(operation_name(op) for op in junction_ops))
        where = f" at {site.source}" if site.source else ""
        return f"graphs around {tried} were tried, then {site.name}{where} stopped them: " + _why_no_junction(
            site, frozenset()
        )
    if site is None:
        return "the capture did not fail inside one operation"
    if not site.eligible:
        return f"{site.name} cannot run eager between graphs: {site.why_not}"
    if site.op in junction_ops:
        return f"{site.name} fails under capture even when run eager between graphs"
    return f"more than {MAX_JUNCTION_OPS} kinds of operation would run eager"


def _capture_once(run: _Run, pool: Any) -> tuple[torch.cuda.CUDAGraph, Any]:
    """The forward captured as one graph."""
    device, generator = run.device, run.generator
    rng_before = generator.clone_state()
    graph = torch.cuda.CUDAGraph(keep_graph=True) if run.keep_graph else torch.cuda.CUDAGraph()
    with own_blas_workspaces(), torch.cuda.stream(run.stream), _capture_autocast(), _no_cyclic_gc():
        try:
            graph.capture_begin(pool=pool, capture_error_mode="thread_local")
        except Exception as exc:  # e.g. a pool whose graphs are all gone: its generator state is set already
            _abandon(graph, device, pool, generator, rng_before, ended=True)
            raise CaptureFailed(Stage.CAPTURE, exc, str(exc)) from exc
        try:
            outputs = run.forward()
        except BaseException as exc:
            _abandon(graph, device, pool, generator, rng_before)
            raise CaptureFailed(Stage.CAPTURE, exc, str(exc)) from exc
        try:
            graph.capture_end()
        except Exception as exc:
            _abandon(graph, device, pool, generator, rng_before, ended=True)
            raise CaptureFailed(Stage.CAPTURE, exc, str(exc)) from exc
        if run.keep_graph:  # the template stays readable (pointer indirection); replays need the instance
            graph.instantiate()
    return graph, outputs


def _capture_chain(run: _Run, pool: Any, junction_ops: frozenset[Any]) -> tuple[SegmentedGraph, Any]:
    """The forward captured as graphs with the calls of ``junction_ops`` run eager between them."""
    device, generator = run.device, run.generator
    rng_before = generator.clone_state()
    chain = SegmentedGraph(device)

    def begin() -> None:
        graph = torch.cuda.CUDAGraph()
        chain.graphs.append(graph)
        chain.empty.append(False)
        clear_blas_workspaces()  # a junction's eager matmul may have made one outside the pool
        graph.capture_begin(pool=pool, capture_error_mode="thread_local")

    mode = SegmentingMode(chain, junction_ops=junction_ops, device=device, begin=begin)
    with own_blas_workspaces(), torch.cuda.stream(run.stream), _capture_autocast(), _no_cyclic_gc():
        try:
            mode.start()
            with mode:
                outputs = run.forward()
            mode.end()
        except BaseException as exc:
            for graph in chain.graphs[:-1]:  # complete graphs of a chain given up: their memory goes
                with contextlib.suppress(Exception):
                    graph.reset()
            if chain.graphs:
                _abandon(chain.graphs[-1], device, pool, generator, rng_before, ended=not mode.capturing)
            cause = exc.__cause__ if isinstance(exc, NotAJunction) and exc.__cause__ else exc
            fail = CaptureFailed(Stage.CAPTURE, cause, str(cause))
            fail.site = mode.site
            if isinstance(exc, NotAJunction):
                fail.no_junction = str(exc)
            raise fail from exc
    return chain, outputs


def _recorded_warmup(fn: Callable[..., Any], args: tuple, kwargs: dict) -> HostCopies:
    """One warm-up run that records its host-to-device copies (``host_constants``), on the path the capture takes:
    library code that asks whether the stream is capturing is told yes (``capture_path``), as it will be while
    capturing -- transformers skips its mask's host check under capture and builds the mask instead, copying a
    constant from the host that the eager path never copies. A forward that fails only under the recorder (a
    dispatch mode it does not support) or only on that path runs again without either, and nothing is recorded (a
    copy the capture then meets refuses it, as before)."""
    try:
        with pretend_capturing(), recording() as recorder:
            fn(*args, **kwargs)
        return recorder.copies
    except Exception:
        fn(*args, **kwargs)
        return HostCopies()


def _traced_warmup(fn: Callable[..., Any], args: tuple, kwargs: dict, leaves: list) -> frozenset[int]:
    """One warm-up run that also finds the inputs read as addresses. A forward that fails only under the
    trace (a dispatch mode it does not support) is run again without it, and nothing is known; one that fails
    without the trace too is a broken forward, reported as such (not as a trace problem)."""
    try:
        with IndexTrace(leaves) as trace:
            fn(*args, **kwargs)
        return frozenset(trace.found)
    except Exception as exc:
        traced_error = exc
    try:
        fn(*args, **kwargs)
    except Exception as exc:
        raise CaptureFailed(Stage.WARM_UP, exc, f"the forward failed during warm-up: {exc}") from exc
    first_line = str(traced_error).strip().splitlines()[0] if str(traced_error).strip() else ""
    logging.getLogger("launchless").info(
        "launchless: the warm-up could not be traced for inputs read as addresses (%s: %s); verification "
        "probes every float input at random",
        type(traced_error).__name__,
        first_line,
    )
    return frozenset()


def _abandon(
    graph: torch.cuda.CUDAGraph,
    device: torch.device,
    pool: Any,
    generator: torch.Generator,
    rng_before: torch.Generator,
    ended: bool = False,
) -> None:
    """Leave no trace of a failed capture.

    End the capture; tell the device allocator the pool is no longer captured into; give the
    default generator back the state it had (a capture that never reached its end leaves it in
    capture mode, and every later random op would fail); reset the graph but keep the object alive,
    since an allocator may still hold a raw pointer to it. The host allocator cannot be told from
    Python, so the pool stays marked as recording: callers capture into a new pool afterwards.
    """
    if not ended:
        with contextlib.suppress(Exception), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "The CUDA Graph is empty": nothing was recorded before the failure
            graph.capture_end()
    _end_pool_allocation(device, pool)
    with contextlib.suppress(Exception):
        generator.graphsafe_set_state(rng_before)
    with contextlib.suppress(Exception):
        graph.reset()
    _failed_graphs.append(graph)
    with contextlib.suppress(Exception):
        torch.cuda.synchronize(device)
