"""CPU tests (two gloo ranks) of how the ranks of a forward with collectives stay together: the process groups a
warm-up finds, the agreement on a capture or a verification, the error when a rank never arrives, and waiting
for asynchronous collective outputs."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist
from ranks import RankFailed, run_ranks

from launchless import RanksDisagree
from launchless.core.collectives import (
    CollectiveTrace,
    agree,
    distributed,
    module_groups,
    wait_outputs,
)


def _sharded_mlp():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8)).eval()
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    return model, mesh


def _groups_found(rank: int, world: int) -> tuple:
    model, mesh = _sharded_mlp()
    with torch.no_grad(), CollectiveTrace() as trace:
        out = wait_outputs(model(torch.randn(2, 8)))
    funcol = torch.distributed._functional_collectives
    with CollectiveTrace() as direct:
        wait_outputs(funcol.all_reduce(torch.ones(3), "sum", dist.group.WORLD))
    return (
        distributed(),
        trace.groups == [mesh.get_group(0)],
        module_groups(model) == [mesh.get_group(0)],
        direct.groups == [dist.group.WORLD],
        type(out).__name__,
    )


def test_the_groups_of_a_sharded_forward_and_of_a_collective_called_directly_are_found() -> None:
    for found in run_ranks(_groups_found):
        assert found == (True, True, True, True, "Tensor"), found


def _agreement(rank: int, world: int, refusing: tuple[int, ...], transient: bool) -> tuple:
    ok = rank not in refusing
    said = agree([dist.group.WORLD], ok=ok, reason=f"reason of rank {rank}", what="capture", transient=transient)
    return said.all_agree, said.refusals, said.transient, said.describe()


@pytest.mark.parametrize(
    ("refusing", "transient"), [((), False), ((1,), False), ((0, 1), True)], ids=["none", "one", "both-oom"]
)
def test_every_rank_gets_the_same_answer_with_the_refusing_ranks_reasons(refusing, transient) -> None:
    results = run_ranks(_agreement, refusing, transient)
    assert results[0] == results[1], results
    all_agree, refusals, passing, text = results[0]
    assert all_agree == (not refusing)
    assert refusals == {r: f"reason of rank {r}" for r in refusing}
    assert passing == (bool(refusing) and transient)
    assert all(f"rank {r}: reason of rank {r}" in text for r in refusing)


def _one_rank_never_arrives(rank: int, world: int) -> str:
    if rank == 1:
        time.sleep(4)  # never calls agree (it crashed, or calls the model with another input)
        return "absent"
    try:
        agree([dist.group.WORLD], ok=True, reason="", what="verification", timeout_s=1.0)
    except RanksDisagree as exc:
        return str(exc)
    return "agreed"


def test_a_rank_that_never_arrives_is_an_error_that_says_so_not_a_hang() -> None:
    try:
        said, _ = run_ranks(_one_rank_never_arrives, timeout_s=60)
    except RankFailed as exc:  # a gloo build that ends the process group on the timeout
        pytest.fail(f"the waiting rank did not raise RanksDisagree: {exc}")
    assert "waited 1 s for the other ranks" in said and "verification" in said, said
    assert "same input shapes" in said


def test_outside_a_process_group_nothing_is_distributed() -> None:
    assert not distributed()
    x = torch.ones(2)
    assert wait_outputs((x, [x])) == (x, [x])


def _relocated_shard_seen(rank: int, world: int) -> tuple:
    from torch.distributed.tensor import distribute_tensor

    from launchless.core.relocation import RelocationWatch

    model, mesh = _sharded_mlp()
    watch = RelocationWatch(model, full=True)
    nonzero = all(p != 0 for p in watch._ptrs)
    still = watch.moved()
    weight = model[0].weight
    full = weight.detach().full_tensor().clone()
    fresh = torch.nn.Parameter(distribute_tensor(full, mesh, weight.placements))
    torch.utils.swap_tensors(weight, fresh)  # the same Parameter object, another shard under it
    return nonzero, still, watch.moved()


def test_the_relocation_watch_reads_the_shards_of_dtensor_parameters() -> None:
    """A DTensor's own data_ptr() is 0 whatever it holds: the watch must read where its shard lives."""
    for found in run_ranks(_relocated_shard_seen):
        assert found == (True, False, True), found


def _static_dtensor_input_moved(rank: int, world: int) -> tuple:
    from torch.distributed.tensor import distribute_tensor

    from launchless.core.relocation import InputAddresses

    model, mesh = _sharded_mlp()
    weight = model[0].weight
    watch = InputAddresses([0])
    watch.arm([weight])
    before = watch.stale([weight])
    full = weight.detach().full_tensor().clone()
    moved = torch.nn.Parameter(distribute_tensor(full, mesh, weight.placements))  # another DTensor, other shards
    return before, watch.stale([moved]) is not None


def test_a_compiled_graphs_static_dtensor_input_that_moves_is_noticed() -> None:
    """The compiler hands a sharded model's parameters to its graphs as DTensor inputs, whose data_ptr() is 0."""
    for found in run_ranks(_static_dtensor_input_moved):
        assert found == (None, True), found
