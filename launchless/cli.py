"""The `launchless` command."""

from __future__ import annotations

import argparse
import logging
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="launchless", description="Safe, automatic CUDA graphs for PyTorch.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="wrap a real model (random weights), verify it and time eager vs graph")
    demo.add_argument("--model", default="timm:resnet18", help="a launchless.zoo workload name")
    demo.add_argument("--batch", type=int, default=1)
    demo.add_argument("--iters", type=int, default=100)
    demo.add_argument("--list", action="store_true", help="list the workload names and exit")
    bench = sub.add_parser("bench", help="eager vs torch.compile vs reduce-overhead vs hand graph vs launchless")
    bench.add_argument("--suite", choices=("quick", "standard"), default="quick")
    bench.add_argument("--workloads", nargs="+", help="workload names (default: the suite's); see --list")
    bench.add_argument("--modes", nargs="+", help="modes to run (default: all)")
    bench.add_argument("--out", default="bench-results", help="folder for bench.json, bench.md, bench.png")
    bench.add_argument("--iters", type=int, default=100, help="timed calls per (workload, mode)")
    bench.add_argument("--timeout", type=float, default=300, help="seconds one workload may take in one mode")
    bench.add_argument("--list", action="store_true", help="list workloads and modes and exit")
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
    return 2


def _bench(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from .bench import workloads
    from .bench.modes import MODES

    if args.list:
        for w in workloads.WORKLOADS.values():
            print(f"{w.name:40s} {w.kind:9s} batch {w.batch}  suites: {', '.join(w.suites)}")
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
    import torch

    if not torch.cuda.is_available():
        print(
            "launchless bench needs a CUDA GPU: it times GPU work with CUDA events and the profiler, and none is "
            "visible here (torch.cuda.is_available() is False). Run it on a machine with an NVIDIA GPU.",
            file=sys.stderr,
        )
        return 2
    from .bench.runner import run_suite

    return run_suite(args.suite, names, list(args.modes or MODES), args.out, args.iters, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
