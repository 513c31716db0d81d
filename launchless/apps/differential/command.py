"""``launchless differential``: its arguments, checked, and a shard run or shard folders merged."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..arguments import seconds, whole_number


def add_parser(sub: argparse._SubParsersAction) -> None:
    """``launchless differential run|merge``'s arguments."""
    from .candidate import Library
    from .rows import Entry

    differential = sub.add_parser(
        "differential",
        help="every model the libraries list, accelerated every way, compared with eager on fresh inputs each call",
    )
    actions = differential.add_subparsers(dest="action", required=True)
    run = actions.add_parser("run", help="run one shard of a population on the GPU")
    run.add_argument("--library", required=True, choices=[lib.value for lib in Library])
    run.add_argument("--shard", default="1/1", help="INDEX/COUNT: every COUNT-th model from the INDEX-th")
    run.add_argument("--models", nargs="+", help="only these models of the population")
    run.add_argument("--out", required=True, help="folder for the shard's rows")
    run.add_argument("--processes", type=whole_number(1), default=1, help="workers side by side on the GPU")
    run.add_argument("--timeout", type=seconds, default=300, help="seconds one model may take (all its rows)")
    run.add_argument(
        "--resume", action="store_true", help="leave out models that already have rows in --out (a shard cut short)"
    )
    run.add_argument(
        "--timing",
        action="store_true",
        help="the timing pass: each model alone on the GPU (one process), speed-ups the merge lays over the rows",
    )
    run.add_argument(
        "--entries",
        nargs="+",
        choices=[entry.value for entry in Entry],
        help="only these entry points' rows (a run again after a change to them; the merge replaces just those); "
        "with --timing, the entry points the timing pass runs again alone (default: wrap-auto and greedy decoding)",
    )
    run.add_argument("--list", action="store_true", help="list the shard's models and exit (no GPU needed)")
    merge = actions.add_parser("merge", help="merge shard folders into differential.json, .md and .png")
    merge.add_argument("dirs", nargs="+", metavar="DIR")
    merge.add_argument("--out", required=True)


def run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """A shard run (or listed) on the GPU, or shard folders merged into the report; bad folders, rows or models are
    an argparse error naming the fix."""
    from . import report
    from .candidate import Library
    from .population import candidates, parse_shard, pick, shard

    if args.action == "merge":
        fix = "pass the --out folders of launchless differential run"
        for directory in args.dirs:
            if not Path(directory).is_dir():
                parser.error(f"{directory}: no such folder; {fix}")
        if not any(any(Path(d).glob("rows*.jsonl")) for d in args.dirs):
            parser.error(f"no rows*.jsonl in {', '.join(args.dirs)}; {fix}")
        try:
            rows = report.apply_timings(report.load(args.dirs), report.load_timings(args.dirs))
        except ValueError as exc:  # a line that is not JSON (``read_rows`` names its file and line)
            parser.error(f"{exc}; {fix}")
        except (KeyError, TypeError) as exc:  # JSON, but not a line a run writes
            parser.error(f"a line of a rows*.jsonl file is not a row a run wrote (no {exc}); {fix}")
        paths = report.write_all(rows, args.out, report.load_populations(args.dirs))
        print(paths["md"].read_text())
        return 0
    try:
        spec = parse_shard(args.shard)
        chosen = shard(pick(candidates(Library(args.library)), args.models), *spec)
    except KeyError as exc:  # a model not in the population: its message, not the key's repr
        parser.error(f"--models: {exc.args[0]}; `launchless differential run --library {args.library} --list` lists it")
    except ValueError as exc:
        parser.error(str(exc))
    if args.timing and args.entries:
        from .timing import TIMABLE

        timable = [entry.value for entry in TIMABLE]
        others = [e for e in args.entries if e not in timable]
        if others:
            parser.error(
                f"--timing --entries {' '.join(others)}: the timing pass runs again {', '.join(timable)} (decoding "
                "greedy at batch 1); leave the others out"
            )
    if args.timing and args.processes != 1:
        parser.error(f"--timing times each model with the GPU to itself: one process, not --processes {args.processes}")
    if args.list:
        print("\n".join(c.name for c in chosen))
        return 0
    import torch

    if not torch.cuda.is_available():
        print("launchless differential run needs a CUDA GPU; `launchless differential run --list` works without one.")
        return 2
    from .shard import run_shard

    rows = run_shard(
        Library(args.library),
        args.out,
        shard_spec=spec,
        names=args.models,
        processes=args.processes,
        timeout_s=args.timeout,
        resume=args.resume,
        timing=args.timing,
        entries=args.entries,
    )
    print(f"{len(rows)} rows in {args.out}")
    return 0
