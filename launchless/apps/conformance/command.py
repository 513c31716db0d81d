"""``launchless conformance`` and ``launchless verify``: their arguments, checked, and the matrix or the one model
checked."""

from __future__ import annotations

import argparse

from ..arguments import seconds, whole_number


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """``launchless conformance`` and ``launchless verify``'s arguments."""
    matrix = sub.add_parser(
        "conformance",
        help="run every zoo model through wrap(model, 'auto'): whole graph / split / eager, verified, speed-up",
    )
    matrix.add_argument("--models", nargs="+", help="zoo workload names (default: every available one)")
    matrix.add_argument("--tasks", nargs="+", help="only the models of these tasks")
    matrix.add_argument("--out", default="conformance", help="folder for conformance.json, .md and .png")
    matrix.add_argument("--iters", type=whole_number(1), default=50, help="timed calls per model and mode")
    matrix.add_argument("--timeout", type=seconds, default=300, help="seconds one model may take")
    matrix.add_argument("--gpus", nargs="+", type=int, metavar="INDEX", help="deal the models over these GPUs")
    matrix.add_argument("--list", action="store_true", help="list the models per task and exit")
    matrix.add_argument(
        "--resume", action="store_true", help="keep the rows an interrupted run left in --out; check only the rest"
    )
    verify = sub.add_parser(
        "verify",
        help="check one model as the conformance matrix does; exit 1 when it is refused or not verified",
        description="MODEL: a zoo workload name, or package.module:function returning (model, inputs), where "
        "inputs is a tuple of arguments, an (args, kwargs) pair, or a function returning fresh ones.",
    )
    verify.add_argument("model", metavar="MODEL")
    verify.add_argument("--iters", type=whole_number(1), default=50, help="timed calls per mode")
    verify.add_argument("--json", action="store_true", help="print the row as JSON")


def run_conformance(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """The matrix over the zoo's models (task by task in turn), or their list; exit 2 without a GPU."""
    from .. import zoo

    by_task = zoo.tasks()
    unknown = [t for t in args.tasks or () if t not in by_task]
    if unknown:
        parser.error(f"unknown task(s) {', '.join(unknown)}; choose from: {', '.join(by_task)}")
    names = args.models or interleaved({t: ns for t, ns in by_task.items() if not args.tasks or t in args.tasks})
    bad = [n for n in names if n not in zoo.names()]
    if bad:
        parser.error(f"unknown model(s) {', '.join(bad)}; see `launchless conformance --list`")
    if args.list:  # the models the other arguments chose, per task
        for task, listed in by_task.items():
            chosen = [n for n in listed if n in names]
            if chosen:
                print(f"{task}: {', '.join(chosen)}")
        return 0
    names = [n for n in names if zoo.available(n)]
    import torch

    if not torch.cuda.is_available():
        print("launchless conformance needs a CUDA GPU (it captures and times graphs); none is visible here.")
        return 2
    from ..workers import GpusUnavailable, check_gpus
    from .runner import run_matrix

    try:
        check_gpus(args.gpus or [])
    except GpusUnavailable as exc:  # a GPU not there, named twice, or of another model than the rest
        parser.error(str(exc))

    paths = run_matrix(names, args.out, iters=args.iters, timeout_s=args.timeout, gpus=args.gpus, resume=args.resume)
    print(paths["md"].read_text())
    return 0


def interleaved(by_task: dict[str, list[str]]) -> list[str]:
    """The models task by task in turn (one of each task, then the next of each...): a run cut short has covered
    every task."""
    queues = [list(names) for names in by_task.values()]
    order: list[str] = []
    while any(queues):
        order += [queue.pop(0) for queue in queues if queue]
    return order


def run_verify(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """One model checked as the matrix checks it: exit 0 verified, 1 refused or unproven, 2 without a GPU (the
    first capture blocker found on the meta device is printed instead)."""
    import json

    import torch

    from .user_model import ModelSpecError, load

    device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        model, make_inputs, task = load(args.model, device=device)
    except ModelSpecError as exc:
        parser.error(str(exc))
    if device == "cpu":
        from .check import dry_check

        row = dry_check(model, make_inputs(), name=args.model, task=task)
        print(json.dumps(row, indent=1) if args.json else f"{args.model}: no CUDA device here; first capture "
              f"blocker on the meta device: {row['blocker'] or 'none found'}")  # fmt: skip
        return 2
    from .check import check
    from .report import markdown

    row = check(model, make_inputs, name=args.model, task=task, iters=args.iters)
    if args.json:
        print(json.dumps(row, indent=1))
    else:
        from ..environment import describe

        print(markdown(describe(), [row]))
    # verified: bit-identical, or within a named class's bound (the row says which); refused or unproven: 1
    return 0 if row["status"] in ("graph", "split") and row["verified"] else 1
