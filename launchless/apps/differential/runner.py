"""The rows of one model on the GPU: every entry point under every grad mode, each call on fresh inputs.

Each call draws new inputs, runs the reference and the accelerated model on the same ones, from the same state of
the random-number generators (a model that draws random numbers -- a masked autoencoder's mask -- is compared on the
same draws), and compares them bit for bit. The reference is eager for ``wrap``; for ``torch.compile`` it is the
very programs the backend compiled for the accelerated model, run without graphs (``compiler.without_graphs``):
Inductor's fused kernels round differently from eager, a second compilation may pick other kernel configurations
(benchmarked on the device at its first call) that round differently again, and the launchless backend compiles its
own programs (a CGCT rewrite, its own partitions), which round differently from ``torch.compile(model)``'s; what
launchless promises there is that its graphs replay its kernels exactly. New inputs on every call are what users
send: a graph replaying stale addresses, a wrong guard or a missed mutation shows up as a difference on some call. A
mismatch is ``bounded`` only when launchless's own verification named a class for it (eager noise, capture path,
identical values) and the difference lies within that class's bound -- or, by verification's own rule applied to
that call, where the graph's verification recorded library code branching on capture and the difference lies
within the rounding bound (its probes may not have met the inputs that show it); anything else ``differs``. A
capture-path call that eager forced onto the capture path does not reproduce bit for bit keeps how far that run
is from the graph (``capture_path_max_abs``): the report lists those rows, named by the branch alone. An exception
from the accelerated model where eager worked is a ``crash`` (with its text and the line it came from). After the
calls, eager and accelerated are timed in interleaved rounds (CUDA events) on the last inputs.

Two mismatches are not wrong values. Outputs equal as numbers whose bits differ only in NaN payloads or in the sign
of zeros are ``bounded`` with that class and a bound of 0. And a model whose reference is not deterministic (atomic
adds, an algorithm picked per call) differs from itself: the reference is run again on the same inputs, and an
accelerated result no farther from it than NOISE_FACTOR times the reference's own spread is ``bounded`` as
``eager-nondeterministic`` with that bound -- launchless cannot be held to more than eager repeats.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import time
import zlib
from collections.abc import Callable, Iterator
from enum import Enum
from typing import Any

import torch
import torch.utils._pytree as pytree

from ...core.capture_path import pretend_capturing
from ...core.output_tree import see_into
from ...core.verify import difference, identical
from ...diagnose.source import locate_exception
from ...errors import CaptureError, VerificationError, one_line
from ...timing import interleaved_ms
from ..what_ran import what_ran
from .candidate import Built, Candidate
from .rows import SEVERITY, Entry, GradMode, Result, Status, new_row

CALLS = 8
TIMING_ROUNDS = 11
TIMING_PER_ROUND = 3
COMPILE_EVERY = 4  # torch.compile runs on every 4th model (by a stable hash of its key): compiling is slow
ULPS = 64.0  # launchless's default rounding bound, in units of the output dtype's epsilon
CAPTURE_PATH = "capture-path"
NAMED_CLASSES = ("eager-noise", CAPTURE_PATH, "identical values")
NOISE_REPEATS = 3  # reference runs again on a mismatching call, to see whether it differs from itself
NOISE_FACTOR = 4.0  # an accelerated result within this many times the reference's own spread is its noise
EAGER_NONDETERMINISTIC = "eager-nondeterministic"
# A measurement of eager against the accelerated model, each a call without arguments: the row's speed fields.
Measure = Callable[[Callable[[], Any], Callable[[], Any]], dict[str, Any]]


class Mismatch(str, Enum):
    """How two outputs that are not bit for bit equal differ, coarsest first."""

    STRUCTURE = "structure"  # another tree of outputs
    OTHER_LEAVES = "other leaves"  # the non-tensor leaves differ
    SHAPE = "shape"
    DTYPE = "dtype"
    VALUES = "values"  # numbers differ
    NAN_PAYLOADS = "NaN payloads"  # NaN where the other has NaN, with other bits
    SIGNED_ZEROS = "signed zeros"  # -0.0 where the other has 0.0


SAME_NUMBERS = (Mismatch.NAN_PAYLOADS, Mismatch.SIGNED_ZEROS)


def grad_mode(mode: GradMode) -> contextlib.AbstractContextManager:
    return torch.inference_mode() if mode is GradMode.INFERENCE_MODE else torch.no_grad()


def forward_entries(candidate: Candidate) -> list[Entry]:
    """wrap("auto") and wrap(True) for every model; torch.compile for a stable sample of them."""
    entries = [Entry.WRAP_AUTO, Entry.WRAP_TRUE]
    if zlib.crc32(candidate.key.encode()) % COMPILE_EVERY == 0:
        entries.append(Entry.COMPILE)
    return entries


def accelerate(model: torch.nn.Module, entry: Entry) -> Callable[..., Any]:
    from ... import wrap

    if entry is Entry.WRAP_AUTO:
        return wrap(model, cuda_graph="auto")
    if entry is Entry.WRAP_TRUE:
        return wrap(model, cuda_graph=True)
    torch._dynamo.reset()
    return torch.compile(model, backend="launchless")


def graph_info(accelerated: Any, entry: Entry) -> dict[str, Any] | list[Any]:
    if entry is Entry.COMPILE:
        from ...compiler.backend import graph_info as compiled_info

        return compiled_info()
    return accelerated.graph_info()


def verifications(info: Any) -> Iterator[dict[str, Any]]:
    """Every verification report in a ``graph_info()`` tree (a dict with a ``status`` and ``passed``)."""
    if isinstance(info, dict):
        if "passed" in info and "status" in info:
            yield info
        for value in info.values():
            yield from verifications(value)
    elif isinstance(info, list):
        for value in info:
            yield from verifications(value)


def status_of(info: Any, entry: Entry) -> tuple[Status, str | None, str | None]:
    """(status, reason, source) from ``graph_info()``."""
    if entry is Entry.COMPILE:
        return _compiled_status(info)
    ran = what_ran(info)
    return Status(str(ran.ran)), ran.reason, ran.source


def _compiled_status(info: list[dict[str, Any]]) -> tuple[Status, str | None, str | None]:
    """The compiler backend's verdict: a verified graph that replays (a chain around operations run eager between
    graphs is a split), else eager -- where every verified graph lost to the compiled code alone (the variant
    choice kept "no-graph"), or with the first refusal."""
    verified = [g for graph in info for g in graph.get("graphs", []) if (g.get("verification") or {}).get("passed")]
    replaying = [g for g in verified if g.get("variant") != "no-graph"]
    if replaying:
        regions = [g["region_split"] for g in replaying if g.get("region_split")]
        if not regions:
            return Status.GRAPH, None, None
        ops = ", ".join(dict.fromkeys(op["op"] for region in regions for op in region["eager_ops"]))
        return Status.SPLIT, f"runs {ops} eager between graphs", regions[0].get("source")
    if verified:
        return Status.EAGER, "the compiled code without a graph was faster than its verified graph", None
    return Status.EAGER, *_compiled_refusal(info)


def _compiled_refusal(info: list[dict[str, Any]]) -> tuple[str, str | None]:
    """Why the compiler backend kept no verified graph, from its ``graph_info()``: the first refusal of its FX
    graphs (the operation and source line), or that Dynamo handed it no graph, or that graphs were compiled and
    none captured yet."""
    refusals = [f for graph in info for f in graph.get("fallbacks", [])]
    if refusals:
        first = refusals[0]
        return f"no verified graph in graph_info(): {first['reason']}", first.get("source")
    if not info:
        return "no verified graph in graph_info(): Dynamo handed the launchless backend no FX graph", None
    return f"no verified graph in graph_info(): {len(info)} FX graphs compiled, none captured", None


def mismatch(want: Any, got: Any) -> Mismatch:
    """The coarsest way ``got`` differs from ``want`` (two trees that ``identical`` says differ)."""
    see_into(want)
    see_into(got)
    if pytree.tree_structure(want) != pytree.tree_structure(got):
        return Mismatch.STRUCTURE
    leaves = list(zip(pytree.tree_leaves(want), pytree.tree_leaves(got), strict=True))
    if any(not isinstance(a, torch.Tensor) and a != b for a, b in leaves):
        return Mismatch.OTHER_LEAVES
    pairs = [(a, b) for a, b in leaves if isinstance(a, torch.Tensor)]
    if any(a.shape != b.shape for a, b in pairs):
        return Mismatch.SHAPE
    if any(a.dtype != b.dtype for a, b in pairs):
        return Mismatch.DTYPE
    kinds: set[Mismatch] = set()
    for a, b in pairs:
        if not (a.is_floating_point() or a.is_complex()):
            if not torch.equal(a, b):
                return Mismatch.VALUES
            continue
        ra, rb = _as_real(a), _as_real(b)
        nan_a, nan_b = ra.isnan(), rb.isnan()
        if not torch.equal(nan_a, nan_b) or not torch.equal(ra[~nan_a], rb[~nan_b]):
            return Mismatch.VALUES
        if nan_a.any():
            kinds.add(Mismatch.NAN_PAYLOADS)  # may not be the cause; signed zeros are checked too
        if not torch.equal(ra.signbit() & ~nan_a, rb.signbit() & ~nan_b):
            kinds.add(Mismatch.SIGNED_ZEROS)
    if not kinds:  # equal numbers, equal signs, no NaN: the bits differ some other way
        return Mismatch.VALUES
    return Mismatch.SIGNED_ZEROS if Mismatch.SIGNED_ZEROS in kinds else Mismatch.NAN_PAYLOADS


def differing_leaf(want: Any, got: Any) -> str | None:
    """Where two output trees of the same structure first differ bit for bit: the leaf's path, dtype, shape and
    device, how many of its elements differ, and its NaNs on each side -- what a ``differs`` row needs to be traced
    (the largest difference alone does not say which output, nor whether it is a count, a mask or a value)."""
    see_into(want)
    see_into(got)
    wanted, got_leaves = pytree.tree_leaves(want), pytree.tree_leaves(got)
    if len(wanted) != len(got_leaves):
        return None
    try:
        names = [pytree.keystr(path) for path, _ in pytree.tree_flatten_with_path(want)[0]]
    except ValueError:  # a class registered without key paths (a cache ``see_into`` registered): leaf numbers
        names = [f"leaf {i} of {len(wanted)} ({type(leaf).__name__})" for i, leaf in enumerate(wanted)]
    for name, a, b in zip(names, wanted, got_leaves, strict=True):
        if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
            if a != b:
                return f"{name}: {a!r} against {b!r}"
            continue
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"{name}: {a.dtype}{list(a.shape)} against {b.dtype}{list(b.shape)}"
        if identical(a, b):
            continue
        where = f"{name} {a.dtype}{list(a.shape)} on {a.device}"
        if not a.is_floating_point():
            return f"{where}: {int((a != b).sum())} of {a.numel()} elements differ"
        differs = (a != b) & ~(a.isnan() & b.isnan())
        gap = (a.double() - b.double()).abs()[differs & a.isfinite() & b.isfinite()]
        by = f", by at most {float(gap.max()):.3g}" if gap.numel() else ""
        return (
            f"{where}: {int(differs.sum())} of {a.numel()} elements differ{by}; "
            f"NaN {int(a.isnan().sum())} in the reference, {int(b.isnan().sum())} accelerated"
        )
    return None


def _as_real(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    return torch.view_as_real(t.resolve_conj()) if t.is_complex() else t


def judge_mismatch(want: Any, got: Any, info: Any) -> tuple[Result, float, float | None, str | None]:
    """(result, max abs diff, bound, named class) of a call whose outputs are not bit-identical."""
    kind = mismatch(want, got)
    if kind in SAME_NUMBERS:
        return Result.BOUNDED, 0.0, 0.0, kind.value
    if kind is not Mismatch.VALUES:
        return Result.DIFFERS, float("inf"), None, None
    max_abs, _, bound = difference(want, got, ULPS)
    passed = [v for v in verifications(info) if v["passed"]]
    named = [v for v in passed if str(v["status"]) in NAMED_CLASSES]
    if named and max_abs <= bound:
        return Result.BOUNDED, max_abs, bound, str(named[0]["status"])
    if any(v.get("capture_branches") for v in passed) and max_abs <= bound:
        # verification's rule on this call: library code branched on capture (the lines are in the report), so a
        # difference within the rounding bound is the capture-path class, whichever probes verification drew
        return Result.BOUNDED, max_abs, bound, CAPTURE_PATH
    return Result.DIFFERS, max_abs, None, None


def on_capture_path(
    reference: Callable[..., Any], want: Any, got: Any, seed: int, args: tuple, kwargs: dict
) -> tuple[Result, float | None, str | None, float | None]:
    """A call whose graph differs from eager within the rounding bound, where eager told it is capturing returns the
    graph's outputs bit for bit: library code took another branch for this input's values than while capturing
    (transformers skips an all-ones attention mask, a host check it cannot make under capture) -- the capture-path
    class, confirmed on this call, as verification confirms it on its probes. Otherwise it differs; the last value
    is how far eager on the capture path is from the graph (None where it was not run)."""
    max_abs, _, bound = difference(want, got, ULPS)  # the rounding bound at the outputs' magnitude
    if max_abs > bound:
        return Result.DIFFERS, None, None, None
    with pretend_capturing():
        forced = seeded(reference, seed, *args, **kwargs)
    if identical(forced, got):
        return Result.BOUNDED, bound, CAPTURE_PATH, 0.0
    return Result.DIFFERS, None, None, difference(forced, got, ULPS)[0]


def reference_noise(reference: Callable[..., Any], want: Any, seed: int, args: tuple, kwargs: dict) -> float:
    """The largest difference between ``want`` and the reference run again on the same inputs and draws (0.0
    when the reference repeats itself bit for bit, inf when it changes shape)."""
    noise = 0.0
    for _ in range(NOISE_REPEATS):
        again = seeded(reference, seed, *args, **kwargs)
        if not identical(again, want):
            if mismatch(want, again) is not Mismatch.VALUES:
                return float("inf")
            noise = max(noise, difference(want, again, ULPS)[0])
    return noise


def reference_of(model: torch.nn.Module, entry: Entry, accelerated: Any = None) -> Callable[..., Any]:
    """What the accelerated model must equal: eager, or for ``compile`` the very programs the backend compiled for
    ``accelerated`` (a compilation of its own where none is given), run without graphs: the graphs must change
    nothing, while Inductor's kernels -- configurations benchmarked on the device at a program's first call -- and the
    backend's own rewrites and partitions round as they do."""
    if entry is Entry.COMPILE:
        compiled = accelerated if accelerated is not None else torch.compile(model, backend="launchless")
        return functools.partial(_without_graphs, compiled)
    return model


