"""Compiled kernels for decode steps: per decode graph (a batch on one static cache, of one length), Inductor's
program of the step compiled beside the generations and swapped in between two ``generate()`` calls once proven.

With ``wrap(model, kernels="compiled")``, ``generate()`` decodes through eager-kernel graphs from its first call, as
without it. When a decode step's graph is kept, the step starts compiling in a child process
(``core.compiled_programs``): a ``DecodeStep`` module holds the model and the cache, every tensor of the cache one of
its buffers, so that the export sees the cache's writes as writes to buffers and the program writes the cache's own
tensors in place, as eager does. At the start of each later ``generate()`` call -- never inside one: a generation's
tokens come from one set of kernels, and a class of calls proves its loop on the kernels it then decodes with -- a
ready program's proof goes one part further (a part a call: no generation waits for all of it): it is loaded onto
the model's weights and the cache's tensors, captured into a graph and proven before it replaces the eager-kernel
graph:

- the graph replays the program bit for bit, outputs and cache writes, from the same cache state (``verify_step``);
- the program is as accurate as eager against the step run in float64 (model and cache widened), on the call's
  tokens and on others, the logits and the cache it leaves alike (``core.accuracy``);
- it is faster than the eager-kernel graph (``judge_speed``).

The cache is put back after each proof. The step is compiled with eager's numerics (``eager_numerics``: each fused
operation's result rounded to its dtype, as eager rounds it), so that the logits a greedy token is picked from stay
as near eager's as fused kernels allow; reductions still add in their own order, so where two logits lie within a
rounding of each other a token can differ from eager's (``kernels="eager"`` keeps tokens bit for bit). Whatever
forgets a decode graph (its cache dropped or re-allocated, the weights replaced, the model moved) cancels its
compile.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Generator, Hashable, Iterator, Mapping
from typing import Any, Protocol

import torch

from ..core.accuracy import allowed_float32_precision, as_accurate_as_eager, float64_copy, widened
from ..core.cache import GraphCache
from ..core.capture import CapturedGraph, capture
from ..core.compiled_programs import JobState, SpareCompiler, compile_in_background
from ..core.kernel_swaps import KernelDecision, KernelState, unpackaged_note
from ..core.signature import FlatInputs, Signature
from ..core.verify import verify_step
from ..errors import one_line
from ..timing import judge_speed
from .cache_layers import CacheState, DevicePositions, HostCounters
from .split import copies
from .static_cache import cache_slots, cache_tensors


class DecodeStep(torch.nn.Module):
    """One decode step of ``model`` on a static ``cache``, as a module the compiler process can rebuild and export:
    the model a submodule, each tensor of the cache a buffer (the export then sees the step's cache writes as buffer
    writes, and the program is called with the cache's own tensors). The model's own ``forward`` runs (its class's:
    not the routing ``generate()`` puts on the instance); the output is the model's without the cache object."""

    def __init__(self, model: torch.nn.Module, cache: Any, keyword: str) -> None:
        super().__init__()
        self.model = model
        self.cache = cache
        self.keyword = keyword
        for index, (_, _, tensor) in enumerate(cache_slots(cache)):
            self.register_buffer(f"cache_{index}", tensor, persistent=False)

    def forward(self, **tensors: Any) -> Any:
        output = type(self.model).forward(self.model, **tensors, **{self.keyword: self.cache})
        if isinstance(output, Mapping):
            return {k: v for k, v in output.items() if v is not self.cache}
        return output


@dataclasses.dataclass
class _Compile:
    """One decode graph's compile: the decision, the step it compiles, the call it was captured on (copied) and the
    cache's positions then (``positions`` on the device, ``counts`` on the host): the program is proven from them,
    where the eager-kernel graph's own warm-up steps ran within the cache."""

    decision: KernelDecision
    step: DecodeStep
    flat: FlatInputs
    positions: DevicePositions
    counts: list[int]


class HeldGraph(Protocol):
    """What a decode graph is replayed with, as ``DecodeSteps`` holds it: the cache and its host-side lengths."""

    cache: Any
    counters: HostCounters


# a proof under way: sent each generate() call's eager-kernel graph and held cache; returns the proven graph or why not
DecodeProof = Generator[None, tuple[CapturedGraph, HeldGraph], "CapturedGraph | str"]


class DecodeKernels:
    """The compiled programs of one model's decode graphs (see the module docstring). ``pending`` counts the
    undecided ones."""

    def __init__(
        self,
        *,
        name: str,
        graphs: GraphCache[CapturedGraph],
        held: Callable[[Hashable], HeldGraph | None],
        warmup: int,
        verify: str,
        spare: SpareCompiler | None = None,
    ) -> None:
        self.name, self.graphs, self.held, self.warmup, self.verify = name, graphs, held, warmup, verify
        self._spare = spare  # a compiler process started with the wrapper, if the forward's compile did not take it
        self._compiles: dict[Hashable, _Compile] = {}
        self._refused: dict[Hashable, KernelDecision] = {}  # decided before any compile was started
        self._proofs: dict[Hashable, DecodeProof] = {}  # proofs under way, a part done per generate() call
        self.pending = 0

    def start(self, key: Signature, forward: Callable[..., Any], cache: Any, keyword: str, flat: FlatInputs) -> None:
        """Compile the step of a decode graph just kept, off the calls' path (a program on disk is ready at once)."""
        model = getattr(forward, "__self__", None)
        if not isinstance(model, torch.nn.Module) or getattr(forward, "__func__", None) is not type(model).forward:
            self._refused[key] = KernelDecision(
                None,
                started=time.perf_counter(),
                state=KernelState.KEPT_EAGER,
                reason="the model's forward is replaced on the instance, so its class's forward is not the step",
            )
            return
        step = DecodeStep(model, cache, keyword)
        args, kwargs = flat.rebuild(flat.leaves)
        job = compile_in_background(
            step, args, kwargs, signature=f"decode step {key.describe()}", eager_numerics=True, spare=self._spare
        )
        self._spare = None  # taken (or not needed: the program was on disk)
        decision = KernelDecision(job, started=time.perf_counter())
        positions, counts = DevicePositions(cache), HostCounters.of(cache).read()
        self._compiles[key] = _Compile(decision, step, flat._replace(leaves=copies(flat.leaves)), positions, counts)
        self.pending += 1

    def forget(self, key: Hashable, why: str) -> None:
        """A decode graph forgotten (its cache dropped or re-allocated): its compile goes, with no trace."""
        self._refused.pop(key, None)
        proof = self._proofs.pop(key, None)
        if proof is not None:
            proof.close()  # a graph captured for it goes with it, never kept
        entry = self._compiles.pop(key, None)
        if entry is not None and entry.decision.state is KernelState.COMPILING:
            self.pending -= 1
            if entry.decision.job is not None:
                entry.decision.job.cancel(why)

    def cancel(self, why: str) -> None:
        """The decode graphs were dropped (the weights replaced, the model moved): every compile in flight ends."""
        for key in [*self._compiles, *self._refused]:
            self.forget(key, why)

    def end_spare(self) -> None:
        if self._spare is not None:
            self._spare.end()
            self._spare = None

    def swap_ready(self) -> None:
        """Between two ``generate()`` calls: every ready program's proof goes one part further (read, capture,
        accuracy, speed: a part per call, so that no generation waits for the whole proof); a proven one is swapped
        in, a failed one leaves its decode graph on eager's kernels with the reason (one log line each)."""
        if not self.pending:
            return
        for key, entry in list(self._compiles.items()):
            decision = entry.decision
            if decision.state is not KernelState.COMPILING or not decision.compile.done:
                continue
            graph, held = self.graphs.graphs.get(key), self.held(key)
            if graph is None or held is None or held.cache is not entry.step.cache:  # forgotten meanwhile
                self.forget(key, "its decode graph was dropped")
                continue
            if decision.compile.state is not JobState.READY:
                self.pending -= 1
                self._keep_eager(key, decision, f"the compile {decision.compile.state}: {decision.compile.reason}")
                continue
            proof = self._proofs.get(key)
            if proof is None:
                proof = self._proofs[key] = self._proof(key, entry)
                next(proof)  # to its first part, which waits for a call
            try:
                proof.send((graph, held))
            except StopIteration as done:
                outcome: CapturedGraph | str = done.value
            except Exception as exc:  # loading, capturing or proving the program failed: no generation sees it
                outcome = one_line(exc)
            else:
                continue  # a part done: the next generate() does the next
            del self._proofs[key]
            self.pending -= 1
            if isinstance(outcome, str):
                self._keep_eager(key, decision, outcome)
                continue
            self.graphs.keep(key, outcome, self.graphs.reports.get(key), entry.flat.leaves)
            decision.state, decision.swap_s = KernelState.SWAPPED, time.perf_counter() - decision.started
            speed = decision.speed
            assert speed is not None  # every swap is timed
            self.graphs.log_once(
                f"compiled:{key.describe()}",
                logging.INFO,
                f"launchless: {self.name} decode step {key.describe()} replays Inductor's compiled kernels from the "
                f"next generate() on ({speed.candidate_ms:.3f} ms against {speed.eager_ms:.3f} ms a step with eager's "
                f"kernels; compiled in {decision.compile.seconds:.1f} s beside the calls; as accurate as eager against "
                "float64)" + unpackaged_note(decision.compile),
            )

    def _proof(self, key: Hashable, entry: _Compile) -> DecodeProof:
        """The program's graph, captured and proven, or why it is not used: a part per ``generate()`` call, each sent
        that call's eager-kernel graph and held cache, and run from the positions its decode graph was captured at
        (``_at_capture``)."""
        step, flat, decision = entry.step, entry.flat, entry.decision
        probes = [list(flat.leaves), other_tokens_probe(flat)]
        tensors = [x for x in flat.leaves if isinstance(x, torch.Tensor)]
        device = next((x.device for x in tensors if x.is_cuda), tensors[0].device)
        graph, held = yield
        with decision.timed("read"):
            program = decision.compile.load(step)
        graph, held = yield
        with decision.timed("capture"), _at_capture(entry, held) as state, self.graphs.capturing(key) as pool:
            compiled = capture(program, flat, device=device, pool=pool, warmup=self.warmup)
            state.restore()  # the warm-up steps wrote the cache
            mode = "strict" if self.verify == "strict" else "on"
            report = verify_step(compiled, program, flat, probes, state, mode=mode)
        if not report.passed:
            return f"its graph does not replay the compiled program ({report.status}: {report.detail})"
        graph, held = yield
        with decision.timed("accuracy"), _at_capture(entry, held) as state:
            why = self._as_accurate(entry, program, probes, state)
        if why:
            return why
        graph, held = yield
        with decision.timed("speed"), _at_capture(entry, held):
            leaves = copies(flat.leaves)

            def replayed(which: CapturedGraph) -> Callable[[], Any]:
                return lambda: (entry.positions.rewind(), which.replay_cloned(leaves))  # every replay from one place

            decision.speed = speed = judge_speed(replayed(graph), replayed(compiled))
            graph.replays = compiled.replays = 0  # the judge's replays are not the caller's
        if not speed.faster:
            return f"the compiled kernels' graph is {speed.detail.replace('eager', 'eager kernels')}"
        compiled.speed = graph.speed
        return compiled

    @staticmethod
    def _as_accurate(entry: _Compile, program: Callable[..., Any], probes: list[list], state: CacheState) -> str:
        """Why the program is not as accurate as eager against the step in float64, its logits and the cache it
        leaves alike, on each probe from the same cache state; empty where it is."""
        step, flat = entry.step, entry.flat
        precision = allowed_float32_precision(step.model)
        for probe in probes:
            args, kwargs = flat.rebuild(probe)
            runs = []
            for run in (step, program):
                state.restore()
                out = run(*args, **kwargs)
                runs.append((out, [t.clone() for t in cache_tensors(step.cache)]))
            state.restore()
            try:
                wide = float64_copy(step)  # the model and the cache as they stand, widened
                wide_args, wide_kwargs = widened((args, kwargs))
                reference = (wide(*wide_args, **wide_kwargs), cache_tensors(wide.cache))
            except Exception as exc:  # an operation without a float64 kernel, say: nothing to prove against
                return f"the decode step does not run in float64, the reference it is proven against ({one_line(exc)})"
            finally:
                state.restore()  # the wide step shares the cache's integer tensors
            report = as_accurate_as_eager(runs[0], runs[1], reference, float32_precision=precision)
            entry.decision.accuracy = report
            del wide, reference
            if not report.passed:
                return f"the compiled decode step is not as accurate as eager: {report.detail}"
        return ""

    def _keep_eager(self, key: Hashable, decision: KernelDecision, why: str) -> None:
        decision.state, decision.reason = KernelState.KEPT_EAGER, why
        self.graphs.discard()
        describe = key.describe() if isinstance(key, Signature) else str(key)
        self.graphs.log_once(
            f"compiled-kept-eager:{why}",
            logging.INFO,
            f"launchless: {self.name} decode step {describe} keeps eager's kernels: {why}",
        )

    def info(self) -> list[dict[str, Any]]:
        """Per decode graph: its compile, what was decided and why (``graph_info()["decode"]["compiled_kernels"]``)."""
        decisions = {**{key: entry.decision for key, entry in self._compiles.items()}, **self._refused}
        return [
            decision.row(key.describe() if isinstance(key, Signature) else str(key))
            for key, decision in decisions.items()
        ]


@contextlib.contextmanager
def _at_capture(entry: _Compile, held: HeldGraph) -> Iterator[CacheState]:
    """The cache at the positions its decode graph was captured at (each step run advances them: run from where the
    last generation ended, the capture's warm-up steps or the timed replays would write past the cache's end), its
    state as it stands then yielded to put back between runs; on the way out the cache is put back and its positions
    are where they were."""
    now, counts_now = DevicePositions(held.cache), held.counters.read()
    entry.positions.rewind()
    held.counters.write(entry.counts)
    state = CacheState(cache_tensors(held.cache), held.counters)
    try:
        yield state
    finally:
        state.restore()
        now.rewind()
        held.counters.write(counts_now)


def other_tokens_probe(flat: FlatInputs) -> list:
    """The call's leaves with other tokens: every id one lower (0 one higher), so every id stays in the vocabulary."""
    _, kwargs = flat.rebuild(list(range(len(flat.leaves))))
    names = {position: name for name, position in kwargs.items() if isinstance(position, int)}
    return [
        torch.where(x > 0, x - 1, x + 1) if names.get(i) == "input_ids" and isinstance(x, torch.Tensor) else x
        for i, x in enumerate(flat.leaves)
    ]


__all__ = ["DecodeKernels", "DecodeStep", "HeldGraph", "other_tokens_probe"]
