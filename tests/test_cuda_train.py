"""GPU behaviour of graphed_step. Run with ``python -m pytest -m cuda``.

Each test trains a graphed copy and an eager copy of one model from the same state on the same
batches. The eager copy's optimizer is prepared the same way (``CapturableOptimizer``: capturable Adam,
fused SGD, a tensor lr where a scheduler is attached) so that both run the same numerics; the graphed
copy must then track it.
"""

from __future__ import annotations

import copy
import logging

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import launchless as ll
from launchless.core.verify import identical
from launchless.train.optim import CapturableOptimizer

pytestmark = pytest.mark.cuda
DEV = torch.device("cuda")


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(32, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 10))


def _batch(n: int = 16):
    return torch.randn(n, 32, device="cuda"), torch.randint(0, 10, (n,), device="cuda")


def _plain_step(model, opt, **_):
    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return step


def _pair(build, opt_factory, body=_plain_step, copies=2, prepare_reference=True, **extra):
    """(model, optimizer, step, extra) per copy from one state: [0] is to be graphed, the rest run eager."""
    torch.manual_seed(0)
    base = build().cuda().train()
    out = []
    for i in range(copies):
        model = copy.deepcopy(base)
        opt = opt_factory(model)
        ctx = {k: (f() if callable(f) else f) for k, f in extra.items()}
        step = body(model, opt, **ctx)  # may attach a scheduler, which the preparation looks for
        if i > 0 and prepare_reference:
            CapturableOptimizer(opt, DEV)  # same numerics as the graphed copy
        out.append((model, opt, step, ctx))
    return out


def _run(graphed, eager, batches, seeds=True):
    for i, batch in enumerate(batches):
        if seeds:
            torch.manual_seed(i)
        lg = graphed(*batch)
        if seeds:
            torch.manual_seed(i)
        le = eager(*batch)
        assert identical(lg, le), (i, float(lg), float(le))  # NaN equals NaN (skipped fp16 steps)


def _same_state(a: nn.Module, b: nn.Module, exact: bool = True) -> None:
    for (k, x), y in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        if exact:
            assert torch.equal(x, y), k  # parameters, BN statistics, num_batches_tracked
        else:
            assert torch.allclose(x.float(), y.float(), rtol=1e-4, atol=1e-5), k


SGD = lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4)  # noqa: E731


@pytest.mark.parametrize(
    "opt_factory",
    [
        SGD,
        lambda m: torch.optim.SGD(m.parameters(), lr=0.1, foreach=False),
        lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.05),
        lambda m: torch.optim.Adam(m.parameters(), lr=1e-3, foreach=True),
        lambda m: torch.optim.Adam(m.parameters(), lr=1e-3, fused=True),
    ],
    ids=["sgd-nesterov-wd", "sgd-for-loop", "adamw", "adam-foreach", "adam-fused"],
)
def test_whole_step_replays_bit_identical_to_eager(opt_factory) -> None:
    (gm, gopt, gstep, _), (em, eopt, estep, _) = _pair(_mlp, opt_factory)
    graphed = ll.graphed_step(gstep, model=gm, optimizer=gopt)
    x, y = _batch()
    _run(graphed, estep, [(x, y)] * 8)  # dropout draws the same numbers in the graph
    info = graphed.graph_info()
    assert info["level"] == "whole-step graph" and info["graphs"][0]["replays"] >= 5, info
    assert info["graphs"][0]["verification"]["passed"]
    _same_state(gm, em)
    for pg, pe in zip(gm.parameters(), em.parameters(), strict=True):  # momentum buffers, Adam moments, steps
        sg, se = gopt.state[pg], eopt.state[pe]
        assert sg.keys() == se.keys() and all(torch.equal(sg[k], se[k]) for k in sg), list(sg)


