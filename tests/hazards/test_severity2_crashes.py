"""Hazard catalogue, severity 2: crashes, hangs and a poisoned process.

A CUDA graph capture that goes wrong does not stay local: a capture that is never ended leaves the stream in
capture mode, the default generator in graph mode or a memory pool marked as recording, and every later CUDA call
in the process fails -- or another thread's ``cudaHostAlloc`` invalidates the capture, or replays run on the wrong
device. In these scenarios a naive graph library raises deep inside PyTorch, hangs, or leaves the process
unusable. Each test asserts the clear error the library must raise (or that the call works), and then that the
process still works: eager, random numbers, and a fresh capture of another model, compared bit for bit with eager.

Scenarios (entry point) and what goes wrong without the library's protection:
"""

# test_host_sync_in_the_one_graph_asked_for_names_item_and_the_line (wrap): `.item()` during capture is "operation
#     not permitted when stream is capturing", the capture is invalidated and the process poisoned; where the one
#     graph is asked for (capture_graph()) the library must raise CaptureError naming `.item()` and the source line,
#     and stay usable; a call replays graphs around the read, bit for bit.
# test_exception_raised_inside_forward_for_one_input (wrap): the user's own exception during warm-up or capture
#     must propagate unchanged and leave the lock, the stream and the other signatures' graphs working.
# test_cuda_oom_during_capture_leaves_the_process_usable (wrap): an OutOfMemoryError in the middle of a capture
#     leaves the capture open and the generator in graph mode unless the library ends both.
# test_pinned_dataloader_iterating_while_graphs_are_captured (wrap): the pin-memory thread's cudaHostAlloc during
#     a global-mode capture invalidates it (and is corrupted by it).
# test_two_threads_wrapping_and_capturing_different_models (wrap): two captures at once in global mode
#     invalidate each other.
# test_output_refused_for_one_signature_then_another_captures (wrap): a graph captured and then dropped (its
#     output cannot be copied) leaves a pool with no live graph, and PyTorch asserts on the next capture into it.
# test_model_on_the_second_gpu (wrap): capturing on the current device (cuda:0) for a model on cuda:1 fails or
#     reads another device's memory.
# test_inputs_created_under_the_other_grad_mode (wrap): inference tensors passed under no_grad (and normal
#     tensors under inference_mode) must be accepted as eager accepts them.
# test_graph_captured_under_one_grad_mode_replayed_under_the_other (wrap): static buffers made under
#     inference_mode are inference tensors, which may not be written outside it: the next replay raises.
# test_gradient_checkpointing_inside_the_model (graphed_step): torch.utils.checkpoint reads the RNG state on the
#     host, which raises during capture; whatever level runs, the steps must equal eager.
# test_batch_created_under_inference_mode_and_cloned (graphed_step): a batch made by an inference-mode data
#     pipeline and cloned by the user must train as eager does (an inference tensor cannot be saved for backward).

from __future__ import annotations

import copy
import inspect
import re
import threading
import time
from pathlib import Path

import pytest
import torch
from conftest import (
    WHOLE_STEP,
    assert_bit_identical,
    assert_same_training_state,
    call_replays,
    classifier_batches,
    graph_count,
    make_step,
    mlp,
    other_grad_mode,
    replays,
    run_in_threads,
    run_twins,
    sgd_momentum,
    train_twins,
)
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, TensorDataset

import launchless as ll

cuda = pytest.mark.cuda


def _process_still_works(grad_mode) -> None:
    """Eager, random numbers and a fresh capture of another model all work, the capture bit-identical to eager."""
    torch.randn(16, device="cuda").sum().item()  # the default generator is not stuck in graph mode
    other = mlp(seed=5).cuda().eval()
    fresh = ll.wrap(other, cuda_graph=True)
    x = torch.randn(4, 64, device="cuda")
    with grad_mode():
        assert_bit_identical(fresh(x), other(x), "a fresh capture of another model")
        assert_bit_identical(call_replays(fresh, lambda: fresh(x)), other(x), "its replay")
    torch.cuda.synchronize()


