"""Hazard catalogue, severity 3: resources and API footguns.

Nothing is wrong in the numbers and nothing crashes at once, but the process degrades or the user is misled:
graph memory that is never given back (a graph's private pool lives as long as anything references it), memory
that grows with every new input shape, copies and pickles that drag graphs and locks along or lose the options,
state_dict keys that no plain model can load, options that are silently ignored, and mistakes that surface as an
AttributeError deep inside the library instead of a ConfigError naming the fix. Tests without the ``cuda`` marker
run on any machine.

Scenarios (entry point) and what goes wrong without the library's protection:
"""

# test_deleting_a_wrapped_model_returns_its_graph_memory (wrap): a graph kept alive by a global reference holds
#     its private pool forever after the model is gone.
# test_graph_memory_stays_bounded_under_ever_new_shapes (wrap, "auto"): a graph per shape, never freed, grows
#     GPU memory with every new batch size; so do evicted graphs' blocks when every capture runs on a new stream
#     (the allocator reuses a block only on the stream it was allocated on).
# test_out_of_memory_while_capturing_is_tried_again (wrap "auto" and True, graphed_step, torch.compile backend):
#     running out of GPU memory is passing (another model's graphs freed, smaller batches), unlike a blocker in the
#     forward; refused for good, the signature would run eager for the rest of the process (and raise for ever
#     under cuda_graph=True) with nothing but an INFO line.
# test_release_graphs_then_call_again (wrap): released graphs must free their pool and later calls capture again.
# test_copy_of_a_wrapped_model_with_graphs (wrap; deepcopy and pickle): a copy sharing the original's graphs would
#     replay the original's weights; a CUDAGraph, a memory pool or a lock cannot be copied or pickled.
# test_wrap_verify_off_skips_verification (wrap): verify="off" must really skip the proof, and say so.
# test_graphed_step_verify_off_skips_verification (graphed_step): the same option name with the same meaning.
# test_opaque_object_output_is_refused_by_name (wrap): tensors inside an object the library cannot look into would
#     be overwritten by the next replay; it must be refused naming the type.
# test_dataclass_outputs_are_copied_and_verified (wrap): a dataclass of the user's own (frozen, with attributes
#     added after __init__) must come back as a fresh object per call, not the graph's buffers.
# test_torch_compile_options_reach_the_backend (torch.compile backend): options={...} must be honoured, not
#     dropped or rejected by Dynamo's call.
# test_copy_of_a_wrapped_model_on_cpu (wrap, CPU): deepcopy and pickle keep the model and the options.
# test_state_dict_of_a_wrapped_model_has_the_models_own_keys (wrap, CPU): a "model." prefix in every key makes
#     checkpoints of the wrapped and the plain model incompatible.
# test_wrap_rejects_a_bad_option_naming_the_accepted_values (wrap, CPU): a typo'd mode silently means eager.
# test_wrapping_a_wrapped_model_or_a_function_is_refused (wrap, CPU): double wrapping doubles the bookkeeping.
# test_capture_graph_when_graphs_are_off_or_the_model_trains (wrap, CPU): capture_graph() must say why it cannot.
# test_graphed_step_rejects_a_bad_option (graphed_step, CPU): max_graphs=0 or a bogus verify silently accepted.
# test_graphed_step_with_model_and_optimizer_swapped (graphed_step, CPU): an AttributeError deep in the library
#     instead of a ConfigError naming the fix.
# test_make_backend_rejects_a_bad_option (make_backend, CPU): a misspelt option silently ignored.
# test_torch_compile_bad_option_names_the_option (torch.compile backend, CPU): the error must name the option,
#     also when Dynamo wraps it in BackendCompilerFailed.
# test_torch_compile_options_are_accepted_on_cpu (torch.compile backend, CPU): the same options work where there
#     is no GPU (the graph runs compiled, without a CUDA graph).

from __future__ import annotations

import copy
import dataclasses
import io
import logging
import pickle
import re

import pytest
import torch
from conftest import (
    assert_bit_identical,
    assert_same_training_state,
    call_replays,
    classifier_batches,
    compiled_graph_count,
    compiled_replays,
    config_error_in,
    conv_bn,
    dropout_mlp,
    graph_count,
    make_step,
    mlp,
    private_pool_bytes,
    replays,
    run_twins,
    settle_gpu_memory,
    sgd_momentum,
    spy_on,
    train_twins,
)
from torch import nn

