"""Two-GPU tests (NCCL, one process per GPU): tensor-parallel forwards captured by ``wrap`` and by the compiler
backend with their collectives inside the graph, verified against eager on every rank; a refusal on one rank makes
every rank run eager, without a hang; DistributedDataParallel steps captured whole by ``graphed_step`` and
checked against eager DDP from the same state."""

from __future__ import annotations

import contextlib
import logging

import pytest
import torch
import torch.distributed as dist
from ranks import run_ranks

pytestmark = pytest.mark.cuda
WORLD = 2
# one rank (NCCL over a group of one: DDP's all-reduce and the agreement still run), and two where two GPUs are
WORLDS = [1, pytest.param(2, marks=pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs"))]
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")


def _mesh():
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cuda", (dist.get_world_size(),))


def _tp_wrap(rank: int, world: int, name: str, grad_mode: str) -> dict:
    import launchless as ll
    from launchless.apps.zoo.tensor_parallel import build_tp
    from launchless.core.verify import difference, identical

    model, args, kwargs = build_tp(name, mesh=_mesh(), device=f"cuda:{rank}")
    wrapped = ll.wrap(model, cuda_graph="auto", capture_after=1)
    mode = torch.no_grad if grad_mode == "no_grad" else torch.inference_mode
    results = []
    with mode():
        for step in range(4):  # new token ids every call: the graph must follow them
            call = dict(kwargs, input_ids=(kwargs["input_ids"] + step) % 1000)
            eager = model(*args, **call)
            graphed = wrapped(*args, **call)
            results.append((identical(graphed, eager), difference(eager, graphed, 64.0)[0]))
    info = wrapped.graph_info()
    rows = info["graphs"]
    return {
        "graphs": len(rows),
        "replays": rows[0]["replays"] if rows else 0,
        "verification": rows[0]["verification"]["status"] if rows else None,
        "fallbacks": info["fallbacks"],
        "identical": [same for same, _ in results],
        "max_diff": max(diff for _, diff in results),
    }


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("grad_mode", ["no_grad", "inference_mode"])
@pytest.mark.parametrize("name", ["tp:bert", "tp:llama", "tp:opt"])
def test_a_tensor_parallel_forward_replays_one_graph_per_rank_equal_to_eager(name: str, grad_mode: str, world) -> None:
    pytest.importorskip("transformers")
    for rank, got in enumerate(run_ranks(_tp_wrap, name, grad_mode, world_size=world, backend="nccl", timeout_s=300)):
        assert got["graphs"] == 1 and got["fallbacks"] == [], (rank, got)
        assert got["replays"] >= 3 and got["verification"] in ("bit-identical", "capture-path"), (rank, got)
        if got["verification"] == "bit-identical":
            assert all(got["identical"]), (rank, got)
        assert got["max_diff"] < 1e-4, (rank, got)


def _tp_compiled(rank: int, world: int) -> dict:
    import launchless.compiler as llc
    from launchless.apps.zoo.tensor_parallel import build_tp
    from launchless.compiler.backend import make_backend
    from launchless.core.verify import difference

    torch._dynamo.reset()
    model, args, kwargs = build_tp("tp:llama", mesh=_mesh(), device=f"cuda:{rank}")
    compiled = torch.compile(model, backend=make_backend(capture_after=1))
    with torch.no_grad():
        diffs = []
        for step in range(4):
            call = dict(kwargs, input_ids=(kwargs["input_ids"] + step) % 1000)
            eager = model(*args, **call)
            diffs.append(difference(eager, compiled(*args, **call), 64.0)[0])
    rows = llc.graph_info()
    return {"variants": [g["variant"] for r in rows for g in r["graphs"]], "max_diff": max(diffs)}


@pytest.mark.parametrize("world", WORLDS)
def test_the_compiler_backend_captures_a_tensor_parallel_forward_on_every_rank(world: int) -> None:
    pytest.importorskip("transformers")
    for rank, got in enumerate(run_ranks(_tp_compiled, world_size=world, backend="nccl", timeout_s=400)):
        assert got["variants"] and set(got["variants"]) == {"graph"}, (rank, got)
        assert got["max_diff"] < 1e-3, (rank, got)


class _SyncsOnOneRank(torch.nn.Module):
    """A sharded MLP whose forward reads a value on the host on rank 1 only: that rank cannot capture it."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(64, 256), torch.nn.Linear(256, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.up(x))
        if dist.get_rank() == 1 and float(h.sum()) == float("inf"):  # a host sync, on one rank
            h = h * 0
        return self.down(h)


def _one_rank_refuses(rank: int, world: int) -> dict:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    import launchless as ll

    torch.manual_seed(0)
    model = _SyncsOnOneRank().cuda().eval()
    parallelize_module(model, _mesh(), {"up": ColwiseParallel(), "down": RowwiseParallel()})
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("launchless").addHandler(handler)
    logging.getLogger("launchless").setLevel(logging.INFO)
    wrapped = ll.wrap(model, cuda_graph="auto", capture_after=1)
    x = torch.randn(4, 64, device="cuda")
    with torch.no_grad():
        same = [torch.equal(wrapped(x), model(x)) for _ in range(3)]
    info = wrapped.graph_info()
    return {"graphs": len(info["graphs"]), "fallbacks": info["fallbacks"], "same": same, "lines": records}


@two_gpus
def test_a_refusal_on_one_rank_makes_every_rank_run_eager_without_a_hang() -> None:
    ranks = run_ranks(_one_rank_refuses, world_size=WORLD, backend="nccl", timeout_s=200)
    for rank, got in enumerate(ranks):
        assert got["graphs"] == 0 and all(got["same"]), (rank, got)
        (fallback,) = got["fallbacks"]
        refusal_lines = [line for line in got["lines"] if "Running eager" in line or "runs collectives" in line]
        assert len(refusal_lines) == 1, (rank, got["lines"])
        if rank == 0:
            assert "another rank's capture failed (rank 1:" in fallback["message"], fallback
        else:
            assert "host sync" in fallback["reason"] or "capture" in fallback["reason"], fallback


def _syncing_allreduce_hook(state, bucket):
    """DDP's default all-reduce after a host read of the bucket (as a hook that logs gradient norms would do): a
    graph cannot record the read, so the all-reduce cannot be in the graph."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    if float(bucket.buffer().abs().sum()) < 0:
        raise AssertionError("unreachable")
    return allreduce_hook(state, bucket)


def _ddp_step(
    rank: int, world: int, find_unused: bool, fp16_adamw: bool, syncing_hook: bool = False, own_stream: bool = False
) -> dict:
    """DDP training through graphed_step against eager DDP; ``own_stream`` builds DDP on a stream of its own instead
    of ``launchless.capture_stream()``."""
    import launchless as ll

    torch.manual_seed(0)
    timm = pytest.importorskip("timm")

    def build():
        torch.manual_seed(0)
        model = timm.create_model("resnet18", num_classes=10).cuda()
        side = torch.cuda.Stream() if own_stream else ll.capture_stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # PyTorch's condition for a backward with its all-reduce in a graph
            ddp = torch.nn.parallel.DistributedDataParallel(
                model, device_ids=[rank], find_unused_parameters=find_unused
            )
        torch.cuda.current_stream().wait_stream(side)
        if syncing_hook:
            ddp.register_comm_hook(None, _syncing_allreduce_hook)
        if fp16_adamw:  # capturable: the arithmetic graphed_step gives AdamW, in the eager twins too -- AdamW's
            # near-sign updates turn capturable=False's rounding (1.2e-7 after one step) into 1.5e-2 in 16 steps
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=True)
        else:
            opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        scaler = torch.amp.GradScaler("cuda") if fp16_adamw else None
        return ddp, opt, scaler

    def step_of(ddp, opt, scaler):
        def step(x, y):
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.float16, enabled=scaler is not None):
                loss = torch.nn.functional.cross_entropy(ddp(x), y)
            if scaler is None:
                loss.backward()
                opt.step()
            else:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            return loss

        return step

    graphed_parts, eager_parts, again_parts = build(), build(), build()
    graphed = ll.graphed_step(
        step_of(*graphed_parts), model=graphed_parts[0], optimizer=graphed_parts[1], scaler=graphed_parts[2]
    )
    eager, again = step_of(*eager_parts), step_of(*again_parts)
    gen = torch.Generator(device="cuda").manual_seed(100 + rank)  # each rank its own batches, as a sampler gives
    # a failure inside the backward (the syncing hook) waits for DDP to rebuild its buckets before each next level
    with _records_warnings(logging.getLogger("launchless")) as caught:
        for _ in range(48 if syncing_hook else 16):
            x = torch.randn(2, 3, 64, 64, device="cuda", generator=gen)
            y = torch.randint(0, 10, (2,), device="cuda", generator=gen)
            graphed(x, y), eager(x, y), again(x, y)
        torch.cuda.synchronize()

    def max_diff(a, b) -> float:
        pairs = zip(a.parameters(), b.parameters(), strict=True)
        return max((p - q).abs().max().item() for p, q in pairs)

    diff = max_diff(graphed_parts[0], eager_parts[0])
    noise = max_diff(again_parts[0], eager_parts[0])  # cuDNN's backward uses atomics: eager differs from itself
    info = graphed.graph_info()
    replicas = [None] * world
    dist.all_gather_object(replicas, [p.detach().sum().item() for p in graphed_parts[0].parameters()][:3])
    return {
        "level": info["level"],
        "eager_reason": info["eager_reason"],
        "replays": info["graphs"][0]["replays"] if info["graphs"] else 0,
        "whole_step_refused": info["graphs"][0]["whole_step_refused"] if info["graphs"] else None,
        "diff": diff,
        "noise": noise,
        "close": diff <= max(10 * noise, 1e-6),
        "replicas_equal": all(r == replicas[0] for r in replicas),
        "warnings": caught,
    }


