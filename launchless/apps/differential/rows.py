"""One row of the differential report: a model through one entry point under one grad mode, and its verdict.

The enums name every state a row can be in, so the report can count them and judge the targets without reading
free text: ``status`` is what launchless did (from ``graph_info()``), ``result`` is what the caller got compared
with eager on the same fresh inputs.
"""

from __future__ import annotations

from enum import Enum
from typing import Any


class Entry(str, Enum):
    """How the model was accelerated."""

    WRAP_AUTO = "wrap-auto"  # launchless.wrap(model, cuda_graph="auto")
    WRAP_TRUE = "wrap-true"  # launchless.wrap(model, cuda_graph=True)
    COMPILE = "compile"  # torch.compile(model, backend="launchless")
    GENERATE_GREEDY_B1 = "generate-greedy-b1"  # wrap(model).generate, greedy, batch 1, bfloat16
    GENERATE_GREEDY_B4 = "generate-greedy-b4"  # greedy, batch 4 left-padded, bfloat16
    GENERATE_SAMPLE = "generate-sample"  # sampling under a seed, float32


class GradMode(str, Enum):
    NO_GRAD = "no_grad"
    INFERENCE_MODE = "inference_mode"


class Status(str, Enum):
    """What launchless did with the calls."""

    GRAPH = "graph"  # the whole forward (or every decode step) replays a verified graph
    SPLIT = "split"  # graphs with eager parts between them
    EAGER = "eager"  # runs eager, with a named reason
    REFUSED = "refused"  # cuda_graph=True raised: no verified graph or faster split, said so
    NOT_RUN = "not-run"  # the model did not build or eager itself failed


class Result(str, Enum):
    """What the caller got, compared with eager on the same inputs."""

    IDENTICAL = "identical"  # bit for bit on every call
    BOUNDED = "bounded"  # within the bound of a class launchless's verification named
    DIFFERS = "differs"  # a wrong value: the promise broken
    CRASH = "crash"  # an exception (or a killed process) where eager worked: the promise broken
    EAGER_FAILS = "eager-fails"  # eager itself raised on the harness's inputs: nothing to compare
    NOT_IN_LIBRARY = "not-in-library"  # the library cannot build it (listed, not counted)
    HARNESS = "harness-gap"  # the harness could not make it small or build it (counted against the harness)


BROKEN = (Result.DIFFERS, Result.CRASH)
# the results of a row that ran, least to most severe: of several calls (or two runs) of one row, the worst stands
SEVERITY = (Result.IDENTICAL, Result.BOUNDED, Result.DIFFERS, Result.CRASH)
VERIFIED = (Result.IDENTICAL, Result.BOUNDED)
ROW_KEYS = (
    "model",
    "library",
    "task",
    "architecture",
    "entry",
    "grad_mode",
    "status",
    "result",
    "speedup",
    "timed_alone",
    "eager_ms",
    "accelerated_ms",
    "calls",
    "identical_calls",
    "max_abs_diff",
    "bound",
    "bound_class",
    "first_differing_call",
    "capture_path_max_abs",
    "mismatch",
    "differing_leaf",
    "reason",
    "source",
    "wall_s",
)


def new_row(model: str, library: str, task: str, entry: str, grad_mode: str, **values: Any) -> dict[str, Any]:
    """A row with every key present (None where not measured)."""
    row: dict[str, Any] = dict.fromkeys(ROW_KEYS)
    row.update(model=model, library=library, task=task, entry=Entry(entry).value, grad_mode=GradMode(grad_mode).value)
    row["calls"] = 0
    row.update(status=Status.NOT_RUN.value, result=None)
    row.update({k: (v.value if isinstance(v, Enum) else v) for k, v in values.items()})
    return row
