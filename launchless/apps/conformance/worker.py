"""Models checked in turn in their own process, one JSON line each; the runner restarts a worker that dies."""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch

from ...errors import one_line
from .. import zoo
from ..environment import describe
from ..workers import append_row
from .check import check, empty_row

ENVIRONMENT = ("date", "gpu", "driver", "cuda", "torch", "triton", "python")


def task_of(name: str) -> str:
    return next((task for task, names in zoo.tasks().items() if name in names), "other")


def check_zoo_model(name: str, *, iters: int) -> dict[str, Any]:
    """The row of zoo workload ``name``; an error row when it cannot be built or run."""
    task = task_of(name)
    try:
        workload = zoo.build(name, device="cuda")
    except Exception as exc:
        row = empty_row(name, task)
        row["reason"] = f"could not be built: {one_line(exc)}"
        return row
    try:
        return check(workload.model, workload.inputs, name=name, task=task, iters=iters)
    except Exception as exc:  # the model's own forward failing (eager too): a row, not the end of the run
        row = empty_row(name, task)
        row["reason"] = one_line(exc)
        return row


def run(names: list[str], out: str, iters: int) -> None:
    environment = {k: v for k, v in describe().items() if k in ENVIRONMENT}
    for name in names:
        start = time.perf_counter()
        row = check_zoo_model(name, iters=iters)
        row["wall_s"] = round(time.perf_counter() - start, 2)
        row.update(environment)  # each row says where it was measured: parts of a matrix may be merged
        append_row(out, row)
        torch._dynamo.reset()
        torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", required=True)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    run(args.models, args.out, args.iters)


if __name__ == "__main__":
    main()
