"""Forwards that run collectives (tensor parallelism): found during warm-up, captured by every rank alike.

A forward sharded with ``torch.distributed.tensor.parallel`` (DTensor parameters) or calling collectives itself
(``torch.distributed`` or its functional collectives) runs NCCL kernels that a graph records like any kernel --
but every rank of the group must take part in each collective, in the same order. So what a rank does with a
graph must not differ from what the others do:

- the ranks *agree* after the capture and after the verification (``agree``): when one rank refuses, every rank
  runs eager, each with one log line naming the rank(s) that refused and why. The agreement itself is a
  collective over the forward's own process group(s) with a timeout: a rank that never arrives (it crashed, or
  it calls the model with another input) is an error that says so, not a hang;
- verification runs the same calls on every rank whatever it finds (``verify(lockstep=True)``);
- nothing is tried that one rank could do alone: no graphs around operations run eager, no split by submodule.

An output a collective still writes asynchronously (``AsyncCollectiveTensor``) is waited for inside the capture
(``wait_outputs``), so the graph ends after the collective, as eager's first use of the output would.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterable
from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from ..errors import RanksDisagree

AGREE_TIMEOUT_S = 300.0  # how long a rank waits for the others to finish their capture or verification
COLLECTIVE_NAMESPACES = frozenset({"c10d", "_c10d_functional", "c10d_functional", "_c10d_functional_autograd"})


def distributed() -> bool:
    """Whether this process is one rank of several."""
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _is_dtensor(x: Any) -> bool:
    return type(x).__name__ == "DTensor" and hasattr(x, "device_mesh")


def _mesh_groups(mesh: Any) -> list[Any]:
    return [mesh.get_group(dim) for dim in range(mesh.ndim)]


def module_groups(module: torch.nn.Module) -> list[Any]:
    """Process groups of the meshes the module's DTensor parameters and buffers are sharded over."""
    groups: list[Any] = []
    for tensor in (*module.parameters(), *module.buffers()):
        if _is_dtensor(tensor):
            groups.extend(g for g in _mesh_groups(tensor.device_mesh) if g not in groups)
    return groups


class CollectiveTrace(TorchDispatchMode):
    """During one warm-up run: the process groups of the collectives the forward calls itself, and of the DTensors
    it computes with (their collectives run inside DTensor's own dispatch, below this mode)."""

    def __init__(self) -> None:
        super().__init__()
        self.groups: list[Any] = []

    def _add(self, group: Any) -> None:
        if group is not None and group not in self.groups:
            self.groups.append(group)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        namespace = getattr(func, "namespace", "")
        for leaf in pytree.tree_leaves((args, kwargs)):
            if _is_dtensor(leaf):
                for group in _mesh_groups(leaf.device_mesh):
                    self._add(group)
            elif namespace in COLLECTIVE_NAMESPACES:
                self._add(_group_of(leaf))
        return func(*args, **kwargs)


def _group_of(arg: Any) -> Any:
    """The process group a collective's argument names: a group object, or a group name (functional collectives)."""
    dist = torch.distributed
    if isinstance(arg, dist.ProcessGroup):
        return arg
    if isinstance(arg, str):
        try:
            return dist.distributed_c10d._resolve_process_group(arg)
        except Exception:
            return None
    return None


def wait_outputs(outputs: Any) -> Any:
    """``outputs`` with every asynchronously written collective result waited for (on the current stream)."""
    try:
        from torch.distributed._functional_collectives import AsyncCollectiveTensor
    except ImportError:
        return outputs
    leaves = pytree.tree_leaves(outputs)
    if not any(isinstance(x, AsyncCollectiveTensor) for x in leaves):
        return outputs
    return pytree.tree_map(lambda x: x.trigger_wait() if isinstance(x, AsyncCollectiveTensor) else x, outputs)


@dataclasses.dataclass(frozen=True)
class Agreement:
    """What every rank of the groups said: ``refusals`` maps a rank (global) that refused to its reason."""

    refusals: dict[int, str]
    transient: bool = False  # every rank that refused ran out of memory: all try again later, together

    @property
    def all_agree(self) -> bool:
        return not self.refusals

    def describe(self) -> str:
        return "; ".join(f"rank {rank}: {why}" for rank, why in sorted(self.refusals.items()))


def agree(
    groups: Iterable[Any],
    *,
    ok: bool,
    reason: str,
    what: str,
    transient: bool = False,
    timeout_s: float | None = None,
) -> Agreement:
    """Every rank of ``groups`` says whether its ``what`` (capture, verification) succeeded; all get the same
    answer. One small all-reduce per group (waited for at most ``timeout_s``); the reasons are gathered only when
    a rank refused. Raises ``RanksDisagree`` when a rank does not arrive in time (``timeout_s``, by default
    ``AGREE_TIMEOUT_S`` as it is set when called)."""
    dist = torch.distributed
    timeout_s = AGREE_TIMEOUT_S if timeout_s is None else timeout_s
    refusals: dict[int, str] = {}
    passing: list[bool] = []
    for group in groups:
        device = torch.device("cuda", torch.cuda.current_device()) if _backend(group) == "nccl" else torch.device("cpu")
        flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=device)
        work = dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group, async_op=True)
        try:
            work.wait(timeout=datetime.timedelta(seconds=timeout_s))
        except Exception as exc:
            raise RanksDisagree(
                f"launchless: rank {dist.get_rank()} waited {timeout_s:.0f} s for the other ranks of its process "
                f"group to finish the {what} of a forward with collectives; a rank crashed, or calls the model with "
                "another input or not at all. Every rank must call a model whose forward runs collectives with the "
                f"same input shapes, in the same order ({type(exc).__name__}: {exc})"
            ) from exc
        if int(flag.item()) == 1:
            continue
        said: list[Any] = [None] * dist.get_world_size(group)
        dist.all_gather_object(said, (dist.get_rank(), ok, reason, transient), group=group)
        refusals.update({rank: why for rank, fine, why, _ in said if not fine})
        passing.extend(passes for _, fine, _, passes in said if not fine)
    return Agreement(refusals, transient=bool(passing) and all(passing))


def _backend(group: Any) -> str:
    try:
        return str(torch.distributed.get_backend(group)).lower()
    except Exception:
        return ""
