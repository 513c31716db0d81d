"""Training workloads in every mode: the same model, optimizer, batch, loss and scheduler for each.

A task builds the pieces; ``train_step`` is the user's step (zero_grad, forward under optional bf16
autocast, loss, backward, optimizer, scheduler). reduce-overhead marks each step and uses
``set_to_none=True``. hand-graph captures the whole step the way an expert would by hand: warm-up
steps on a side stream, the learning rate as a device tensor (so a scheduler, stepped after each
replay, still acts), AdamW with ``capturable=True``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils import _pytree as pytree

from ...core.output_tree import see_into
from ...core.workspaces import own_blas_workspaces
from .. import zoo
from .modes import KERNEL_MODES, ModeUnavailable, Prepared, compiled_model, kernels_decided
from .workloads import MEAN_OF_OUTPUTS, MODEL_LOSS, BenchWorkload

LossFn = Callable[[Callable[..., Any], tuple], torch.Tensor]


@dataclass
class TrainingSetup:
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    batch: tuple[torch.Tensor, ...]
    loss: LossFn
    scheduler: Any = None  # an LRScheduler stepped once per step
    amp: str | None = None


def classify_loss(model: Callable[..., Any], batch: tuple) -> torch.Tensor:
    x, y = batch
    return F.cross_entropy(model(x), y)


def _sequence_loss(model: Callable[..., Any], batch: tuple) -> torch.Tensor:
    ids, mask, labels = batch
    return model(input_ids=ids, attention_mask=mask, labels=labels).loss


class RunnersLoss:
    """The losses PyTorch's benchmark runners train zoo-style models on: a model with labels among its inputs
    returns its own loss (``MODEL_LOSS``: transformers' ``loss``); otherwise the loss is the mean of each floating
    output's mean, whatever the outputs' structure (``MEAN_OF_OUTPUTS``). The batch is the model call's tensors in
    order: its positional arguments, then its keyword arguments' tensors by ``names``; ``flags`` are the call's
    other keyword arguments."""

    def __init__(self, task: str, positional: int, names: list[str], flags: dict[str, Any]) -> None:
        self.task, self.positional, self.names, self.flags = task, positional, names, flags

    def __call__(self, model: Callable[..., Any], batch: tuple) -> torch.Tensor:
        keywords = dict(zip(self.names, batch[self.positional :], strict=True))
        out = model(*batch[: self.positional], **keywords, **self.flags)
        if self.task == MODEL_LOSS:
            return out["loss"]
        see_into(out)
        floats = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point()]
        return torch.stack([t.float().mean() for t in floats]).mean()


def _optimizer(model: torch.nn.Module, name: str, lr: float) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    if name == "adam":  # PyTorch's benchmark runners' training optimizer (capturable on the GPU, as they set it)
        on_gpu = next(model.parameters()).is_cuda
        return torch.optim.Adam(model.parameters(), lr=lr, capturable=on_gpu, foreach=True)
    # a float lr: a scheduler built on a tensor lr reads its base value back with .item() every step
    return torch.optim.AdamW(model.parameters(), lr=lr, capturable=True)


def setup(w: BenchWorkload, *, device: str = "cuda") -> TrainingSetup:
    """Seeded: every mode (and the eager reference) starts from the same state on the same batch."""
    torch.manual_seed(0)
    generator = torch.Generator(device="cpu").manual_seed(1)
    if w.task in (MEAN_OF_OUTPUTS, MODEL_LOSS):  # the zoo model's own call, the runners' loss
        built = zoo.build(w.zoo, batch=w.batch, device=device, dtype=w.torch_dtype)
        keywords = dict(built.kwargs)
        if w.task == MODEL_LOSS:  # random next tokens: the model computes its own loss on them
            ids = keywords["input_ids"]
            keywords["labels"] = torch.randint(built.model.config.vocab_size, ids.shape, generator=generator).to(
                ids.device
            )
        names = [k for k, v in keywords.items() if isinstance(v, torch.Tensor)]
        flags = {k: v for k, v in keywords.items() if not isinstance(v, torch.Tensor)}
        batch = (*built.args, *(keywords[k] for k in names))
        loss = RunnersLoss(w.task, len(built.args), names, flags)
        model = built.model.train()
        return TrainingSetup(model, _optimizer(model, w.optimizer, 0.01), batch, loss, None, w.amp)
    if w.task == "sequence-classification":
        import transformers

        config = transformers.BertConfig(attn_implementation="sdpa", num_labels=2)
        model = transformers.BertForSequenceClassification(config).to(device).train()
        ids = torch.randint(config.vocab_size, (w.batch, w.seq), generator=generator).to(device)
        labels = torch.randint(2, (w.batch,), generator=generator).to(device)
        batch: tuple = (ids, torch.ones_like(ids), labels)
        opt = _optimizer(model, w.optimizer, 2e-5)
        scheduler = transformers.get_linear_schedule_with_warmup(opt, num_warmup_steps=100, num_training_steps=10_000)
        return TrainingSetup(model, opt, batch, _sequence_loss, scheduler, w.amp)
    built = zoo.build(w.zoo, batch=w.batch, device=device, dtype=w.torch_dtype)
    model = built.model.train()
    (x,) = built.args
    y = torch.randint(0, 1000, (x.shape[0],), generator=generator).to(x.device)
    lr = 0.01 if w.optimizer == "sgd" else 1e-3
    return TrainingSetup(model, _optimizer(model, w.optimizer, lr), (x, y), classify_loss, None, w.amp)


def train_step(s: TrainingSetup, model: Callable[..., Any], *, mark: bool = False, schedule: bool = True):
    def step(*batch: torch.Tensor) -> torch.Tensor:
        if mark:
            torch.compiler.cudagraph_mark_step_begin()
        s.optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=s.amp == "bf16", cache_enabled=False):
            loss = s.loss(model, batch)
        loss.backward()
        s.optimizer.step()
        if schedule and s.scheduler is not None:
            s.scheduler.step()
        return loss

    return step


def _hand_graph(s: TrainingSetup, warmup: int = 3) -> Prepared:
    if s.scheduler is not None:  # the scheduler must reach the graph: lr moves to the device, filled in place
        device = next(s.model.parameters()).device
        for group in s.optimizer.param_groups:
            group["lr"] = torch.tensor(float(group["lr"]), device=device)
    step = train_step(s, s.model, schedule=False)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):  # real steps: they create the gradients and optimizer state the graph reuses
            step(*s.batch)
            if s.scheduler is not None:
                s.scheduler.step()
    torch.cuda.current_stream().wait_stream(stream)
    static = [t.clone() for t in s.batch]
    graph = torch.cuda.CUDAGraph()
    with own_blas_workspaces(), torch.cuda.graph(graph):  # a later capture empties PyTorch's shared workspaces
        loss = step(*static)

    def replay() -> torch.Tensor:
        for st, t in zip(static, s.batch, strict=True):
            st.copy_(t, non_blocking=True)
        graph.replay()
        if s.scheduler is not None:
            s.scheduler.step()
        return loss

    return Prepared(replay, steps_in_prepare=warmup)


def training(mode: str, s: TrainingSetup) -> Prepared:
    if mode == "eager":
        step = train_step(s, s.model)
        return Prepared(lambda: step(*s.batch))
    if mode in ("compile", "reduce-overhead"):
        step = train_step(s, compiled_model(s.model, mode), mark=mode == "reduce-overhead")
        return Prepared(lambda: step(*s.batch))
    if mode == "hand-graph":
        return _hand_graph(s)
    if mode == "launchless":
        import launchless

        graphed = launchless.graphed_step(train_step(s, s.model), model=s.model, optimizer=s.optimizer)
        for _ in range(graphed.capture_after):  # real steps: eager, then capture + verification
            graphed(*s.batch)
        info = graphed.graph_info()
        if info["level"] == "eager":
            reasons = [info["eager_reason"], *(f["reason"] for f in info["fallbacks"])]
            raise ModeUnavailable("graphed_step runs eager: " + "; ".join(r for r in reasons if r))
        return Prepared(lambda: graphed(*s.batch), steps_in_prepare=graphed.capture_after)
    if mode in KERNEL_MODES:  # the step graph at once; Inductor's forward and backward swapped in once proven
        import launchless

        graphed = launchless.graphed_step(
            train_step(s, s.model), model=s.model, optimizer=s.optimizer, kernels="compiled"
        )
        return Prepared(
            lambda: graphed(*s.batch),
            settled=lambda: kernels_decided(graphed.graph_info()),
        )
    if mode == "launchless-compile":
        raise ModeUnavailable("launchless-compile graphs inference; whole training steps are the launchless mode's")
    raise ModeUnavailable(f"unknown mode {mode!r}")


def eager_loss_after(w: BenchWorkload, steps: int) -> torch.Tensor:
    """The loss eager reaches after ``steps`` steps from the same state on the same batch."""
    s = setup(w)
    step = train_step(s, s.model)
    for _ in range(steps):
        loss = step(*s.batch)
    return loss.detach().clone()
