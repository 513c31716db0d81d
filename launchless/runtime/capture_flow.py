"""One input signature's forward captured, proven and judged: the graph ``GraphedModule`` keeps, or why it does not.

The flow of a capture, in order: capture the forward on static copies of the call's inputs (where the caller did not
ask for one graph, as graphs around the operations that block one graph); where the forward runs collectives, every
rank agrees that it captured, and later that it verified, before any keeps a graph (a graph on some ranks only would
leave the others waiting in its collectives); verify the graph against eager; under "auto", time it against eager
(a chain of graphs always: it must be faster than eager both ways). The outcome is a graph to keep or a refusal with
its reason and source line; the policy decides what a refused signature runs instead (a split, eager, an error).
The random-number generators go back to where the call began before its own result is made: warm-ups, verification
and timing draw too.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any, cast

import torch

from ..core import capture as _capture
from ..core.cache import GraphCache, Refusal
from ..core.capture_path import record_capture_branches
from ..core.collectives import agree
from ..core.junctions import SegmentedGraph, guard_note, op_names
from ..core.pool import new_pool
from ..core.relocation import RelocationWatch
from ..core.signature import FlatInputs, Signature
from ..core.snapshot import RngState
from ..core.status import Stage, VerifyStatus
from ..core.verify import VerifyReport, verify
from ..diagnose.messages import capture_error, out_of_memory_error, verification_error
from ..errors import CaptureError, LaunchlessError, NoCudaError
from ..timing import WHOLE_GRAPH_MIN_SPEEDUP, SpeedVerdict, judge_speed
from .split import copies


@dataclasses.dataclass
class Captured:
    """What capturing one signature decided: a verified (and, under "auto", faster) graph to keep, or the refusal
    and the level its log line takes."""

    graph: _capture.CapturedGraph | None = None
    report: VerifyReport | None = None
    refusal: Refusal | None = None
    level: int = logging.INFO


class CaptureFlow:
    """Capture, the ranks' agreement, verification and the speed judgement of one wrapped forward's signatures.

    ``target`` gives what is captured and run eager (the model, or a split piece's own submodule forward).
    ``splits``: a forward that cannot be one graph may replay as graphs around the operations that block it.
    ``judged``: "auto" keeps a whole graph only when timed faster than eager (a split piece is timed with its split).
    """

    def __init__(
        self,
        *,
        cache: GraphCache[_capture.CapturedGraph],
        watch: RelocationWatch,
        target: Callable[[], Any],
        name: str,
        mode: bool | str,
        warmup: int,
        verify: str,
        tolerance_ulps: float,
        outputs: str,
    ) -> None:
        self.cache, self.watch, self.target, self.name, self.mode = cache, watch, target, name, mode
        self.warmup, self.verify_mode, self.tolerance_ulps, self.outputs = warmup, verify, tolerance_ulps, outputs
        self.splits = True
        self.judged = True
        self.collective = False  # a capture found collectives in the forward: ranks agree, nothing is split

    def device(self, flat: FlatInputs) -> torch.device | None:
        """Where the forward runs: the model's CUDA device, else its inputs'."""
        return self.watch.cuda_device or next(
            (x.device for x in flat.leaves if isinstance(x, torch.Tensor) and x.is_cuda), None
        )

    def capture(self, sig: Signature, flat: FlatInputs, *, explicit: bool, around_operations: bool = True) -> Captured:
        """Capture ``sig``'s forward on the call's inputs, prove it and judge it (``explicit``: one graph asked for,
        by ``cuda_graph=True``'s first call or ``capture_graph()``: no graphs around operations, no timing;
        ``around_operations``: False where graphs around operations are not allowed (a batch bucket's padded
        call))."""
        device = self.device(flat)
        if device is None:
            error: LaunchlessError = NoCudaError(
                f"launchless: {self.name} has no parameters, buffers or inputs on a CUDA device, so there "
                "is nothing to capture; move the model to the GPU (model.cuda()) or use cuda_graph=False"
            )
            return Captured(refusal=Refusal(Stage.NO_DEVICE, "no CUDA device", str(error), error=error))
        cache = self.cache
        branches: list[str] = []
        # a forward that cannot be one graph may replay as graphs around the operations that block it (not where the
        # caller asked for this one graph: capture_graph())
        around_junctions = self.splits and not explicit and around_operations
        # "auto" never runs slower than eager: a verified graph is timed against eager before it is kept (a graph
        # asked for -- cuda_graph=True, capture_graph() -- is the caller's choice; collectives would need agreeing)
        judged = self.mode == "auto" and self.judged and not explicit
        groups: list[Any] = []  # the process groups of the forward's collectives, once the warm-up found them
        rng = RngState()
        try:
            with cache.capturing(sig) as pool:
                with record_capture_branches(branches):
                    graph = _capture.capture(
                        self.target(),
                        flat,
                        device=device,
                        pool=pool,
                        warmup=self.warmup,
                        trace_indices=self.verify_mode != "off",
                        junction_pool=cache.pool.replace if around_junctions else None,
                        write_back=True,
                    )
                groups = graph.collective_groups
                if groups:  # every rank captured? (before verification runs collectives)
                    self.collective = True
                    refused = self._ranks_refused(sig, groups, ok=True, what="capture")
                    if refused is not None:
                        del graph
                        cache.discard()
                        return Captured(refusal=refused)
                report = self.verify(graph, flat, branches, lockstep=bool(groups))
                if groups:
                    refused = self._ranks_refused(
                        sig, groups, ok=report.passed, reason=report.detail, what="verification"
                    )
                    if refused is not None and report.passed:  # another rank's graph failed: none is replayed
                        del graph
                        cache.discard()
                        return Captured(refusal=refused)
                if graph.junctions and report.passed:
                    graph.speed = self._time_chain(graph, flat)
                elif judged and report.passed and not groups:
                    graph.speed = self._time_whole(graph, flat)
        except _capture.CaptureFailed as fail:
            fail.collective_groups = fail.collective_groups or groups  # out of memory while verifying: still agreed
            return self._failed(sig, flat, fail, device, rng=rng)
        rng.rewind()
        if graph.junctions and (not report.passed or not graph.speed.faster):
            return Captured(refusal=self._dropped_chain(sig, flat, graph, report, device))
        if not report.passed:
            del graph
            cache.discard()
            error = verification_error(self.name, sig, report)
            return Captured(refusal=Refusal(Stage.VERIFICATION, "verification", str(error), error=error))
        if graph.speed is not None and not graph.speed.faster:
            detail = graph.speed.detail
            del graph
            cache.discard()
            error = CaptureError(
                f"launchless: the graph of {self.name} {sig.describe()} is verified but {detail}: replaying it "
                "would not save time (its kernels, not their launches, take the time, or the copies into and out of "
                "the graph's buffers cost what the launches saved)",
                reason="not faster than eager",
            )
            return Captured(refusal=Refusal(Stage.SPEED, error.reason, str(error), error=error))
        if report.status not in (VerifyStatus.BIT_IDENTICAL, VerifyStatus.SKIPPED):
            cache.log_once(
                f"class:{report.status}",
                logging.INFO,
                f"launchless: {self.name} {sig.describe()} replays within the rounding bound, "
                f"not bit-identically ({report.status}: {report.detail}; max abs diff "
                f"{report.max_abs:.3g}, rel {report.max_rel:.3g}, bound {report.bound:.3g})",
            )
        return Captured(graph=graph, report=report)

    def verify(
        self, graph: _capture.CapturedGraph, flat: FlatInputs, branches: list[str], *, lockstep: bool = False
    ) -> VerifyReport:
        """Prove ``graph`` against eager, unless verify="off" (raises ``CaptureFailed`` when out of memory).
        ``lockstep``: the same calls on every rank (a forward with collectives)."""
        if self.verify_mode == "off":
            return VerifyReport(VerifyStatus.SKIPPED, True)
        return verify(
            graph,
            self.target(),
            flat,
            mode=self.verify_mode,
            tolerance_ulps=self.tolerance_ulps,
            branches=branches,
            from_call=graph.index_inputs,
            lockstep=lockstep,
        )

    def _failed(
        self, sig: Signature, flat: FlatInputs, fail: _capture.CaptureFailed, device: Any, *, rng: RngState
    ) -> Captured:
        """This rank's capture failed: refused (transiently when out of memory); the other ranks of a forward with
        collectives are told, so that they refuse too. Finding the blocking operation runs the forward again: the
        generators go back to ``rng`` (the call's start) before the call's own result is made."""
        transient = _capture.out_of_memory(fail.cause)
        if fail.stage == Stage.WARM_UP and fail.cause is not None and not transient:
            raise fail.cause from None  # the forward itself is broken: eager would raise the same
        if transient:
            self.cache.discard()
            error = out_of_memory_error(self.name, sig, fail)
            refusal = Refusal(fail.stage, error.reason, str(error), error=error, transient=True)
        else:
            error = capture_error(self.target(), self.name, sig, flat, fail, device, find=not fail.collective_groups)
            refusal = Refusal(
                fail.stage, error.reason, str(error), operation=error.operation, source=error.source, error=error
            )
        if fail.collective_groups:
            self.collective = True
            agree(fail.collective_groups, ok=False, reason=refusal.reason, what="capture", transient=transient)
        rng.rewind()
        return Captured(refusal=refusal, level=logging.WARNING if transient else logging.INFO)

    def _ranks_refused(
        self, sig: Signature, groups: list[Any], *, ok: bool, what: str, reason: str = ""
    ) -> Refusal | None:
        """The ranks agree on this rank's ``what`` (capture or verification); the refusal when another refused."""
        agreement = agree(groups, ok=ok, reason=reason, what=what)
        if agreement.all_agree:
            return None
        others = {rank: why for rank, why in agreement.refusals.items() if rank != torch.distributed.get_rank()}
        if not others:
            return None  # only this rank refused: its own refusal says why
        error = CaptureError(
            f"launchless: {self.name} {sig.describe()} runs collectives, and another rank's {what} failed "
            f"({'; '.join(f'rank {r}: {why}' for r, why in sorted(others.items()))}); every rank runs it without a "
            "graph, as a graph on some ranks only would leave the others waiting in its collectives",
            reason=f"another rank's {what} failed",
        )
        stage = Stage.VERIFICATION if what == "verification" else Stage.CAPTURE
        return Refusal(stage, error.reason, str(error), error=error, transient=agreement.transient)

    # ---- speed: eager against the graph, on copies of the call's tensors (the caller's are used once) ----------
    def _time_chain(self, graph: _capture.CapturedGraph, flat: FlatInputs) -> SpeedVerdict:
        """Eager against the chain of graphs."""
        leaves = copies(flat.leaves)
        args, kwargs = flat.rebuild(leaves)
        target = self.target()
        try:
            return judge_speed(lambda: target(*args, **kwargs), lambda: graph.replay_cloned(leaves))
        finally:
            graph.replays = 0  # the judge's replays are not the caller's

    def _time_whole(self, graph: _capture.CapturedGraph, flat: FlatInputs) -> SpeedVerdict:
        """Eager against the whole graph as the caller gets it; settled after three rounds when the graph is clearly
        faster (a launch-bound forward), else measured in full."""
        leaves = copies(flat.leaves)
        args, kwargs = flat.rebuild(leaves)
        target = self.target()
        replay = graph.replay_cloned if self.outputs == "clone" else graph.replay
        try:
            return judge_speed(
                lambda: target(*args, **kwargs),
                lambda: replay(leaves),
                min_speedup=WHOLE_GRAPH_MIN_SPEEDUP,
                settle_early=True,
            )
        finally:
            graph.replays = 0  # the judge's replays are not the caller's

    # ---- graphs around operations run eager (a chain) ---------------------------------------------------------
    def _dropped_chain(
        self, sig: Signature, flat: FlatInputs, graph: _capture.CapturedGraph, report: VerifyReport, device: Any
    ) -> Refusal:
        """A chain that differs from eager or is not faster: refused as the forward was (a split by submodule may
        still take it), the refusal saying what was tried."""
        fail, ops = cast(_capture.CaptureFailed, graph.split_from), op_names(graph.junctions)  # a chain's failure
        why = f"they differ from eager ({report.status}: {report.detail})" if not report.passed else graph.speed.detail
        del graph
        self.cache.discard()
        error = capture_error(self.target(), self.name, sig, flat, fail, device)
        note = f"Graphs around {ops} (run eager between them) were tried and dropped: {why}"
        add_note(error, note)
        return Refusal(
            fail.stage, error.reason, f"{error}. {note}", operation=error.operation, source=error.source, error=error
        )

    def log_chain(self, sig: Signature, graph: _capture.CapturedGraph) -> None:
        """One line for a chain kept: what blocks one graph, and how many graphs replay around it."""
        site = graph.split_from.site if graph.split_from else None
        what = site.name if site else "a capture error"
        where = f" at {site.source}" if site and site.source else ""
        ops, graphs = op_names(graph.junctions), len(cast(SegmentedGraph, graph.graph).graphs)
        self.cache.log_once(
            f"chain:{ops}",
            logging.INFO,
            f"launchless: {self.name} {sig.describe()} cannot be captured as one graph ({what}{where}); it "
            f"replays {graphs} graphs with {len(graph.junctions)} call(s) of {ops} run eager "
            f"between them{guard_note(graph.junctions)}, verified against eager, {graph.speed.speedup:.2f}x over "
            "eager. graph_info()['graphs'] has the details",
        )

    def chain_note(self, flat: FlatInputs) -> str:
        """Whether a call would replay the forward as graphs around operations run eager: captured on this call
        into pools of its own, verified, then released (not timed: the note names what is allowed)."""
        device = self.device(flat)
        if device is None or not self.splits:
            return ""
        try:
            with self.cache.lock:
                graph = _capture.capture(
                    self.target(),
                    flat,
                    device=device,
                    pool=new_pool(),
                    warmup=1,
                    junction_pool=new_pool,
                    write_back=True,
                )
                report = self.verify(graph, flat, []) if graph.junctions else None
        except _capture.CaptureFailed:
            return ""
        if report is None or not report.passed:
            return ""
        graphs = len(cast(SegmentedGraph, graph.graph).graphs)  # a report is made for a chain only
        return (
            f" A call replays it as {graphs} graphs with {op_names(graph.junctions)} run eager between them"
            f"{guard_note(graph.junctions)}, verified against eager (if faster than eager)."
        )


def graph_row(cache: GraphCache[_capture.CapturedGraph], sig: Signature, graph: _capture.CapturedGraph) -> dict:
    """A kept graph as ``graph_info()`` shows it: its replays, capture and memory, its proof, and what the flow
    judged (the region split's graphs and what runs eager between them, or a whole graph's speed against eager)."""
    report = cache.reports.get(sig)
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


def add_note(error: Exception | None, note: str) -> None:
    """Append ``note`` to the error's message (once)."""
    if error is not None and note and not str(error).endswith(note):
        error.args = (f"{error}{note}", *error.args[1:])