class SyncsOnItem(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        if y.abs().sum().item() > 1e9:  # the host sync under test
            y = y * 2
        return y


class RejectsOddBatches(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] % 2:
            raise ValueError("odd batch sizes are not supported by this model")  # the user's own check
        return self.lin(x)


class Checkpointed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(32, 64)
        self.block = nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Dropout(0.2), nn.Linear(64, 64))
        self.head = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.inp(x))
        h = checkpoint(self.block, h, use_reentrant=False)  # recomputed in backward, with the same dropout mask
        return self.head(h)


# ---- inference: wrap ---------------------------------------------------------------------------------------------
@cuda
def test_host_sync_in_the_one_graph_asked_for_names_item_and_the_line(grad_mode) -> None:
    model = SyncsOnItem().cuda().eval()
    bad = ll.wrap(model, cuda_graph=True)
    x = torch.randn(4, 64, device="cuda")
    with grad_mode(), pytest.raises(ll.CaptureError) as info:
        bad.capture_graph(x)
    message = str(info.value)
    lines, first = inspect.getsourcelines(SyncsOnItem.forward)
    line = first + next(i for i, text in enumerate(lines) if ".item()" in text)
    assert ".item()" in message, message
    assert f"{Path(__file__).name}:{line}" in message, message
    with grad_mode(), pytest.raises(ll.CaptureError):  # the same capture raises again, it does not crash
        bad.capture_graph(x)
    assert graph_count(bad) == 0
    auto = ll.wrap(model, capture_after=1)  # a call replays graphs around the read (or runs split, or eager)
    with grad_mode():
        for i in range(3):
            fresh = torch.randn(4, 64, device="cuda")
            assert_bit_identical(auto(fresh), model(fresh), f"call {i} around the read")
    _process_still_works(grad_mode)


@cuda
def test_exception_raised_inside_forward_for_one_input(grad_mode) -> None:
    model = RejectsOddBatches().cuda().eval()
    m = ll.wrap(model, cuda_graph=True)
    even, odd, other = (torch.randn(n, 64, device="cuda") for n in (4, 3, 6))
    with grad_mode():
        assert_bit_identical(m(even), model(even), "captured")
        for _ in range(2):
            with pytest.raises(ValueError, match="odd batch sizes"):
                m(odd)
            assert_bit_identical(call_replays(m, lambda: m(even)), model(even), "replay after the exception")
        assert_bit_identical(m(other), model(other), "a new signature captured after the exception")
        assert_bit_identical(call_replays(m, lambda: m(other)), model(other), "its replay")
    assert graph_count(m) == 2
    _process_still_works(grad_mode)


@cuda
def test_cuda_oom_during_capture_leaves_the_process_usable(grad_mode, monkeypatch: pytest.MonkeyPatch) -> None:
    model = mlp().cuda().eval()
    twin = copy.deepcopy(model)
    original = model.forward

    def forward(x: torch.Tensor) -> torch.Tensor:
        if torch.cuda.is_current_stream_capturing():  # out of memory while capturing, only then
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated during capture)")
        return original(x)

    monkeypatch.setattr(model, "forward", forward)
    x = torch.randn(4, 64, device="cuda")
    loud = ll.wrap(model, cuda_graph=True)
    with grad_mode(), pytest.raises((ll.CaptureError, torch.cuda.OutOfMemoryError)):
        loud(x)
    soft = ll.wrap(model, cuda_graph="auto", capture_after=1)
    with grad_mode():
        for _ in range(3):  # the capture fails, the call runs eager
            assert_bit_identical(soft(x), twin(x), "'auto' after an OOM during capture")
    assert graph_count(soft) == 0 and graph_count(loud) == 0
    _process_still_works(grad_mode)
    monkeypatch.undo()  # memory is back: the model itself is not left broken, a new wrapper of it captures
    again = ll.wrap(model, cuda_graph=True)
    with grad_mode():
        assert_bit_identical(again(x), twin(x), "capture once memory is back")
        assert_bit_identical(call_replays(again, lambda: again(x)), twin(x), "its replay")


