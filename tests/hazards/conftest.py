"""Shared pieces of the hazard catalogue (``tests/hazards``).

Every hazard test compares launchless against eager bit for bit, or asserts the exact error it must raise, and
before it claims bit identity it checks that a graph really replayed: an eager fallback would otherwise pass any
comparison trivially. Here: the two inference grad modes, tiny seeded models, the bit-exact comparison, graph
and replay counting from ``graph_info()``, the eager twin of a training run, and the clean-up of process-wide
switches (TF32, cuDNN benchmark, deterministic algorithms) after each test.

Test modules import the helpers with ``from conftest import ...`` (pytest's default ``prepend`` import mode puts
this folder on ``sys.path`` and loads this conftest last, after ``tests/conftest.py``).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import gc
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

LOGGER = "launchless"
WHOLE_STEP = "whole-step graph"

GRAD_MODES: dict[str, Callable[[], contextlib.AbstractContextManager]] = {
    "no_grad": torch.no_grad,
    "inference_mode": torch.inference_mode,
}


@pytest.fixture(params=list(GRAD_MODES), ids=list(GRAD_MODES))
def grad_mode(request: pytest.FixtureRequest) -> Callable[[], contextlib.AbstractContextManager]:
    """``torch.no_grad`` or ``torch.inference_mode`` (the factory: enter it as often as the test needs)."""
    return GRAD_MODES[request.param]


def other_grad_mode(mode: Callable[[], contextlib.AbstractContextManager]) -> Callable:
    """The inference grad mode that ``mode`` is not."""
    return torch.no_grad if mode is torch.inference_mode else torch.inference_mode


# ---- clean-up of process-wide state ---------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def restore_process_state() -> Iterator[None]:
    """Numerics switches a test may flip are put back, and the GPU is idle and collected before the next test."""
    saved = (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.backends.cudnn.benchmark,
        torch.backends.cudnn.deterministic,
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.get_default_dtype(),
        torch.is_grad_enabled(),
    )
    try:
        yield
    finally:
        (matmul_tf32, cudnn_tf32, benchmark, cudnn_deterministic, deterministic, warn_only, dtype, grad) = saved
        torch.backends.cuda.matmul.allow_tf32 = matmul_tf32
        torch.backends.cudnn.allow_tf32 = cudnn_tf32
        torch.backends.cudnn.benchmark = benchmark
        torch.backends.cudnn.deterministic = cudnn_deterministic
        torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
        torch.set_default_dtype(dtype)
        torch.set_grad_enabled(grad)
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        gc.collect()


@pytest.fixture
def fresh_dynamo() -> Iterator[None]:
    """Dynamo's caches are per code object: tests compiling the same module class must not share them."""
    torch._dynamo.reset()
    try:
        yield
    finally:
        torch._dynamo.reset()


def clear_cublas_workspaces() -> None:
    """cuBLAS keeps a workspace per (handle, stream) for the life of the process; PyTorch's own leak checks clear
    them before measuring (``torch.testing._internal.common_utils``), and so do the memory tests here."""
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()


def settle_gpu_memory() -> None:
    """Collect, wait for the GPU, clear cuBLAS workspaces and release cached blocks: what is left is in use."""
    gc.collect()
    torch.cuda.synchronize()
    clear_cublas_workspaces()
    torch.cuda.empty_cache()


def private_pool_bytes() -> dict[tuple, int]:
    """Bytes reserved per private memory pool (the pools CUDA graphs allocate from), from the allocator snapshot."""
    pools: dict[tuple, int] = {}
    for segment in torch.cuda.memory_snapshot():
        pool = tuple(segment.get("segment_pool_id", (0, 0)))
        if pool != (0, 0):
            pools[pool] = pools.get(pool, 0) + segment.get("total_size", 0)
    return pools


# ---- tiny deterministic models --------------------------------------------------------------------------------
def mlp(width: int = 64, seed: int = 0) -> nn.Sequential:
    """Linear-GELU-Linear, seeded. A ``Sequential`` of torch modules: it deep-copies and pickles by reference."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, width))


def conv_bn(seed: int = 0) -> nn.Sequential:
    """A small conv net with BatchNorm whose running statistics are not the defaults (eval mode reads them)."""
    torch.manual_seed(seed)
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 10),
    )
    with torch.no_grad():
        for module in net.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.normal_(0.0, 0.5)
                module.running_var.uniform_(0.5, 2.0)
    return net


def dropout_mlp(seed: int = 0, p: float = 0.1) -> nn.Sequential:
    """A classifier with BatchNorm and dropout (32 features in, 10 classes out): training tests' default model."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(32, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Dropout(p), nn.Linear(64, 10))


