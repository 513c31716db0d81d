"""The `launchless` command: one parser, each subcommand's arguments and run in its application's ``command``
module (bench, train, conformance and verify, differential, cache); demo and doctor here."""

from __future__ import annotations

import argparse
import logging
import sys

import torch

from .. import __version__
from . import program_cache
from .arguments import whole_number
from .bench import command as bench_command
from .conformance import command as conformance_command
from .differential import command as differential_command
from .trainer import command as trainer_command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="launchless", description="Safe, automatic CUDA graphs for PyTorch.")
    parser.add_argument("--version", action="version", version=f"launchless {__version__} (torch {torch.__version__})")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="wrap a real model (random weights), verify it and time eager vs graph")
    demo.add_argument("--model", default="timm:resnet18", help="a launchless.apps.zoo workload name")
    demo.add_argument("--batch", type=whole_number(1), default=1)
    demo.add_argument("--iters", type=whole_number(1), default=100)
    demo.add_argument("--list", action="store_true", help="list the workload names and exit")
    bench_command.add_parser(sub)
    trainer_command.add_parser(sub)
    doctor = sub.add_parser(
        "doctor", help="compile a model with the launchless backend and explain each graph: blockers, variant, coverage"
    )
    doctor.add_argument("--model", default="timm:resnet18", help="a launchless.apps.zoo workload name")
    doctor.add_argument("--batch", type=whole_number(1), default=1)
    doctor.add_argument("--reprofile", action="store_true", help="measure the graph variants again (ignore the cache)")
    doctor.add_argument("--clear-cache", action="store_true", help="delete the cached graph decisions and exit")
    conformance_command.add_parsers(sub)
    differential_command.add_parser(sub)
    program_cache.add_parser(sub)
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
        return bench_command.run(parser, args)
    if args.command == "train":
        return trainer_command.run(parser, args, argv=sys.argv[1:] if argv is None else list(argv))
    if args.command == "doctor":
        return _doctor(parser, args)
    if args.command == "conformance":
        return conformance_command.run_conformance(parser, args)
    if args.command == "verify":
        return conformance_command.run_verify(parser, args)
    if args.command == "differential":
        return differential_command.run(parser, args)
    if args.command == "cache":
        return program_cache.run(args)
    return 2


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


if __name__ == "__main__":
    sys.exit(main())
