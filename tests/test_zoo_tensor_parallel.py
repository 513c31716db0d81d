"""CPU tests for launchless.apps.zoo.tensor_parallel: a 2-rank gloo mesh gives the unsharded forward, really sharded.

The sharded forward is only a fair benchmark if it computes the same thing as the plain model, and only a
tensor-parallel one if the plan actually split the weights, so both are checked on every rank.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from ranks import run_ranks
from torch.distributed.tensor import DTensor

pytest.importorskip("transformers")

from launchless.apps.zoo.tensor_parallel import TP_WORKLOADS, build_tp, tp_plan

WORLD_SIZE = 2
SEQ = 16


def _main_output(output: Any) -> torch.Tensor:
    """last_hidden_state or logits: a ModelOutput indexes its fields that are set, and loss is unset here."""
    return output[0]


def sharded_against_reference(
    rank: int, world_size: int, device_type: str, seq: int, atol: float, rtol: float
) -> dict[str, dict[str, Any]]:
    """Per workload: whether this rank's sharded output matches the unsharded one, and each planned weight's shapes."""
    from torch.distributed.device_mesh import init_device_mesh

    device = torch.device(device_type, rank) if device_type == "cuda" else torch.device(device_type)
    mesh = init_device_mesh(device_type, (world_size,))
    results: dict[str, dict[str, Any]] = {}
    for name in TP_WORKLOADS:
        reference, args, kwargs = build_tp(name, mesh=None, device=device, seq=seq)
        sharded, sharded_args, sharded_kwargs = build_tp(name, mesh=mesh, device=device, seq=seq)
        with torch.no_grad():
            expected = _main_output(reference(*args, **kwargs))
            got = _main_output(sharded(*sharded_args, **sharded_kwargs))
        weights = {}
        for module_name, style in tp_plan(name, sharded).items():
            weight = sharded.get_submodule(module_name).weight
            weights[module_name] = {
                "style": type(style).__name__,
                "is_dtensor": isinstance(weight, DTensor),
                "full_shape": tuple(weight.shape),
                "local_shape": tuple(weight.to_local().shape) if isinstance(weight, DTensor) else None,
            }
        results[name] = {
            "plain_output": not isinstance(got, DTensor),
            "close": torch.allclose(got, expected, atol=atol, rtol=rtol),
            "max_diff": (got - expected).abs().max().item(),
            "weights": weights,
        }
    return results


def check_rank_results(results: list[dict[str, dict[str, Any]]], name: str, *, world_size: int) -> None:
    """Assert, for every rank, the sharded output matched and every planned linear holds 1/world_size of its weight."""
    for rank, by_name in enumerate(results):
        result = by_name[name]
        assert result["plain_output"], f"rank {rank}: the output is still a DTensor"
        assert result["close"], f"rank {rank}: sharded output differs from the reference by {result['max_diff']:.3g}"
        assert result["weights"], f"rank {rank}: the plan is empty"
        for module_name, weight in result["weights"].items():
            assert weight["is_dtensor"], f"rank {rank}: {module_name}.weight was not sharded"
            split_dim = 0 if weight["style"] == "ColwiseParallel" else 1  # nn.Linear weight is (out, in)
            expected_local = list(weight["full_shape"])
            expected_local[split_dim] //= world_size
            assert list(weight["local_shape"]) == expected_local, f"rank {rank}: {module_name} {weight}"


@pytest.fixture(scope="module")
def cpu_results() -> list[dict[str, dict[str, Any]]]:
    """One process group for all workloads: spawning ranks costs far more than these forwards."""
    return run_ranks(sharded_against_reference, "cpu", SEQ, 1e-5, 1e-4, world_size=WORLD_SIZE, timeout_s=180)


@pytest.mark.parametrize("name", TP_WORKLOADS)
def test_sharded_forward_matches_reference_on_every_rank(
    cpu_results: list[dict[str, dict[str, Any]]], name: str
) -> None:
    check_rank_results(cpu_results, name, world_size=WORLD_SIZE)


def test_plans_split_every_block_column_then_row_wise() -> None:
    for name in TP_WORKLOADS:
        model, _, _ = build_tp(name, mesh=None, device="cpu", seq=SEQ)
        styles = [type(style).__name__ for style in tp_plan(name, model).values()]
        assert styles.count("RowwiseParallel") >= 2, name  # attention output and MLP output per block
        assert set(styles) == {"ColwiseParallel", "RowwiseParallel"}, name


@pytest.mark.parametrize("name", TP_WORKLOADS)
def test_unsharded_build_runs_deterministically(name: str) -> None:
    assert name.startswith("tp:")
    first, args, kwargs = build_tp(name, mesh=None, device="cpu", batch=2, seq=SEQ, seed=3)
    again, again_args, again_kwargs = build_tp(name, mesh=None, device="cpu", batch=2, seq=SEQ, seed=3)
    assert not any(module.training for module in first.modules())
    assert not any(isinstance(p, DTensor) for p in first.parameters())
    assert kwargs["use_cache"] is False
    with torch.no_grad():
        output = _main_output(first(*args, **kwargs))
        output_again = _main_output(again(*again_args, **again_kwargs))
    assert output.shape[:2] == (2, SEQ)
    assert torch.isfinite(output).all()
    assert torch.equal(output, output_again)


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown") as from_build:
        build_tp("tp:nope", mesh=None, device="cpu")
    with pytest.raises(ValueError, match="unknown") as from_plan:
        tp_plan("tp:nope", torch.nn.Linear(2, 2))
    for raised in (from_build, from_plan):
        assert all(name in str(raised.value) for name in TP_WORKLOADS)