@cuda
def test_pinned_dataloader_iterating_while_graphs_are_captured(grad_mode) -> None:
    data, labels = torch.randn(1024, 64), torch.arange(1024)
    loader = DataLoader(TensorDataset(data, labels), batch_size=8, num_workers=2, pin_memory=True)
    batches: list = []
    errors: list[BaseException] = []

    def consume(iterator) -> None:  # the pin-memory thread calls cudaHostAlloc for every batch kept here
        try:
            for batch in iterator:
                batches.append(batch)
                time.sleep(0.001)  # a consumer with work of its own: pinning goes on while graphs are captured
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    model = mlp().cuda().eval()
    m = ll.wrap(model, cuda_graph=True, max_graphs=64)
    iterator = iter(loader)  # forks the workers and starts the pin-memory thread before any capture runs
    reader = threading.Thread(target=consume, args=(iterator,))
    reader.start()
    captured = 0
    try:
        with grad_mode():
            while captured < 8 or (reader.is_alive() and captured < 48):  # a capture per new batch size
                captured += 1
                x = torch.randn(captured, 64, device="cuda")
                assert_bit_identical(m(x), model(x), f"batch of {captured}, captured")
                assert_bit_identical(call_replays(m, lambda x=x: m(x)), model(x), f"batch of {captured}, replayed")
    finally:
        reader.join(timeout=120)
    assert not reader.is_alive(), "the DataLoader hangs"
    assert not errors, errors
    assert graph_count(m) == captured
    assert all(xb.is_pinned() for xb, _ in batches)
    assert_bit_identical(torch.cat([xb for xb, _ in batches]), data, "every batch the loader delivered")
    assert_bit_identical(torch.cat([yb for _, yb in batches]), labels, "every label the loader delivered")


@cuda
def test_two_threads_wrapping_and_capturing_different_models(grad_mode) -> None:
    models = [mlp(seed=s).cuda().eval() for s in range(2)]
    inputs = [torch.randn(8, 64, device="cuda") for _ in range(2)]
    wrapped: list = [None, None]
    results: list = [None, None]
    torch.cuda.synchronize()

    def work(i: int) -> None:
        with grad_mode(), torch.cuda.stream(torch.cuda.Stream()):
            wrapped[i] = ll.wrap(models[i], cuda_graph=True)
            results[i] = [wrapped[i](inputs[i]) for _ in range(5)]
            torch.cuda.current_stream().synchronize()

    run_in_threads(work)  # both wrap and capture at the same moment; fails with what a thread raised
    torch.cuda.synchronize()
    with grad_mode():
        for i in range(2):
            assert replays(wrapped[i]) >= 5, wrapped[i].graph_info()
            for k, out in enumerate(results[i]):
                assert_bit_identical(out, models[i](inputs[i]), f"thread {i}, call {k}")
    _process_still_works(grad_mode)


@cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs a second GPU")
def test_model_on_the_second_gpu(grad_mode) -> None:
    assert torch.cuda.current_device() == 0
    model = mlp().to("cuda:1").eval()
    m = ll.wrap(model, cuda_graph=True)
    xs = [torch.randn(4, 64, device="cuda:1") for _ in range(3)]
    with grad_mode():
        m(xs[0])
        outs = [call_replays(m, lambda x=x: m(x)) for x in xs]
        wants = [model(x) for x in xs]
    assert torch.cuda.current_device() == 0
    for i, (out, want) in enumerate(zip(outs, wants, strict=True)):
        assert out.device == torch.device("cuda:1")
        assert_bit_identical(out, want, f"call {i} on cuda:1")


