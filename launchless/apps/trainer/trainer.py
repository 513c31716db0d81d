"""`launchless train`: a small image-classification trainer for timm models, optionally one CUDA graph per step.

The step function (zero_grad, forward under autocast, cross-entropy, backward, optimizer step) returns
device tensors only -- the loss and the number of correct predictions -- so it can be captured whole by
``launchless.graphed_step``. Metrics are accumulated on the device and read back once per epoch; the
cosine learning-rate schedule steps once per epoch, outside the step. With ``cuda_graph=False`` the loop
is identical, only the step is not wrapped. In a data-parallel group (``--gpus N``, ``distributed``) the step
trains the model wrapped in ``DistributedDataParallel``, which ``graphed_step`` captures with its all-reduce.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from torch.utils.data import DistributedSampler

from ...errors import ConfigError
from ...train.step import graphed_step
from .data import loaders
from .distributed import DataParallel, replicate

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "off": None}
OPTIMIZERS = ("sgd", "adamw")
DEFAULT_LR = {"sgd": 0.05, "adamw": 1e-3}


def timm_name(model_name: str) -> str:
    """``"timm:resnet18"`` or ``"resnet18"`` -> ``"resnet18"``; another prefix is refused."""
    prefix, sep, rest = model_name.partition(":")
    if not sep:
        return model_name
    if prefix != "timm" or not rest:
        raise ConfigError(
            f"model {model_name!r}: launchless train builds timm models only; pass a timm name, e.g. "
            "'timm:resnet18' or 'resnet18'"
        )
    return rest


def check_model(model_name: str) -> str:
    """The timm name of ``model_name``; a clear error when timm is missing or does not know the name."""
    try:
        import timm
    except ImportError as exc:
        raise ConfigError(
            "launchless train needs timm; install it with: pip install 'launchless[zoo]' (or pip install timm)"
        ) from exc
    name = timm_name(model_name)
    if not timm.is_model(name):
        close = difflib.get_close_matches(name, timm.list_models(), n=3, cutoff=0.6)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise ConfigError(
            f"unknown timm model {name!r}{hint}; list the model names with: "
            "python -c \"import timm; print(timm.list_models('*resnet*'))\" (any wildcard pattern works)"
        )
    return name


def build_model(model_name: str, num_classes: int) -> torch.nn.Module:
    """A randomly initialised timm model with a ``num_classes`` head."""
    import timm

    return timm.create_model(check_model(model_name), pretrained=False, num_classes=num_classes)


def check_options(
    model_name: str, *, epochs: int, batch: int, lr: float | None, amp: str, optimizer: str, size: int
) -> None:
    """Raises ``ConfigError`` naming the fix for the first option ``train`` cannot use: checked before any data is
    read, and by ``launchless train --gpus N`` before its processes are started."""
    if amp not in AMP_DTYPES:
        raise ConfigError(f"amp={amp!r} is not accepted; pass one of: {' | '.join(AMP_DTYPES)} (e.g. --amp bf16)")
    if optimizer not in OPTIMIZERS:
        raise ConfigError(f"optimizer={optimizer!r} is not accepted; pass one of: {' | '.join(OPTIMIZERS)}")
    if epochs < 1:
        raise ConfigError(f"epochs={epochs}: pass --epochs 1 or more")
    if batch < 1:
        raise ConfigError(f"batch={batch}: pass --batch 1 or more")
    if lr is not None and not lr > 0:
        raise ConfigError(f"lr={lr}: pass a positive learning rate (default {DEFAULT_LR[optimizer]} for {optimizer})")
    if size < 8:
        raise ConfigError(f"size={size}: pass an image size of at least 8 pixels (--size)")
    check_model(model_name)


def _pick_device(device: str | torch.device | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {device} was asked for but no CUDA device is visible; leave device unset for CPU")
    return device


def make_step(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    device: torch.device,
    amp: str,
    scaler: torch.amp.GradScaler | None = None,
):
    """The training step ``step(x, y) -> (loss, correct)``; both are device tensors (no host sync inside).

    ``scaler`` (fp16 only) scales the loss. With SGD (run fused by graphed_step) the scaler's skip-on-inf
    stays on the device and the whole step is captured; with AdamW graphed_step captures forward+backward
    and runs the scaler and optimizer eager (one log line says so).
    """
    dtype = AMP_DTYPES[amp] or torch.bfloat16  # the dtype is unused when autocast is disabled

    def step(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        opt.zero_grad(set_to_none=True)
        # cache_enabled=False: no weight cast outlives the autocast region (what CUDA graphs with AMP ask for);
        # eager runs the same way, so the graphed and the eager step compute the same thing.
        with torch.autocast(device.type, dtype=dtype, enabled=amp != "off", cache_enabled=False):
            logits = model(x)
            loss = F.cross_entropy(logits, y)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        correct = (logits.argmax(dim=1) == y).sum()
        return loss.detach().float(), correct

    return step


@torch.no_grad()
def evaluate(
    model: torch.nn.Module, loader: torch.utils.data.DataLoader, device: torch.device, amp: str
) -> tuple[float, float]:
    """Mean loss and accuracy over ``loader`` in eval mode; one host sync at the end."""
    model.eval()
    dtype = AMP_DTYPES[amp] or torch.bfloat16
    loss_sum = torch.zeros((), device=device)
    correct = torch.zeros((), dtype=torch.long, device=device)
    seen = 0
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=dtype, enabled=amp != "off"):
            logits = model(x)
        loss_sum += F.cross_entropy(logits.float(), y, reduction="sum")
        correct += (logits.argmax(dim=1) == y).sum()
        seen += y.shape[0]
    loss_total, correct_total = torch.stack([loss_sum.double(), correct.double()]).tolist()
    return loss_total / max(seen, 1), correct_total / max(seen, 1)


def _validate(
    model: torch.nn.Module,
    loader: torch.utils.data.DataLoader,
    device: torch.device,
    amp: str,
    parallel: DataParallel | None,
) -> tuple[float, float]:
    """``evaluate`` on one process; in a group rank 0 evaluates and the others wait for its numbers. So every rank
    returns the same metrics, and all start the next epoch together: a rank that ran ahead would otherwise wait for
    rank 0's validation inside the next steps, where the agreement of a graph capture gives up after 300 s."""
    if parallel is None:
        return evaluate(model, loader, device, amp)
    metrics = torch.zeros(2, dtype=torch.float64, device=device)
    if parallel.is_main:
        metrics.copy_(torch.tensor(evaluate(model, loader, device, amp), dtype=torch.float64))
    dist.broadcast(metrics, src=0)
    val_loss, val_acc = metrics.tolist()
    return val_loss, val_acc


