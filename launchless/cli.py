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
    return 2


if __name__ == "__main__":
    sys.exit(main())
