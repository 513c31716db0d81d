"""The `launchless` command."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import torch

from .. import __version__
from .bench.multigpu_report import SUITE as MULTIGPU
from .bench.serving_report import SUITE as SERVING
from .bench.serving_workloads import TRACE_CALLS
from .bench.workloads import SUITES

BENCH_ITERS = 100  # timed calls per (workload, mode) unless --iters says otherwise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="launchless", description="Safe, automatic CUDA graphs for PyTorch.")
    parser.add_argument("--version", action="version", version=f"launchless {__version__} (torch {torch.__version__})")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="wrap a real model (random weights), verify it and time eager vs graph")
    demo.add_argument("--model", default="timm:resnet18", help="a launchless.apps.zoo workload name")
    demo.add_argument("--batch", type=int, default=1)
    demo.add_argument("--iters", type=int, default=100)
    demo.add_argument("--list", action="store_true", help="list the workload names and exit")
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
        type=int,
        help=f"timed calls per (workload, mode) (default {BENCH_ITERS}); serving suite: the calls of the trace of "
        f"batch sizes (default {TRACE_CALLS})",
    )
    bench.add_argument("--timeout", type=float, default=300, help="seconds one workload may take in one mode")
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
    bench.add_argument("--list", action="store_true", help="list workloads and modes and exit")
    bench.add_argument(
        "--merge",
        nargs="+",
        metavar="BENCH_JSON",
        help="write one report from partial runs' bench.json (no GPU needed)",
    )
    _add_train_parser(sub)
    doctor = sub.add_parser(
        "doctor", help="compile a model with the launchless backend and explain each graph: blockers, variant, coverage"
    )
    doctor.add_argument("--model", default="timm:resnet18", help="a launchless.apps.zoo workload name")
    doctor.add_argument("--batch", type=int, default=1)
    doctor.add_argument("--reprofile", action="store_true", help="measure the graph variants again (ignore the cache)")
    doctor.add_argument("--clear-cache", action="store_true", help="delete the cached graph decisions and exit")
    _add_conformance_parsers(sub)
    _add_differential_parser(sub)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.command == "demo":
        from . import demo as demo_module
        from . import zoo

        if args.list:
            print("\n".join(zoo.names()))
            return 0
        if args.model not in zoo.names():
            parser.error(f"unknown model {args.model!r}; choose one of: {', '.join(zoo.names())}")
        return demo_module.run(args.model, args.batch, args.iters)
    if args.command == "bench":
        return _bench(parser, args)
    if args.command == "train":
        return _train(parser, args, argv=sys.argv[1:] if argv is None else list(argv))
    if args.command == "doctor":
        return _doctor(parser, args)
    if args.command == "conformance":
        return _conformance(parser, args)
    if args.command == "verify":
        return _verify(parser, args)
    if args.command == "differential":
        return _differential(parser, args)
    return 2


def _add_conformance_parsers(sub: argparse._SubParsersAction) -> None:
    matrix = sub.add_parser(
        "conformance",
        help="run every zoo model through wrap(model, 'auto'): whole graph / split / eager, verified, speed-up",
    )
    matrix.add_argument("--models", nargs="+", help="zoo workload names (default: every available one)")
    matrix.add_argument("--tasks", nargs="+", help="only the models of these tasks")
    matrix.add_argument("--out", default="conformance", help="folder for conformance.json, .md and .png")
    matrix.add_argument("--iters", type=int, default=50, help="timed calls per model and mode")
    matrix.add_argument("--timeout", type=float, default=300, help="seconds one model may take")
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
    verify.add_argument("--iters", type=int, default=50, help="timed calls per mode")
    verify.add_argument("--json", action="store_true", help="print the row as JSON")


def _add_differential_parser(sub: argparse._SubParsersAction) -> None:
    from .differential.candidate import Library
    from .differential.rows import Entry

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
    run.add_argument("--processes", type=int, default=1, help="workers side by side on the GPU")
    run.add_argument("--timeout", type=float, default=300, help="seconds one model may take (all its rows)")
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
        help="only these entry points' rows (a run again after a change to them; the merge replaces just those)",
    )
    run.add_argument("--list", action="store_true", help="list the shard's models and exit (no GPU needed)")
    merge = actions.add_parser("merge", help="merge shard folders into differential.json, .md and .png")
    merge.add_argument("dirs", nargs="+", metavar="DIR")
    merge.add_argument("--out", required=True)


def _differential(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from .differential import report
    from .differential.candidate import Library
    from .differential.population import candidates, parse_shard, pick, shard

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
        parser.error("--entries picks correctness rows; the timing pass times what it times (wrap-auto, decoding)")
    if args.timing and args.processes != 1:
        parser.error(f"--timing times each model with the GPU to itself: one process, not --processes {args.processes}")
    if args.list:
        print("\n".join(c.name for c in chosen))
        return 0
    import torch

    if not torch.cuda.is_available():
        print("launchless differential run needs a CUDA GPU; `launchless differential run --list` works without one.")
        return 2
    from .differential.shard import run_shard

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


def _conformance(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from . import zoo

    by_task = zoo.tasks()
    if args.list:
        for task, names in by_task.items():
            print(f"{task}: {', '.join(names)}")
        return 0
    unknown = [t for t in args.tasks or () if t not in by_task]
    if unknown:
        parser.error(f"unknown task(s) {', '.join(unknown)}; choose from: {', '.join(by_task)}")
    names = args.models or interleaved({t: ns for t, ns in by_task.items() if not args.tasks or t in args.tasks})
    bad = [n for n in names if n not in zoo.names()]
    if bad:
        parser.error(f"unknown model(s) {', '.join(bad)}; see `launchless conformance --list`")
    names = [n for n in names if zoo.available(n)]
    import torch

    if not torch.cuda.is_available():
        print("launchless conformance needs a CUDA GPU (it captures and times graphs); none is visible here.")
        return 2
    from .conformance.runner import run_matrix

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


def _verify(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    import json

    import torch

    from .conformance.user_model import ModelSpecError, load

    device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        model, make_inputs, task = load(args.model, device=device)
    except ModelSpecError as exc:
        parser.error(str(exc))
    if device == "cpu":
        from .conformance.check import dry_check

        row = dry_check(model, make_inputs(), name=args.model, task=task)
        print(json.dumps(row, indent=1) if args.json else f"{args.model}: no CUDA device here; first capture "
              f"blocker on the meta device: {row['blocker'] or 'none found'}")  # fmt: skip
        return 2
    from .conformance.check import check
    from .conformance.report import markdown

    row = check(model, make_inputs, name=args.model, task=task, iters=args.iters)
    if args.json:
        print(json.dumps(row, indent=1))
    else:
        from .environment import describe

        print(markdown(describe(), [row]))
    # verified: bit-identical, or within a named class's bound (the row says which); refused or unproven: 1
    return 0 if row["status"] in ("graph", "split") and row["verified"] else 1


def _doctor(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from ..compiler.decisions import DecisionCache

    if args.clear_cache:
        cache = DecisionCache()
        print(f"removed {cache.clear()} cached decision(s) from {cache.directory}")
        return 0
    import torch

    from . import zoo

    if args.model not in zoo.names():
        parser.error(f"unknown model {args.model!r}; choose one of: {', '.join(zoo.names())}")
    if not torch.cuda.is_available():
        print("launchless doctor: no CUDA device here; it explains CUDA graphs, so run it on a machine with a GPU")
        return 2
    if args.reprofile:
        DecisionCache().clear()
    from ..compiler.explain import explain

    workload = zoo.build(args.model, batch=args.batch, device="cuda")
    print(explain(workload.model.eval(), *workload.args, **workload.kwargs))
    print(f"\nlaunchless.wrap(model) ('auto'): {_runtime_line(workload)}")
    return 0


def _runtime_line(workload) -> str:
    """What the run-time wrapper does with the model: whole graph, split (pieces, share) or eager (why)."""
    import torch

    from ..core.budget import memory_budget
    from ..runtime import wrap
    from .bench.graphs import describe_runtime, runtime_summary

    wrapped = wrap(workload.model, cuda_graph="auto", capture_after=1)
    with torch.no_grad():
        for _ in range(2):
            args, kwargs = workload.inputs()
            wrapped(*args, **kwargs)
    line = describe_runtime(runtime_summary(wrapped.graph_info()))
    budget = memory_budget()
    held = budget["by_model"].get(wrapped._name(), 0)
    limit = budget["limit_bytes"]
    line += f"; its graphs hold {held / 2**20:.1f} MiB" + (
        f" of the {limit / 2**20:.0f} MiB memory budget" if limit is not None else " (no memory budget set)"
    )
    wrapped.release_graphs()
    return line


def _add_train_parser(sub: argparse._SubParsersAction) -> None:
    train = sub.add_parser(
        "train",
        help="train a timm image classifier on an ImageFolder, optionally with a whole-step CUDA graph",
        description="Train a timm model (random init) on an ImageFolder directory with train/ and val/ sub-folders. "
        "--cuda-graph captures the whole training step with launchless.graphed_step.",
    )
    train.add_argument("--model", default="timm:resnet18", help="timm model name, with or without 'timm:'")
    data = train.add_mutually_exclusive_group()
    data.add_argument("--data", metavar="DIR", help="ImageFolder root holding train/<class>/... and val/<class>/...")
    data.add_argument(
        "--tiny-data", action="store_true", help="generate a tiny 3-class image set into <out>/tiny-data and use it"
    )
    train.add_argument("--epochs", type=int, default=5)
    train.add_argument("--batch", type=int, default=32, help="batch size (the last partial training batch is dropped)")
    train.add_argument("--lr", type=float, default=None, help="learning rate (default 0.05 for sgd, 1e-3 for adamw)")
    train.add_argument("--amp", choices=("bf16", "fp16", "off"), default="off", help="autocast dtype, or off")
    train.add_argument("--cuda-graph", action="store_true", help="capture and replay the whole step as a CUDA graph")
    train.add_argument("--out", default="train-out", help="folder for checkpoint.pt and metrics.json")
    train.add_argument("--size", type=int, default=None, help="image size (default 32 with --tiny-data, else 224)")
    train.add_argument("--workers", type=int, default=2, help="data-loader worker processes")
    train.add_argument("--optimizer", choices=("sgd", "adamw"), default="sgd")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument(
        "--gpus",
        type=_gpu_count,
        default=1,
        metavar="N",
        help="data-parallel training on the first N visible GPUs of this host (pick them with CUDA_VISIBLE_DEVICES): "
        "one process per GPU started by torchrun, DistributedDataParallel, --batch images per GPU; without CUDA, N "
        "CPU processes over gloo",
    )


def _gpu_count(text: str) -> int:
    """``--gpus``: a count of processes, one per GPU."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(
            f"got {text!r}; pass the number of GPUs to train on, 1 or more (1, the default, trains in this "
            "process; e.g. --gpus 2)"
        )
    return int(text)