def test_new_batches_each_step_and_two_shapes_share_one_pool() -> None:
    (gm, gopt, gstep, _), (em, _, estep, _) = _pair(_mlp, SGD)
    graphed = ll.graphed_step(gstep, model=gm, optimizer=gopt)
    batches = [_batch(16 if i % 2 else 8) for i in range(12)]  # multi-scale: two signatures alternate
    _run(graphed, estep, batches)
    info = graphed.graph_info()
    assert len(info["graphs"]) == 2 and all(g["replays"] >= 3 for g in info["graphs"]), info
    _same_state(gm, em)


def test_a_step_captured_while_another_graph_lives_finds_no_state_beyond_its_own() -> None:
    """Beginning a capture fills the CUDA generator's seed and offset tensors, which outlive every graph once one
    exists: no state of the step, so neither saved by verification nor counted as state outside the model."""
    (first, first_opt, first_step, _), _ = _pair(_mlp, SGD)
    kept = ll.graphed_step(first_step, model=first, optimizer=first_opt)
    for _ in range(4):
        kept(*_batch())
    assert kept.graph_info()["level"] == "whole-step graph"
    (gm, gopt, gstep, _), (em, _, estep, _) = _pair(_mlp, SGD)  # the dropout of _mlp draws in both graphs
    graphed = ll.graphed_step(gstep, model=gm, optimizer=gopt)
    _run(graphed, estep, [_batch() for _ in range(6)])
    info = graphed.graph_info()
    assert info["level"] == "whole-step graph" and info["extra_state_tensors"] == 0, info
    assert info["graphs"][0]["verification"]["status"] == "bit-identical", info
    _same_state(gm, em)
    kept(*_batch())  # the first graph still replays


def test_memory_compiled_code_allocates_inside_the_step_is_not_state_the_step_writes() -> None:
    """Inductor's code allocates its buffers without the dispatcher seeing it, then fills them with ``out=``
    operations: those buffers are the step's own, while a tensor that existed before and is written with
    ``out=`` (an EMA) is state verification must save."""
    from launchless.train.hooks import MutationLog

    weights, ema = torch.randn(8, 8, device="cuda"), torch.zeros(8, 8, device="cuda")
    log = MutationLog()
    with log:
        scratch = torch._C._dynamo.guards._empty_strided_cuda((8, 8), (8, 1), torch.float32)  # as Inductor does
        torch.mm(weights, weights, out=scratch)
        torch.mm(scratch, weights, out=ema)
    assert [id(t) for t in log.state()] == [id(ema)]
    assert log.writers[id(ema)] == "aten::mm"


def test_scheduler_inside_the_step_keeps_stepping_and_replays_use_the_new_lr() -> None:
    def body(model, opt, **_):
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)

        def step(x, y):
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            sched.step()
            return loss

        return step

    (gm, gopt, gstep, _), (em, _, estep, _) = _pair(_mlp, lambda m: torch.optim.SGD(m.parameters(), lr=0.1), body)
    graphed = ll.graphed_step(gstep, model=gm, optimizer=gopt)
    x, y = _batch()
    _run(graphed, estep, [(x, y)] * 7)
    assert graphed.graph_info()["level"] == "whole-step graph"
    assert float(gopt.param_groups[0]["lr"]) == pytest.approx(0.1 * 0.5**7)
    _same_state(gm, em)  # every replayed step used the lr the scheduler had set


def test_linear_warmup_scheduler_outside_the_step() -> None:
    (gm, gopt, gstep, _), (em, eopt, estep, _) = _pair(
        _mlp, lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3), prepare_reference=False
    )
    scheds = [torch.optim.lr_scheduler.LambdaLR(o, lambda s: min(1.0, (s + 1) / 5)) for o in (gopt, eopt)]
    CapturableOptimizer(eopt, DEV)  # after the scheduler, as graphed_step does at its first call
    graphed = ll.graphed_step(gstep, model=gm, optimizer=gopt)
    x, y = _batch()
    for i in range(9):
        torch.manual_seed(i)
        lg = graphed(x, y)
        torch.manual_seed(i)
        assert torch.equal(lg, estep(x, y)), i
        for s in scheds:
            s.step()
    assert graphed.graph_info()["graphs"][0]["replays"] >= 6
    assert float(gopt.param_groups[0]["lr"]) == float(eopt.param_groups[0]["lr"]) == pytest.approx(1e-3)
    _same_state(gm, em)


