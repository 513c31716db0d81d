"""CPU tests of the training capture's host-side logic (the GPU behaviour is in test_cuda_train.py)."""

from __future__ import annotations

import logging
import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import launchless as ll
from launchless.train import hooks
from launchless.train.ddp import DdpSteps
from launchless.train.optim import CapturableOptimizer, OptimizerNotCapturable, UnfrozenMomentumUnsupported
from launchless.train.snapshot import Snapshot, state_labels, state_tensors
from launchless.train.verification import verified_step

CPU = torch.device("cpu")


def _setup(opt_cls=torch.optim.SGD, **opt_kwargs):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    opt = opt_cls(model.parameters(), lr=0.1, **opt_kwargs)

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return model, opt, step


def test_cpu_model_trains_eager_with_one_log_line(caplog: pytest.LogCaptureFixture) -> None:
    model, opt, step = _setup()
    ref_model, _, ref_step = _setup()
    graphed = ll.graphed_step(step, model=model, optimizer=opt)
    x, y = torch.randn(6, 4), torch.tensor([0, 1, 2, 0, 1, 2])
    with caplog.at_level(logging.INFO, logger="launchless"):
        for _ in range(4):
            assert torch.equal(graphed(x, y), ref_step(x, y))
    assert [r.getMessage() for r in caplog.records].count(
        "launchless: training runs eager: the model's parameters are not all on a CUDA device, so there is nothing "
        "to capture"
    ) == 1
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), ref_model.parameters(), strict=True))
    info = graphed.graph_info()
    assert info["level"] == "eager" and "CUDA" in info["eager_reason"] and info["graphs"] == []


def test_decorator_form_and_bad_option() -> None:
    model, opt, step = _setup()
    decorated = ll.graphed_step(model=model, optimizer=opt)(step)
    assert isinstance(decorated, ll.GraphedStep)
    with pytest.raises(ll.ConfigError, match="capture_after=1 is not accepted; pass an integer >= 2"):
        ll.graphed_step(step, model=model, optimizer=opt, capture_after=1)


def test_learning_rate_becomes_a_tensor_that_schedulers_update_in_place() -> None:
    _, opt, step = _setup()
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)  # attached: lr must reach graphs
    prepared = CapturableOptimizer(opt, CPU)
    lr = opt.param_groups[0]["lr"]
    assert isinstance(lr, torch.Tensor) and float(lr) == pytest.approx(0.1)
    assert opt.param_groups[0]["fused"] is True and opt.param_groups[0]["foreach"] is False  # reads lr on device
    assert not prepared.float_lr_changed()
    step(torch.randn(6, 4), torch.zeros(6, dtype=torch.long))
    scheduler.step()
    assert opt.param_groups[0]["lr"] is lr and float(lr) == pytest.approx(0.05)
    opt.param_groups[0]["lr"] = 0.3  # a user setting a plain number: copied into the graph's tensor
    assert prepared.sync() is None and opt.param_groups[0]["lr"] is lr and float(lr) == pytest.approx(0.3)
    opt.param_groups[0]["momentum"] = 0.5
    assert "hyperparameter(s) momentum change between steps" in prepared.sync()


def test_an_unscheduled_learning_rate_stays_a_number_until_it_changes() -> None:
    """A number keeps eager's arithmetic (AdamW rounds differently with a tensor lr); a change is noticed."""
    _, opt, _ = _setup(torch.optim.AdamW)
    prepared = CapturableOptimizer(opt, CPU)
    assert opt.param_groups[0]["lr"] == 0.1 and not prepared.float_lr_changed()
    opt.param_groups[0]["lr"] = 0.05
    assert prepared.float_lr_changed()
    prepared.move_lr_to_device()
    lr = opt.param_groups[0]["lr"]
    assert isinstance(lr, torch.Tensor) and float(lr) == pytest.approx(0.05) and not prepared.float_lr_changed()
    opt.param_groups[0]["lr"] = 0.01  # from now on a number set by user code is copied into the tensor
    assert prepared.sync() is None and opt.param_groups[0]["lr"] is lr and float(lr) == pytest.approx(0.01)


