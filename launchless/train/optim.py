"""Make an optimizer safe to replay inside a captured training step.

A graph freezes every Python number it reads. A learning rate that a scheduler (attached before the
first step) will change therefore becomes a one-element device tensor that schedulers update in place
(PyTorch's schedulers ``fill_`` tensor learning rates); a plain-number lr that nothing schedules stays a
number -- the same arithmetic as eager -- until it changes, when it moves to the device and the step
is captured again. Adam and AdamW switch to ``capturable=True`` with their step counters on the device,
SGD switches to its fused kernel (its for-loop and foreach updates read a tensor learning rate on the
host; the fused one takes it on the device, and also takes GradScaler's skip-on-inf as a device
tensor), and the remaining hyperparameters are remembered so that a change to them (which the graph
would ignore) is noticed.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

_CAPTURABLE = (torch.optim.Adam, torch.optim.AdamW)
_SUPPORTED = (torch.optim.SGD, *_CAPTURABLE)


class OptimizerNotCapturable(Exception):
    """The optimizer cannot run inside a graph; the message says why (shown in the fallback line)."""


# lr is a device tensor; the rest is bookkeeping that schedulers add to a group and never read in step()
_NOT_FROZEN = {"params", "lr", "initial_lr", "max_lr", "min_lr", "max_momentum", "base_momentum"}
log = logging.getLogger("launchless")


def _hyperparameters(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    return [{k: v for k, v in g.items() if k not in _NOT_FROZEN} for g in optimizer.param_groups]


class CapturableOptimizer:
    """Prepares ``optimizer`` once and answers, before each replay, whether the graph still matches it."""

    def __init__(self, optimizer: torch.optim.Optimizer, device: torch.device) -> None:
        if not isinstance(optimizer, _SUPPORTED):
            raise OptimizerNotCapturable(
                f"{type(optimizer).__name__} is not known to be capturable (supported: SGD, Adam, AdamW)"
            )
        self.optimizer = optimizer
        if isinstance(optimizer, torch.optim.SGD):
            _use_fused_sgd(optimizer)
        self.device = device
        for group in optimizer.param_groups:
            if isinstance(optimizer, _CAPTURABLE):
                group["capturable"] = True
        for state in optimizer.state.values():
            step = state.get("step")
            if isinstance(step, torch.Tensor) and step.device != device:
                state["step"] = step.to(device)
        scheduled = hasattr(optimizer.step, "_wrapped_by_lr_sched")  # an LRScheduler wraps step() when built
        if scheduled or any(isinstance(g["lr"], torch.Tensor) for g in optimizer.param_groups):
            self.move_lr_to_device()
        else:
            self.remember_lr()
        self.hyperparameters = _hyperparameters(optimizer)

    def remember_lr(self) -> None:
        self.lrs: list[Any] = [g["lr"] for g in self.optimizer.param_groups]

    def move_lr_to_device(self) -> None:
        """Every group's lr as a device tensor that schedulers and :meth:`sync` update in place."""
        for group in self.optimizer.param_groups:
            if not isinstance(group["lr"], torch.Tensor):
                group["lr"] = torch.tensor(float(group["lr"]), device=self.device)
        self.remember_lr()

    def float_lr_changed(self) -> bool:
        """A plain-number lr the graphs froze has changed (a scheduler attached later, or user code)."""
        return any(
            not isinstance(lr, torch.Tensor) and group["lr"] != lr
            for group, lr in zip(self.optimizer.param_groups, self.lrs, strict=True)
        )

    def sync(self) -> str | None:
        """Bring a learning rate set as a Python number back into the device tensor; report other changes.

        Returns None when the graph still applies, else why it no longer does.
        """
        for group, lr in zip(self.optimizer.param_groups, self.lrs, strict=True):
            if isinstance(lr, torch.Tensor) and group["lr"] is not lr:
                lr.fill_(float(group["lr"]))
                group["lr"] = lr
        now = _hyperparameters(self.optimizer)
        if now != self.hyperparameters:
            keys = sorted(
                {k for old, new in zip(self.hyperparameters, now, strict=True) for k in new if old.get(k) != new.get(k)}
            )
            return (
                f"optimizer hyperparameter(s) {', '.join(keys)} change between steps (a graph freezes them; "
                "e.g. OneCycleLR(cycle_momentum=True)); only lr may change"
            )
        return None


def _use_fused_sgd(optimizer: torch.optim.SGD) -> None:
    """SGD's foreach/for-loop update calls ``add_(alpha=-lr)``, a host read of a tensor lr; fused does not."""
    groups = optimizer.param_groups
    if not getattr(optimizer, "_launchless_momentum_hook", False):
        optimizer.register_step_pre_hook(_start_missing_momentum)
        optimizer._launchless_momentum_hook = True
    if all(g.get("fused") for g in groups):
        return
    params = [p for g in groups for p in g["params"]]
    supported = _get_fused_kernels_supported_devices()
    if any(g.get("differentiable") for g in groups) or not all(
        p.device.type in supported and p.is_floating_point() for p in params
    ):
        raise OptimizerNotCapturable(
            "SGD needs its fused kernel to read a device learning rate, which takes floating-point parameters "
            f"on {'/'.join(supported)} and differentiable=False"
        )
    for g in groups:
        g["fused"], g["foreach"] = True, False
    optimizer._step_supports_amp_scaling = True  # GradScaler then passes found_inf on the device
    log.info("launchless: SGD runs its fused kernel (fused=True) so the learning rate can live on the GPU")


class UnfrozenMomentumUnsupported(Exception):
    """Fused SGD with dampening cannot start momentum for parameters unfrozen after the first step."""


def _start_missing_momentum(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    """Fused SGD crashes when some parameters of a group have a momentum buffer and newly unfrozen ones
    do not. Eager starts such a buffer as the gradient; a zero buffer gives exactly that (0*m + g = g)
    when dampening is 0."""
    for group in optimizer.param_groups:
        if not group.get("fused") or group["momentum"] == 0:
            continue
        with_grad = [p for p in group["params"] if p.grad is not None]
        missing = [p for p in with_grad if optimizer.state[p].get("momentum_buffer") is None]
        if not missing or len(missing) == len(with_grad):
            continue  # none missing, or the first step: the fused kernel starts them all itself
        if group["dampening"] != 0:
            raise UnfrozenMomentumUnsupported(
                f"SGD(dampening={group['dampening']}) in its fused kernel cannot start momentum for "
                f"{len(missing)} parameter(s) unfrozen after the first step; use dampening=0, or build the "
                "optimizer after unfreezing, or run this step without launchless"
            )
        for p in missing:
            optimizer.state[p]["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
