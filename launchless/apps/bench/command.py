"""``launchless bench``: its arguments, checked, and the suite they ask for run (or partial runs merged)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from ..arguments import seconds, whole_number
from .multigpu_report import SUITE as MULTIGPU
from .serving_report import SUITE as SERVING
from .serving_workloads import TRACE_CALLS
from .workloads import SUITES

BENCH_ITERS = 100  # timed calls per (workload, mode) unless --iters says otherwise


def add_parser(sub: argparse._SubParsersAction) -> None:
    """``launchless bench``'s arguments."""
    bench = sub.add_parser(
        "bench", help="eager vs torch.compile vs reduce-overhead vs hand graph vs launchless (runtime and compiler)"
    )
    bench.add_argument(
        "--suite",
        choices=(*SUITES, MULTIGPU, SERVING),
        default="quick",
        help="multigpu: tensor-parallel inference and DDP training at several world sizes, groups run by torchrun; "
        "serving: a trace of batch sizes with a graph per size against batch buckets, and generate() decoding",
    )
    bench.add_argument("--workloads", nargs="+", help="workload names (default: the suite's); see --list")
    bench.add_argument("--modes", nargs="+", help="modes to run (default: all)")
    bench.add_argument("--out", default="bench-results", help="folder for bench.json, bench.md, bench.png")
    bench.add_argument(
        "--iters",
        type=whole_number(1),
        help=f"timed calls per (workload, mode) (default {BENCH_ITERS}); serving suite: the calls of the trace of "
        f"batch sizes (default {TRACE_CALLS})",
    )
    bench.add_argument("--timeout", type=seconds, default=300, help="seconds one workload may take in one mode")
    bench.add_argument(
        "--gpus",
        nargs="+",
        type=int,
        metavar="INDEX",
        help="deal the workloads over these GPUs and run the parts at once (each workload runs all its modes on "
        "one GPU; CPU cores are split between the parts); multigpu suite: world size W runs on the first W",
    )
    bench.add_argument(
        "--world-sizes",
        nargs="+",
        type=int,
        metavar="W",
        help="multigpu suite: the process-group sizes to measure (default: 1 2)",
    )
    bench.add_argument(
        "--balance-from",
        metavar="BENCH_JSON",
        help="with --gpus: deal the workloads by the time each took in this earlier bench.json (longest first to "
        "the least-loaded GPU) instead of round-robin, so that the GPUs finish together",
    )
    bench.add_argument(
        "--profile",
        action="store_true",
        help="after each (workload, mode)'s figures, where its calls' time goes: cProfile's host functions and "
        "torch.profiler's operations, in --out/profiles/<workload>--<mode>.txt (serving: its decode workloads' "
        "generations; not the multigpu suite)",
    )
    bench.add_argument("--list", action="store_true", help="list workloads and modes and exit")
    bench.add_argument(
        "--merge",
        nargs="+",
        metavar="BENCH_JSON",
        help="write one report from partial runs' bench.json (no GPU needed); a worker's rows-*.jsonl among them "
        "adds the rows of a run cut short before its report took them in",
    )