def test_adam_becomes_capturable_and_unknown_optimizers_are_refused() -> None:
    _, adam, _ = _setup(torch.optim.AdamW)
    CapturableOptimizer(adam, CPU)
    assert adam.param_groups[0]["capturable"] is True
    _, rms, _ = _setup(torch.optim.RMSprop)
    with pytest.raises(OptimizerNotCapturable, match="RMSprop is not known to be capturable"):
        CapturableOptimizer(rms, CPU)


def test_snapshot_restores_in_place() -> None:
    model, opt, step = _setup(momentum=0.9)
    x, y = torch.randn(6, 4), torch.tensor([0, 1, 2, 0, 1, 2])
    step(x, y)  # creates the momentum buffers
    tensors = state_tensors(model, opt)
    pointers = [t.data_ptr() for t in tensors]
    snap = Snapshot(tensors)
    first = step(x, y)
    assert not torch.equal(model[0].weight, snap.values[0])
    snap.restore()
    assert [t.data_ptr() for t in tensors] == pointers
    assert all(torch.equal(t, v) for t, v in zip(tensors, snap.values, strict=True))
    assert torch.equal(step(x, y), first)  # the same step from the same state (BatchNorm stats included)


def test_scheduler_steps_are_deferred_while_capturing() -> None:
    _, opt, _ = _setup()
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    calls: list = []
    with hooks.deferred_schedulers(calls):
        scheduler.step()
    assert calls == [scheduler] and scheduler.last_epoch == 0
    opt.step()
    scheduler.step()
    assert scheduler.last_epoch == 1  # restored afterwards


def test_grad_scaler_is_refused_before_it_changes_state() -> None:
    from launchless.core.capture import CaptureFailed

    model, opt, _ = _setup()
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale(F.cross_entropy(model(torch.randn(6, 4)), torch.zeros(6, dtype=torch.long))).backward()
    scaled = [p.grad.clone() for p in model.parameters()]
    with hooks.refuse_scaler_sync(), pytest.raises(CaptureFailed, match="host sync to skip steps with inf"):
        scaler.step(opt)
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), scaled, strict=True))  # untouched
    scale = float(scaler.get_scale())
    scaler.step(opt)  # outside capture the scaler still unscales before stepping (its state was not advanced)
    assert all(torch.allclose(p.grad, g / scale) for p, g in zip(model.parameters(), scaled, strict=True))


def test_mutation_log_tells_whether_the_step_reads_the_gradients_it_found() -> None:
    model, _, step = _setup()
    x, y = torch.randn(6, 4), torch.tensor([0, 1, 2, 0, 1, 2])
    step(x, y)
    grads = [p.grad for p in model.parameters()]
    full = hooks.MutationLog(watch=grads)
    with full:
        step(x, y)  # zero_grad(set_to_none=True) first: fresh gradients, the old ones are never read
    assert not any(full.was_read(g) for g in grads)
    grads = [p.grad for p in model.parameters()]
    micro = hooks.MutationLog(watch=grads)
    with micro:
        F.cross_entropy(model(x), y).backward()  # accumulation into the existing gradients
    assert all(micro.was_read(g) for g in grads)
    assert all(p.grad is g for p, g in zip(model.parameters(), grads, strict=True))


def test_optimizer_and_scaler_calls_are_deferred_and_replayable() -> None:
    model, opt, _ = _setup()
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
    x, y = torch.randn(6, 4), torch.tensor([0, 1, 2, 0, 1, 2])
    calls: list = []
    before = [p.detach().clone() for p in model.parameters()]
    with hooks.deferred_optimizer(opt, calls):
        scaler.scale(F.cross_entropy(model(x), y)).backward()
        scaler.step(opt)
        scaler.update()
        opt.step()
    assert len(calls) == 3 and "step" not in vars(opt)  # the instance patch is gone
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), before, strict=True))
    for call in calls[:2]:  # scaler.step(opt): unscale, then the real optimizer step
        call()
    assert not all(torch.equal(a, b) for a, b in zip(model.parameters(), before, strict=True))