def _train(parser: argparse.ArgumentParser, args: argparse.Namespace, *, argv: list[str]) -> int:
    """Train in this process, or as one rank of a torchrun group; with --gpus N (N > 1) outside such a group, check
    the options and become torchrun running this same command line in N processes."""
    import contextlib
    from pathlib import Path

    from ..errors import ConfigError
    from .trainer import distributed
    from .trainer.data import make_tiny_imagefolder
    from .trainer.trainer import train

    if not args.data and not args.tiny_data:
        parser.error("train needs --data DIR (an ImageFolder with train/ and val/) or --tiny-data")
    size = args.size if args.size is not None else (32 if args.tiny_data else 224)
    in_group = distributed.launched_by_torchrun()
    if in_group and args.gpus not in (1, distributed.processes_per_host()):
        per_host = distributed.processes_per_host()
        parser.error(
            f"--gpus {args.gpus} in a torchrun group of {per_host} process(es) per host: torchrun has started the "
            f"processes already; leave --gpus out (or pass --gpus {per_host})"
        )
    try:
        if args.gpus > 1 and not in_group:
            cuda = _check_before_launch(parser, args, size=size)
            if not cuda:
                print(
                    f"launchless train: no CUDA device here: --gpus {args.gpus} runs {args.gpus} CPU processes (gloo)"
                )
            distributed.relaunch(nproc_per_node=args.gpus, argv=argv)
        with distributed.joined_group() if in_group else contextlib.nullcontext() as parallel:
            if parallel is not None and not parallel.is_main:  # rank 0 speaks for the group; the others warn only
                logging.getLogger().setLevel(logging.WARNING)
            data = args.data
            if args.tiny_data:
                data = Path(args.out) / "tiny-data"
                if parallel is None or parallel.is_main:  # one writer: the ranks read it once it is complete
                    make_tiny_imagefolder(data, classes=3, per_class=64, size=size, seed=args.seed)
                if parallel is not None:
                    parallel.barrier()
            train(
                args.model,
                data,
                epochs=args.epochs,
                batch=args.batch,
                lr=args.lr,
                amp=args.amp,
                cuda_graph=args.cuda_graph,
                out=args.out,
                size=size,
                workers=args.workers,
                seed=args.seed,
                optimizer=args.optimizer,
                parallel=parallel,
            )
    except ConfigError as exc:
        print(f"launchless train: error: {exc}", file=sys.stderr)
        return 2
    return 0