import launchless as ll
from launchless.compiler.backend import launchless_backend, make_backend
from launchless.core.cache import RETRY_FIRST

cuda = pytest.mark.cuda
MiB = 1 << 20


class Opaque:  # a plain object: launchless cannot know what it holds
    def __init__(self, logits: torch.Tensor) -> None:
        self.logits = logits


class ReturnsOpaque(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> Opaque:
        return Opaque(self.lin(x))


@dataclasses.dataclass(frozen=True)
class Prediction:
    logits: torch.Tensor
    scale: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "probabilities", self.logits.softmax(-1))  # not a field: kept all the same


class ReturnsDataclass(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> Prediction:
        return Prediction(self.lin(x), 2.0)


# ---- memory -------------------------------------------------------------------------------------------------------
@cuda
def test_deleting_a_wrapped_model_returns_its_graph_memory(grad_mode) -> None:
    def serve() -> ll.GraphedModule:
        model = mlp(256).cuda().eval()
        m = ll.wrap(model, cuda_graph=True)
        x = torch.randn(32768, 256, device="cuda")  # 32 MiB per activation: the graph's pool is ~100 MiB
        with grad_mode():
            m(x)
            call_replays(m, lambda: m(x))
        return m

    m = serve()  # once before measuring: one-time allocations (generator state, handles) are not the graph's
    del m
    settle_gpu_memory()
    pools_before, reserved_before = set(private_pool_bytes()), torch.cuda.memory_reserved()
    m = serve()
    graph_pools = {pool: size for pool, size in private_pool_bytes().items() if pool not in pools_before}
    assert graph_pools, "the graph holds no private pool: nothing to measure"
    held = sum(graph_pools.values())
    del m
    settle_gpu_memory()
    assert not set(graph_pools) & set(private_pool_bytes()), "the graph's pool outlived the wrapped model"
    grown = torch.cuda.memory_reserved() - reserved_before  # what is left: per-stream library workspaces at most
    assert grown <= held // 2, f"{grown / MiB:.1f} MiB still reserved of the graph's {held / MiB:.1f} MiB"


@cuda
def test_graph_memory_stays_bounded_under_ever_new_shapes(judged_faster) -> None:
    model = mlp(256).cuda().eval()
    m = ll.wrap(model, cuda_graph="auto", capture_after=1, max_graphs=2)

    def serve(rows: int) -> None:
        x = torch.randn(rows, 256, device="cuda")  # under 1 MiB per tensor
        with torch.no_grad():
            assert_bit_identical(m(x), model(x), f"batch of {rows}")

    def graph_memory() -> int:  # the private pools this model's graphs allocated from (not cuBLAS workspaces)
        settle_gpu_memory()
        return sum(size for pool, size in private_pool_bytes().items() if pool not in pools_before)

    settle_gpu_memory()
    pools_before = set(private_pool_bytes())
    # batch sizes shrink, so a freed graph's blocks fit the next one: only a graph that is kept can grow memory
    for rows in range(1000, 996, -1):  # two graphs held, two evicted: the steady state
        serve(rows)
    early = graph_memory()
    for rows in range(996, 972, -1):  # 24 more shapes, each seen once (a dynamic batch size)
        serve(rows)
    late = graph_memory()
    info = m.graph_info()
    assert len(info["graphs"]) <= 2 and info["evictions"] >= 24, info
    assert early > 0, "no graph memory to measure"
    # a graph's output alone is ~1 MiB: 24 graphs kept would add 24 MiB or more
    assert late - early <= 8 * MiB, f"graph memory grew from {early / MiB:.1f} to {late / MiB:.1f} MiB"


class RunsOutOfMemory(nn.Module):
    """Eight Linears (launch-bound: a graph "auto" keeps) whose capture fails with a real out-of-memory error for as
    long as ``exhausted`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Sequential(*(nn.Linear(64, 64) for _ in range(8)))
        self.exhausted = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        exhaust_while_capturing(self.exhausted, x.device)
        return self.lin(x)


def exhaust_while_capturing(exhausted: bool, device: torch.device) -> None:
    if exhausted and torch.cuda.is_current_stream_capturing():
        torch.empty(1 << 50, dtype=torch.uint8, device=device)  # a petabyte: torch.OutOfMemoryError


def oom_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "memory" in r.getMessage()]


@cuda
def test_out_of_memory_while_capturing_is_tried_again(grad_mode, caplog, judged_faster) -> None:
    model = RunsOutOfMemory().cuda().eval()
    x = torch.randn(8, 64, device="cuda")
    m = ll.wrap(model, cuda_graph="auto", capture_after=1)
    with grad_mode(), caplog.at_level(logging.INFO, logger="launchless"):
        assert_bit_identical(m(x), model(x), "the call whose capture ran out of memory")
        model.exhausted = False  # memory was freed
        for _ in range(RETRY_FIRST - 1):
            m(x)
        assert graph_count(m) == 0, "tried again before its wait was over"
        assert_bit_identical(m(x), model(x), "the call that captured")
        assert graph_count(m) == 1
        assert_bit_identical(call_replays(m, lambda: m(x)), model(x))
    (line,) = oom_warnings(caplog)
    assert "out of GPU memory during the capture" in line and f"trying again in {RETRY_FIRST} calls" in line, line

    model.exhausted = True  # cuda_graph=True raises while memory is short, and captures once it is not
    strict = ll.wrap(model, cuda_graph=True)
    with grad_mode():
        for _ in range(2):
            with pytest.raises(ll.CaptureError, match="out of GPU memory"):
                strict(x)
        model.exhausted = False
        assert_bit_identical(strict(x), model(x))
        assert graph_count(strict) == 1 and not strict.graph_info()["fallbacks"]


@cuda
def test_out_of_memory_while_capturing_a_training_step_is_tried_again(caplog) -> None:
    model = RunsOutOfMemory().cuda().train()
    opt = sgd_momentum(model.parameters())

    def step(x: torch.Tensor) -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        return loss

    graphed = ll.graphed_step(step, model=model, optimizer=opt, capture_after=2)
    x = torch.randn(8, 64, device="cuda")
    with caplog.at_level(logging.INFO, logger="launchless"):
        for _ in range(2):
            graphed(x)
        assert graph_count(graphed) == 0
        model.exhausted = False
        for _ in range(RETRY_FIRST):
            graphed(x)
        assert graph_count(graphed) == 1
        assert graphed.graph_info()["level"] == "whole-step graph"
        before = replays(graphed)
        graphed(x)
        assert replays(graphed) > before
    (line,) = oom_warnings(caplog)
    assert "out of memory" in line and "trying again later" in line, line


@cuda
def test_out_of_memory_while_capturing_a_compiled_graph_is_tried_again(fresh_dynamo, caplog) -> None:
    from launchless.compiler import graph_info

    state = {"exhausted": True}

    def inner(gm, example_inputs):
        def run(*args):
            exhaust_while_capturing(state["exhausted"], torch.device("cuda"))
            return gm(*args)

        return run

    model = mlp(64).cuda().eval()
    compiled = torch.compile(model, backend=make_backend(inner, capture_after=1, selective=False, indirection=False))
    x = torch.randn(8, 64, device="cuda")
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="launchless"):
        assert_bit_identical(compiled(x), model(x))
        state["exhausted"] = False
        for _ in range(RETRY_FIRST):
            compiled(x)
        assert_bit_identical(compiled(x), model(x))
    info = graph_info()[-1]  # compile order: this test's graph is the last one compiled
    assert len(info["graphs"]) == 1 and info["graphs"][0]["replays"] >= 1, info
    assert info["graphs"][0]["verification"]["status"] == "bit-identical", info
    (line,) = oom_warnings(caplog)
    assert "out of memory" in line and "trying again later" in line, line


@cuda
def test_release_graphs_then_call_again(grad_mode) -> None:
    model = mlp(256).cuda().eval()
    m = ll.wrap(model, cuda_graph=True)
    x = torch.randn(1024, 256, device="cuda")
    settle_gpu_memory()
    pools_before = set(private_pool_bytes())
    with grad_mode():
        m(x)
    graph_pools = set(private_pool_bytes()) - pools_before
    assert graph_count(m) == 1 and graph_pools
    m.release_graphs()
    settle_gpu_memory()
    assert graph_count(m) == 0
    assert not graph_pools & set(private_pool_bytes()), "release_graphs() kept the pool"
    with grad_mode():
        first = m(x)
        again = call_replays(m, lambda: m(x))
        want = model(x)
    assert_bit_identical(first, want, "first call after release_graphs()")
    assert_bit_identical(again, want, "replay after release_graphs()")
    assert graph_count(m) == 1


# ---- copies, pickles, state_dict -------------------------------------------------------------------------------
def _own_parameters_are_independent(copied: nn.Module, original: nn.Module) -> None:
    pairs = list(zip(copied.parameters(), original.parameters(), strict=True))
    assert pairs and all(p is not q and p.data_ptr() != q.data_ptr() for p, q in pairs)


@cuda
@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_copy_of_a_wrapped_model_with_graphs(how: str) -> None:
    model = mlp().cuda().eval()
    m = ll.wrap(model, cuda_graph=True)
    x = torch.randn(4, 64, device="cuda")
    with torch.no_grad():
        m(x)
    c = copy.deepcopy(m) if how == "deepcopy" else pickle.loads(pickle.dumps(m))
    assert isinstance(c, ll.GraphedModule)
    assert graph_count(c) == 0 and graph_count(m) == 1  # the copy starts without graphs
    _own_parameters_are_independent(c, m)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        assert_bit_identical(c(x), twin(x), "the copy, first call")
        assert_bit_identical(call_replays(c, lambda: c(x)), twin(x), "the copy, replayed")
        for p, q in zip(c.parameters(), twin.parameters(), strict=True):
            p.mul_(2)  # the copy's weights are its own...
            q.mul_(2)
        assert_bit_identical(call_replays(c, lambda: c(x)), twin(x), "the copy after its weights changed")
        assert_bit_identical(call_replays(m, lambda: m(x)), model(x), "...and the original is untouched")


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_copy_of_a_wrapped_model_on_cpu(how: str) -> None:
    model = mlp().eval()
    m = ll.wrap(model, cuda_graph="auto", capture_after=2, max_graphs=3)
    x = torch.randn(4, 64)
    with torch.no_grad():
        for _ in range(3):
            m(x)  # no GPU: eager, with a fallback recorded
    c = copy.deepcopy(m) if how == "deepcopy" else pickle.loads(pickle.dumps(m))
    assert isinstance(c, ll.GraphedModule)
    info = c.graph_info()
    assert info["graphs"] == []
    assert info["mode"] == "auto" and info["max_graphs"] == 3  # the options travel with the copy
    _own_parameters_are_independent(c, m)
    with torch.no_grad():
        assert_bit_identical(c(x), model(x))


def test_state_dict_of_a_wrapped_model_has_the_models_own_keys() -> None:
    model = conv_bn(seed=0)
    m = ll.wrap(model)
    assert list(m.state_dict()) == list(model.state_dict())
    plain = conv_bn(seed=1)
    plain.load_state_dict(m.state_dict())  # a checkpoint of the wrapped model loads into the plain one...
    assert_bit_identical(dict(plain.state_dict()), dict(model.state_dict()))
    other = conv_bn(seed=2)
    m.load_state_dict(other.state_dict())  # ...and the other way round
    assert_bit_identical(dict(model.state_dict()), dict(other.state_dict()))
    buffer = io.BytesIO()
    torch.save(m.state_dict(), buffer)
    buffer.seek(0)
    assert list(torch.load(buffer)) == list(model.state_dict())
    parent, plain_parent = nn.Sequential(ll.wrap(conv_bn())), nn.Sequential(conv_bn())  # also inside a parent
    assert list(parent.state_dict()) == list(plain_parent.state_dict())
    plain_parent.load_state_dict(parent.state_dict())


# ---- options and misuse -------------------------------------------------------------------------------------------
AT_LEAST_1 = r"(>=\s*1|at least 1|positive)"
BAD_WRAP_OPTIONS = {
    "cuda_graph-always": ({"cuda_graph": "always"}, [r"False", r"True", r"'auto'"]),
    "capture_after-0": ({"capture_after": 0}, [r"capture_after", AT_LEAST_1]),
    "max_graphs-0": ({"max_graphs": 0}, [r"max_graphs", AT_LEAST_1]),
    "max_graphs-minus1": ({"max_graphs": -1}, [r"max_graphs", AT_LEAST_1]),
    "warmup-0": ({"warmup": 0}, [r"warmup", AT_LEAST_1]),
    "verify-bogus": ({"verify": "bogus"}, [r"'on'", r"'strict'", r"'off'"]),
    "tolerance_ulps-minus1": ({"tolerance_ulps": -1.0}, [r"tolerance_ulps", r"(>=\s*0|non-negative|at least 0)"]),
    "outputs-copy": ({"outputs": "copy"}, [r"'clone'", r"'static'"]),
    "address_check-sometimes": ({"address_check": "sometimes"}, [r"'events'", r"'full'"]),
}


@pytest.mark.parametrize(("options", "accepted"), list(BAD_WRAP_OPTIONS.values()), ids=list(BAD_WRAP_OPTIONS))
def test_wrap_rejects_a_bad_option_naming_the_accepted_values(options: dict, accepted: list[str]) -> None:
    with pytest.raises(ll.ConfigError) as info:
        ll.wrap(mlp().eval(), **options)
    for pattern in accepted:
        assert re.search(pattern, str(info.value)), f"{pattern!r} not in: {info.value}"


def test_wrapping_a_wrapped_model_or_a_function_is_refused() -> None:
    m = ll.wrap(mlp().eval())
    with pytest.raises(ll.ConfigError, match="already wrapped"):
        ll.wrap(m)
    with pytest.raises(ll.ConfigError, match="Module"):
        ll.wrap(lambda x: x)


def test_capture_graph_when_graphs_are_off_or_the_model_trains() -> None:
    x = torch.randn(4, 64)
    with pytest.raises(ll.ConfigError, match="cuda_graph"):
        ll.wrap(mlp().eval(), cuda_graph=False).capture_graph(x)
    with pytest.raises(ll.ConfigError, match=r"\.eval\(\)"):
        ll.wrap(mlp().train(), cuda_graph=True).capture_graph(x)


BAD_STEP_OPTIONS = {
    "max_graphs-0": ({"max_graphs": 0}, [r"max_graphs", AT_LEAST_1]),
    "max_graphs-minus1": ({"max_graphs": -1}, [r"max_graphs", AT_LEAST_1]),
    "capture_after-1": ({"capture_after": 1}, [r"capture_after", r"(>=\s*2|at least 2)"]),
    "verify-bogus": ({"verify": "bogus"}, [r"'on'", r"'strict'", r"'off'"]),
}


@pytest.mark.parametrize(("options", "accepted"), list(BAD_STEP_OPTIONS.values()), ids=list(BAD_STEP_OPTIONS))
def test_graphed_step_rejects_a_bad_option(options: dict, accepted: list[str]) -> None:
    model = dropout_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ll.ConfigError) as info:
        ll.graphed_step(make_step(model, opt), model=model, optimizer=opt, **options)
    for pattern in accepted:
        assert re.search(pattern, str(info.value)), f"{pattern!r} not in: {info.value}"


def test_graphed_step_with_model_and_optimizer_swapped() -> None:
    model = dropout_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ll.ConfigError) as info:  # at construction, or at the latest at the first step
        step = ll.graphed_step(make_step(model, opt), model=opt, optimizer=model)
        step(torch.randn(4, 32), torch.randint(0, 10, (4,)))
    message = str(info.value)
    assert "model=" in message and "optimizer=" in message, message


BAD_BACKEND_OPTIONS = {
    "max_graphs-0": ({"max_graphs": 0}, "max_graphs"),
    "capture_after-0": ({"capture_after": 0}, "capture_after"),
    "verify-bogus": ({"verify": "bogus"}, "verify"),
    "misspelt-option": ({"capture_afer": 2}, "capture_afer"),
}


@pytest.mark.parametrize(("options", "name"), list(BAD_BACKEND_OPTIONS.values()), ids=list(BAD_BACKEND_OPTIONS))
def test_make_backend_rejects_a_bad_option(options: dict, name: str) -> None:
    # a bad value is a ConfigError; a misspelt keyword may be Python's own TypeError, which names it too
    errors = (ll.ConfigError, TypeError) if name not in ("max_graphs", "capture_after", "verify") else ll.ConfigError
    with pytest.raises(errors, match=name):
        make_backend(**options)


@pytest.mark.parametrize(("options", "name"), list(BAD_BACKEND_OPTIONS.values()), ids=list(BAD_BACKEND_OPTIONS))
def test_torch_compile_bad_option_names_the_option(options: dict, name: str, fresh_dynamo) -> None:
    compiled = torch.compile(nn.Linear(4, 4), backend=launchless_backend, options=options)
    with pytest.raises((ll.ConfigError, torch._dynamo.exc.BackendCompilerFailed)) as info:
        compiled(torch.randn(2, 4))
    error = config_error_in(info.value)
    assert error is not None, f"no launchless.ConfigError behind {info.value!r}"
    assert name in str(error), str(error)


def test_torch_compile_options_are_accepted_on_cpu(tmp_path, fresh_dynamo) -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU()).eval()
    options = {"capture_after": 2, "max_graphs": 2, "verify": "on", "selective": False, "cache_dir": str(tmp_path)}
    compiled = torch.compile(model, backend=launchless_backend, options=options)
    x = torch.randn(4, 8)
    with torch.no_grad():
        for _ in range(3):
            # no GPU, no graph: Inductor's CPU kernels may round differently from eager's, hence a tolerance
            torch.testing.assert_close(compiled(x), model(x))


# ---- GPU: the options at work ----------------------------------------------------------------------------------
@cuda
def test_wrap_verify_off_skips_verification() -> None:
    model = mlp().cuda().eval()
    m = ll.wrap(model, cuda_graph=True, verify="off")
    x = torch.randn(4, 64, device="cuda")
    with torch.no_grad():
        assert_bit_identical(m(x), model(x))
        assert_bit_identical(call_replays(m, lambda: m(x)), model(x))
    assert m.graph_info()["graphs"][0]["verification"]["status"] == "skipped"


@cuda
def test_graphed_step_verify_off_skips_verification() -> None:
    model, opt, twin, twin_opt = train_twins(sgd_momentum)
    graphed = ll.graphed_step(make_step(model, opt), model=model, optimizer=opt, verify="off")
    run_twins(graphed, make_step(twin, twin_opt), classifier_batches(6))
    info = graphed.graph_info()
    assert info["level"] == "whole-step graph" and replays(graphed) >= 2, info
    assert info["graphs"][0]["verification"]["status"] == "skipped", info
    assert_same_training_state(model, opt, twin, twin_opt)


@cuda
def test_opaque_object_output_is_refused_by_name() -> None:
    model = ReturnsOpaque().cuda().eval()
    x = torch.randn(4, 64, device="cuda")
    with torch.no_grad(), pytest.raises(ll.CaptureError, match="Opaque"):
        ll.wrap(model, cuda_graph=True)(x)
    soft = ll.wrap(model, cuda_graph="auto", capture_after=1)
    with torch.no_grad():
        for _ in range(3):
            out, want = soft(x), model(x)
            assert type(out) is Opaque and torch.equal(out.logits, want.logits), "'auto' runs it eager"
    assert graph_count(soft) == 0


@cuda
def test_dataclass_outputs_are_copied_and_verified(grad_mode) -> None:
    model = ReturnsDataclass().cuda().eval()
    m = ll.wrap(model, cuda_graph=True)
    x, x2 = torch.randn(4, 64, device="cuda"), torch.randn(4, 64, device="cuda")
    with grad_mode():
        m(x)
        first = call_replays(m, lambda: m(x))
        kept = first.probabilities.clone()
        second = call_replays(m, lambda: m(x2))
        want = model(x2)
    assert type(second) is Prediction and second.scale == 2.0
    assert_bit_identical((second.logits, second.probabilities), (want.logits, want.probabilities))
    assert torch.equal(first.probabilities, kept), "the first result was overwritten by the next replay"
    assert m.graph_info()["graphs"][0]["verification"]["status"] == "bit-identical"


@cuda
def test_torch_compile_options_reach_the_backend(tmp_path, fresh_dynamo) -> None:
    model = mlp().cuda().eval()
    x = torch.randn(8, 64, device="cuda")
    reference = torch.compile(
        model, backend=make_backend(capture_after=10**9, selective=False, cache_dir=str(tmp_path))
    )
    with torch.no_grad():
        want = reference(x)  # the same Inductor code, run without a graph
    torch._dynamo.reset()
    spy, made = spy_on(launchless_backend)
    options = {"capture_after": 4, "max_graphs": 2, "verify": "on", "selective": False, "cache_dir": str(tmp_path)}
    compiled = torch.compile(model, backend=spy, options=options)
    with torch.no_grad():
        for i in range(3):
            assert_bit_identical(compiled(x), want, f"call {i}")
            assert compiled_graph_count(made) == 0, f"captured at call {i + 1}, before capture_after=4"
        assert_bit_identical(compiled(x), want, "call 4: captured")
        assert compiled_graph_count(made) == 1
        held = compiled_replays(made)
        assert_bit_identical(compiled(x), want, "call 5: replayed")
        assert compiled_replays(made) > held
