"""CPU tests of what ``graphed_step`` checks before every replay (``train.validity.TrainingState``) and of its
options: a replaced optimizer state, model relocation or scaler change must be noticed -- a graph replayed after
it would update tensors training no longer uses -- while in-place updates must not be."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import launchless as ll
from launchless.train.validity import TrainingState


def trained(opt_name: str = "SGD"):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = (
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        if opt_name == "SGD"
        else torch.optim.AdamW(model.parameters(), lr=1e-3)
    )
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(3, 4)).square().mean().backward()
        opt.step()
    state = TrainingState(model, opt, None)
    state.arm()
    return model, opt, state


@pytest.mark.parametrize("opt_name", ["SGD", "AdamW"])
def test_a_resumed_checkpoint_is_noticed(opt_name: str) -> None:
    model, opt, state = trained(opt_name)
    osd = copy.deepcopy(opt.state_dict())
    model.load_state_dict(copy.deepcopy(model.state_dict()))  # in place: the graph reads the new values
    assert state.stale() is None
    opt.load_state_dict(osd)
    assert "optimizer.load_state_dict" in state.stale()
    assert state.stale() is None  # disarmed: the graphs are gone; the next one kept arms it again


def test_a_cleared_optimizer_state_is_noticed() -> None:
    _, opt, state = trained()
    opt.state.clear()
    assert "state.clear()" in state.stale()


def test_an_added_param_group_is_noticed() -> None:
    _, opt, state = trained()
    opt.add_param_group({"params": [nn.Parameter(torch.zeros(2))]})
    assert "add_param_group" in state.stale()


def test_a_replaced_state_tensor_is_noticed() -> None:
    _, opt, state = trained()
    p = next(iter(opt.state))
    opt.state[p]["momentum_buffer"] = opt.state[p]["momentum_buffer"].clone()
    assert "state were replaced" in state.stale()


@pytest.mark.parametrize("how", ["assign", "to"])
def test_relocated_parameters_are_noticed(how: str) -> None:
    model, _, state = trained()
    if how == "assign":
        model.load_state_dict(copy.deepcopy(model.state_dict()), assign=True)
    else:
        model.to(torch.float64)
    assert "relocated" in state.stale()


def test_frozen_parameters_are_noticed() -> None:
    model, _, state = trained()
    model[0].requires_grad_(False)
    assert "frozen or unfrozen" in state.stale()


def test_a_learning_rate_or_scheduler_change_is_not_a_stale_state() -> None:
    _, opt, state = trained()
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
    opt.param_groups[0]["lr"] = 0.01  # the step's own learning-rate handling deals with it
    scheduler.load_state_dict(scheduler.state_dict())
    with torch.no_grad():
        next(iter(opt.state.values()))["momentum_buffer"].zero_()  # in place
    assert state.stale() is None


def test_a_scaler_with_other_settings_is_noticed() -> None:
    model, opt, _ = trained()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    scaler.scale(torch.ones(()))  # makes its scale tensor
    state = TrainingState(model, opt, scaler)
    state.arm()
    scaler.load_state_dict({**scaler.state_dict(), "scale": 4.0})  # filled in place: the graph reads it
    assert state.stale() is None
    scaler.load_state_dict({**scaler.state_dict(), "growth_interval": 7})
    assert "GradScaler" in state.stale()


def step_parts():
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x):
        return model(x).sum()

    return step, model, opt


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"capture_after": 1}, "capture_after=1 is not accepted; pass an integer >= 2"),
        ({"max_graphs": 0}, "max_graphs=0 is not accepted"),
        ({"max_graphs": -1}, "max_graphs=-1 is not accepted"),
        ({"verify": "bogus"}, "verify='bogus' is not accepted; use 'on'"),
        ({"verify": False}, "verify=False is not accepted"),
    ],
)
def test_graphed_step_options_are_checked(options: dict, needle: str) -> None:
    step, model, opt = step_parts()
    with pytest.raises(ll.ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        ll.graphed_step(step, model=model, optimizer=opt, **options)


def test_swapped_model_and_optimizer_name_the_fix() -> None:
    step, model, opt = step_parts()
    with pytest.raises(ll.ConfigError, match="optimizer as model= and the model as optimizer="):
        ll.graphed_step(step, model=opt, optimizer=model)
    with pytest.raises(ll.ConfigError, match=r"optimizer= takes a torch\.optim"):
        ll.graphed_step(step, model=model, optimizer="sgd")


def test_verify_off_is_really_off_and_the_decorator_takes_the_same_options() -> None:
    step, model, opt = step_parts()
    graphed = ll.graphed_step(model=model, optimizer=opt, verify="off", capture_after=4)(step)
    assert graphed.verify == "off" and graphed.capture_after == 4


def test_a_state_tensor_deleted_and_made_again_between_two_steps_is_noticed() -> None:
    """A freed tensor's id() is taken by the next tensor made (CPython reuses the slot): the check keeps alive what
    it fingerprinted while armed, and lets go once it found the change."""
    _, opt, state = trained()
    for p in list(opt.state):  # each state tensor freed, then made again of the same size
        del opt.state[p]["momentum_buffer"]
        opt.state[p]["momentum_buffer"] = torch.zeros_like(p)
    assert "tensors of the optimizer's state were replaced" in (state.stale() or "")
    assert state._identities_held is None  # let go: the replaced state is not kept beside the new one