def run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``launchless bench``: partial runs merged (``--merge``), the workloads and modes listed, or the suite run
    (the multigpu and serving suites by their own runners); a wrong argument is an argparse error naming the fix."""
    from . import workloads
    from .modes import MODES, default_modes, order_problem

    if args.merge:
        from .runner import merge

        try:
            return merge(args.merge, args.out)
        except ValueError as exc:  # a file that is not a bench.json, or runs that do not belong together
            parser.error(str(exc))
    if args.iters is None:
        args.iters = TRACE_CALLS if args.suite == SERVING else BENCH_ITERS
    if args.profile and args.suite == MULTIGPU:
        parser.error("--profile profiles one process's calls; the multigpu suite's run in torchrun groups")
    if args.suite == MULTIGPU:
        return _multigpu(parser, args)
    if args.suite == SERVING:
        return _serving(parser, args)
    if args.list:
        for w in workloads.WORKLOADS.values():
            print(f"{w.name:40s} {w.kind:9s} batch {w.batch}  suites: {', '.join(w.suites) or '(run by name)'}")
        print("modes: " + ", ".join(MODES))
        return 0
    try:
        names = (
            [workloads.get(n).name for n in args.workloads]
            if args.workloads
            else [w.name for w in workloads.suite(args.suite)]
        )
    except workloads.UnknownWorkload as exc:
        parser.error(str(exc))
    unknown = [m for m in args.modes or () if m not in MODES]
    if unknown:
        parser.error(f"unknown mode(s) {', '.join(unknown)}; choose from: {', '.join(MODES)}")
    modes = list(args.modes or default_modes(args.suite))
    problem = order_problem(modes)
    if problem:
        parser.error(problem)
    weights = None
    if args.balance_from:
        from .runner import BalanceFileUnreadable, balance_weights

        try:
            weights = balance_weights(args.balance_from, modes)
        except BalanceFileUnreadable as exc:
            parser.error(str(exc))
    import torch

    if not torch.cuda.is_available():
        print(
            "launchless bench needs a CUDA GPU: it times GPU work with CUDA events and the profiler, and none is "
            "visible here (torch.cuda.is_available() is False). Run it on a machine with an NVIDIA GPU.",
            file=sys.stderr,
        )
        return 2
    from .runner import measure_suite

    if args.gpus:
        _check_gpus(parser, args.gpus)
    measure_suite(
        args.suite, names, modes, out_dir=args.out, iters=args.iters, timeout_s=args.timeout, gpus=args.gpus,
        weights=weights, profile=args.profile,
    )  # fmt: skip
    return 0


def _multigpu(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """The multigpu suite: its own workloads and modes, every world size a torchrun group (gloo on a CPU-only
    machine, so that it runs anywhere; its times are then the host's)."""
    from . import multigpu, multigpu_workloads

    if args.list:
        own = "tp:package.module:function, ddp:package.module:function"
        print(f"workloads: {', '.join(multigpu_workloads.default_workloads())}, {own}")
        print("modes: " + ", ".join(multigpu_workloads.MODES))
        return 0
    if args.balance_from:
        parser.error("--balance-from deals single-GPU workloads; the multigpu suite runs every group on --gpus")
    names = args.workloads or multigpu_workloads.default_workloads()
    _check_suite_choices(
        parser, names, args.modes, check_workload=multigpu_workloads.check_workload, modes=multigpu_workloads.MODES
    )
    device = multigpu.device_type()
    gpus = args.gpus
    if device == "cuda":
        import torch

        gpus = gpus or list(range(torch.cuda.device_count()))
        _check_gpus(parser, gpus)
    world_sizes = args.world_sizes or list(multigpu.WORLD_SIZES)
    try:
        multigpu.check_world_sizes(world_sizes, gpus, device)
    except multigpu.MultiGpuUnavailable as exc:
        parser.error(str(exc))
    multigpu.run_multigpu(
        names,
        args.modes or multigpu_workloads.MODES,
        world_sizes=world_sizes,
        out_dir=args.out,
        iters=args.iters,
        timeout_s=args.timeout,
        gpus=gpus,
        device=device,
    )
    return 0


def _serving(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """The serving suite: its own workloads and modes, a worker per mode; it runs on a CPU too (host-clock times,
    tiny models by default), so that it can be checked anywhere."""
    from . import serving_workloads
    from .runner import measure_suite
    from .worker import device_type

    if args.list:
        print("\n".join(serving_workloads.listing()))
        return 0
    if args.balance_from:
        parser.error("--balance-from deals the standard suites' workloads; the serving suite deals its own round-robin")
    device = device_type()
    names = args.workloads or serving_workloads.default_workloads(device)
    _check_suite_choices(
        parser, names, args.modes, check_workload=serving_workloads.check_workload, modes=serving_workloads.MODES
    )
    if args.gpus:
        if device != "cuda":
            parser.error("--gpus names GPUs and none is visible here; leave it out to run on the CPU")
        _check_gpus(parser, args.gpus)
    measure_suite(
        SERVING, names, list(args.modes or serving_workloads.MODES), out_dir=args.out, iters=args.iters,
        timeout_s=args.timeout, gpus=args.gpus, device=device, profile=args.profile,
    )  # fmt: skip
    return 0


def _check_suite_choices(
    parser: argparse.ArgumentParser,
    names: list[str],
    asked_modes: list[str] | None,
    *,
    check_workload: Callable[[str], None],
    modes: Sequence[str],
) -> None:
    """A suite with workloads and modes of its own: an unknown name of either is an argparse error naming the
    choices."""
    from .workloads import UnknownWorkload

    try:
        for name in names:
            check_workload(name)
    except UnknownWorkload as exc:
        parser.error(str(exc))
    unknown = [m for m in asked_modes or () if m not in modes]
    if unknown:
        parser.error(f"unknown mode(s) {', '.join(unknown)}; choose from: {', '.join(modes)}")


def _check_gpus(parser: argparse.ArgumentParser, gpus: list[int]) -> None:
    """``--gpus`` (or every GPU) checked before any worker starts: a GPU not there, named twice, or of another model
    than the rest is an argparse error."""
    from ..workers import GpusUnavailable, check_gpus

    try:
        check_gpus(gpus)
    except GpusUnavailable as exc:
        parser.error(str(exc))
