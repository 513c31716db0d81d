"""``launchless train``: its arguments, checked before anything starts, and the training run (in this process, or
as the ranks torchrun starts)."""

from __future__ import annotations

import argparse
import logging
import sys


def add_parser(sub: argparse._SubParsersAction) -> None:
    """``launchless train``'s arguments."""
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


def run(parser: argparse.ArgumentParser, args: argparse.Namespace, *, argv: list[str]) -> int:
    """Train in this process, or as one rank of a torchrun group; with --gpus N (N > 1) outside such a group, check
    the options and become torchrun running this same command line in N processes."""
    import contextlib
    from pathlib import Path

    from ...errors import ConfigError
    from . import distributed
    from .data import make_tiny_imagefolder
    from .trainer import train

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

    from .data import check_imagefolder
    from .trainer import check_options

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