@cuda
def test_inputs_created_under_the_other_grad_mode(grad_mode) -> None:
    model = mlp().cuda().eval()
    m = ll.wrap(model, cuda_graph=True)
    with other_grad_mode(grad_mode)():
        xs = [torch.randn(4, 64, device="cuda") for _ in range(3)]
    with grad_mode():
        m(xs[0])
        outs = [call_replays(m, lambda x=x: m(x)) for x in xs]
        wants = [model(x) for x in xs]
    for i, (out, want) in enumerate(zip(outs, wants, strict=True)):
        assert_bit_identical(out, want, f"input {i}, made under the other grad mode")


@cuda
def test_graph_captured_under_one_grad_mode_replayed_under_the_other(grad_mode) -> None:
    model = mlp().cuda().eval()
    m = ll.wrap(model, cuda_graph=True)
    x = torch.randn(4, 64, device="cuda")
    with grad_mode():
        m(x)  # captured here
    for mode in (other_grad_mode(grad_mode), grad_mode, other_grad_mode(grad_mode)):
        with mode():
            y = call_replays(m, lambda: m(x))
            want = model(x)
        assert_bit_identical(y, want, f"replayed under {mode.__name__}")
    assert graph_count(m) == 1


class Boxed:  # a plain object, not registered with torch.utils._pytree: launchless cannot look inside
    def __init__(self, value: torch.Tensor) -> None:
        self.value = value


class MaybeBoxed(nn.Module):
    """Returns an opaque object or a tensor depending on a flag, as transformers' ``return_dict`` does."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor, boxed: bool):
        y = self.lin(x)
        return Boxed(y) if boxed else y


@cuda
def test_output_refused_for_one_signature_then_another_captures(grad_mode) -> None:
    model = MaybeBoxed().cuda().eval()
    m = ll.wrap(model, cuda_graph=True)
    x = torch.randn(4, 64, device="cuda")
    with grad_mode():
        with pytest.raises(ll.CaptureError, match="Boxed"):  # captured, then refused: its pool holds no graph
            m(x, True)
        assert_bit_identical(m(x, False), model(x, False), "the next signature, captured into the same model's pool")
        assert_bit_identical(call_replays(m, lambda: m(x, False)), model(x, False), "its replay")
        with pytest.raises(ll.CaptureError, match="Boxed"):
            m(x, True)
    assert graph_count(m) == 1
    _process_still_works(grad_mode)


# ---- training: graphed_step ----------------------------------------------------------------------------------
@cuda
def test_gradient_checkpointing_inside_the_model() -> None:
    model, opt, twin, twin_opt = train_twins(sgd_momentum, build=Checkpointed)
    graphed = ll.graphed_step(make_step(model, opt), model=model, optimizer=opt)
    run_twins(graphed, make_step(twin, twin_opt), classifier_batches(10))
    info = graphed.graph_info()
    assert re.fullmatch(r"eager|whole-step graph|forward\+backward graph.*", info["level"]), info
    if info["level"] != "eager":  # a graph level must have replayed; eager must say why
        assert replays(graphed) >= 2, info
    else:
        assert info["eager_reason"] or info["fallbacks"], info
    assert_same_training_state(model, opt, twin, twin_opt)


@cuda
def test_batch_created_under_inference_mode_and_cloned() -> None:
    model, opt, twin, twin_opt = train_twins(sgd_momentum)
    graphed = ll.graphed_step(make_step(model, opt), model=model, optimizer=opt)
    with torch.inference_mode():  # an inference-mode data pipeline
        made = classifier_batches(10)
    batches = [(x.clone(), y.clone()) for x, y in made]  # the user's clone, outside inference mode
    assert not batches[0][0].is_inference()
    run_twins(graphed, make_step(twin, twin_opt), batches)
    info = graphed.graph_info()
    assert info["level"] == WHOLE_STEP and replays(graphed) >= 2, info
    assert_same_training_state(model, opt, twin, twin_opt)