def test_a_learning_rate_changed_by_hand_moves_to_the_gpu_and_the_step_is_captured_again(caplog) -> None:
    (gm, gopt, gstep, _), (em, eopt, estep, _) = _pair(
        _mlp, lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3), prepare_reference=False
    )
    reference = CapturableOptimizer(eopt, DEV)
    graphed = ll.graphed_step(gstep, model=gm, optimizer=gopt)
    x, y = _batch()
    _run(graphed, estep, [(x, y)] * 5)
    assert isinstance(gopt.param_groups[0]["lr"], float)  # nothing schedules it: eager's arithmetic
    assert graphed.graph_info()["graphs"][0]["replays"] >= 2
    with caplog.at_level(logging.INFO, logger="launchless"):
        for o in (gopt, eopt):
            o.param_groups[0]["lr"] = 5e-4  # the graph froze 1e-3: it must not replay any more
        reference.move_lr_to_device()  # what graphed_step does, so that both keep the same numerics
        _run(graphed, estep, [(x, y)] * 6)
    assert sum("the learning rate changed" in r.getMessage() for r in caplog.records) == 1
    assert float(gopt.param_groups[0]["lr"]) == pytest.approx(5e-4)
    assert graphed.graph_info()["graphs"][0]["replays"] >= 2
    _same_state(gm, em)


def test_set_to_none_outside_the_step_keeps_eager_semantics() -> None:
    (gm, gopt, gstep, _), (em, eopt, estep, _) = _pair(_mlp, SGD)
    graphed = ll.graphed_step(gstep, model=gm, optimizer=gopt)
    x, y = _batch()
    for i in range(6):
        torch.manual_seed(i)
        graphed(x, y)
        assert all(p.grad is not None for p in gm.parameters())  # the step's gradients, as in eager
        gopt.zero_grad(set_to_none=True)  # user code outside the step frees them...
        torch.manual_seed(i)
        estep(x, y)
        eopt.zero_grad(set_to_none=True)
    assert all(p.grad is None for p in gm.parameters())
    assert graphed.graph_info()["graphs"][0]["replays"] >= 3  # ...and the graph keeps working
    _same_state(gm, em)


def test_gradient_accumulation_micro_step_and_full_step_are_two_signatures() -> None:
    def body(model, opt, **_):
        def step(x, y, *, update: bool):
            loss = F.cross_entropy(model(x), y) / 4
            loss.backward()
            if update:
                opt.step()
                opt.zero_grad(set_to_none=True)
            return loss

        return step

    (gm, gopt, gstep, _), (em, _, estep, _) = _pair(_mlp, SGD, body)
    graphed = ll.graphed_step(gstep, model=gm, optimizer=gopt)
    x, y = _batch()
    for i in range(24):
        kwargs = {"update": i % 4 == 3}
        torch.manual_seed(i)
        lg = graphed(x, y, **kwargs)
        torch.manual_seed(i)
        assert torch.equal(lg, estep(x, y, **kwargs)), i
    info = graphed.graph_info()
    assert len(info["graphs"]) == 2, info
    _same_state(gm, em)