def parameters_sha256(model: torch.nn.Module) -> str:
    """A digest of the bytes of ``model``'s parameters in order: equal digests are bit-identical parameters (the
    replicas of data-parallel training stay so, or a rank has gone its own way)."""
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().reshape(-1).view(torch.uint8).cpu().numpy())
    return digest.hexdigest()


def train(
    model_name: str,
    data: str | Path,
    epochs: int = 5,
    batch: int = 32,
    lr: float | None = None,
    amp: str = "off",
    cuda_graph: bool = False,
    out: str | Path = "train-out",
    size: int = 32,
    workers: int = 2,
    seed: int = 0,
    optimizer: str = "sgd",
    *,
    device: str | torch.device | None = None,
    console: Console | None = None,
    parallel: DataParallel | None = None,
) -> dict[str, Any]:
    """Train ``model_name`` (a timm name) on the ImageFolder ``data`` (``train/`` and ``val/``).

    ``lr`` None picks 0.05 for SGD, 1e-3 for AdamW. ``device`` None picks CUDA when available, else CPU
    (where ``cuda_graph=True`` runs eager: graphed_step logs why). Writes ``out/checkpoint.pt`` and
    ``out/metrics.json`` and returns the metrics: ``epochs`` (one dict per epoch), ``total_wall_s``,
    ``final_train_loss``, ``final_val_acc``, ``graph_level`` (None without ``cuda_graph``), ``device``,
    ``world_size`` and ``parameters_sha256`` (a digest of the trained parameters, one per process).

    ``parallel`` (a rank of a joined group, ``distributed.joined_group()``): this process trains one replica in
    ``DistributedDataParallel`` on its share of each epoch, ``batch`` images per step; the training metrics are
    the whole group's. Rank 0 alone prints, validates (the unwrapped model on the whole validation set, no
    collectives) and writes; every rank returns the same metrics.
    """
    check_options(model_name, epochs=epochs, batch=batch, lr=lr, amp=amp, optimizer=optimizer, size=size)
    lr = DEFAULT_LR[optimizer] if lr is None else float(lr)
    if parallel is not None and device is not None:
        raise ConfigError(
            f"device={device!r} and parallel= given: a rank of a data-parallel group trains on its own device "
            f"({parallel.device}); leave device unset"
        )
    dev = parallel.device if parallel is not None else _pick_device(device)
    world_size = parallel.world_size if parallel is not None else 1
    is_main = parallel is None or parallel.is_main
    console = console or Console(quiet=not is_main)
    out = Path(out)
    args = {
        "model": model_name,
        "data": str(data),
        "epochs": epochs,
        "batch": batch,
        "lr": lr,
        "amp": amp,
        "cuda_graph": cuda_graph,
        "size": size,
        "workers": workers,
        "seed": seed,
        "optimizer": optimizer,
        "device": str(dev),
        "world_size": world_size,
    }

    torch.manual_seed(seed)
    train_loader, val_loader, num_classes = loaders(
        data,
        batch,
        size,
        workers=workers,
        pin_memory=dev.type == "cuda",
        seed=seed,
        rank=parallel.rank if parallel is not None else 0,
        world_size=world_size,
    )
    model = build_model(model_name, num_classes).to(dev).train()  # the seed makes it the same on every rank
    net = replicate(model, parallel) if parallel is not None else model  # what the step trains
    params = [p for p in model.parameters() if p.requires_grad]
    if optimizer == "sgd":
        # fused on CUDA in both modes: graphed_step needs the fused kernel (it reads a device lr), and eager
        # using the same kernel leaves the graph as the only difference between a run with and without it
        fused = True if dev.type == "cuda" else None
        opt: torch.optim.Optimizer = torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=5e-4, fused=fused)
    else:
        opt = torch.optim.AdamW(params, lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs)
    scaler = torch.amp.GradScaler(dev.type) if amp == "fp16" else None
    step = make_step(net, opt, dev, amp, scaler)
    if cuda_graph:
        step = graphed_step(step, model=net, optimizer=opt, scaler=scaler)

    group = f", {world_size} data-parallel processes ({dist.get_backend()})" if parallel is not None else ""
    per_process = " per process" if parallel is not None else ""
    console.print(
        f"launchless train: {timm_name(model_name)} ({sum(p.numel() for p in params):,} parameters) on {dev}, "
        f"{optimizer} lr {lr:g}, amp {amp}, cuda graph {'on' if cuda_graph else 'off'}{group}\n"
        f"data: {num_classes} classes, {len(train_loader.dataset)} train / {len(val_loader.dataset)} val images "
        f"at {size}px, batch {batch}{per_process}, {len(train_loader)} steps per epoch"
    )
    sampler = train_loader.sampler
    history: list[dict[str, Any]] = []
    start = time.perf_counter()
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("", total=len(train_loader))
        for epoch in range(1, epochs + 1):
            progress.reset(task, total=len(train_loader), description=f"epoch {epoch}/{epochs}")
            epoch_start = time.perf_counter()
            epoch_lr = float(opt.param_groups[0]["lr"])
            if isinstance(sampler, DistributedSampler):
                sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
            net.train()
            loss_sum = torch.zeros((), device=dev)
            correct_sum = torch.zeros((), dtype=torch.long, device=dev)
            seen = steps = 0
            for x, y in train_loader:
                x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
                loss, correct = step(x, y)
                loss_sum += loss
                correct_sum += correct
                seen += y.shape[0]
                steps += 1
                progress.advance(task)
            sched.step()  # per epoch, outside the step: a graphed step keeps reading the lr tensor it updates
            images = torch.tensor(seen, dtype=torch.float64, device=dev)
            totals = torch.stack([loss_sum.double(), correct_sum.double(), images])
            if parallel is not None:  # the whole group's epoch: every rank made as many steps
                dist.all_reduce(totals)
            # the epoch's one host sync for the training metrics
            loss_total, correct_total, seen_total = totals.tolist()
            step_ms = (time.perf_counter() - epoch_start) * 1000 / steps
            train_loss, train_acc = loss_total / (steps * world_size), correct_total / seen_total
            val_loss, val_acc = _validate(model, val_loader, dev, amp, parallel)
            wall = time.perf_counter() - epoch_start
            history.append(
                {
                    "epoch": epoch,
                    "lr": epoch_lr,
                    "train_loss": train_loss,
                    "train_acc": train_acc,
                    "val_loss": val_loss,
                    "val_acc": val_acc,
                    "wall_s": wall,
                    "steps": steps,
                    "step_ms": step_ms,
                    "images_per_s": seen_total / wall,
                }
            )
            progress.console.print(
                f"epoch {epoch}/{epochs}  train loss {train_loss:.4f}  train acc {train_acc:.3f}  "
                f"val loss {val_loss:.4f}  val acc {val_acc:.3f}  {wall:.2f} s"
            )
    total = time.perf_counter() - start
    digests = [parameters_sha256(model)]
    if parallel is not None:
        digests = parallel.all_ranks(digests[0])
        if len(set(digests)) > 1:
            console.print(f"[bold red]warning:[/] the {world_size} processes ended with different parameters")

    info = step.graph_info() if cuda_graph else None
    console.print(f"total wall time {total:.2f} s over {epochs} epoch(s)")
    if info is not None:
        why = f" ({info['eager_reason']})" if info["eager_reason"] else ""
        fallbacks = "; ".join(f["reason"] for f in info["fallbacks"])
        console.print(
            f"cuda graph level: {info['level']}{why}"
            + (f"; {sum(g['replays'] for g in info['graphs'])} replays" if info["graphs"] else "")
            + (f"; fallbacks: {fallbacks}" if fallbacks else "")
        )
    result = {
        "epochs": history,
        "total_wall_s": total,
        "final_train_loss": history[-1]["train_loss"],
        "final_val_acc": history[-1]["val_acc"],
        "graph_level": info["level"] if info is not None else None,
        "device": str(dev),
        "world_size": world_size,
        "parameters_sha256": digests,
    }
    if not is_main:
        return result

    out.mkdir(parents=True, exist_ok=True)
    opt_state = opt.state_dict()
    for group in opt_state["param_groups"]:  # copies; a graphed step keeps lr in a device tensor
        if isinstance(group["lr"], torch.Tensor):
            group["lr"] = float(group["lr"])
    torch.save(
        {
            "model": model.state_dict(),
            "optimizer": opt_state,
            "epoch": epochs,
            "args": args,
            "classes": list(train_loader.dataset.classes),
            "grad_scaler": scaler.state_dict() if scaler is not None else None,
        },
        out / "checkpoint.pt",
    )
    (out / "metrics.json").write_text(
        json.dumps({**result, "args": args, "graph_info": info}, indent=2, default=str) + "\n"
    )
    console.print(f"wrote {out / 'checkpoint.pt'} and {out / 'metrics.json'}", markup=False)
    return result
