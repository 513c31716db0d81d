"""Compiled kernels for a training step (``train.compiled_kernels``), on the CPU: the model's call recorded while
the step runs, its training program proven as accurate as eager (outputs, gradients, running statistics) against
float64, the forward replaced while a step is captured, and the steps that cannot use a program saying why (the
swap itself needs step graphs: ``test_cuda_train_compiled_kernels.py``)."""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from launchless.core.compiled_programs import JobState, compile_in_background, saves_training_programs
from launchless.train.compiled_kernels import ModelCall, forward_replaced, recorded_call, training_accuracy

needs_compiler = pytest.mark.skipif(shutil.which("g++") is None, reason="Inductor's CPU kernels need a C++ compiler")
saves_training = pytest.mark.skipif(
    not saves_training_programs(), reason="this torch cannot compile a training program's backward with its forward"
)
COMPILE_S = 600


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.norm = nn.BatchNorm2d(6)
        self.head = nn.Linear(6, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.norm(self.conv(x))).mean((2, 3)))


def test_the_models_call_is_recorded_with_how_often_and_under_autocast() -> None:
    model = Net().train()
    call = ModelCall()
    x = torch.randn(2, 3, 8, 8)
    with recorded_call(model, call):
        F.cross_entropy(model(x), torch.tensor([0, 1])).backward()
    assert call.calls == 1 and call.args[0] is x and call.refusal() is None
    assert not model._forward_pre_hooks  # the hook is gone
    twice = ModelCall()
    with recorded_call(model, twice):
        model(x), model(x)
    assert "calls the model 2 times" in str(twice.refusal())
    autocast = ModelCall()
    with recorded_call(model, autocast), torch.autocast("cpu", dtype=torch.bfloat16):
        model(x)
    assert "autocast" in str(autocast.refusal())


def test_the_forward_is_replaced_inside_the_block_only() -> None:
    model = Net().eval()
    x = torch.randn(1, 3, 8, 8)
    with forward_replaced(model, lambda t: t * 0):  # type: ignore[arg-type]
        assert torch.equal(model(x), x * 0)
    assert "forward" not in model.__dict__ and model(x).shape == (1, 4)


@needs_compiler
@saves_training
def test_a_training_program_is_proven_on_outputs_gradients_and_statistics_and_a_skewed_one_is_not(tmp_path) -> None:
    torch.manual_seed(0)
    model = Net().train()
    x = torch.randn(4, 3, 8, 8)
    call = ModelCall()
    with recorded_call(model, call):
        model(x)
    job = compile_in_background(model, call.args, call.kwargs, signature="step", training=True, directory=tmp_path)
    assert job.wait(COMPILE_S) is JobState.READY, job.reason
    program = job.load(model)
    statistics = [b.clone() for b in model.buffers()]
    report = training_accuracy(model, program, call)
    assert report.passed, report.detail
    assert all(torch.equal(a, b) for a, b in zip(statistics, model.buffers(), strict=True))  # put back
    assert all(p.grad is None for p in model.parameters())  # no .grad touched

    def skewed(*args, **kwargs):  # a program whose backward is off: its outputs are right
        out = program(*args, **kwargs)
        return out + (out - out.detach()) * 0.05

    skewed.training = True  # type: ignore[attr-defined]
    report = training_accuracy(model, skewed, call)  # type: ignore[arg-type]
    assert not report.passed and "error against float64" in report.detail


def test_graphed_step_takes_the_kernels_option_and_a_cpu_run_says_it_trains_eager() -> None:
    import launchless as ll
    from launchless.errors import ConfigError

    model = Net().train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    with pytest.raises(ConfigError, match=r"kernels='fast' is not accepted; use 'eager' .*'compiled'"):
        ll.graphed_step(step, model=model, optimizer=opt, kernels="fast")  # type: ignore[arg-type]
    graphed = ll.graphed_step(step, model=model, optimizer=opt, kernels="compiled")
    for _ in range(4):
        graphed(torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 2, 3]))
    info = graphed.graph_info()
    assert info["level"] == "eager" and info["compiled_kernels"] == []  # nothing captured: nothing compiled


@saves_training  # its second signature's compile must be in flight to be cancelled
def test_a_step_that_cannot_use_a_program_keeps_eager_kernels_saying_why_and_nothing_is_compiled(tmp_path, monkeypatch):
    from launchless.core.signature import flatten_inputs, signature_of
    from launchless.train.compiled_kernels import StepKernels

    monkeypatch.setenv("LAUNCHLESS_CACHE_DIR", str(tmp_path))
    model = Net().train()
    kernels = StepKernels(model)
    x = torch.randn(2, 3, 8, 8)
    sig = signature_of(flatten_inputs((x,), {}))
    twice = ModelCall(args=(x,), calls=2)
    kernels.start(sig, twice)
    row = kernels.info()[0]
    assert row["kernels"] == "eager" and "calls the model 2 times" in row["reason"] and row["compile_s"] is None
    assert kernels.pending == 0 and not kernels.ready(sig)
    other = signature_of(flatten_inputs((torch.randn(4, 3, 8, 8),), {}))
    kernels.start(other, ModelCall(args=(torch.randn(4, 3, 8, 8),), calls=1))  # a compile starts
    assert kernels.pending == 1
    job = kernels._entries[other].job
    kernels.refuse(other, "the step writes state outside the model and optimizer")
    assert kernels.pending == 0 and kernels.info()[1]["reason"].startswith("the step writes state")
    assert job is not None and job.wait(60).value == "cancelled"  # its compile ended with it
    kernels.cancel("the graphs were dropped")
    assert kernels.info() == []