def test_clip_grad_norm_and_ema_inside_the_step() -> None:
    def body(model, opt, *, ema):
        def step(x, y):
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5, foreach=True)
            opt.step()
            with torch.no_grad():
                torch._foreach_lerp_(list(ema.parameters()), list(model.parameters()), 0.01)
            return loss

        return step

    (gm, gopt, gstep, gctx), (em, _, estep, ectx) = _pair(_mlp, SGD, body, ema=lambda: copy.deepcopy(_mlp()).cuda())
    ectx["ema"].load_state_dict(gctx["ema"].state_dict())
    graphed = ll.graphed_step(gstep, model=gm, optimizer=gopt)
    x, y = _batch()
    _run(graphed, estep, [(x, y)] * 8)
    info = graphed.graph_info()
    assert info["level"] == "whole-step graph"
    assert info["extra_state_tensors"] >= 4  # the EMA weights were found, saved and restored by verification
    _same_state(gm, em)
    _same_state(gctx["ema"], ectx["ema"])  # updated once per step, also on the capturing step


def test_bf16_autocast_step() -> None:
    def body(model, opt, **_):
        def step(x, y):
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss

        return step

    (gm, gopt, gstep, _), (em, _, estep, _) = _pair(_mlp, SGD, body)
    graphed = ll.graphed_step(gstep, model=gm, optimizer=gopt)
    x, y = _batch()
    _run(graphed, estep, [(x, y)] * 8)
    assert graphed.graph_info()["level"] == "whole-step graph"
    _same_state(gm, em)


def _fp16_body(model, opt, *, scaler):
    def step(x, y, boost):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss * boost).backward()
        scaler.step(opt)
        scaler.update()
        return loss

    return step


@pytest.mark.parametrize(
    ("opt_factory", "level"),
    [
        (SGD, "whole-step graph"),  # fused SGD takes found_inf on the device
        (lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3), "forward+backward graph, eager optimizer"),
        (lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3, fused=True), "whole-step graph"),
    ],
    ids=["sgd", "adamw-foreach", "adamw-fused"],
)
def test_fp16_grad_scaler(opt_factory, level, caplog: pytest.LogCaptureFixture) -> None:
    (gm, gopt, gstep, gctx), (em, _, estep, ectx) = _pair(
        _mlp, opt_factory, _fp16_body, scaler=lambda: torch.amp.GradScaler("cuda", init_scale=2.0**16)
    )
    graphed = ll.graphed_step(gstep, model=gm, optimizer=gopt, scaler=gctx["scaler"])
    x, y = _batch()
    one, huge = torch.tensor(1.0, device="cuda"), torch.tensor(1e38, device="cuda")
    with caplog.at_level(logging.INFO, logger="launchless"):
        _run(graphed, estep, [(x, y, one)] * 8)
        before = [p.detach().clone() for p in gm.parameters()]
        _run(graphed, estep, [(x, y, huge)])  # inf gradients: the step is skipped and the scale halved
        assert all(torch.equal(a, b) for a, b in zip(gm.parameters(), before, strict=True))
        assert float(gctx["scaler"].get_scale()) == 2.0**15
        _run(graphed, estep, [(x, y, one)] * 2)
    info = graphed.graph_info()
    assert info["level"] == level, info
    assert torch.equal(gctx["scaler"]._scale, ectx["scaler"]._scale)
    assert torch.equal(gctx["scaler"]._growth_tracker, ectx["scaler"]._growth_tracker)
    _same_state(gm, em)
    if level != "whole-step graph":
        lines = [r.getMessage() for r in caplog.records if "forward+backward" in r.getMessage()]
        assert len(lines) == 1 and "GradScaler.unscale_" in lines[0], lines
        assert "GradScaler.unscale_" in info["graphs"][0]["whole_step_refused"], info["graphs"][0]
    else:
        assert info["graphs"][0]["whole_step_refused"] is None


def _eager_with_one_line(body, caplog: pytest.LogCaptureFixture) -> str:
    """Train 6 steps graphed and eager; the graphed copy must fall back with exactly one line, lose no step."""
    (gm, gopt, gstep, _), (em, _, estep, _) = _pair(_mlp, SGD, body)
    graphed = ll.graphed_step(gstep, model=gm, optimizer=gopt)
    x, y = _batch()
    with caplog.at_level(logging.INFO, logger="launchless"):
        _run(graphed, estep, [(x, y)] * 6)
    lines = [r.getMessage() for r in caplog.records if "runs eager" in r.getMessage()]
    assert len(lines) == 1, lines
    info = graphed.graph_info()
    assert info["level"] == "eager", info
    _same_state(gm, em)  # no batch applied twice, none skipped
    return lines[0]