def test_snapshot_restores_gradients_and_their_tensors() -> None:
    model, opt, step = _setup(momentum=0.9)
    x, y = torch.randn(6, 4), torch.tensor([0, 1, 2, 0, 1, 2])
    step(x, y)
    params = list(model.parameters())
    grads = [p.grad for p in params]
    snap = Snapshot(state_tensors(model, opt), params=params)
    saved = [g.clone() for g in grads]
    step(x * 2, y)  # set_to_none: new gradient tensors
    assert any(p.grad is not g for p, g in zip(params, grads, strict=True))
    snap.restore()
    assert all(p.grad is g and torch.equal(g, s) for p, g, s in zip(params, grads, saved, strict=True))
    state = snap.current()
    step(x, y)
    snap.load(state)
    assert all(p.grad is g and torch.equal(g, s) for p, g, s in zip(params, grads, saved, strict=True))


def test_mutation_log_finds_state_outside_the_model_and_optimizer() -> None:
    model, opt, step = _setup(momentum=0.9)
    ema = [p.detach().clone() for p in model.parameters()]
    x, y = torch.randn(6, 4), torch.tensor([0, 1, 2, 0, 1, 2])
    step(x, y)
    log = hooks.MutationLog()
    with log:
        step(x, y)
        with torch.no_grad():
            torch._foreach_lerp_(ema, list(model.parameters()), 0.1)

    def ptr(t: torch.Tensor) -> int:
        return t.untyped_storage().data_ptr()

    found = {ptr(t) for t in log.state()}
    assert all(ptr(t) in found for t in ema)  # the EMA copy: written in place, created before
    assert all(ptr(p) in found for p in model.parameters())  # the optimizer's in-place update
    assert ptr(model[1].running_mean) in found and ptr(model[1].num_batches_tracked) in found
    allowed = {ptr(t) for t in [*state_tensors(model, opt), *ema]} | {ptr(p.grad) for p in model.parameters()}
    assert found <= allowed  # no temporary of the step is reported


def test_mutation_log_logging_a_step_sees_the_steps_writes_not_those_around_it() -> None:
    """Beginning a CUDA capture fills the generator's seed and offset tensors, which outlive every graph: they are
    written around the step, not by it, and must not count as its state."""
    model, _, step = _setup(momentum=0.9)
    x, y = torch.randn(6, 4), torch.tensor([0, 1, 2, 0, 1, 2])
    step(x, y)
    around = torch.zeros(1, dtype=torch.int64)  # e.g. the generator's offset, filled as a capture begins
    log = hooks.MutationLog()
    with log:  # the whole capture watched: the fill is taken for state
        around.fill_(7)
        step(x, y)
    assert any(t is around for t in log.state())
    log = hooks.MutationLog()
    logged = log.logging(step)
    around.fill_(8)
    logged(x, y)
    around.fill_(9)
    found = {t.untyped_storage().data_ptr() for t in log.state()}
    assert around.untyped_storage().data_ptr() not in found
    assert {p.untyped_storage().data_ptr() for p in model.parameters()} <= found  # the step's own writes


def test_mutation_log_names_a_read_only_teacher_but_not_trained_or_updated_state() -> None:
    model, _, step = _setup()
    teacher = nn.Linear(4, 3).eval().requires_grad_(False)
    ema = nn.Linear(8, 3).requires_grad_(False)
    x, y = torch.randn(6, 4), torch.tensor([0, 1, 2, 0, 1, 2])
    log = hooks.MutationLog()
    with log:
        step(x, y)
        with torch.no_grad():  # an EMA of the trained weights: written, so it is state, not a teacher
            torch._foreach_lerp_(list(ema.parameters()), [model[3].weight, model[3].bias], 0.1)
    assert log.foreign_parameters(model) == []
    log = hooks.MutationLog()
    with log:
        step(x, y)
        with torch.no_grad():
            teacher(x)
    foreign = log.foreign_parameters(model)
    assert {t.untyped_storage().data_ptr() for t in foreign} == {
        p.untyped_storage().data_ptr() for p in teacher.parameters()
    }