# ---- comparison and counting ------------------------------------------------------------------------------------
def _bytes(t: torch.Tensor) -> torch.Tensor:
    # clone first: views and reshapes of an inference tensor are fine, but a copy is never an inference tensor
    return t.detach().clone().contiguous().reshape(-1).view(torch.uint8)


def assert_bit_identical(actual: Any, expected: Any, path: str = "output") -> None:
    """``actual`` and ``expected`` are the same tree (dicts, lists, tuples, dataclasses) with tensors equal bit for
    bit -- same dtype, shape and device, ``torch.equal`` on their bytes (NaN equals NaN, -0.0 differs from 0.0)
    -- and every other leaf equal."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{path}: {type(actual).__name__} where eager gives a tensor"
        assert actual.dtype == expected.dtype, f"{path}: dtype {actual.dtype}, eager {expected.dtype}"
        assert actual.shape == expected.shape, f"{path}: shape {tuple(actual.shape)}, eager {tuple(expected.shape)}"
        assert actual.device == expected.device, f"{path}: device {actual.device}, eager {expected.device}"
        a, b = _bytes(actual), _bytes(expected)
        if not torch.equal(a, b):
            diff = (actual.detach().double() - expected.detach().double()).abs().nan_to_num(nan=float("inf"))
            raise AssertionError(
                f"{path}: not bit-identical to eager ({int((a != b).sum())} of {a.numel()} bytes differ, "
                f"max abs diff {float(diff.max()):.3g})"
            )
        return
    if dataclasses.is_dataclass(expected) and not isinstance(expected, type):
        assert type(actual) is type(expected), f"{path}: {type(actual).__name__}, eager {type(expected).__name__}"
        for field in dataclasses.fields(expected):
            assert_bit_identical(getattr(actual, field.name), getattr(expected, field.name), f"{path}.{field.name}")
        return
    if isinstance(expected, dict):
        assert isinstance(actual, dict), f"{path}: {type(actual).__name__}, eager {type(expected).__name__}"
        assert list(actual) == list(expected), f"{path}: keys {list(actual)}, eager {list(expected)}"
        for key in expected:
            assert_bit_identical(actual[key], expected[key], f"{path}[{key!r}]")
        return
    if isinstance(expected, (list, tuple)):
        assert type(actual) is type(expected), f"{path}: {type(actual).__name__}, eager {type(expected).__name__}"
        assert len(actual) == len(expected), f"{path}: {len(actual)} items, eager {len(expected)}"
        for i, (x, y) in enumerate(zip(actual, expected, strict=True)):
            assert_bit_identical(x, y, f"{path}[{i}]")
        return
    assert actual == expected, f"{path}: {actual!r}, eager {expected!r}"


def bit_identical(actual: Any, expected: Any) -> bool:
    try:
        assert_bit_identical(actual, expected)
    except AssertionError:
        return False
    return True


def run_in_threads(work: Callable[[int], None], count: int = 2) -> None:
    """Run ``work(0)`` ... ``work(count - 1)`` on as many threads, released together from one barrier, wait for all
    of them, and fail with every exception a thread raised."""
    barrier = threading.Barrier(count)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait()
            work(i)
        except BaseException as exc:  # surfaced below, on the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors


def graph_count(wrapped: Any) -> int:
    """Graphs held now (``GraphedModule``, ``GraphedStep`` or one compiled graph of the backend)."""
    return len(wrapped.graph_info()["graphs"])


def replays(wrapped: Any) -> int:
    """Replays of the graphs held now (verification replays included: compare counts around a call)."""
    return sum(g["replays"] for g in wrapped.graph_info()["graphs"])


def call_replays(wrapped: Any, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` (one call of ``wrapped``) and assert that a held graph replayed for it."""
    before = replays(wrapped)
    out = fn()
    assert replays(wrapped) > before, f"the call ran without replaying a graph: {wrapped.graph_info()}"
    return out


# ---- the compiler backend, seen through the public backend call ---------------------------------------------------
def spy_on(backend: Callable[..., Any]) -> tuple[Callable[..., Any], list]:
    """A backend that passes through to ``backend`` (``options=`` included) and keeps what it returned for each
    Dynamo graph, so a test can read each one's ``graph_info()``."""
    made: list = []

    def spy(gm: Any, example_inputs: list, **kwargs: Any) -> Any:
        compiled = backend(gm, example_inputs, **kwargs)
        made.append(compiled)
        return compiled

    return spy, made