def test_item_in_the_step_falls_back_to_eager_with_one_line(caplog: pytest.LogCaptureFixture) -> None:
    def body(model, opt, **_):
        def step(x, y):
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            value = loss.item()  # the host sync under test
            return torch.tensor(value)

        return step

    line = _eager_with_one_line(body, caplog)
    assert "test_cuda_train.py" in line and "loss.item()" in line, line


def test_hyperparameter_change_goes_eager_with_one_line(caplog: pytest.LogCaptureFixture) -> None:
    (gm, gopt, gstep, _), (em, eopt, estep, _) = _pair(_mlp, SGD)
    graphed = ll.graphed_step(gstep, model=gm, optimizer=gopt)
    x, y = _batch()
    _run(graphed, estep, [(x, y)] * 4)
    for o in (gopt, eopt):
        o.param_groups[0]["momentum"] = 0.5
    with caplog.at_level(logging.INFO, logger="launchless"):
        _run(graphed, estep, [(x, y)] * 3)
    assert graphed.graph_info()["level"] == "eager"
    assert sum("momentum" in r.getMessage() for r in caplog.records) == 1
    _same_state(gm, em)


def test_eval_mode_calls_get_their_own_signature() -> None:
    (gm, gopt, gstep, _), (em, _, estep, _) = _pair(_mlp, SGD)
    graphed = ll.graphed_step(gstep, model=gm, optimizer=gopt)
    x, y = _batch()
    _run(graphed, estep, [(x, y)] * 4)
    gm.eval(), em.eval()
    _run(graphed, estep, [(x, y)] * 4)
    gm.train(), em.train()
    _run(graphed, estep, [(x, y)] * 2)
    assert len(graphed.graph_info()["graphs"]) == 2
    _same_state(gm, em)


def _max_diff(a: nn.Module, b: nn.Module) -> float:
    pairs = zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    return max((x.float() - y.float()).abs().max().item() for x, y in pairs)


def test_real_timm_resnet18_sgd_step() -> None:
    timm = pytest.importorskip("timm")
    (gm, gopt, gstep, _), (em, _, estep, _), (fm, _, fstep, _) = _pair(
        lambda: timm.create_model("resnet18", num_classes=10),
        lambda m: torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9),
        copies=3,
    )
    graphed = ll.graphed_step(gstep, model=gm, optimizer=gopt)
    batches = [(torch.randn(2, 3, 64, 64, device="cuda"), torch.randint(0, 10, (2,), device="cuda")) for _ in range(6)]
    for x, y in batches:
        graphed(x, y), estep(x, y), fstep(x, y)
    info = graphed.graph_info()
    assert info["level"] == "whole-step graph", info["graphs"][0]["whole_step_refused"]
    assert info["graphs"][0]["verification"]["passed"], info["graphs"][0]
    noise = _max_diff(em, fm)  # cuDNN's backward uses atomics: two eager runs already differ
    print("graph vs eager", _max_diff(gm, em), "eager vs eager", noise, info["graphs"][0]["verification"])
    assert _max_diff(gm, em) <= max(10 * noise, 1e-6)