def test_ddp_over_gloo_trains_eager_naming_the_backend(tmp_path, caplog: pytest.LogCaptureFixture) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        model, opt, _ = _setup()
        ddp = nn.parallel.DistributedDataParallel(model)

        def step(x, y):
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(ddp(x), y)
            loss.backward()
            opt.step()
            return loss

        graphed = ll.graphed_step(step, model=ddp, optimizer=opt)
        x, y = torch.randn(6, 4), torch.tensor([0, 1, 2, 0, 1, 2])
        with caplog.at_level(logging.INFO, logger="launchless"):
            for _ in range(4):
                graphed(x, y)
        lines = [r.getMessage() for r in caplog.records if "runs eager" in r.getMessage()]
        assert lines == [
            "launchless: training runs eager: DistributedDataParallel over gloo cannot be captured: use the NCCL "
            "backend"
        ]
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("dampening", [0.0, 0.5])
def test_fused_sgd_starts_momentum_for_layers_unfrozen_later(dampening: float) -> None:
    """Fused SGD (which launchless switches to) crashes on a group with some momentum buffers missing;
    with dampening 0 the missing ones start as eager's (the CPU fused kernel rounds differently from foreach,
    so this compares closely; the GPU test checks bit-identity); otherwise the error names the fix."""

    def make() -> tuple[nn.Module, torch.optim.SGD]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, dampening=dampening, weight_decay=1e-4)
        return model, opt

    (prepared, prepared_opt), (plain, plain_opt) = make(), make()
    CapturableOptimizer(prepared_opt, torch.device("cpu"))
    assert prepared_opt.param_groups[0]["fused"]
    x = torch.randn(8, 4)
    for m in (prepared, plain):
        m[0].requires_grad_(False)
    for i in range(5):
        if i == 2:
            for m in (prepared, plain):
                m.requires_grad_(True)  # unfrozen after two steps: no momentum buffer yet
        for m, o in ((prepared, prepared_opt), (plain, plain_opt)):
            o.zero_grad()
            m(x).square().sum().backward()
            if dampening and i == 2 and o is prepared_opt:
                with pytest.raises(UnfrozenMomentumUnsupported, match="use dampening=0"):
                    o.step()
                return
            o.step()
        for p, q in zip(prepared.parameters(), plain.parameters(), strict=True):
            torch.testing.assert_close(p, q)
    assert prepared_opt.state[prepared[0].weight]["momentum_buffer"] is not None


@pytest.mark.parametrize(
    ("replay_off_by", "passes", "eager_reruns"),
    [
        (1.8e-7, True, 3),  # eager's noise spreads: the third rerun lands high enough to cover the replay
        (1e-3, False, 8),  # a stale graph is far outside any rerun: rejected after the most reruns
    ],
)
def test_training_verification_measures_eager_noise_until_it_covers_the_replay(
    replay_off_by: float, passes: bool, eager_reruns: int
) -> None:
    """cuDNN's backward atomics differ by 1.5e-08 to 1.8e-07 from run to run on resnet18: two reruns can land low
    while the replay landed high (a sound graph refused one time in three on an H200)."""
    from launchless.train.step import GraphedStep

    model, opt, step = _setup()
    graphed = GraphedStep(step, model=model, optimizer=opt)
    base = torch.zeros(4)
    noise = iter([0.0, 1e-8, 2e-8, 5e-8, 1e-8, 2e-8, 1e-8, 3e-8, 1e-8, 2e-8])  # first: the reference run
    calls = []

    def eager(flat):
        calls.append(1)
        return base + next(noise)

    graphed._runs.eager = eager
    graphed._runs.replay = lambda entry, flat: base + replay_off_by
    before = Snapshot(state_tensors(model, opt), params=list(model.parameters()))  # device None: no CUDA RNG
    report, _ = graphed._capture.verify(None, None, before)
    assert report["passed"] is passes and len(calls) - 1 == eager_reruns, report
    assert report["status"] == ("eager-noise" if passes else "failed")


