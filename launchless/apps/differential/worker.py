"""A worker process: the models it is given in turn, all rows of one model as one JSON line.

Each model is built on the GPU afresh and dropped (graphs released, compiler caches reset) before the next, so a
model sees no state of another; a hard CUDA error ends only this process, and the shard restarts a worker past
the model it was on (``shard.run_shard``).
"""

from __future__ import annotations

import argparse
import logging
import time
import warnings
import zlib
from typing import Any

import torch

from ...errors import one_line
from ..environment import gpu_name
from ..workers import append_row, exit_if_gpu_unusable
from .candidate import Built, Candidate, Library, NotInLibraryError
from .population import candidates, pick
from .rows import Entry, GradMode, Result, new_row
from .runner import forward_entries, forward_row, one_reading, release

RUNNING = "launchless-differential: running"


def model_rows(
    candidate: Candidate, *, timed: bool = True, entries: frozenset[Entry] | None = None
) -> list[dict[str, Any]]:
    """Every row of ``candidate``: forward entries x grad modes, and the decoding requests of a causal LM; speed-ups
    only when ``timed`` (a worker alone on the GPU); only the rows of ``entries`` where given (a run again after a
    change that touches those entry points)."""
    seed = seed_of(candidate)
    started = time.perf_counter()
    try:
        built = _seeded_build(candidate, seed)
    except NotInLibraryError as exc:
        return [_not_built(candidate, Result.NOT_IN_LIBRARY, str(exc))]
    except ImportError as exc:  # the library itself (diffusers) or a package the model needs is not installed
        return [_not_built(candidate, Result.NOT_IN_LIBRARY, f"needs a package that is not installed: {one_line(exc)}")]
    except Exception as exc:
        return [_not_built(candidate, Result.HARNESS, f"does not build: {one_line(exc)}")]
    rows = []
    for entry in forward_entries(candidate):
        if entries is not None and entry not in entries:
            continue
        for mode in GradMode:
            announce(candidate, entry, mode)
            rows.append(forward_row(candidate, built, entry, mode, seed, measure=one_reading if timed else None))
    if candidate.library is Library.TRANSFORMERS_CAUSAL and hasattr(built.model, "generate"):
        from .generate import REQUESTS, best_of_two, generate_row

        for entry, mode in REQUESTS:
            if entries is not None and entry not in entries:
                continue
            announce(candidate, entry, mode)
            measure = best_of_two if timed else None
            rows.append(generate_row(candidate, built, entry, mode, seed, measure=measure))
    for row in rows:
        row["model_s"] = round(time.perf_counter() - started, 1)
    del built
    release(None)
    return rows


def announce(candidate: Candidate, entry: Entry, mode: GradMode) -> None:
    """One line in the worker's log before each row: a model that kills the process (a device-side assert) is
    charged to the row it was on (``shard.killed_reason`` reads it back)."""
    print(f"{RUNNING} {candidate.name} {entry.value} {mode.value}", flush=True)


def seed_of(candidate: Candidate) -> int:
    """The model's own seed (a hash of its key): its weights, inputs and draws are the same in every process that
    builds it -- a correctness row, its timing, the references a killed row reruns alone."""
    return zlib.crc32(candidate.key.encode())


def _seeded_build(candidate: Candidate, seed: int) -> Built:
    torch.manual_seed(seed)
    return _build_on_gpu(candidate)


def _build_on_gpu(candidate: Candidate) -> Built:
    """Built on the GPU directly (fast for large models); on the CPU and moved where an init needs host tensors."""
    try:
        return candidate.build("cuda")
    except NotInLibraryError:
        raise
    except Exception:
        built = candidate.build("cpu")
        built.model.to("cuda")
        return built


def _not_built(candidate: Candidate, result: Result, reason: str) -> dict[str, Any]:
    return new_row(
        candidate.name, candidate.library.value, candidate.task, Entry.WRAP_AUTO, GradMode.NO_GRAD, result=result,
        reason=reason,
    )  # fmt: skip


def timing_of(candidate: Candidate, *, entries: frozenset[Entry] | None = None) -> dict[str, Any]:
    """The timing pass's line for ``candidate`` (``timing.timing_line``, of ``entries`` where given); a model that
    does not build has none."""
    from .timing import timing_line

    seed = seed_of(candidate)
    try:
        built = _seeded_build(candidate, seed)
    except Exception as exc:
        return {"key": candidate.name, "library": candidate.library.value, "timings": [], "error": one_line(exc)}
    try:
        return timing_line(candidate, built, seed, entries=entries)
    finally:
        del built
        release(None)


def eager_alone(candidate: Candidate, entry: Entry, mode: GradMode, out: str) -> None:
    """Only the references of one row of ``candidate`` -- the row a killed worker was on -- on the same inputs and
    draws, in a process of their own: if this process ends after the model is built (a ``built`` line in ``out``),
    eager itself ends it (``shard.eager_alone``); a line ``survived`` follows when it runs through."""
    seed = seed_of(candidate)
    built = _seeded_build(candidate, seed)
    torch.cuda.synchronize()
    append_row(out, {"key": candidate.name, "built": True})
    if entry.value.startswith("generate"):
        from .generate import references_alone
    else:
        from .runner import references_alone
    references_alone(built, entry, mode, seed)


def run(
    library: Library,
    names: list[str],
    out: str,
    *,
    timing: bool = False,
    side_by_side: bool = False,
    entries: frozenset[Entry] | None = None,
) -> None:
    population = {c.name: c for c in candidates(library)}
    for candidate in pick(list(population.values()), names):
        if timing:
            append_row(out, timing_of(candidate, entries=entries))
        else:
            rows = model_rows(candidate, timed=not side_by_side, entries=entries)
            line: dict[str, Any] = {"key": candidate.name, "rows": rows, "finished_at": time.time(), "gpu": gpu_name()}
            if entries is not None:  # the merge replaces only these entry points' rows of the model
                line["entries"] = sorted(e.value for e in entries)
            append_row(out, line)
        exit_if_gpu_unusable()  # a model that ended the CUDA context: the next ones get a fresh process


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--library", required=True, choices=[lib.value for lib in Library])
    parser.add_argument("--models", nargs="+", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--timing", action="store_true", help="time the models (the timing pass) instead")
    parser.add_argument("--side-by-side", action="store_true", help="other workers share the GPU: no speed-ups")
    parser.add_argument(
        "--eager-alone", metavar="ENTRY/MODE", help="only the references of that row of the one model named"
    )
    parser.add_argument("--entries", nargs="+", choices=[e.value for e in Entry], help="only these entry points")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.basicConfig(level=logging.WARNING)
    if args.timing:  # one model at a time: its capture, split and speed decisions in the log, once each
        logging.getLogger("launchless").setLevel(logging.INFO)
    if args.eager_alone:
        entry, _, mode = args.eager_alone.partition("/")
        (candidate,) = pick(candidates(Library(args.library)), args.models)
        eager_alone(candidate, Entry(entry), GradMode(mode), args.out)
        append_row(args.out, {"key": candidate.name, "survived": True})
        return
    entries = frozenset(Entry(e) for e in args.entries) if args.entries else None
    run(
        Library(args.library),
        args.models,
        args.out,
        timing=args.timing,
        side_by_side=args.side_by_side,
        entries=entries,
    )


if __name__ == "__main__":
    main()