def test_real_bert_fine_tuning_step_with_warmup() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256, num_labels=3
    )

    def body(model, opt, **_):
        sched = transformers.get_linear_schedule_with_warmup(opt, num_warmup_steps=3, num_training_steps=20)

        def step(ids, mask, labels):
            opt.zero_grad(set_to_none=True)
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            return loss

        return step

    (gm, gopt, gstep, _), (em, _, estep, _) = _pair(
        lambda: transformers.BertForSequenceClassification(config),
        lambda m: torch.optim.AdamW(m.parameters(), lr=5e-5),
        body,
    )
    graphed = ll.graphed_step(gstep, model=gm, optimizer=gopt)
    ids = torch.randint(0, config.vocab_size, (4, 32), device="cuda")
    mask = torch.ones_like(ids)
    labels = torch.randint(0, 3, (4,), device="cuda")
    _run(graphed, estep, [(ids, mask, labels)] * 8)
    info = graphed.graph_info()
    assert info["level"] == "whole-step graph", info
    assert float(gopt.param_groups[0]["lr"]) == pytest.approx(5e-5 * (20 - 8) / 17)
    _same_state(gm, em, exact=False)


@pytest.mark.parametrize(
    ("blocker", "text"),
    [
        (lambda x, y, loss: x[y > 4].sum(), "x[y > 4]"),  # data-dependent shape (boolean mask)
        (lambda x, y, loss: loss.detach().cpu(), ".cpu()"),  # copy to the host
    ],
    ids=["boolean-mask", "cpu-copy"],
)
def test_other_blockers_fall_back_to_eager_with_their_line(blocker, text, caplog) -> None:
    def body(model, opt, **_):
        def step(x, y):
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            extra = blocker(x, y, loss)
            return loss + 0 * extra.to(loss.device)

        return step

    line = _eager_with_one_line(body, caplog)
    assert "test_cuda_train.py" in line and text in line, line


def test_distillation_trains_eager_with_one_line(caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(1)
    teacher = _mlp().cuda().eval().requires_grad_(False)

    def body(model, opt, **_):
        def step(x, y):
            opt.zero_grad(set_to_none=True)
            with torch.no_grad():
                soft = teacher(x).softmax(-1)
            logits = model(x)
            loss = F.cross_entropy(logits, y) + F.kl_div(logits.log_softmax(-1), soft, reduction="batchmean")
            loss.backward()
            opt.step()
            return loss

        return step

    assert "distillation" in _eager_with_one_line(body, caplog)


def test_unfreezing_a_layer_captures_the_step_again(caplog: pytest.LogCaptureFixture) -> None:
    (gm, gopt, gstep, _), (em, _, estep, _) = _pair(_mlp, SGD)
    for m in (gm, em):
        m[0].requires_grad_(False)  # the first layer starts frozen
    graphed = ll.graphed_step(gstep, model=gm, optimizer=gopt)
    x, y = _batch()
    _run(graphed, estep, [(x, y)] * 4)
    frozen = gm[0].weight.detach().clone()
    with caplog.at_level(logging.INFO, logger="launchless"):
        for m in (gm, em):
            m.requires_grad_(True)  # unfrozen: the step now computes and applies its gradients too
        _run(graphed, estep, [(x, y)] * 5, seeds=True)
    assert not torch.equal(gm[0].weight, frozen)
    assert sum("frozen or unfrozen" in r.getMessage() for r in caplog.records) == 1
    assert graphed.graph_info()["level"] == "whole-step graph"
    _same_state(gm, em)


def test_capture_stream_is_one_per_device_and_the_stream_graphed_steps_warm_up_on() -> None:
    stream = ll.capture_stream()
    assert stream is ll.capture_stream(0) is ll.capture_stream("cuda:0") is ll.capture_stream(torch.device("cuda"))
    assert stream != torch.cuda.current_stream()
    with pytest.raises(ll.ConfigError, match="captured on CUDA devices only"):
        ll.capture_stream("cpu")
    torch.manual_seed(0)
    model = _mlp().cuda().train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    streams: list[torch.cuda.Stream] = []
    plain = _plain_step(model, opt)

    def step(x, y):
        streams.append(torch.cuda.current_stream())
        return plain(x, y)

    graphed = ll.graphed_step(step, model=model, optimizer=opt, capture_after=2)
    graphed(*_batch())  # an eager warm-up step
    assert streams == [stream]  # where DistributedDataParallel is to be constructed
