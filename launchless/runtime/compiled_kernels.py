"""Compiled kernels without the compile wait: per input signature, Inductor's program built off the calls' path and
its graph swapped in for the eager-kernel graph once it is proven.

With ``wrap(model, kernels="compiled")`` the calls capture and replay eager-kernel graphs exactly as without it.
When a signature's graph is kept, the same forward starts compiling in a child process
(``core.compiled_programs``); the calls never wait for it. Once the program is ready, the next calls of that signature
each do one part of its proof -- read onto the model's own weights, captured into a graph, held to eager's accuracy,
timed -- and replay the eager-kernel graph meanwhile (no call waits for the whole proof); the graph is proven three
ways before it replaces the eager-kernel graph:

- it replays the compiled program bit for bit (``verify`` against the program itself, as every graph);
- the program is as accurate as eager, against the forward run in float64, on two probes (``core.accuracy``:
  fused kernels round differently, so bit identity with eager cannot hold, and a fixed tolerance proves nothing);
- it is faster than the eager-kernel graph it replaces (``judge_speed``, interleaved rounds).

Then it replaces that graph, with one log line; otherwise the eager-kernel graph stays and ``graph_info()`` says why.
Whatever drops graphs (weights replaced, the model moved, ``release_graphs()``) also cancels a compile in flight:
no program is ever swapped in onto weights it was not loaded with.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Generator
from typing import Any, cast

import torch

from ..core import capture as _capture
from ..core.accuracy import (
    allowed_float32_precision,
    as_accurate_as_eager,
    channels_last_copy,
    float64_copy,
    widened,
)
from ..core.cache import GraphCache
from ..core.compiled_programs import JobState, SpareCompiler, compile_in_background, gpu_of
from ..core.kernel_swaps import KernelDecision, KernelState, unpackaged_note
from ..core.signature import FlatInputs, Signature
from ..core.verify import make_probes, verify
from ..errors import one_line
from ..timing import SpeedVerdict, judge_speed
from .split import copies

# a proof under way: sent each call's (inputs, eager-kernel graph), it returns the proven graph or why it is not used
Proof = Generator[None, tuple[FlatInputs, _capture.CapturedGraph], "_capture.CapturedGraph | str"]


class CompiledKernels:
    """The compiled programs of one wrapped forward, per signature: started when its eager-kernel graph is kept,
    swapped in at a call once ready and proven. ``pending`` counts the undecided ones: while it is 0 the calls'
    path reads nothing else of this."""

    def __init__(
        self,
        *,
        model: torch.nn.Module,
        name: str,
        cache: GraphCache[_capture.CapturedGraph],
        warmup: int,
        verify: str = "on",
    ) -> None:
        self.name, self.cache, self.warmup, self.verify = name, cache, warmup, verify
        # loads while the calls warm up; the first compile takes it. A model with nothing on a GPU gets none: it
        # compiles nothing there (graphs are captured on a GPU only), and a compile after a move starts its own process
        self._spare: SpareCompiler | None = SpareCompiler(model) if gpu_of(model) is not None else None
        self._entries: dict[Signature, KernelDecision] = {}
        self.pending = 0
        self._swapping = threading.Lock()  # one swap at a time: threads calling at once swap once
        self._proofs: dict[Signature, Proof] = {}  # proofs under way, a part done per call

    def take_spare(self) -> SpareCompiler | None:
        """The compiler process started with the wrapper, for another policy's first compile (decode steps), where
        no forward's compile has taken it."""
        spare, self._spare = self._spare, None
        return spare

    def decode_spare(self, model: torch.nn.Module) -> SpareCompiler:
        """The compiler process for the first decode step's compile: the wrapper's, where no forward's compile took
        it, else one started now -- it loads while the first generations decode through eager-kernel graphs, so
        that the decode step's compile begins with its export rather than with imports (seconds for a
        transformers model)."""
        spare = self.take_spare()
        return spare if spare is not None else SpareCompiler(model)

    def start(self, sig: Signature, model: torch.nn.Module, flat: FlatInputs) -> None:
        """Compile ``model`` for ``sig`` off the calls' path (a program on disk is ready at once). A signature whose
        program was swapped in before and whose graph was captured again (evicted, say) gets it again; one decided
        against keeps eager's kernels."""
        entry = self._entries.get(sig)
        if entry is not None and entry.state is not KernelState.SWAPPED:
            return
        args, kwargs = flat.rebuild(flat.leaves)
        job = compile_in_background(model, args, kwargs, signature=sig.describe(), spare=self._spare)
        self._spare = None  # taken (or not needed: the program was on disk)
        self._entries[sig] = KernelDecision(job, started=time.perf_counter())
        self.pending += 1

    def swap(
        self, sig: Signature, flat: FlatInputs, graph: _capture.CapturedGraph, model: torch.nn.Module
    ) -> _capture.CapturedGraph:
        """The graph to replay for this call: the compiled program's, once ready and proven, else ``graph``. The proof
        is spread over the signature's calls, one part a call (read, capture, accuracy, speed: ``_proof``), each call
        replaying ``graph`` until the last part swaps: no call waits for the whole of it."""
        entry = self._entries.get(sig)
        if entry is None or entry.state is not KernelState.COMPILING or not entry.compile.done:
            return graph
        if not self._swapping.acquire(blocking=False):  # another thread swaps it: this call replays what is held
            return graph
        try:
            if entry.state is not KernelState.COMPILING:  # decided while this thread waited to look
                return cast(_capture.CapturedGraph, self.cache.graphs.get(sig, graph))
            return self._step(sig, entry, flat, graph, model)
        finally:
            self._swapping.release()

    def _step(
        self,
        sig: Signature,
        entry: KernelDecision,
        flat: FlatInputs,
        graph: _capture.CapturedGraph,
        model: torch.nn.Module,
    ) -> _capture.CapturedGraph:
        """One part of ``sig``'s proof on this call's inputs; the decision once the last part is done."""
        if entry.compile.state is not JobState.READY:
            return self._decided(sig, entry, f"the compile {entry.compile.state}: {entry.compile.reason}", graph)
        proof = self._proofs.get(sig)
        if proof is None:
            proof = self._proofs[sig] = self._proof(sig, entry, model)
            next(proof)  # to its first part, which waits for a call
        try:
            proof.send((flat, graph))
        except StopIteration as done:
            outcome: _capture.CapturedGraph | str = done.value
        except Exception as exc:  # loading, capturing or proving the program failed: the calls never see it
            outcome = one_line(exc)
        else:
            return graph  # a part done: this call replays the eager-kernel graph
        if self._proofs.pop(sig, None) is not proof:  # the graphs were dropped meanwhile (another thread): no swap
            return graph
        return self._decided(sig, entry, outcome, graph, flat)

    def _decided(
        self,
        sig: Signature,
        entry: KernelDecision,
        outcome: _capture.CapturedGraph | str,
        graph: _capture.CapturedGraph,
        flat: FlatInputs | None = None,
    ) -> _capture.CapturedGraph:
        """Swap in the proven graph ``outcome``, or keep ``graph`` saying why not (``outcome`` the reason)."""
        self.pending -= 1
        if isinstance(outcome, str):
            return self._keep_eager(sig, entry, outcome, graph)
        assert flat is not None  # a proven graph comes with the call that finished its proof
        self.cache.keep(sig, outcome, self.cache.reports.get(sig), flat.leaves)
        entry.state, entry.swap_s = KernelState.SWAPPED, time.perf_counter() - entry.started
        speed = cast(SpeedVerdict, entry.speed)  # every swap is timed
        self.cache.log_once(
            f"compiled:{sig.describe()}",
            logging.INFO,
            f"launchless: {self.name} {sig.describe()} replays Inductor's compiled kernels from now on "
            f"({speed.candidate_ms:.3f} ms against {speed.eager_ms:.3f} ms a call with eager's kernels; compiled in "
            f"{entry.compile.seconds:.1f} s beside the calls; as accurate as eager against float64)"
            + unpackaged_note(entry.compile),
        )
        return outcome

    def _proof(self, sig: Signature, entry: KernelDecision, model: torch.nn.Module) -> Proof:
        """The program's graph, captured and proven, or why it is not used: a part per call of ``sig``, each on that
        call's inputs and eager-kernel graph (sent in; the graph is captured again should it be evicted meanwhile).
        Between two parts the model may change in place (a checkpoint loaded): each part reads it as it is then."""
        flat, graph = yield
        with entry.timed("read"):
            program = entry.compile.load(model)
        flat, graph = yield
        tensors = [x for x in flat.leaves if isinstance(x, torch.Tensor)]
        device = next((x.device for x in tensors if x.is_cuda), tensors[0].device)
        with entry.timed("capture"), self.cache.capturing(sig) as pool:
            compiled = _capture.capture(program, flat, device=device, pool=pool, warmup=self.warmup)
            # against the program itself: bit for bit, or within its own spread where its kernels are not
            # deterministic (verify="strict": bit for bit only)
            report = verify(compiled, program, flat, mode="strict" if self.verify == "strict" else "on")
        if not report.passed:
            return f"its graph does not replay the compiled program ({report.status}: {report.detail})"
        flat, graph = yield
        with entry.timed("accuracy"):
            why = self._as_accurate(entry, flat, graph, model, program)
        if why:
            return why
        flat, graph = yield
        leaves = copies(flat.leaves)
        try:
            with entry.timed("speed"):
                entry.speed = judge_speed(lambda: graph.replay_cloned(leaves), lambda: compiled.replay_cloned(leaves))
        finally:
            graph.replays = compiled.replays = 0  # the judge's replays are not the caller's
        if not entry.speed.faster:
            return f"the compiled kernels' graph is {entry.speed.detail.replace('eager', 'eager kernels')}"
        compiled.speed = graph.speed
        return compiled

    @staticmethod
    def _as_accurate(
        entry: KernelDecision,
        flat: FlatInputs,
        graph: _capture.CapturedGraph,
        model: torch.nn.Module,
        program: Callable[..., Any],
    ) -> str:
        """Why the program is not as accurate as eager against the forward in float64 on two probes; empty where
        it is."""
        wide = float64_copy(model)  # the reference: the same forward in float64
        precision = allowed_float32_precision(model)  # eager itself may round so under the process's settings
        laid_out = channels_last_copy(model)  # eager's other layout, where its convolutions may round otherwise
        for probe in make_probes(flat.leaves, from_call=graph.index_inputs):
            args, kwargs = flat.rebuild(probe)
            wide_args, wide_kwargs = widened((args, kwargs))
            try:
                reference = wide(*wide_args, **wide_kwargs)
            except Exception as exc:  # an operation without a float64 kernel, say: nothing to prove against
                why = one_line(exc)
                return f"the forward does not run in float64, the reference the program is proven against ({why})"
            entry.accuracy = as_accurate_as_eager(
                model(*args, **kwargs),
                program(*args, **kwargs),
                reference,
                float32_precision=precision,
                eager_other_layout=laid_out(*args, **kwargs) if laid_out is not None else None,
            )
            if not entry.accuracy.passed:
                return f"the compiled program is not as accurate as eager: {entry.accuracy.detail}"
        return ""

    def _keep_eager(
        self, sig: Signature, entry: KernelDecision, why: str, graph: _capture.CapturedGraph
    ) -> _capture.CapturedGraph:
        entry.state, entry.reason = KernelState.KEPT_EAGER, why
        self.cache.discard()
        self.cache.log_once(
            f"compiled-kept-eager:{why}",
            logging.INFO,
            f"launchless: {self.name} {sig.describe()} keeps eager's kernels: {why}",
        )
        return graph

    def cancel(self, why: str) -> None:
        """The graphs were dropped: every compile in flight is ended (it would load onto weights no graph holds);
        the next captures start again (a finished program is found on disk)."""
        for entry in self._entries.values():
            if entry.state is KernelState.COMPILING:
                entry.compile.cancel(why)
        for proof in self._proofs.values():
            with contextlib.suppress(ValueError):  # one running in another thread ends at its part's end, unused
                proof.close()  # a graph captured for it goes with it, never kept
        self._entries.clear()
        self._proofs.clear()
        self.pending = 0

    def info(self, describe: Callable[[Signature], str]) -> list[dict[str, Any]]:
        return [entry.row(describe(sig)) for sig, entry in self._entries.items()]


__all__ = ["CompiledKernels"]