def compiled_replays(made: list) -> int:
    return sum(replays(c) for c in made if hasattr(c, "graph_info"))


def compiled_graph_count(made: list) -> int:
    return sum(graph_count(c) for c in made if hasattr(c, "graph_info"))


# ---- training twins ---------------------------------------------------------------------------------------------
# graphed_step runs SGD fused and Adam/AdamW capturable (README, "Training"); the eager twin is built that way too,
# so that both run the same arithmetic and the graphed copy must track it bit for bit.
def sgd_momentum(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.05, momentum=0.9, fused=True)


def adamw(params: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, capturable=True)


OPTIMIZERS = {"sgd_momentum": sgd_momentum, "adamw": adamw}


def train_twins(
    make_opt: Callable[[Any], torch.optim.Optimizer], build: Callable[[], nn.Module] = dropout_mlp
) -> tuple[nn.Module, torch.optim.Optimizer, nn.Module, torch.optim.Optimizer]:
    """(model, optimizer, twin, twin's optimizer): one state on the GPU, in training mode, twice."""
    model = build().cuda().train()
    twin = copy.deepcopy(model)
    trainable = lambda m: [p for p in m.parameters() if p.requires_grad]  # noqa: E731
    return model, make_opt(trainable(model)), twin, make_opt(trainable(twin))


def make_step(model: nn.Module, opt: torch.optim.Optimizer, *, zero_grad: bool = True) -> Callable[..., Any]:
    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if zero_grad:
            opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return step


def classifier_batches(n: int, size: int = 16, seed: int = 1234) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n`` batches for ``dropout_mlp`` (one signature), made once and fed to both twins."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [
        (
            torch.randn(size, 32, device="cuda", generator=g),
            torch.randint(0, 10, (size,), device="cuda", generator=g),
        )
        for _ in range(n)
    ]


def run_twins(
    graphed: Callable[..., Any],
    eager: Callable[..., Any],
    batches: list,
    before_step: Callable[[int], None] | None = None,
) -> None:
    """Step both twins on the same batches, each step from the same seed (dropout draws the same numbers), with
    ``before_step(i)`` applying the same user events to both; every step's loss must be bit-identical."""
    for i, batch in enumerate(batches):
        if before_step is not None:
            before_step(i)
        torch.manual_seed(i)
        got = graphed(*batch)
        torch.manual_seed(i)
        want = eager(*batch)
        assert_bit_identical(got, want, f"loss of step {i}")


def assert_whole_step_replaying(graphed: Any) -> None:
    """The graphed step runs as a whole-step graph that has replayed: the hazard that follows is armed."""
    info = graphed.graph_info()
    assert info["level"] == WHOLE_STEP, info
    assert replays(graphed) >= 2, info


def assert_same_training_state(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    twin: nn.Module,
    twin_opt: torch.optim.Optimizer,
    *,
    grads: bool = False,
) -> None:
    """Parameters, buffers (BatchNorm statistics, num_batches_tracked), optionally gradients, and the optimizer's
    parameters, state and learning rates, bit for bit."""
    assert_bit_identical(dict(model.state_dict()), dict(twin.state_dict()), "model.state_dict()")
    if grads:
        for (name, p), q in zip(model.named_parameters(), twin.parameters(), strict=True):
            assert_bit_identical(p.grad, q.grad, f"{name}.grad")
    for gi, (g, h) in enumerate(zip(opt.param_groups, twin_opt.param_groups, strict=True)):
        assert float(g["lr"]) == float(h["lr"]), f"param_groups[{gi}] lr {float(g['lr'])}, eager {float(h['lr'])}"
        for pi, (p, q) in enumerate(zip(g["params"], h["params"], strict=True)):
            where = f"param_groups[{gi}] parameter {pi}"
            assert_bit_identical(p, q, where)
            sp, sq = opt.state.get(p, {}), twin_opt.state.get(q, {})
            assert sorted(sp) == sorted(sq), f"{where}: optimizer state keys {sorted(sp)}, eager {sorted(sq)}"
            for key in sq:
                assert_bit_identical(sp[key], sq[key], f"{where}: optimizer state {key!r}")


def config_error_in(exc: BaseException | None) -> BaseException | None:
    """The ``launchless.ConfigError`` in ``exc``'s chain (Dynamo wraps a backend's error in BackendCompilerFailed)."""
    import launchless

    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, launchless.ConfigError):
            return exc
        seen.add(id(exc))
        exc = getattr(exc, "inner_exception", None) or exc.__cause__ or exc.__context__
    return None