def _without_graphs(compiled: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    from ...compiler import without_graphs

    with without_graphs():
        return compiled(*args, **kwargs)


def seeded(call: Callable[..., Any], seed: int, *args: Any, **kwargs: Any) -> Any:
    """``call`` from a fixed state of the CPU and CUDA generators (the same draws for reference and accelerated)."""
    torch.manual_seed(seed)
    return call(*args, **kwargs)


def references_alone(built: Built, entry: Entry, mode: GradMode, seed: int) -> None:
    """The references of ``entry``'s row alone, on the same inputs and draws (nothing accelerated): whether eager
    itself ends the process (``shard``'s check of a model that killed its worker)."""
    generator = torch.Generator().manual_seed(seed)
    reference = reference_of(built.model, entry)
    with grad_mode(mode):
        for call in range(CALLS):
            args, kwargs = built.make_inputs(generator, "cuda")
            seeded(reference, seed + call, *args, **kwargs)
    torch.cuda.synchronize()


def release(accelerated: Any) -> None:
    with contextlib.suppress(Exception):
        accelerated.release_graphs()
    torch._dynamo.reset()
    gc.collect()
    torch.cuda.empty_cache()


def forward_row(
    candidate: Candidate,
    built: Built,
    entry: Entry,
    mode: GradMode,
    seed: int,
    *,
    measure: Measure | None = None,
) -> dict[str, Any]:
    """The row of ``entry`` under ``mode``: CALLS fresh-input comparisons, the status, then the speed-up by
    ``measure`` on the last call's inputs (none without: beside other workers on the GPU a timing is not one; the
    timing pass measures it)."""
    row = new_row(candidate.name, candidate.library.value, candidate.task, entry, mode, architecture=built.architecture)
    generator = torch.Generator().manual_seed(seed)
    model = built.model
    started = time.perf_counter()
    accelerated: Any = None
    results: list[Result] = []
    try:
        accelerated = accelerate(model, entry)
        reference = reference_of(model, entry, accelerated)
        with grad_mode(mode):
            for call in range(CALLS):
                args, kwargs = built.make_inputs(generator, "cuda")
                try:
                    want = seeded(reference, seed + call, *args, **kwargs)
                except Exception as exc:
                    what = "the launchless backend without graphs" if entry is Entry.COMPILE else "eager"
                    row.update(result=Result.EAGER_FAILS.value, reason=f"{what}: {one_line(exc)}")
                    return row
                try:
                    got = seeded(accelerated, seed + call, *args, **kwargs)
                except (CaptureError, VerificationError) as exc:
                    if entry is not Entry.WRAP_TRUE:
                        raise
                    row.update(status=Status.REFUSED.value, reason=one_line(exc), source=_where(exc))
                    return row
                row["calls"] += 1
                if identical(got, want):
                    results.append(Result.IDENTICAL)
                    continue
                if row["first_differing_call"] is None:
                    row.update(first_differing_call=call + 1, mismatch=mismatch(want, got).value)
                    row["differing_leaf"] = differing_leaf(want, got)
                    if torch.cuda.is_available():  # every stream: outputs still being written when the call returned?
                        torch.cuda.synchronize()
                    if identical(got, want):
                        row["differing_leaf"] = (
                            f"{row['differing_leaf']} (bit-identical once every stream finished: the call returned "
                            "before its outputs were written)"
                        )
                result, max_abs, bound, named = judge_mismatch(want, got, graph_info(accelerated, entry))
                confirm = result is Result.DIFFERS or named == CAPTURE_PATH
                if confirm and max_abs < float("inf") and entry is not Entry.COMPILE:
                    confirmed, confirmed_bound, confirmed_class, off_path = on_capture_path(
                        reference, want, got, seed + call, args, kwargs
                    )
                    if off_path:  # kept for the report: how far eager on the capture path is from the graph
                        row["capture_path_max_abs"] = max(row["capture_path_max_abs"] or 0.0, off_path)
                    if result is Result.DIFFERS:
                        result, bound, named = confirmed, confirmed_bound, confirmed_class
                if result is Result.DIFFERS and max_abs < float("inf"):
                    noise = reference_noise(reference, want, seed + call, args, kwargs)
                    if 0.0 < noise < float("inf") and max_abs <= NOISE_FACTOR * noise:
                        result, bound, named = Result.BOUNDED, NOISE_FACTOR * noise, EAGER_NONDETERMINISTIC
                results.append(result)
                if row["max_abs_diff"] is None or max_abs > row["max_abs_diff"]:
                    row.update(max_abs_diff=max_abs, bound=bound, bound_class=named)
            status, reason, source = status_of(graph_info(accelerated, entry), entry)
            row.update(status=status.value, reason=reason, source=source)
            row["identical_calls"] = results.count(Result.IDENTICAL)
            row["result"] = max(results, key=_severity).value
            if measure is not None:
                eager, fast = functools.partial(model, *args, **kwargs), functools.partial(accelerated, *args, **kwargs)
                row.update(timed_alone=True, **measure(eager, fast))
    except Exception as exc:  # the accelerated model raised where eager worked
        row.update(result=Result.CRASH.value, reason=one_line(exc), source=_where(exc))
    finally:
        row["wall_s"] = round(time.perf_counter() - started, 2)
        release(accelerated)
    return row


def _severity(result: Result) -> int:
    return SEVERITY.index(result)


def _where(exc: BaseException) -> str | None:
    location = locate_exception(exc)
    return None if location is None else str(location)


def one_reading(eager: Callable[[], Any], accelerated: Callable[[], Any]) -> dict[str, Any]:
    """Eager against accelerated in interleaved rounds (CUDA events, calls back to back): a correctness run's
    worker alone on the GPU times its rows so."""
    medians = interleaved_ms(
        {"eager": eager, "accelerated": accelerated}, waited=False, rounds=TIMING_ROUNDS, per_round=TIMING_PER_ROUND
    )
    return {
        "eager_ms": round(medians["eager"], 4),
        "accelerated_ms": round(medians["accelerated"], 4),
        "speedup": round(medians["eager"] / medians["accelerated"], 3),
    }