def _check_before_launch(parser: argparse.ArgumentParser, args: argparse.Namespace, *, size: int) -> bool:
    """Whether the processes of ``--gpus N`` get GPUs (an argparse error when fewer than N are visible); the options
    and --data are checked here, so that a mistake is one message before any process starts rather than one per
    rank. Raises ``ConfigError``."""
    import os

    import torch

    from .trainer.data import check_imagefolder
    from .trainer.trainer import check_options

    cuda = torch.cuda.is_available()
    if cuda and args.gpus > torch.cuda.device_count():
        visible = torch.cuda.device_count()
        chosen = os.environ.get("CUDA_VISIBLE_DEVICES")
        where = f" (CUDA_VISIBLE_DEVICES={chosen})" if chosen is not None else ""
        parser.error(
            f"--gpus {args.gpus}: only {visible} GPU(s) visible here{where}; pass --gpus {visible} or fewer"
            + (", or list more devices in CUDA_VISIBLE_DEVICES" if chosen is not None else "")
        )
    check_options(
        args.model,
        epochs=args.epochs,
        batch=args.batch,
        lr=args.lr,
        amp=args.amp,
        optimizer=args.optimizer,
        size=size,
    )
    if args.data:
        check_imagefolder(args.data)
    return cuda


def _bench(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from .bench import workloads
    from .bench.modes import MODES, default_modes, order_problem

    if args.merge:
        from .bench.runner import merge

        try:
            return merge(args.merge, args.out)
        except ValueError as exc:  # a file that is not a bench.json, or runs that do not belong together
            parser.error(str(exc))
    if args.iters is None:
        args.iters = TRACE_CALLS if args.suite == SERVING else BENCH_ITERS
    if args.suite == MULTIGPU:
        return _bench_multigpu(parser, args)
    if args.suite == SERVING:
        return _bench_serving(parser, args)
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
        from .bench.runner import BalanceFileUnreadable, balance_weights

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
    from .bench.runner import GpusUnavailable, check_gpus, run_suite

    if args.gpus:
        try:
            check_gpus(args.gpus)
        except GpusUnavailable as exc:
            parser.error(str(exc))
    return run_suite(args.suite, names, modes, args.out, args.iters, args.timeout, args.gpus, weights)


def _bench_multigpu(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """The multigpu suite: its own workloads and modes, every world size a torchrun group (gloo on a CPU-only
    machine, so that it runs anywhere; its times are then the host's)."""
    from .bench import multigpu
    from .bench.workloads import UnknownWorkload

    if args.list:
        own = "tp:package.module:function, ddp:package.module:function"
        print(f"workloads: {', '.join(multigpu.default_workloads())}, {own}")
        print("modes: " + ", ".join(multigpu.MODES))
        return 0
    if args.balance_from:
        parser.error("--balance-from deals single-GPU workloads; the multigpu suite runs every group on --gpus")
    names = args.workloads or multigpu.default_workloads()
    try:
        multigpu.check_workloads(names)
    except UnknownWorkload as exc:
        parser.error(str(exc))
    unknown = [m for m in args.modes or () if m not in multigpu.MODES]
    if unknown:
        parser.error(f"unknown mode(s) {', '.join(unknown)}; choose from: {', '.join(multigpu.MODES)}")
    device = multigpu.device_type()
    gpus = args.gpus
    if device == "cuda":
        import torch

        from .bench.runner import GpusUnavailable, check_gpus

        gpus = gpus or list(range(torch.cuda.device_count()))
        try:
            check_gpus(gpus)
        except GpusUnavailable as exc:
            parser.error(str(exc))
    world_sizes = args.world_sizes or list(multigpu.WORLD_SIZES)
    try:
        multigpu.check_world_sizes(world_sizes, gpus, device)
    except multigpu.MultiGpuUnavailable as exc:
        parser.error(str(exc))
    multigpu.run_multigpu(
        names,
        args.modes or multigpu.MODES,
        world_sizes=world_sizes,
        out_dir=args.out,
        iters=args.iters,
        timeout_s=args.timeout,
        gpus=gpus,
        device=device,
    )
    return 0


def _bench_serving(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """The serving suite: its own workloads and modes, a worker per mode; it runs on a CPU too (host-clock times,
    tiny models by default), so that it can be checked anywhere."""
    from .bench import serving, serving_workloads
    from .bench.workloads import UnknownWorkload

    if args.list:
        print("\n".join(serving_workloads.listing()))
        return 0
    if args.balance_from:
        parser.error("--balance-from deals the standard suites' workloads; the serving suite deals its own round-robin")
    if args.iters < 1:
        parser.error(f"--iters {args.iters}: the trace of batch sizes needs at least one call")
    device = serving.device_type()
    names = args.workloads or serving_workloads.default_workloads(device)
    try:
        serving.check_workloads(names)
    except UnknownWorkload as exc:
        parser.error(str(exc))
    unknown = [m for m in args.modes or () if m not in serving_workloads.MODES]
    if unknown:
        parser.error(f"unknown mode(s) {', '.join(unknown)}; choose from: {', '.join(serving_workloads.MODES)}")
    if args.gpus:
        if device != "cuda":
            parser.error("--gpus names GPUs and none is visible here; leave it out to run on the CPU")
        from .bench.runner import GpusUnavailable, check_gpus

        try:
            check_gpus(args.gpus)
        except GpusUnavailable as exc:
            parser.error(str(exc))
    serving.run_serving(
        names,
        args.modes or serving_workloads.MODES,
        out_dir=args.out,
        calls=args.iters,
        timeout_s=args.timeout,
        gpus=args.gpus,
        device=device,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