def test_a_graphed_step_is_freed_with_its_last_reference_without_a_garbage_collection() -> None:
    """Under DDP the step must go before the process group does; a reference cycle would keep it (and the model)
    until a collection runs, possibly after the group was destroyed."""
    import gc
    import weakref

    model, opt, step = _setup()
    graphed = ll.graphed_step(step, model=model, optimizer=opt)
    graphed(torch.randn(6, 4), torch.tensor([0, 1, 2, 0, 1, 2]))
    alive = weakref.ref(graphed)
    enabled = gc.isenabled()
    gc.disable()
    try:
        del graphed
        assert alive() is None
    finally:
        if enabled:
            gc.enable()


# --- DistributedDataParallel built on another stream than the capture's ------------------------------------------

MISMATCH = (
    "The AccumulateGrad node's stream does not match the stream of the node that produced the incoming gradient. "
    "This may incur unnecessary synchronization"
)


def test_pytorchs_accumulator_stream_warning_is_told_apart_from_the_others() -> None:
    import warnings

    from launchless.train.ddp import split_accumulator_stream_warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.warn("a user's own warning", UserWarning, stacklevel=1)
        warnings.warn(MISMATCH, UserWarning, stacklevel=1)
    mismatched, others = split_accumulator_stream_warnings(caught)
    assert mismatched and [str(w.message) for w in others] == ["a user's own warning"]
    assert split_accumulator_stream_warnings(others) == (False, others)


@pytest.mark.parametrize("any_rank_mismatched", [False, True])
def test_a_ddp_warm_up_on_another_stream_makes_every_rank_train_eager_naming_the_fix(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, any_rank_mismatched: bool
) -> None:
    """The warm-up notes PyTorch's warning (and shows the others as they were); before the capture the ranks agree,
    and where any rank saw it every rank trains eager with one WARNING naming launchless.capture_stream()."""
    import warnings

    from launchless.core.collectives import Agreement
    from launchless.train import ddp as ddp_module

    model, opt, step = _setup()
    graphed = ll.graphed_step(step, model=model, optimizer=opt)
    graphed._runs.ddp = DdpSteps(types.SimpleNamespace(process_group=object()))  # as _ddp_reason leaves it for DDP
    said: list[bool] = []

    def agree(groups, *, ok, reason, what, **_):
        said.append(ok)
        refused = not ok or any_rank_mismatched
        return Agreement({1: reason} if refused else {})

    monkeypatch.setattr(ddp_module, "agree", agree)
    shown = pytest.warns(UserWarning, match="a user's own warning")  # shown, not swallowed
    with shown, graphed._runs.watching_accumulator_streams():
        warnings.warn("a user's own warning", UserWarning, stacklevel=1)
    assert graphed._runs.ddp.accumulators_elsewhere is False
    with caplog.at_level(logging.INFO, logger="launchless"):
        agreed = graphed._accumulator_streams_agreed()
        assert agreed is not any_rank_mismatched and said == [True]
        if any_rank_mismatched:  # another rank saw it: this one goes eager too
            assert "launchless.capture_stream()" in graphed.graph_info()["eager_reason"]
            graphed._accumulator_streams_agreed()  # asked again: no second line
    warned = [r for r in caplog.records if r.levelno == logging.WARNING and "capture_stream()" in r.getMessage()]
    assert len(warned) == (1 if any_rank_mismatched else 0)


def test_the_step_that_saw_the_warning_says_so_when_the_ranks_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    import warnings

    from launchless.core.collectives import Agreement
    from launchless.train import ddp as ddp_module

    model, opt, step = _setup()
    graphed = ll.graphed_step(step, model=model, optimizer=opt)
    graphed._runs.ddp = DdpSteps(types.SimpleNamespace(process_group=object()))
    monkeypatch.setattr(
        ddp_module, "agree", lambda groups, *, ok, reason, what, **_: Agreement({} if ok else {0: reason})
    )
    with pytest.raises(RuntimeError, match="the step failed"), graphed._runs.watching_accumulator_streams():
        warnings.warn(MISMATCH, UserWarning, stacklevel=1)
        raise RuntimeError("the step failed")  # noted even when the step raises
    assert graphed._runs.ddp.accumulators_elsewhere is True
    assert graphed._accumulator_streams_agreed() is False
    assert graphed.graph_info()["eager_reason"].startswith("DistributedDataParallel was constructed on another")