@contextlib.contextmanager
def _records_warnings(logger: logging.Logger):
    """The WARNING lines ``logger`` writes inside the block (a list filled as they come)."""
    lines: list[str] = []

    class Lines(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING:
                lines.append(record.getMessage())

    handler = Lines()
    logger.addHandler(handler)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)


@pytest.mark.parametrize("world", WORLDS)
def test_a_ddp_step_is_captured_whole_with_its_all_reduce_and_equals_eager_ddp(world: int) -> None:
    pytest.importorskip("timm")
    for rank, got in enumerate(run_ranks(_ddp_step, False, False, world_size=world, backend="nccl", timeout_s=400)):
        assert got["level"] == "whole-step graph" and got["replays"] >= 4, (rank, got)
        assert got["replicas_equal"], "the ranks' parameters drifted apart: the all-reduce did not run"
        assert got["close"], (rank, got["diff"], got["noise"], got)


@pytest.mark.parametrize("world", WORLDS)
def test_ddp_built_on_another_stream_trains_eager_naming_capture_stream(world: int) -> None:
    pytest.importorskip("timm")
    ranks = run_ranks(_ddp_step, False, False, False, True, world_size=world, backend="nccl", timeout_s=300)
    for rank, got in enumerate(ranks):
        assert got["level"] == "eager" and "launchless.capture_stream()" in got["eager_reason"], (rank, got)
        stream_warnings = [w for w in got["warnings"] if "capture_stream()" in w]
        assert len(stream_warnings) == 1, (rank, got["warnings"])  # one WARNING, not one per step
        assert got["close"] and got["replicas_equal"], (rank, got)


