"""Prove a captured graph before it is trusted.

Protocol: two probe inputs from different distributions (floats ``randn`` and ``randn*3+2``,
integers random within the range observed in the example, booleans as observed) run through
eager and through the graph. Outputs must be bit-identical, and the two probes must give
different outputs whenever eager's do (a stale graph replays the same values whatever the input).

Random values can be outside what a model accepts (roi_align's boxes carry a batch index as a float):
where the caller knows such inputs (the compiler path reads them off the FX graph, the runtime follows
them through a warm-up run: ``index_trace``) they are probed from the call's own values, since an
out-of-bounds read can fault and end the process. Where eager still
differs from itself on random probes, the protocol runs again on the call's own inputs and on them
reordered along the first dimension, where only bit identity passes.

Random values can also be values a model refuses outright: sizes kept in an integer tensor (a detector's feature
map shapes, from which it splits a sequence) drawn at random no longer add up, and eager raises on them. Then the
protocol runs on the call's own inputs and on them reordered; where eager raises there too, the graph is not
proven and fails. Verification never raises what eager raised on a probe: the caller's own call is not failed.
A graph that raises on a probe where eager did not fails as well.

Where replay is not bit-identical the difference gets a name and a measured size:
- ``eager-noise``: eager run twice (or on the capture stream) already differs -- nothing can pass
  bit-identity, so the graph is held to the rounding bound;
- ``capture-path``: eager is deterministic but library code branched on
  ``torch.cuda.is_current_stream_capturing()`` (we name the lines) -- confirmed when eager forced
  onto that path reproduces the graph bit for bit;
- anything else is unexplained and fails.
The rounding bound is ``tolerance_ulps`` units of the output dtype's epsilon at the output's
largest magnitude. ``mode="strict"`` demands bit identity.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch.utils import _pytree as pytree

from ..errors import one_line
from .capture import CapturedGraph, CaptureFailed
from .capture_path import pretend_capturing
from .junctions import JunctionChanged
from .output_tree import see_into
from .signature import FlatInputs, flatten_inputs
from .snapshot import RngState, Snapshot
from .status import Stage, VerifyStatus

PROBE_SEED = 0x1A0C


@dataclass
class VerifyReport:
    """Outcome of verifying one graph; ``passed`` decides whether it is ever replayed."""

    status: VerifyStatus
    passed: bool
    max_abs: float = 0.0
    max_rel: float = 0.0
    bound: float = 0.0
    probes_differ: bool = True
    branches: list[str] = field(default_factory=list)
    detail: str = ""
    from_call: tuple[int, ...] = ()  # inputs read as addresses, probed from the call's own values

    def as_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "passed": self.passed,
            "max_abs_diff": self.max_abs,
            "max_rel_diff": self.max_rel,
            "bound": self.bound,
            "probes_differ": self.probes_differ,
            "capture_branches": list(self.branches),
            "detail": self.detail,
            "inputs_probed_from_the_call": list(self.from_call),
        }


def _probe(example: torch.Tensor, kind: int, gen: dict[torch.device, torch.Generator]) -> torch.Tensor:
    """A probe shaped, strided and typed like ``example`` (the layout picks kernels, so it must match)."""
    device = example.device
    if device not in gen:
        gen[device] = torch.Generator(device=device).manual_seed(PROBE_SEED)
    g = gen[device]
    if example.dtype == torch.bool or example.numel() == 0:
        return example.clone()
    if example.is_floating_point() or example.is_complex():
        x = torch.randn(example.shape, generator=g, device=device, dtype=example.dtype)
        x = x if kind == 0 else x * 3 + 2
    else:
        lo, hi = int(example.min()), int(example.max())
        high = hi + 1 if hi < torch.iinfo(example.dtype).max else hi  # an int64 max sentinel cannot be exceeded
        x = torch.randint(lo, max(high, lo + 1), example.shape, generator=g, device=device, dtype=example.dtype)
    return torch.empty_like(example).copy_(x)


def make_probes(
    leaves: list, keep: frozenset[int] = frozenset(), from_call: frozenset[int] = frozenset()
) -> tuple[list, list]:
    """Two probe inputs like ``leaves``; non-tensor leaves are kept (they are part of the signature), and
    so are the tensors at ``keep`` (parameters a compiled graph reads in place). The tensors at ``from_call``
    are values read as addresses (a box's batch index): random ones would read out of bounds, so they are
    taken from the call, as is and reordered along the first dimension (``input_probes``)."""
    gen: dict[torch.device, torch.Generator] = {}
    return tuple(
        [
            x
            if not isinstance(x, torch.Tensor) or i in keep
            else _from_call(x, roll=k == 1)
            if i in from_call
            else _reordered_ids(x, roll=k == 1)
            if _integral(x)
            else _probe(x, k, gen)
            for i, x in enumerate(leaves)
        ]
        for k in (0, 1)
    )


def _integral(x: torch.Tensor) -> bool:
    """Integer tensors are ids, indices, boxes, lengths: probed from the call, never drawn. A random id can index
    out of bounds, and a random box can have its corners crossed (LayoutLM's height embedding then reads a negative
    row): a device-side assert, which ends the CUDA context -- no probe may cost the process."""
    return not (x.is_floating_point() or x.is_complex() or x.dtype == torch.bool)


def _from_call(x: torch.Tensor, roll: bool) -> torch.Tensor:
    """A copy of ``x`` in its own layout (as ``_probe`` keeps it), rolled by one row with ``roll``."""
    y = x.roll(1, 0) if roll and x.dim() and x.shape[0] > 1 else x
    return torch.empty_like(x).copy_(y)


def _reordered_ids(x: torch.Tensor, roll: bool) -> torch.Tensor:
    """An integer input as the call gave it, or (``roll``) reordered whole: rolled by one along its first dimension
    of more than one entry other than the last (images of a batch, boxes of an image: each box's corners stay in
    order), else along the tokens of a single sequence ((1, T) ids)."""
    dims = [d for d in range(x.dim() - 1) if x.shape[d] > 1] or ([x.dim() - 1] if 0 < x.dim() <= 2 else [])
    y = x.roll(1, dims[0]) if roll and dims else x
    return torch.empty_like(x).copy_(y)


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().contiguous().reshape(-1)
    return t if t.dtype == torch.bool else t.view(torch.uint8)


def identical(a: Any, b: Any) -> bool:
    """Bit-for-bit equality of two output trees (NaN equals NaN, -0.0 differs from 0.0). Caches and dataclasses in
    them are looked into first (``see_into``): unregistered, two equal caches would compare as two distinct objects."""
    see_into(a)
    see_into(b)
    la, lb = pytree.tree_leaves(a), pytree.tree_leaves(b)
    if pytree.tree_structure(a) != pytree.tree_structure(b):
        return False
    ta, tb = _tensors(a), _tensors(b)
    others_a = [x for x in la if not isinstance(x, torch.Tensor)]
    if others_a != [x for x in lb if not isinstance(x, torch.Tensor)]:
        return False
    return all(
        x.shape == y.shape and x.dtype == y.dtype and torch.equal(_bits(x), _bits(y))
        for x, y in zip(ta, tb, strict=True)
    )


def _eps(dtype: torch.dtype) -> float:
    if dtype.is_complex:
        return torch.finfo(dtype.to_real()).eps
    return torch.finfo(dtype).eps if dtype.is_floating_point else 0.0


def _real(t: torch.Tensor) -> torch.Tensor:
    """Complex outputs are compared on their real and imaginary parts alike."""
    t = t.detach()
    return torch.view_as_real(t.resolve_conj()).double() if t.is_complex() else t.double()


def difference(reference: Any, other: Any, ulps: float) -> tuple[float, float, float]:
    """(max abs diff, max rel diff, bound): the bound is ``ulps`` eps at each output's largest magnitude.

    A pair whose exceedance of its own bound is largest sets all three numbers."""
    return worst_pair(reference, other, ulps)[1]


def worst_pair(reference: Any, other: Any, ulps: float) -> tuple[int | None, tuple[float, float, float]]:
    """``difference`` and which pair of tensors (their index among the trees' tensors) set it: None where none
    differs."""
    see_into(reference)
    see_into(other)
    worst: tuple[int | None, tuple[float, float, float]] = (None, (0.0, 0.0, 0.0))
    worst_excess = float("-inf")
    for i, (r, o) in enumerate(zip(_tensors(reference), _tensors(other), strict=True)):
        if r.shape != o.shape:
            return i, (float("inf"), float("inf"), 0.0)
        rd, od = _real(r), _real(o)
        same = (rd == od) | (rd.isnan() & od.isnan())  # matching infinities and NaNs differ by nothing
        diff = torch.where(same, 0.0, (rd - od).abs()).nan_to_num(nan=float("inf"))
        finite = rd[rd.isfinite()].abs()
        scale = float(finite.max()) if finite.numel() else 0.0
        abs_diff = float(diff.max()) if diff.numel() else 0.0
        bound = ulps * _eps(r.dtype) * scale
        rel = abs_diff / scale if scale else (0.0 if abs_diff == 0 else float("inf"))
        if abs_diff - bound > worst_excess:
            worst_excess = abs_diff - bound
            worst = (i if abs_diff > 0 else None, (abs_diff, rel, bound))
    return worst


def _eager(fn: Callable[..., Any], flat: FlatInputs, leaves: list, stream: torch.cuda.Stream | None = None):
    args, kwargs = flat.rebuild(leaves)
    if stream is None:
        return fn(*args, **kwargs)
    caller = torch.cuda.current_stream()
    stream.wait_stream(caller)
    try:
        with torch.cuda.stream(stream):
            return fn(*args, **kwargs)
    finally:  # also when eager raises on a probe: the probe's memory is reused on the caller's stream next
        caller.wait_stream(stream)


def verify(
    graph: CapturedGraph,
    fn: Callable[..., Any],
    flat: FlatInputs,
    *,
    mode: str = "on",
    tolerance_ulps: float = 64.0,
    branches: list[str] | None = None,
    keep: frozenset[int] = frozenset(),
    from_call: frozenset[int] = frozenset(),
    lockstep: bool = False,
) -> VerifyReport:
    """Run the two-probe protocol against eager; never raises for a mismatch, it reports it.

    ``lockstep``: the forward runs collectives, so every rank must make the same calls in the same order whatever
    it finds: every run the protocol may need is made up front (each probe rerun eager, on another stream and on
    the capture path; the protocol on the call's own inputs too), then the same decisions are taken from them.

    Inputs known to be read as addresses (``from_call``) are probed from the call's own values. Random probes
    can still fall outside what a model accepts where that is not known (a row id kept as a float): eager then
    reads out of bounds and differs from itself. Such a graph gets a second protocol on the call's own inputs
    (see ``input_probes``) and passes only bit-identical there, with outputs that follow the inputs.
    Running out of GPU memory raises ``CaptureFailed`` (stage verification): the caller refuses the graph for now,
    the caller's own call is not failed."""
    written: tuple[int, ...] = getattr(graph, "written", ())  # a joined split forward writes back nothing itself
    if written:  # the writes are results too: every run on its own copies of those inputs, compared after
        writes = _Writes(graph, fn, flat, written)
        graph, fn = cast(CapturedGraph, writes), writes.eager
    try:
        return _verify(graph, fn, flat, mode, tolerance_ulps, list(branches or []), keep, from_call, lockstep)
    except torch.cuda.OutOfMemoryError as exc:
        raise CaptureFailed(Stage.VERIFICATION, exc, str(exc)) from exc


class _Writes:
    """A graph of a forward that writes inputs in place, and that forward, as verification runs them: each run on
    its own copies of the written inputs (a probe serves several runs, and eager would otherwise hand the replay
    its written values), returning its outputs and those copies after the run."""

    def __init__(self, graph: CapturedGraph, fn: Callable[..., Any], flat: FlatInputs, written: tuple[int, ...]):
        self.graph, self.fn, self.flat, self.written = graph, fn, flat, written

    def _copied(self, leaves: list) -> list:
        return [x.clone() if i in self.written else x for i, x in enumerate(leaves)]

    def eager(self, *args: Any, **kwargs: Any) -> tuple[Any, tuple]:
        leaves = self._copied(flatten_inputs(args, kwargs).leaves)
        args, kwargs = self.flat.rebuild(leaves)
        return self.fn(*args, **kwargs), tuple(leaves[i] for i in self.written)

    def replay_cloned(self, leaves: list, **kwargs: Any) -> tuple[Any, tuple]:
        leaves = self._copied(leaves)
        return self.graph.replay_cloned(leaves, **kwargs), tuple(leaves[i] for i in self.written)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.graph, name)


def _verify(
    graph: CapturedGraph,
    fn: Callable[..., Any],
    flat: FlatInputs,
    mode: str,
    tolerance_ulps: float,
    branches: list[str],
    keep: frozenset[int],
    from_call: frozenset[int],
    lockstep: bool,
) -> VerifyReport:
    probes = make_probes(flat.leaves, keep, from_call)
    try:
        report = _protocol(graph, fn, flat, probes, mode, tolerance_ulps, branches, lockstep)
    except _ProbeRefused as refused:  # random values the model does not accept: eager raised on them
        return _on_the_calls_inputs(
            graph, fn, flat, mode, tolerance_ulps, branches, keep, f"eager raised on them: {refused}"
        ) or VerifyReport(
            VerifyStatus.FAILED,
            False,
            branches=branches,
            detail=f"eager raised on random probes ({refused}), and the call's own inputs reordered do not prove the "
            "graph (eager raised on them too, or they give the same outputs)",
        )
    report.from_call = tuple(sorted(from_call))
    why = f"on them eager differs from itself, the graph from eager by {report.max_abs:.3g}"
    own = functools.partial(_on_the_calls_inputs, graph, fn, flat, mode, tolerance_ulps, branches, keep, why)
    again = own(lockstep=True) if lockstep else None  # every rank makes the same calls whatever it finds
    if report.status != VerifyStatus.EAGER_NOISE or report.passed:
        return report
    return (again if lockstep else own()) or report


def _on_the_calls_inputs(
    graph: CapturedGraph,
    fn: Callable[..., Any],
    flat: FlatInputs,
    mode: str,
    tolerance_ulps: float,
    branches: list[str],
    keep: frozenset[int],
    why: str,
    *,
    lockstep: bool = False,
) -> VerifyReport | None:
    """The protocol on the call's own inputs and on them reordered (``input_probes``), for random probes outside the
    inputs' domain (``why``). It proves the graph only bit-identical with outputs that follow the reordering; None
    when it does not (or eager raises there too)."""
    try:
        again = _protocol(graph, fn, flat, input_probes(flat.leaves, keep), mode, tolerance_ulps, branches, lockstep)
    except _ProbeRefused:
        return None
    if again.status != VerifyStatus.BIT_IDENTICAL or not again.probes_differ or again.detail:
        return None
    again.detail = (
        f"random probes are outside the inputs' domain ({why}); bit-identical on the call's own inputs and on them "
        "reordered"
    )
    again.from_call = tuple(i for i, x in enumerate(flat.leaves) if isinstance(x, torch.Tensor) and i not in keep)
    return again


class _ProbeRefused(Exception):
    """Eager raised on a probe: the probe's values are not ones the model accepts (the message says what it raised)."""


def input_probes(leaves: list, keep: frozenset[int] = frozenset()) -> tuple[list, list]:
    """Two probes from the call's own inputs: copies of them, and copies rolled by one along the first dimension
    (rows of boxes, tokens of a batch: reordered, every value still one the model was given)."""
    return make_probes(leaves, keep, frozenset(range(len(leaves))))


class _Reruns:
    """The eager reruns a mismatch calls for -- on another stream, again, on the capture path -- made when asked,
    or all of them at once (``made_now``: every rank of a collective forward makes the same calls)."""

    def __init__(
        self, fn: Callable[..., Any], flat: FlatInputs, probes: tuple[list, list], rng: RngState, *, made_now: bool
    ) -> None:
        self.fn, self.flat, self.probes, self.rng = fn, flat, probes, rng
        self.made: dict[tuple[str, int], Any] = {}
        if made_now:
            for i in range(len(probes)):
                self.other_stream(i), self.again(i), self.capture_path(i)

    def _run(self, kind: str, i: int, run: Callable[[], Any]) -> Any:
        if (kind, i) not in self.made:
            self.rng.rewind()
            self.made[(kind, i)] = run()
        return self.made[(kind, i)]

    def other_stream(self, i: int) -> Any:
        return self._run("stream", i, lambda: _eager(self.fn, self.flat, self.probes[i], torch.cuda.Stream()))

    def again(self, i: int) -> Any:
        return self._run("again", i, lambda: _eager(self.fn, self.flat, self.probes[i]))

    def capture_path(self, i: int) -> Any:
        def run() -> Any:
            with pretend_capturing():
                return _eager(self.fn, self.flat, self.probes[i])

        return self._run("capture-path", i, run)


def _protocol(
    graph: CapturedGraph,
    fn: Callable[..., Any],
    flat: FlatInputs,
    probes: tuple[list, list],
    mode: str,
    tolerance_ulps: float,
    branches: list[str],
    lockstep: bool = False,
) -> VerifyReport:
    """The two probes run eager and as replays, each run from the generators' state on entry (a forward that draws
    random numbers draws the same ones in both), and the generators are left in that state."""
    rng = RngState()
    try:
        return _compare_runs(graph, fn, flat, probes, mode, tolerance_ulps, branches, lockstep, rng)
    finally:
        rng.rewind()


def _compare_runs(
    graph: CapturedGraph,
    fn: Callable[..., Any],
    flat: FlatInputs,
    probes: tuple[list, list],
    mode: str,
    tolerance_ulps: float,
    branches: list[str],
    lockstep: bool,
    rng: RngState,
) -> VerifyReport:
    def eager_run(probe: list) -> Any:
        rng.rewind()
        return _eager(fn, flat, probe)

    def replay(probe: list) -> Any:
        rng.rewind()
        return graph.replay_cloned(probe)

    try:
        eager = [eager_run(p) for p in probes]
    except torch.cuda.OutOfMemoryError:
        raise
    except Exception as exc:
        raise _ProbeRefused(one_line(exc)) from exc
    try:
        graphed = [replay(p) for p in probes]
    except JunctionChanged as exc:  # the probes gave an operation between two graphs another shape or value
        return VerifyReport(VerifyStatus.FAILED, False, branches=branches, detail=str(exc))
    except torch.cuda.OutOfMemoryError:
        raise
    except Exception as exc:  # a joined forward's eager code, say: not what eager does on the same probe
        detail = f"the graph raised on a probe where eager did not ({one_line(exc)})"
        return VerifyReport(VerifyStatus.FAILED, False, branches=branches, detail=detail)
    reruns = _Reruns(fn, flat, probes, rng, made_now=lockstep)
    eager_differ = not identical(eager[0], eager[1])
    probes_differ = not identical(graphed[0], graphed[1])
    if eager_differ and not probes_differ:
        return VerifyReport(
            VerifyStatus.FAILED,
            False,
            probes_differ=False,
            branches=branches,
            detail="stale graph: two different probes replayed the same outputs",
        )
    mismatched = [i for i in range(2) if not identical(eager[i], graphed[i])]
    if not mismatched:
        detail = "" if eager_differ else "outputs do not depend on the inputs (stale check not applicable)"
        return VerifyReport(
            VerifyStatus.BIT_IDENTICAL, True, probes_differ=probes_differ, branches=branches, detail=detail
        )
    i = mismatched[0]
    max_abs, max_rel, bound = max(
        (difference(eager[k], graphed[k], tolerance_ulps) for k in mismatched), key=lambda d: d[0] - d[2]
    )
    report = VerifyReport(VerifyStatus.FAILED, False, max_abs, max_rel, bound, probes_differ, branches)
    noise_side = not identical(eager[i], reruns.other_stream(i))
    if noise_side or not identical(eager[i], reruns.again(i)):
        report.status = VerifyStatus.EAGER_NOISE
        report.detail = "eager run twice (or on another stream) already differs"
    else:
        forced = reruns.capture_path(i)
        if identical(forced, graphed[i]) or branches:
            report.status = VerifyStatus.CAPTURE_PATH
            report.detail = (
                "eager forced onto the capture path reproduces the graph bit for bit"
                if identical(forced, graphed[i])
                else "library code branches on is_current_stream_capturing()"
            )
        else:
            report.detail = "eager is deterministic and no capture-dependent branch explains the difference"
    if report.status != VerifyStatus.FAILED:
        report.passed = mode != "strict" and max_abs <= bound
        if not report.passed:
            report.detail += (
                "; verify='strict' demands bit identity"
                if mode == "strict"
                else f"; difference {max_abs:.3g} exceeds the rounding bound {bound:.3g}"
            )
    return report


def verify_step(
    graph: CapturedGraph,
    fn: Callable[..., Any],
    flat: FlatInputs,
    probes: Sequence[list],
    state: Snapshot,
    *,
    mode: str = "on",
    tolerance_ulps: float = 64.0,
) -> VerifyReport:
    """Prove a graph that writes state in place (a decode step its KV cache) against eager: from the same saved
    ``state``, each probe runs eager and as a replay, and both the outputs and the state each leaves behind must be
    bit-identical; two probes whose eager outputs differ must replay different outputs (a stale graph replays the
    same). The state is restored before returning, whatever the verdict. Out of GPU memory raises ``CaptureFailed``.

    A mismatch is held to the rounding bound only where eager run again from the same state differs from itself
    (``eager-noise``); anything else fails, as must everything under ``mode="strict"``."""
    try:
        return _verify_step(graph, fn, flat, probes, state, mode, tolerance_ulps)
    except torch.cuda.OutOfMemoryError as exc:
        raise CaptureFailed(Stage.VERIFICATION, exc, str(exc)) from exc
    finally:
        state.restore()


def _verify_step(
    graph: CapturedGraph,
    fn: Callable[..., Any],
    flat: FlatInputs,
    probes: Sequence[list],
    state: Snapshot,
    mode: str,
    tolerance_ulps: float,
) -> VerifyReport:
    def eager_run(probe: list) -> tuple[Any, list]:
        state.restore()
        out = _eager(fn, flat, probe)
        return out, state.current()

    def replay(probe: list) -> tuple[Any, list]:
        state.restore()
        out = graph.replay_cloned(probe)
        return out, state.current()

    eager = [eager_run(p) for p in probes]
    graphed = [replay(p) for p in probes]
    eager_differ = any(not identical(eager[0][0], e[0]) for e in eager[1:])
    probes_differ = any(not identical(graphed[0][0], g[0]) for g in graphed[1:])
    if eager_differ and not probes_differ:
        return VerifyReport(
            VerifyStatus.FAILED,
            False,
            probes_differ=False,
            detail="stale graph: different probes replayed the same outputs",
        )
    mismatched = [i for i in range(len(probes)) if not identical(eager[i], graphed[i])]
    if not mismatched:
        detail = "outputs and the state left behind equal eager's" + (
            "" if eager_differ else "; outputs do not depend on the probes (stale check not applicable)"
        )
        return VerifyReport(VerifyStatus.BIT_IDENTICAL, True, probes_differ=probes_differ, detail=detail)
    i = mismatched[0]
    max_abs, max_rel, bound = difference(eager[i], graphed[i], tolerance_ulps)
    report = VerifyReport(VerifyStatus.FAILED, False, max_abs, max_rel, bound, probes_differ)
    if identical(eager[i], eager_run(probes[i])):
        report.detail = "eager is deterministic from the same state and the replay differs from it"
        return report
    report.status = VerifyStatus.EAGER_NOISE
    report.passed = mode != "strict" and max_abs <= bound
    report.detail = "eager run twice from the same state already differs" + (
        "" if report.passed else f"; difference {max_abs:.3g} exceeds the rounding bound {bound:.3g}"
    )
    return report