def test_capture_stream_names_what_it_needs_without_a_gpu() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU; test_cuda_train checks the stream itself")
    with pytest.raises(ll.NoCudaError, match="capture_stream\\(\\) needs a CUDA device"):
        ll.capture_stream()


def test_a_users_filter_that_ignores_the_accumulator_warning_does_not_hide_it() -> None:
    """Training scripts often silence this warning; the warm-up must still see it (and the user still not)."""
    import warnings

    model, opt, step = _setup()
    graphed = ll.graphed_step(step, model=model, optimizer=opt)
    graphed._runs.ddp = DdpSteps(types.SimpleNamespace(process_group=object()))
    with warnings.catch_warnings(record=True) as shown:
        warnings.filterwarnings("ignore", message="The AccumulateGrad node's stream does not match")
        with graphed._runs.watching_accumulator_streams():
            warnings.warn(MISMATCH, UserWarning, stacklevel=1)
    assert graphed._runs.ddp.accumulators_elsewhere is True
    assert not [w for w in shown if "AccumulateGrad" in str(w.message)]  # still silent for the user


@pytest.mark.parametrize(
    ("skew", "where"),
    [
        ("momentum", "in optimizer state 'momentum_buffer' of 3.weight"),
        ("statistics", "in buffer 1.running_mean"),
        ("gradient", "in the gradient of 0.bias"),
        ("loss", "in the step's output"),
    ],
)
def test_a_failed_verification_names_the_state_where_the_replay_differs_most(skew: str, where: str) -> None:
    """A step graph that leaves other values than eager's is refused with the place: a parameter's optimizer state,
    a buffer, a gradient or the step's output, named as the model and the optimizer name them."""
    model, opt, step = _setup(momentum=0.9)
    x, y = torch.randn(6, 4), torch.tensor([0, 1, 2, 0, 1, 2])
    step(x, y)  # the momentum buffers exist
    before = Snapshot(state_tensors(model, opt), params=list(model.parameters()))

    def replay() -> torch.Tensor:  # a stand-in for a graph whose replay goes wrong in one place
        loss = step(x, y)
        with torch.no_grad():
            if skew == "momentum":
                opt.state[model[3].weight]["momentum_buffer"].add_(0.5)
            elif skew == "statistics":
                model[1].running_mean.add_(0.5)
            elif skew == "gradient":
                model[0].bias.grad.add_(0.5)
        return loss + 0.5 if skew == "loss" else loss

    report, _ = verified_step(
        lambda: step(x, y),
        replay,
        before,
        mode="auto",
        lockstep=False,
        labels=state_labels(model, opt, before),
    )
    assert not report["passed"] and report["detail"].startswith("replay differs from eager by 0.5")
    assert where in report["detail"], report["detail"]


def test_the_allocators_active_blocks_are_read_with_or_without_their_addresses(monkeypatch) -> None:
    """The mutation log tells the step's own memory by the blocks PyTorch's allocator had handed out before it:
    a block's address is given, or is its segment's address plus the sizes of the blocks before it."""
    segments = [
        {
            "device": 0,
            "address": 1000,
            "blocks": [
                {"size": 100, "state": "active_allocated"},
                {"size": 50, "state": "inactive"},
                {"size": 30, "state": "active_allocated"},
            ],
        },
        {"device": 1, "address": 5000, "blocks": [{"size": 8, "state": "active_allocated", "address": 5000}]},
    ]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "memory_snapshot", lambda: segments)
    assert hooks._active_blocks() == {(0, 1000), (0, 1150), (1, 5000)}

    def no_blocks() -> list:
        raise RuntimeError("memory_snapshot is not supported with the cudaMallocAsync backend")

    monkeypatch.setattr(torch.cuda, "memory_snapshot", no_blocks)
    assert hooks._active_blocks() is None  # every write then counts as state, as before