@pytest.mark.parametrize("world", WORLDS)
def test_ddp_with_find_unused_parameters_trains_eager_naming_the_fix(world: int) -> None:
    pytest.importorskip("timm")
    for got in run_ranks(_ddp_step, True, False, world_size=world, backend="nccl", timeout_s=300):
        assert got["level"] == "eager" and "find_unused_parameters=False" in got["eager_reason"], got
        assert got["close"] and got["replicas_equal"], got


@pytest.mark.parametrize("world", WORLDS)
def test_a_ddp_step_whose_optimizer_cannot_be_captured_falls_back_a_level_on_every_rank(world: int) -> None:
    pytest.importorskip("timm")
    for rank, got in enumerate(run_ranks(_ddp_step, False, True, world_size=world, backend="nccl", timeout_s=400)):
        assert got["level"] == "forward+backward graph, eager optimizer", (rank, got)
        assert "GradScaler" in (got["whole_step_refused"] or ""), (rank, got)
        assert got["replicas_equal"] and got["close"], (rank, got["diff"], got["noise"], got)


@pytest.mark.parametrize("world", WORLDS)
def test_a_ddp_all_reduce_that_cannot_be_captured_runs_eager_after_a_local_backward_graph(world: int) -> None:
    pytest.importorskip("timm")
    ranks = run_ranks(_ddp_step, False, False, True, world_size=world, backend="nccl", timeout_s=400)
    for rank, got in enumerate(ranks):
        assert got["level"] == "forward+backward graph, eager all-reduce and optimizer", (rank, got)
        assert got["replicas_equal"] and got["close"], (rank, got["diff"], got["noise"], got)
