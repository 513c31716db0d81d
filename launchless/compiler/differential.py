"""The proof a CGCT rewrite must pass before it is used: the rewritten graph against the original on random inputs.

Both run on copies of the same inputs with the same random seed; their outputs and the inputs after the run (an
in-place write is an output too) must be bit-identical -- NaN payloads and signed zeros included -- on every trial.
A rewrite that only rounds differently (the GPU dividing by a host scalar as a multiplication by its reciprocal)
fails here and is either folded on the host instead or dropped and reported.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import fx
from torch.utils import _pytree as pytree


def differential_check(
    original: fx.GraphModule, rewritten: fx.GraphModule, make_inputs: Callable[[], list], trials: int = 3
) -> tuple[bool, float]:
    """(bit-identical on every trial, max abs diff) of outputs and mutated inputs: the proof a rewrite must pass."""
    identical, worst = True, 0.0
    for trial in range(trials):
        inputs = make_inputs()
        same, diff = _compare(_run(original, inputs, trial), _run(rewritten, inputs, trial))
        identical, worst = identical and same, max(worst, diff)
    return identical, worst


def _run(gm: fx.GraphModule, inputs: list, seed: int) -> list:
    """Outputs of ``gm`` on copies of ``inputs``, then those copies (to see in-place writes); RNG seeded."""
    args = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        out = gm(*args)
    return [*pytree.tree_leaves(out), *(a for a in args if isinstance(a, torch.Tensor))]


def _compare(a: list, b: list) -> tuple[bool, float]:
    if len(a) != len(b):
        return False, math.inf
    results = [_compare_one(x, y) for x, y in zip(a, b, strict=True)]
    return all(same for same, _ in results), max((diff for _, diff in results), default=0.0)


def _compare_one(x: object, y: object) -> tuple[bool, float]:
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
        return _compare_scalars(x, y)
    if x.shape != y.shape or x.dtype != y.dtype:
        return False, math.inf
    x, y = x.detach().cpu().contiguous(), y.detach().cpu().contiguous()
    if torch.equal(x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8)):
        return True, 0.0
    return False, _max_diff(x, y)


def _compare_scalars(x: object, y: object) -> tuple[bool, float]:
    if x == y or (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y)):
        return True, 0.0
    try:
        return False, abs(float(x) - float(y))
    except (TypeError, ValueError):
        return False, math.inf


def _max_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """Largest |x - y|, with matching NaNs and infinities counting as equal and a lone NaN as infinite."""
    if x.numel() == 0:
        return 0.0
    a, b = (x, y) if x.is_complex() else (x.double(), y.double())
    diff = (a - b).abs().double().nan_to_num(nan=math.inf, posinf=math.inf)
    equal = (a == b) | (a.isnan() & b.isnan())
    return float(torch.where(equal, torch.zeros_like(diff), diff).max())
