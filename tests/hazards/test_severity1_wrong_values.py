"""Hazard catalogue, severity 1: silently wrong values.

The worst class. A CUDA graph replays the kernels and addresses it recorded, whatever has changed since: a naive
graph library in these scenarios returns numbers that look fine and are wrong -- an earlier output overwritten,
a parameter read from where it used to be, a hook, a switch or a new learning rate ignored, an optimizer state
that is no longer the optimizer's. Each test compares launchless with eager bit for bit (inference: the same model
in eval mode, or a copy made before wrapping; training: an identical model and optimizer stepped eager through the
same events), after checking that a graph really replayed -- an eager fallback would pass trivially.

Scenarios (entry point) and what goes wrong without the library's protection:
"""

# test_output_held_across_replays_keeps_its_values (wrap): the next replay overwrites the graph's output buffer,
#     so an output the caller still holds silently becomes a later call's result.
# test_caller_mutating_a_returned_output_in_place (wrap): the caller's in-place post-processing either writes into
#     the graph's buffer or is overwritten by the next replay.
# test_forward_writing_into_its_input_replays_and_writes_the_callers_tensor_as_eager (wrap, cuda_graph=True): a
#     graph writes into its static copy of the input, never into the caller's tensor; each replay must copy the
#     write back.
# test_forward_writing_into_its_input_under_auto_keeps_eager_semantics (wrap, "auto"): the caller's tensor must be
#     written exactly as eager writes it, by the graph "auto" keeps.
# test_a_written_input_that_shares_memory_with_another_input_is_refused (wrap): eager's write changes both
#     inputs; separate static copies would not.
# test_a_refused_capture_with_its_warm_up_still_queued_leaves_the_eager_result_alone (wrap, "auto"): a capture
#     refused after warm-up frees its static input buffers while kernels that write them are still queued on the
#     side stream (a busy GPU); the call's eager result, given that memory, is written by them.
# test_non_contiguous_and_channels_last_inputs (wrap): eager picks other kernels for another layout; a graph
#     captured for a dense input and fed a transposed view or channels_last input returns other bits.
# test_cpu_input_refilled_by_the_caller_right_after_the_call (wrap): an asynchronous copy from a pinned buffer
#     that the caller refills right after the call reads the next batch's values.
# test_two_wrapped_models_sharing_a_submodule (wrap): replacing a shared parameter through one model leaves the
#     other model's graph reading freed memory.
# test_same_model_wrapped_twice (wrap): two wrappers' graphs of one model must neither share buffers nor miss
#     each other's weight updates.
# test_load_state_dict_in_place_keeps_the_graph_and_uses_the_new_values (wrap): in-place loads keep addresses;
#     the graph must stay and read the new weights.
# test_load_state_dict_with_assign_drops_the_graph (wrap): assign=True moves every parameter; a kept graph
#     reads the old (freed) tensors.
# test_weights_replaced_by_a_half_precision_copy (wrap): .half() replaces every parameter; a kept graph reads
#     freed float32 memory.
# test_to_dtype_and_to_channels_last (wrap): .to(float64) / .to(memory_format=channels_last) relocate the weights.
# test_swapped_submodule (wrap): a graph keeps running the old submodule's kernels on the old weights.
# test_eval_train_switch_between_calls (wrap): a graph captured in eval mode replayed in training mode skips
#     dropout and BatchNorm's batch statistics and running-stat updates.
# test_hook_added_after_capture_is_not_ignored (wrap): a replay never calls the module, so a hook registered
#     after capture would silently not run.
# test_python_value_read_by_forward_is_frozen_at_capture_as_documented (wrap): documented limitation -- a Python
#     float read by forward is frozen into the graph; the test pins the README's statement.
# test_forward_reading_the_clock_is_refused_by_verification (wrap): a value that changes on every call
#     (time) would be frozen silently; verification must refuse the graph.
# test_autocast_toggled_between_calls (wrap): a graph captured without autocast replayed under autocast returns
#     float32 where eager returns bfloat16 (and the reverse).
# test_global_numerics_flag_toggled_between_calls (wrap): TF32, cuDNN benchmark and deterministic algorithms pick
#     kernels; a graph captured under the other setting replays the other kernels.
# test_dropout_in_eval_mode_replays_like_eager (wrap): eval-mode dropout is the identity; a graph must not draw
#     random numbers or be refused as random.
# test_structured_outputs_with_none (wrap): dict / dataclass / tuple outputs holding None must come back whole and
#     survive the next replay.
# test_two_threads_calling_one_wrapped_model (wrap): two threads sharing one graph's static input buffers would
#     replay each other's inputs.
# test_checkpoint_resume_mid_run (graphed_step): optimizer.load_state_dict replaces the state tensors; a graph
#     keeps updating the old momentum / Adam moments.
# test_optimizer_state_cleared_mid_run (graphed_step): the cleared state is recreated elsewhere; the graph keeps
#     the old buffers.
# test_optimizer_state_tensors_deleted_and_made_again_mid_run (graphed_step): a new state tensor made where a freed
#     one was takes its id(); a check by identity alone misses it and the graph updates the freed tensors.
# test_add_param_group_mid_run (graphed_step): the new layer's parameters are not in the captured optimizer step.
# test_learning_rate_set_by_assignment (graphed_step): the graph froze the old number.
# test_scheduler_load_state_dict_mid_run (graphed_step): a rewound schedule must set the lr the graph reads.
# test_grad_scaler_load_state_dict_mid_run (graphed_step): the loaded scale must be the one the graph uses.
# test_freeze_then_unfreeze_a_layer (graphed_step): the captured backward computes the old set of gradients.
# test_load_state_dict_assign_mid_run (graphed_step): the graph keeps training the old parameter tensors, while
#     eager trains the new ones' forward (and the optimizer, holding the old ones, updates nothing of the model).
# test_dropout_in_training_matches_eager_under_the_same_seed (graphed_step): a graph must draw the numbers eager
#     draws from the same seed.
# test_batchnorm_running_statistics_after_n_steps (graphed_step): verification runs a step twice; running
#     statistics and num_batches_tracked must still count each step once.
# test_eval_train_switching_between_steps (graphed_step): a training-mode graph replayed in eval mode.
# test_zero_grad_inside_and_outside_the_step (graphed_step): gradients set to None or zeroed outside the step must
#     be what the replay accumulates into, as in eager.
# test_compiled_replay_equals_the_same_compilation_without_graphs (torch.compile backend): replay under no_grad /
#     inference_mode against the same Inductor code run without a graph.
# test_cublas_workspaces_emptied_after_capture (wrap, in a fresh process each): a graph's matmuls write into the
#     cuBLAS workspace they were captured with; PyTorch keeps workspaces in a process-wide map that torch.compile's
#     CUDA graph trees (and memory clean-up code) empty, freeing them -- a graph whose workspace was not its own then
#     writes into another tensor's memory, or memory given back to the driver (an illegal memory access).
# test_cufft_plan_cache_cleared_after_capture (wrap, in a fresh process): an FFT's captured kernels read the plan's
#     own device memory (cuFFT allocates it when PyTorch makes the plan, outside any pool); clearing or evicting the
#     process-wide plan cache destroys the plan and frees that memory under the graph.
# test_a_hand_captured_graph_owning_its_workspace_survives_a_later_capture (a graph of the user's own, in a fresh
#     process): launchless empties the workspace map around each capture, as the graph trees do; a graph captured by
#     hand under launchless.own_blas_workspaces() owns its workspace and is not touched by that.
# test_two_wrapped_models_replayed_at_once_on_two_streams (wrap): graphs captured on one stream recorded the one
#     cuBLAS workspace of that stream; two of them replayed at once on two streams would share its scratch memory.
# test_compiled_graph_after_parameters_are_replaced (torch.compile backend): load_state_dict(assign=True) or a
#     round trip through the CPU moves the parameters the graph reads in place.

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import logging
import time
from collections.abc import Callable

import pytest
import torch
from conftest import (
    OPTIMIZERS,
    adamw,
    assert_bit_identical,
    assert_same_training_state,
    assert_whole_step_replaying,
    bit_identical,
    call_replays,
    classifier_batches,
    compiled_graph_count,
    compiled_replays,
    conv_bn,
    dropout_mlp,
    graph_count,
    make_step,
    mlp,
    replays,
    run_in_threads,
    run_twins,
    sgd_momentum,
    spy_on,
    train_twins,
)
from torch import nn

import launchless as ll
from launchless.compiler.backend import make_backend

cuda = pytest.mark.cuda


# ---- helper models -----------------------------------------------------------------------------------------------
class WritesItsInput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(0.5)  # the in-place write into the caller's tensor under test
        return self.lin(x)


class WritesItsInputDeep(WritesItsInput):
    """Halves its input in place, then eight layers: launch-bound, a graph "auto" keeps."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(*(nn.Sequential(nn.Linear(64, 64), nn.GELU()) for _ in range(8)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(super().forward(x))


class WritesOneReadsTheOther(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor, view: torch.Tensor) -> torch.Tensor:
        x.mul_(0.5)  # also halves ``view`` where it is a view of ``x``
        return self.lin(x) + view.sum()


class CopiesToDevice(nn.Module):
    """Takes a CPU batch and copies it to the GPU itself, blocking: eager has read the batch when it returns."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x.to(self.lin.weight.device))


SCALE = 2.0  # a module global read by ReadsPythonValues.forward


class ReadsPythonValues(nn.Module):
    def __init__(self, source: str) -> None:
        super().__init__()
        self.lin = nn.Linear(64, 64)
        self.source = source
        self.scale = 2.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.scale if self.source == "self_attribute" else SCALE  # a Python float, read on the host
        return self.lin(x) * scale


class ReadsTheClock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * float(time.perf_counter_ns() % 9973 + 1)  # a host value new on every call


@dataclasses.dataclass
class Prediction:
    logits: torch.Tensor
    hidden: torch.Tensor
    extra: torch.Tensor | None = None


torch.export.register_dataclass(Prediction)  # a pytree node, as the README asks of dataclass outputs


class Structured(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.body = nn.Linear(64, 64)
        self.head = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor):
        hidden = torch.relu(self.body(x))
        logits = self.head(hidden)
        if self.kind == "dict":
            return {"logits": logits, "aux": None, "hidden": hidden}
        if self.kind == "dataclass":
            return Prediction(logits, hidden, None)
        return logits, None, (hidden, None)


# ---- inference: wrap ---------------------------------------------------------------------------------------------
@cuda
def test_output_held_across_replays_keeps_its_values(grad_mode) -> None:
    model = mlp().cuda().eval()
    m = ll.wrap(model, cuda_graph=True)
    xs = [torch.randn(4, 64, device="cuda") for _ in range(4)]
    with grad_mode():
        outs = [m(xs[0])]
        outs += [call_replays(m, lambda x=x: m(x)) for x in xs[1:]]
        wants = [model(x) for x in xs]
    assert graph_count(m) == 1
    for i, (out, want) in enumerate(zip(outs, wants, strict=True)):
        assert_bit_identical(out, want, f"output of call {i}, held over {len(xs) - 1 - i} later replays")


@cuda
def test_caller_mutating_a_returned_output_in_place(grad_mode) -> None:
    model = mlp().cuda().eval()
    m = ll.wrap(model, cuda_graph=True)
    a, b = torch.randn(4, 64, device="cuda"), torch.randn(4, 64, device="cuda")
    with grad_mode():
        m(a)  # captured
        y = call_replays(m, lambda: m(a))
        y.mul_(-1).add_(3)  # the caller's own post-processing, in place
        mutated = y.clone()
        yb = call_replays(m, lambda: m(b))
        ya = call_replays(m, lambda: m(a))
        want_a, want_b = model(a), model(b)
    assert_bit_identical(y, mutated, "the caller's mutated output after two more replays")
    assert_bit_identical(yb, want_b)
    assert_bit_identical(ya, want_a, "a replay after the caller mutated an earlier output")


@cuda
def test_forward_writing_into_its_input_replays_and_writes_the_callers_tensor_as_eager(grad_mode) -> None:
    model = WritesItsInput().cuda().eval()
    twin = copy.deepcopy(model)
    m = ll.wrap(model, cuda_graph=True)
    with grad_mode():
        for i in range(4):
            x = torch.randn(4, 64, device="cuda")
            x_twin = x.clone()
            y = call_replays(m, functools.partial(m, x)) if i else m(x)
            want = twin(x_twin)
            assert_bit_identical(y, want, f"output of call {i}")
            assert_bit_identical(x, x_twin, f"the caller's input after call {i} (eager halves it in place)")
    assert graph_count(m) == 1


@cuda
def test_forward_writing_into_its_input_under_auto_keeps_eager_semantics(grad_mode, judged_faster) -> None:
    model = WritesItsInputDeep().cuda().eval()
    twin = copy.deepcopy(model)
    m = ll.wrap(model, cuda_graph="auto", capture_after=2)
    with grad_mode():
        for i in range(6):
            x = torch.randn(4, 64, device="cuda")
            x_twin = x.clone()
            y, want = m(x), twin(x_twin)
            assert_bit_identical(y, want, f"output of call {i}")
            assert_bit_identical(x, x_twin, f"the caller's input after call {i} (eager halves it in place)")
    (row,) = m.graph_info()["graphs"]
    assert row["replays"] >= 3 and row["verification"]["status"] == "bit-identical", row


@cuda
def test_a_written_input_that_shares_memory_with_another_input_is_refused(grad_mode) -> None:
    """Eager's write into ``x`` changes ``view`` too (one memory); a graph's separate static copies would not."""
    model = WritesOneReadsTheOther().cuda().eval()
    twin = copy.deepcopy(model)
    with grad_mode(), pytest.raises(ll.CaptureError, match="shares memory with another input"):
        x = torch.randn(4, 64, device="cuda")
        ll.wrap(model, cuda_graph=True)(x, x[:, :32])
    m = ll.wrap(model, cuda_graph="auto", capture_after=1)
    with grad_mode():
        for i in range(3):
            x = torch.randn(4, 64, device="cuda")
            x_twin = x.clone()
            assert_bit_identical(m(x, x[:, :32]), twin(x_twin, x_twin[:, :32]), f"output of call {i}")
            assert_bit_identical(x, x_twin, f"the caller's input after call {i}")
    assert graph_count(m) == 0 and m.graph_info()["fallbacks"], m.graph_info()


class CountsOnAHostTensor(nn.Module):
    """Adds one to a CPU counter it is given, in place, and offsets its output by the count: a GPU graph would add
    it once, at capture."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
        count.add_(1)
        return self.lin(x) + count.to(x.device, non_blocking=False)


@cuda
def test_a_forward_writing_a_cpu_tensor_it_was_given_is_refused_and_auto_counts_as_eager(grad_mode) -> None:
    model = CountsOnAHostTensor().cuda().eval()
    twin = copy.deepcopy(model)
    with grad_mode(), pytest.raises(ll.CaptureError, match="writes in place into a CPU tensor"):
        ll.wrap(model, cuda_graph=True)(torch.randn(4, 64, device="cuda"), torch.zeros(1))
    m = ll.wrap(model, cuda_graph="auto", capture_after=1)
    count, count_twin = torch.zeros(1), torch.zeros(1)
    with grad_mode():
        for i in range(4):
            x = torch.randn(4, 64, device="cuda")
            assert_bit_identical(m(x, count), twin(x.clone(), count_twin), f"output of call {i}")
            assert torch.equal(count, count_twin), (i, count, count_twin)  # eager's count, once a call


class SlowlyWritesItsInput(WritesOneReadsTheOther):
    """Waits on the GPU before writing its input: a busy GPU, where warm-up kernels on the side stream are still
    queued when the capture is refused (the written input shares memory with the other)."""

    def forward(self, x: torch.Tensor, view: torch.Tensor) -> torch.Tensor:
        torch.cuda._sleep(20_000_000)  # about 10 ms of the GPU spinning, queued before the write
        return super().forward(x, view)


@cuda
def test_a_refused_capture_with_its_warm_up_still_queued_leaves_the_eager_result_alone(grad_mode) -> None:
    model = SlowlyWritesItsInput().cuda().eval()
    twin = copy.deepcopy(model)
    with grad_mode():
        for i in range(3):  # a new wrapper each time: its first call warms up, is refused and runs eager
            m = ll.wrap(model, cuda_graph="auto", capture_after=1)
            x = torch.randn(4, 64, device="cuda")
            x_twin = x.clone()
            y = m(x, x[:, :32])
            want = twin(x_twin, x_twin[:, :32])
            assert_bit_identical(y, want, f"output of wrapper {i}'s first call")
            assert_bit_identical(x, x_twin, f"the caller's input after wrapper {i}'s first call")
            assert m.graph_info()["graphs"] == [] and m.graph_info()["fallbacks"], m.graph_info()


@cuda
@pytest.mark.parametrize("layout", ["transposed", "channels_last"])
def test_non_contiguous_and_channels_last_inputs(layout: str, grad_mode) -> None:
    if layout == "transposed":
        model = mlp().cuda().eval()

        def dense() -> torch.Tensor:
            return torch.randn(8, 64, device="cuda")

        def other() -> torch.Tensor:
            return torch.randn(64, 8, device="cuda").t()  # same shape, strides (1, 8)

    else:
        model = conv_bn().cuda().eval()

        def dense() -> torch.Tensor:
            return torch.randn(2, 3, 16, 16, device="cuda")

        def other() -> torch.Tensor:
            return dense().to(memory_format=torch.channels_last)

    m = ll.wrap(model, cuda_graph=True)
    with grad_mode():
        for make in (dense, other):  # each layout captured at its first call
            x = make()
            assert_bit_identical(m(x), model(x), f"{make.__name__} input, first call")
        for make in (dense, other, dense, other):
            x = make()
            assert_bit_identical(call_replays(m, lambda x=x: m(x)), model(x), f"{make.__name__} input, replay")
    assert graph_count(m) == 2  # a graph per layout


@cuda
@pytest.mark.parametrize("memory", ["pinned", "pageable"])
def test_cpu_input_refilled_by_the_caller_right_after_the_call(memory: str, grad_mode) -> None:
    model = CopiesToDevice().cuda().eval()
    m = ll.wrap(model, cuda_graph=True)

    def batch() -> torch.Tensor:
        x = torch.randn(256, 64)
        return x.pin_memory() if memory == "pinned" else x

    staging = batch()  # one host buffer, refilled for every batch, as a loader loop does
    outs, wants = [], []
    with grad_mode():
        m(staging)  # captured
        for _ in range(3):
            following = batch()
            wants.append(model(staging))  # eager reads the buffer before it returns
            torch.cuda._sleep(50_000_000)  # earlier GPU work still running when the call returns (tens of ms)
            outs.append(call_replays(m, lambda: m(staging)))
            staging.copy_(following)  # ...and the caller refills the buffer at once
        torch.cuda.synchronize()
    for i, (out, want) in enumerate(zip(outs, wants, strict=True)):
        assert_bit_identical(out, want, f"batch {i}")


@cuda
def test_two_wrapped_models_sharing_a_submodule(grad_mode) -> None:
    torch.manual_seed(0)
    shared = nn.Linear(64, 64)
    a = nn.Sequential(shared, nn.GELU(), nn.Linear(64, 8)).cuda().eval()
    b = nn.Sequential(shared, nn.Tanh(), nn.Linear(64, 8)).cuda().eval()
    wa, wb = ll.wrap(a, cuda_graph=True), ll.wrap(b, cuda_graph=True)
    x = torch.randn(4, 64, device="cuda")
    with grad_mode():
        wa(x)  # captured
        wb(x)
    with torch.no_grad():
        shared.weight.mul_(0.5)  # in place: both graphs read it where it is
    with grad_mode():
        assert_bit_identical(call_replays(wa, lambda: wa(x)), a(x), "model a after an in-place update")
        assert_bit_identical(call_replays(wb, lambda: wb(x)), b(x), "model b after an in-place update")
    shared.weight = nn.Parameter(torch.randn(64, 64, device="cuda"))  # replaced: both models see a new tensor
    with grad_mode():
        assert_bit_identical(wa(x), a(x), "model a after the shared parameter was replaced")
        assert_bit_identical(wb(x), b(x), "model b after the shared parameter was replaced")
        assert_bit_identical(call_replays(wb, lambda: wb(x)), b(x), "model b, replayed again")
    assert wa.graph_info()["invalidations"] >= 1 and wb.graph_info()["invalidations"] >= 1


@cuda
def test_same_model_wrapped_twice(grad_mode) -> None:
    model = mlp().cuda().eval()
    first, second = ll.wrap(model, cuda_graph=True), ll.wrap(model, cuda_graph=True)
    xs = [torch.randn(4, 64, device="cuda") for _ in range(4)]
    with grad_mode():
        first(xs[0])  # each captures its own graph
        second(xs[1])
        outs = [call_replays(w, lambda w=w, x=x: w(x)) for w, x in zip((first, second, first, second), xs, strict=True)]
        wants = [model(x) for x in xs]
    for i, (out, want) in enumerate(zip(outs, wants, strict=True)):
        assert_bit_identical(out, want, f"interleaved call {i}")
    with torch.no_grad():
        model[0].weight.add_(0.25)  # in place: both wrappers must see it
    with grad_mode():
        assert_bit_identical(call_replays(first, lambda: first(xs[0])), model(xs[0]), "first wrapper")
        assert_bit_identical(call_replays(second, lambda: second(xs[0])), model(xs[0]), "second wrapper")
    assert graph_count(first) == graph_count(second) == 1


@cuda
def test_load_state_dict_in_place_keeps_the_graph_and_uses_the_new_values(grad_mode) -> None:
    model, other = mlp(seed=0).cuda().eval(), mlp(seed=1).cuda().eval()
    m = ll.wrap(model, cuda_graph=True)
    x = torch.randn(4, 64, device="cuda")
    with grad_mode():
        before = m(x)
    model.load_state_dict(other.state_dict())  # copies into the same tensors
    with grad_mode():
        y = call_replays(m, lambda: m(x))
        want = other(x)
    assert not bit_identical(before, want)  # the new weights change the output
    assert_bit_identical(y, want)
    info = m.graph_info()
    assert len(info["graphs"]) == 1 and info["invalidations"] == 0, info  # the graph stays


@cuda
def test_load_state_dict_with_assign_drops_the_graph(grad_mode) -> None:
    model = mlp().cuda().eval()
    m = ll.wrap(model, cuda_graph=True)
    x = torch.randn(4, 64, device="cuda")
    with grad_mode():
        before = m(x)
    model.load_state_dict({k: torch.randn_like(v) for k, v in model.state_dict().items()}, assign=True)
    with grad_mode():
        first = m(x)
        again = call_replays(m, lambda: m(x))
        want = model(x)
    assert not bit_identical(before, want)
    assert_bit_identical(first, want, "first call after load_state_dict(assign=True)")
    assert_bit_identical(again, want, "replay after load_state_dict(assign=True)")
    info = m.graph_info()
    assert info["invalidations"] >= 1 and len(info["graphs"]) == 1, info


@cuda
def test_weights_replaced_by_a_half_precision_copy(grad_mode) -> None:
    model = mlp().cuda().eval()
    m = ll.wrap(model, cuda_graph=True)
    x = torch.randn(4, 64, device="cuda")
    with grad_mode():
        m(x)
    model.half()
    xh = x.half()
    with grad_mode():
        first = m(xh)
        again = call_replays(m, lambda: m(xh))
        want = model(xh)
    assert want.dtype == torch.float16
    assert_bit_identical(first, want, "first call after .half()")
    assert_bit_identical(again, want, "replay after .half()")
    assert m.graph_info()["invalidations"] >= 1


@cuda
@pytest.mark.parametrize("conversion", ["to_float64", "to_channels_last"])
def test_to_dtype_and_to_channels_last(conversion: str, grad_mode) -> None:
    if conversion == "to_float64":
        model = mlp().cuda().eval()
        x = torch.randn(4, 64, device="cuda")
    else:
        model = conv_bn().cuda().eval()
        x = torch.randn(2, 3, 16, 16, device="cuda")
    m = ll.wrap(model, cuda_graph=True)
    with grad_mode():
        m(x)
    if conversion == "to_float64":
        model.to(torch.float64)
        x = x.double()
    else:
        model.to(memory_format=torch.channels_last)
    with grad_mode():
        first = m(x)
        again = call_replays(m, lambda: m(x))
        want = model(x)
    assert_bit_identical(first, want, f"first call after {conversion}")
    assert_bit_identical(again, want, f"replay after {conversion}")
    assert m.graph_info()["invalidations"] >= 1


@cuda
def test_swapped_submodule(grad_mode) -> None:
    model = mlp().cuda().eval()
    m = ll.wrap(model, cuda_graph=True)
    x = torch.randn(4, 64, device="cuda")
    with grad_mode():
        before = m(x)
    torch.manual_seed(7)
    model[2] = nn.Linear(64, 64).cuda()
    with grad_mode():
        first = m(x)
        again = call_replays(m, lambda: m(x))
        want = model(x)
    assert not bit_identical(before, want)
    assert_bit_identical(first, want, "first call after the swap")
    assert_bit_identical(again, want, "replay after the swap")


@cuda
def test_eval_train_switch_between_calls(grad_mode, caplog: pytest.LogCaptureFixture) -> None:
    model = dropout_mlp(p=0.5).cuda().eval()
    twin = copy.deepcopy(model)
    m = ll.wrap(model, cuda_graph=True)
    x = torch.randn(16, 32, device="cuda")
    with caplog.at_level(logging.INFO, logger="launchless"):
        with grad_mode():
            assert_bit_identical(m(x), twin(x), "eval, captured")
        held = replays(m)
        m.train()
        twin.train()
        for i in range(2):
            with grad_mode():
                torch.manual_seed(i)
                y = m(x)
                torch.manual_seed(i)
                want = twin(x)
            assert_bit_identical(y, want, f"training-mode call {i} (dropout, batch statistics)")
        assert replays(m) == held, "a graph replayed in training mode"
        assert_bit_identical(dict(model.state_dict()), dict(twin.state_dict()), "running statistics")
        m.eval()
        twin.eval()
        with grad_mode():
            y = call_replays(m, lambda: m(x))
            assert_bit_identical(y, twin(x), "eval again: the graph reads the updated running statistics")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "train" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]


@cuda
@pytest.mark.parametrize("hook", ["forward_hook_on_a_submodule", "forward_pre_hook_on_the_model"])
def test_hook_added_after_capture_is_not_ignored(hook: str, grad_mode) -> None:
    model = mlp().cuda().eval()
    m = ll.wrap(model, cuda_graph=True)
    x = torch.randn(4, 64, device="cuda")
    with grad_mode():
        m(x)
        plain = call_replays(m, lambda: m(x))  # the graph serves this signature
    if hook == "forward_hook_on_a_submodule":
        handle = model[0].register_forward_hook(lambda module, args, out: out * 2 + 1)
    else:
        handle = model.register_forward_pre_hook(lambda module, args: (args[0].flip(0),))
    try:
        with grad_mode():
            y = m(x)
            again = m(x)
            want = model(x)  # eager runs the hook
        assert not bit_identical(plain, want)
        assert_bit_identical(y, want, "first call with the hook")
        assert_bit_identical(again, want, "second call with the hook")
    finally:
        handle.remove()
    with grad_mode():
        assert_bit_identical(m(x), model(x), "after the hook was removed")


@cuda
@pytest.mark.parametrize("source", ["self_attribute", "module_global"])
def test_python_value_read_by_forward_is_frozen_at_capture_as_documented(
    source: str, grad_mode, monkeypatch: pytest.MonkeyPatch
) -> None:
    # README, Limitations: "Python values read from `self` (a float attribute, a CPU tensor) are frozen into the
    # graph like any captured value; pass values that change as inputs." A global read on the host is the same.
    model = ReadsPythonValues(source).cuda().eval()
    m = ll.wrap(model, cuda_graph=True)
    x = torch.randn(4, 64, device="cuda")
    with grad_mode():
        m(x)
        frozen = model(x)
    if source == "self_attribute":
        model.scale = 3.0
    else:
        monkeypatch.setitem(globals(), "SCALE", 3.0)
    with grad_mode():
        y = call_replays(m, lambda: m(x))
        changed = model(x)
    assert not bit_identical(frozen, changed)
    assert_bit_identical(y, frozen, "replay after the Python value changed (documented: frozen at capture)")


@cuda
def test_forward_reading_the_clock_is_refused_by_verification(grad_mode) -> None:
    m = ll.wrap(ReadsTheClock().cuda().eval(), cuda_graph=True)
    with grad_mode(), pytest.raises(ll.VerificationError, match="verification"):
        m(torch.randn(4, 64, device="cuda"))
    assert graph_count(m) == 0


@cuda
def test_autocast_toggled_between_calls(grad_mode) -> None:
    model = mlp(128).cuda().eval()
    m = ll.wrap(model, cuda_graph=True)
    x = torch.randn(8, 128, device="cuda")
    with grad_mode():
        for round_ in range(3):
            for on in (True, False):
                with torch.autocast("cuda", dtype=torch.bfloat16, enabled=on):
                    y = m(x) if round_ == 0 else call_replays(m, lambda: m(x))
                    want = model(x)
                assert y.dtype == (torch.bfloat16 if on else torch.float32)
                assert_bit_identical(y, want, f"round {round_}, autocast {'on' if on else 'off'}")
    assert graph_count(m) == 2


def _set_flag(flag: str, on: bool) -> None:
    if flag == "tf32_matmul":
        torch.backends.cuda.matmul.allow_tf32 = on
    elif flag == "cudnn_benchmark":
        torch.backends.cudnn.benchmark = on
    else:  # without CUBLAS_WORKSPACE_CONFIG set before cuBLAS starts, cuBLAS can only warn
        torch.use_deterministic_algorithms(on, warn_only=True)


@cuda
@pytest.mark.parametrize("flag", ["tf32_matmul", "cudnn_benchmark", "deterministic_algorithms"])
def test_global_numerics_flag_toggled_between_calls(flag: str, grad_mode) -> None:
    if flag == "tf32_matmul":
        model, x = mlp(256).cuda().eval(), torch.randn(64, 256, device="cuda")
    else:
        model, x = conv_bn().cuda().eval(), torch.randn(4, 3, 32, 32, device="cuda")
    m = ll.wrap(model, cuda_graph=True)
    eager = {}
    for on in (False, True, False, True):  # the flags are put back by the autouse fixture
        _set_flag(flag, on)
        with grad_mode():
            first = m(x)
            again = call_replays(m, lambda: m(x))
            want = model(x)
        assert_bit_identical(first, want, f"{flag}={on}, first call")
        assert_bit_identical(again, want, f"{flag}={on}, replay")
        eager[on] = want
    if flag == "tf32_matmul":  # the switch changes the bits, so a graph of the other setting would be caught
        assert not bit_identical(eager[False], eager[True])


@cuda
def test_dropout_in_eval_mode_replays_like_eager(grad_mode) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.Dropout(0.5), nn.Linear(64, 64)).cuda().eval()
    m = ll.wrap(model, cuda_graph=True, verify="strict")
    xs = [torch.randn(4, 64, device="cuda") for _ in range(3)]
    with grad_mode():
        m(xs[0])
        outs = [call_replays(m, lambda x=x: m(x)) for x in xs]
        wants = [model(x) for x in xs]
    for i, (out, want) in enumerate(zip(outs, wants, strict=True)):
        assert_bit_identical(out, want, f"call {i}")
    assert m.graph_info()["graphs"][0]["verification"]["status"] == "bit-identical"


@cuda
@pytest.mark.parametrize("kind", ["dict", "dataclass", "tuple_with_none"])
def test_structured_outputs_with_none(kind: str, grad_mode) -> None:
    torch.manual_seed(0)
    model = Structured(kind).cuda().eval()
    m = ll.wrap(model, cuda_graph=True)
    a, b = torch.randn(4, 64, device="cuda"), torch.randn(4, 64, device="cuda")
    with grad_mode():
        m(a)
        ya = call_replays(m, lambda: m(a))
        yb = call_replays(m, lambda: m(b))
        want_a, want_b = model(a), model(b)
    assert_bit_identical(ya, want_a, "first output, held over the next replay")
    assert_bit_identical(yb, want_b, "second output")


@cuda
@pytest.mark.parametrize("streams", ["one_stream", "a_stream_each"])
def test_two_threads_calling_one_wrapped_model(streams: str, grad_mode) -> None:
    model = mlp(128).cuda().eval()
    m = ll.wrap(model, cuda_graph=True)
    calls = 25
    inputs = [[torch.randn(32, 128, device="cuda") for _ in range(calls)] for _ in range(2)]
    with grad_mode():
        m(inputs[0][0])  # captured before the threads start
    held = replays(m)
    torch.cuda.synchronize()
    results: list[list] = [[None] * calls for _ in range(2)]

    def work(t: int) -> None:
        stream = torch.cuda.stream(torch.cuda.Stream()) if streams == "a_stream_each" else contextlib.nullcontext()
        with grad_mode(), stream:  # grad mode is per thread
            for k, x in enumerate(inputs[t]):
                results[t][k] = m(x)
            torch.cuda.current_stream().synchronize()

    run_in_threads(work)  # released together; fails with what a thread raised
    torch.cuda.synchronize()
    assert replays(m) - held >= 2 * calls, m.graph_info()
    with grad_mode():
        for t in range(2):
            for k in range(calls):
                assert_bit_identical(results[t][k], model(inputs[t][k]), f"thread {t}, call {k}")


# ---- training: graphed_step ----------------------------------------------------------------------------------
def resume_checkpoint(graphed, trained: tuple, twins: tuple, *, save_at: int, load_at: int) -> Callable[[int], None]:
    """Events for ``run_twins``: each run writes its own checkpoint (model and optimizer) before step ``save_at``
    and resumes from it before step ``load_at``, once the graphed run replays a whole-step graph."""
    saved: dict[str, tuple] = {}

    def events(i: int) -> None:
        if i == save_at:
            saved["graphed"] = copy.deepcopy(tuple(x.state_dict() for x in trained))
            saved["eager"] = copy.deepcopy(tuple(x.state_dict() for x in twins))
        if i == load_at:
            assert_whole_step_replaying(graphed)
            for objects, key in ((trained, "graphed"), (twins, "eager")):
                for x, state in zip(objects, saved[key], strict=True):
                    x.load_state_dict(state)

    return events


@cuda
@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
def test_checkpoint_resume_mid_run(opt_name: str) -> None:
    model, opt, twin, twin_opt = train_twins(OPTIMIZERS[opt_name])
    graphed = ll.graphed_step(make_step(model, opt), model=model, optimizer=opt)
    events = resume_checkpoint(graphed, (model, opt), (twin, twin_opt), save_at=4, load_at=8)  # of 12 steps
    run_twins(graphed, make_step(twin, twin_opt), classifier_batches(12), events)
    assert_same_training_state(model, opt, twin, twin_opt)


@cuda
@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
def test_checkpoint_resume_then_a_new_batch_shape_first(opt_name: str) -> None:
    # After a resume the next batch has a shape never captured: the old graphs must go (and the optimizer be
    # prepared again) before the new shape is captured, not after -- and the old shape, back later, captured anew.
    model, opt, twin, twin_opt = train_twins(OPTIMIZERS[opt_name])
    graphed = ll.graphed_step(make_step(model, opt), model=model, optimizer=opt)
    events = resume_checkpoint(graphed, (model, opt), (twin, twin_opt), save_at=4, load_at=8)
    batches = classifier_batches(8) + classifier_batches(5, size=8, seed=7) + classifier_batches(4, seed=9)
    run_twins(graphed, make_step(twin, twin_opt), batches, events)
    assert_same_training_state(model, opt, twin, twin_opt)
    assert_whole_step_replaying(graphed)


@cuda
@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
def test_optimizer_state_cleared_mid_run(opt_name: str) -> None:
    model, opt, twin, twin_opt = train_twins(OPTIMIZERS[opt_name])
    graphed = ll.graphed_step(make_step(model, opt), model=model, optimizer=opt)

    def events(i: int) -> None:
        if i == 6:
            assert_whole_step_replaying(graphed)
            opt.state.clear()  # momentum / moments and step counters start again
            twin_opt.state.clear()

    run_twins(graphed, make_step(twin, twin_opt), classifier_batches(12), events)
    assert_same_training_state(model, opt, twin, twin_opt)


@cuda
@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
def test_optimizer_state_tensors_deleted_and_made_again_mid_run(opt_name: str) -> None:
    """Each state tensor freed and a new one made at once: CPython gives the new tensor the freed one's id(), so a
    check by identity alone reads the state as unchanged while the graph keeps updating the freed tensors."""
    model, opt, twin, twin_opt = train_twins(OPTIMIZERS[opt_name])
    graphed = ll.graphed_step(make_step(model, opt), model=model, optimizer=opt)

    def remake(optimizer: torch.optim.Optimizer) -> None:
        for p, state in optimizer.state.items():
            for key in [k for k, v in state.items() if isinstance(v, torch.Tensor) and v.shape == p.shape]:
                del state[key]
                state[key] = torch.zeros_like(p)

    def events(i: int) -> None:
        if i == 6:
            assert_whole_step_replaying(graphed)
            remake(opt)
            remake(twin_opt)

    run_twins(graphed, make_step(twin, twin_opt), classifier_batches(12), events)
    assert_same_training_state(model, opt, twin, twin_opt)


def _three_layers() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    model[2].requires_grad_(False)  # the middle layer starts frozen and outside the optimizer
    return model


@cuda
def test_add_param_group_mid_run() -> None:
    model, opt, twin, twin_opt = train_twins(adamw, build=_three_layers)
    graphed = ll.graphed_step(make_step(model, opt), model=model, optimizer=opt)

    def events(i: int) -> None:
        if i == 6:
            assert_whole_step_replaying(graphed)
            for m, o in ((model, opt), (twin, twin_opt)):
                m[2].requires_grad_(True)
                o.add_param_group({"params": list(m[2].parameters()), "lr": 5e-4})

    run_twins(graphed, make_step(twin, twin_opt), classifier_batches(12), events)
    assert len(opt.param_groups) == 2
    assert_same_training_state(model, opt, twin, twin_opt)


@cuda
def test_learning_rate_set_by_assignment() -> None:
    model, opt, twin, twin_opt = train_twins(sgd_momentum)
    graphed = ll.graphed_step(make_step(model, opt), model=model, optimizer=opt)

    def events(i: int) -> None:
        if i in (4, 8):
            assert_whole_step_replaying(graphed)
            lr = 0.02 if i == 4 else 0.01
            for g in opt.param_groups:
                g["lr"] = lr  # the user's plain assignment
            # README: a learning rate that changes lives on the GPU from then on (a float32 tensor); the eager
            # twin takes the same value the same way, so that both run the same arithmetic
            for g in twin_opt.param_groups:
                g["lr"] = torch.tensor(lr, device="cuda")

    run_twins(graphed, make_step(twin, twin_opt), classifier_batches(14), events)
    assert_whole_step_replaying(graphed)
    assert_same_training_state(model, opt, twin, twin_opt)


def _scheduled_step(model: nn.Module, opt: torch.optim.Optimizer, sched) -> object:
    step = make_step(model, opt)

    def scheduled(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = step(x, y)
        sched.step()
        return loss

    return scheduled


@cuda
def test_scheduler_load_state_dict_mid_run() -> None:
    model, opt, twin, twin_opt = train_twins(adamw)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    twin_sched = torch.optim.lr_scheduler.LambdaLR(twin_opt, lambda s: 1.0 / (1 + s))
    # README: a learning rate a scheduler drives lives on the GPU (graphed_step moves it at its first call); the
    # eager twin's is moved the same way, so that both run the same arithmetic
    for g in twin_opt.param_groups:
        g["lr"] = torch.tensor(float(g["lr"]), device="cuda")
    graphed = ll.graphed_step(_scheduled_step(model, opt, sched), model=model, optimizer=opt)
    saved = {}

    def events(i: int) -> None:
        if i == 3:
            saved["graphed"], saved["eager"] = copy.deepcopy(sched.state_dict()), copy.deepcopy(twin_sched.state_dict())
        if i == 7:  # the schedule is rewound by four steps
            assert_whole_step_replaying(graphed)
            sched.load_state_dict(saved["graphed"])
            twin_sched.load_state_dict(saved["eager"])

    run_twins(graphed, _scheduled_step(twin, twin_opt, twin_sched), classifier_batches(12), events)
    assert sched.last_epoch == twin_sched.last_epoch
    assert_same_training_state(model, opt, twin, twin_opt)


def _fp16_step(model: nn.Module, opt: torch.optim.Optimizer, scaler: torch.amp.GradScaler) -> object:
    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss

    return step


SCALER_OPTIMIZERS = {
    "sgd_fused": lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9, fused=True),
    "adamw_fused": lambda params: torch.optim.AdamW(params, lr=1e-3, fused=True, capturable=True),
}


@cuda
@pytest.mark.parametrize("opt_name", list(SCALER_OPTIMIZERS))
def test_grad_scaler_load_state_dict_mid_run(opt_name: str) -> None:
    model, opt, twin, twin_opt = train_twins(SCALER_OPTIMIZERS[opt_name])
    scaler, twin_scaler = (torch.amp.GradScaler("cuda", init_scale=2.0**10, growth_interval=2) for _ in range(2))
    graphed = ll.graphed_step(_fp16_step(model, opt, scaler), model=model, optimizer=opt, scaler=scaler)
    saved = {}

    def events(i: int) -> None:
        if i == 3:
            saved["graphed"], saved["eager"] = (
                copy.deepcopy(scaler.state_dict()),
                copy.deepcopy(twin_scaler.state_dict()),
            )
        if i == 8:  # the scale has grown since step 3: loading puts it back
            assert_whole_step_replaying(graphed)
            assert scaler.get_scale() != saved["graphed"]["scale"]
            scaler.load_state_dict(saved["graphed"])
            twin_scaler.load_state_dict(saved["eager"])

    run_twins(graphed, _fp16_step(twin, twin_opt, twin_scaler), classifier_batches(12), events)
    assert scaler.get_scale() == twin_scaler.get_scale()
    assert scaler.state_dict() == twin_scaler.state_dict()
    assert_same_training_state(model, opt, twin, twin_opt)


@cuda
def test_freeze_then_unfreeze_a_layer() -> None:
    model, opt, twin, twin_opt = train_twins(sgd_momentum)
    graphed = ll.graphed_step(make_step(model, opt), model=model, optimizer=opt)

    def events(i: int) -> None:
        if i in (4, 9):
            assert_whole_step_replaying(graphed)
            for m in (model, twin):
                m[0].requires_grad_(i == 9)  # frozen at step 4, trained again from step 9

    run_twins(graphed, make_step(twin, twin_opt), classifier_batches(14), events)
    assert_whole_step_replaying(graphed)
    assert_same_training_state(model, opt, twin, twin_opt)


@cuda
def test_load_state_dict_assign_mid_run() -> None:
    # Eager semantics: assign=True gives the model new parameter tensors; the optimizer still holds the old ones,
    # so from then on it updates tensors the model no longer uses, and the new ones' gradients accumulate.
    model, opt, twin, twin_opt = train_twins(sgd_momentum)
    graphed = ll.graphed_step(make_step(model, opt), model=model, optimizer=opt)
    saved = {}

    def events(i: int) -> None:
        if i == 2:
            saved["graphed"], saved["eager"] = copy.deepcopy(model.state_dict()), copy.deepcopy(twin.state_dict())
        if i == 6:
            assert_whole_step_replaying(graphed)
            model.load_state_dict(saved["graphed"], assign=True)
            twin.load_state_dict(saved["eager"], assign=True)

    run_twins(graphed, make_step(twin, twin_opt), classifier_batches(12), events)
    assert_same_training_state(model, opt, twin, twin_opt, grads=True)


@cuda
def test_dropout_in_training_matches_eager_under_the_same_seed() -> None:
    model, opt, twin, twin_opt = train_twins(adamw, build=lambda: dropout_mlp(p=0.5))
    graphed = ll.graphed_step(make_step(model, opt), model=model, optimizer=opt)
    x, y = classifier_batches(1)[0]
    run_twins(graphed, make_step(twin, twin_opt), [(x, y)] * 10)  # one batch: only dropout tells steps apart
    assert_whole_step_replaying(graphed)
    assert_same_training_state(model, opt, twin, twin_opt)


@cuda
def test_batchnorm_running_statistics_after_n_steps() -> None:
    def build() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(32, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 10))

    model, opt, twin, twin_opt = train_twins(sgd_momentum, build=build)
    graphed = ll.graphed_step(make_step(model, opt), model=model, optimizer=opt)
    steps = 10
    run_twins(graphed, make_step(twin, twin_opt), classifier_batches(steps))
    assert_whole_step_replaying(graphed)
    assert int(model[1].num_batches_tracked) == steps  # no step counted twice (verification) or skipped
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        assert_bit_identical(getattr(model[1], name), getattr(twin[1], name), name)
    assert_same_training_state(model, opt, twin, twin_opt)


@cuda
def test_eval_train_switching_between_steps() -> None:
    model, opt, twin, twin_opt = train_twins(sgd_momentum)
    graphed = ll.graphed_step(make_step(model, opt), model=model, optimizer=opt)

    def events(i: int) -> None:
        if i in (4, 9):
            assert_whole_step_replaying(graphed)
            for m in (model, twin):
                m.train(i == 9)  # eval from step 4 (running statistics, no dropout), training again from 9

    run_twins(graphed, make_step(twin, twin_opt), classifier_batches(14), events)
    assert_whole_step_replaying(graphed)
    assert_same_training_state(model, opt, twin, twin_opt)


@cuda
@pytest.mark.parametrize("where", ["inside_set_to_none", "outside_set_to_none", "outside_in_place"])
def test_zero_grad_inside_and_outside_the_step(where: str) -> None:
    model, opt, twin, twin_opt = train_twins(sgd_momentum)
    inside = where == "inside_set_to_none"
    graphed = ll.graphed_step(make_step(model, opt, zero_grad=inside), model=model, optimizer=opt)

    def events(i: int) -> None:
        if i == 6:
            assert_whole_step_replaying(graphed)
        if not inside:
            for o in (opt, twin_opt):
                o.zero_grad(set_to_none=where == "outside_set_to_none")

    run_twins(graphed, make_step(twin, twin_opt, zero_grad=inside), classifier_batches(10), events)
    assert_same_training_state(model, opt, twin, twin_opt, grads=True)


# ---- the torch.compile backend -----------------------------------------------------------------------------------
@cuda
def test_compiled_replay_equals_the_same_compilation_without_graphs(grad_mode, tmp_path, fresh_dynamo) -> None:
    # The reference is the same Inductor code run without a graph (capture_after never reached): Inductor's
    # kernels round differently from eager's, the graph must not change a bit of what they compute.
    model = mlp(128).cuda().eval()
    xs = [torch.randn(8, 128, device="cuda") for _ in range(4)]
    reference = torch.compile(
        model, backend=make_backend(capture_after=10**9, selective=False, cache_dir=str(tmp_path))
    )
    with grad_mode():
        wants = [reference(x) for x in xs]
    torch._dynamo.reset()
    spy, made = spy_on(make_backend(selective=False, cache_dir=str(tmp_path)))
    compiled = torch.compile(model, backend=spy)
    with grad_mode():
        for x in xs:
            compiled(x)  # compiles, then captures at the second call
        held = compiled_replays(made)
        outs = [compiled(x) for x in xs]
    assert compiled_replays(made) - held >= len(xs), [c.graph_info() for c in made if hasattr(c, "graph_info")]
    for i, (out, want) in enumerate(zip(outs, wants, strict=True)):
        assert_bit_identical(out, want, f"input {i}")


@cuda
@pytest.mark.parametrize("change", ["load_state_dict_assign", "moved_to_cpu_and_back"])
def test_compiled_graph_after_parameters_are_replaced(change: str, tmp_path, fresh_dynamo) -> None:
    model = mlp().cuda().eval()
    twin = copy.deepcopy(model)
    reference = torch.compile(twin, backend=make_backend(capture_after=10**9, selective=False, cache_dir=str(tmp_path)))
    spy, made = spy_on(make_backend(selective=False, cache_dir=str(tmp_path)))
    compiled = torch.compile(model, backend=spy)
    x = torch.randn(8, 64, device="cuda")
    with torch.no_grad():
        for _ in range(3):
            before = compiled(x)
        assert compiled_replays(made) > 0
        assert_bit_identical(before, reference(x))
    if change == "load_state_dict_assign":
        fresh = {k: torch.randn_like(v) for k, v in model.state_dict().items()}
        model.load_state_dict({k: v.clone() for k, v in fresh.items()}, assign=True)
        twin.load_state_dict({k: v.clone() for k, v in fresh.items()}, assign=True)
    else:
        for m in (model, twin):
            m.cpu()
            with torch.no_grad():
                for p in m.parameters():
                    p.mul_(-1.5)
            m.cuda()
    with torch.no_grad():
        outs = [compiled(x) for _ in range(3)]
        held = compiled_replays(made)
        outs.append(compiled(x))
        assert compiled_replays(made) > held, "the last call after the change did not replay a graph"
        want = reference(x)
    assert compiled_graph_count(made) >= 1
    assert not bit_identical(before, want)
    for i, out in enumerate(outs):
        assert_bit_identical(out, want, f"call {i} after {change}")


# ---- process-wide cuBLAS workspaces ----------------------------------------------------------------------------
WORKSPACE_SCENARIO = r"""
import json, sys
import torch
from torch import nn
import launchless as ll

scenario = sys.argv[1]
torch.manual_seed(0)
# bfloat16 matmuls of one row over a long inner dimension: cuBLAS splits the sum and uses its workspace
model = nn.Sequential(nn.Linear(4096, 8192), nn.GELU(), nn.Linear(8192, 4096)).cuda().bfloat16().eval()
wrapped = ll.wrap(model, cuda_graph=True)
xs = [torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
with torch.no_grad():
    wrapped(xs[0])  # captured and verified
    if scenario == "reduce_overhead_recorded_after":
        other = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024)).cuda().eval()
        compiled = torch.compile(other, mode="reduce-overhead")
        y = torch.randn(8, 1024, device="cuda")
        for _ in range(4):  # warm-up, then recording: the graph trees empty cuBLAS's workspaces around both
            torch.compiler.cudagraph_mark_step_begin()
            compiled(y)
    else:
        torch._C._cuda_clearCublasWorkspaces()  # what memory clean-up code and the graph trees call
    if scenario == "workspaces_cleared_and_cache_emptied":
        torch.cuda.empty_cache()  # free blocks go back to the driver
    side = ll.capture_stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # blocks freed on the capture stream are handed to tensors made on it
        taken = [torch.full((256 << 10,), 7.0, device="cuda") for _ in range(256)]  # 256 x 1 MiB
    torch.cuda.current_stream().wait_stream(side)
    outs = [wrapped(x).clone() for x in xs]
    wants = [model(x) for x in xs]
    torch.cuda.synchronize()
replays = sum(g["replays"] for g in wrapped.graph_info()["graphs"])
print(json.dumps({
    "identical": all(torch.equal(o, w) for o, w in zip(outs, wants)),
    "taken_intact": all(bool((t == 7.0).all()) for t in taken),
    "replays": replays,
}))
"""


@cuda
@pytest.mark.parametrize(
    "scenario", ["workspaces_cleared", "workspaces_cleared_and_cache_emptied", "reduce_overhead_recorded_after"]
)
def test_cublas_workspaces_emptied_after_capture(scenario: str) -> None:
    """In a process of its own: a graph that wrote into freed memory could leave the process unusable."""
    import json
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", WORKSPACE_SCENARIO, scenario], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["replays"] >= 3, result  # the graph replayed after the workspaces were emptied
    assert result["identical"], result  # bit for bit eager's
    assert result["taken_intact"], result  # and no other tensor was written by the replays


@cuda
def test_two_wrapped_models_replayed_at_once_on_two_streams(grad_mode) -> None:
    torch.manual_seed(0)
    models = [
        nn.Sequential(nn.Linear(4096, 8192), nn.GELU(), nn.Linear(8192, 4096)).cuda().bfloat16().eval()
        for _ in range(2)
    ]
    wrapped = [ll.wrap(model, cuda_graph=True) for model in models]  # each model its own pool
    calls = 40
    inputs = [[torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16) for _ in range(calls)] for _ in range(2)]
    with grad_mode():
        for m, xs in zip(wrapped, inputs, strict=True):
            m(xs[0])  # both captured, on the one capture stream, before the threads start
    held = [replays(m) for m in wrapped]
    torch.cuda.synchronize()
    results: list[list] = [[None] * calls for _ in range(2)]

    def work(t: int) -> None:
        with grad_mode(), torch.cuda.stream(torch.cuda.Stream()):
            for k, x in enumerate(inputs[t]):
                results[t][k] = wrapped[t](x)
            torch.cuda.current_stream().synchronize()

    run_in_threads(work)  # released together; fails with what a thread raised
    torch.cuda.synchronize()
    assert [replays(m) - h for m, h in zip(wrapped, held, strict=True)] == [calls, calls]
    with grad_mode():
        for t in range(2):
            for k in range(calls):
                assert_bit_identical(results[t][k], models[t](inputs[t][k]), f"model {t}, call {k}")


HAND_GRAPH_SCENARIO = r"""
import json
import torch
from torch import nn
import launchless as ll

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4096, 8192), nn.GELU(), nn.Linear(8192, 4096)).cuda().bfloat16().eval()
other = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024)).cuda().bfloat16().eval()
static = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
stream = torch.cuda.Stream()
with torch.no_grad():
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # warm-up: the stream's workspace is made here, in the default pool
            model(static)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with ll.own_blas_workspaces(), torch.cuda.graph(graph, stream=stream):
        out = model(static)
    ll.wrap(other, cuda_graph=True)(torch.randn(8, 1024, device="cuda", dtype=torch.bfloat16))  # empties the map
    torch.cuda.empty_cache()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # blocks freed on the graph's stream are handed to tensors made on it
        taken = [torch.full((256 << 10,), 7.0, device="cuda") for _ in range(256)]
    torch.cuda.current_stream().wait_stream(stream)
    xs = [torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    outs = []
    for x in xs:
        static.copy_(x)
        graph.replay()
        outs.append(out.clone())
    wants = [model(x) for x in xs]
    torch.cuda.synchronize()
print(json.dumps({
    "identical": all(torch.equal(o, w) for o, w in zip(outs, wants)),
    "taken_intact": all(bool((t == 7.0).all()) for t in taken),
}))
"""


@cuda
def test_a_hand_captured_graph_owning_its_workspace_survives_a_later_capture() -> None:
    """In a process of its own: a graph that wrote into freed memory could leave the process unusable."""
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", HAND_GRAPH_SCENARIO], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["identical"] and result["taken_intact"], result


FFT_SCENARIO = r"""
import json
import torch
from torch import nn
import launchless as ll


class Spectral(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(1024, 1024)

    def forward(self, x):
        return torch.fft.irfft(torch.fft.rfft(self.lin(x)) * 0.5, n=1024)


torch.manual_seed(0)
model = Spectral().cuda().eval()
wrapped = ll.wrap(model, cuda_graph=True)
xs = [torch.randn(16, 1024, device="cuda") for _ in range(3)]
with torch.no_grad():
    wrapped(xs[0])  # captured and verified
    torch.backends.cuda.cufft_plan_cache.clear()  # the plans the graph's kernels use are destroyed
    made = [torch.fft.rfft(torch.randn(16, n, device="cuda")) for n in (1000, 1500, 2000)]  # new plans, new memory
    taken = [torch.full((256 << 10,), 7.0, device="cuda") for _ in range(64)]
    outs = [wrapped(x).clone() for x in xs]
    wants = [model(x) for x in xs]
    torch.cuda.synchronize()
print(json.dumps({
    "identical": all(torch.equal(o, w) for o, w in zip(outs, wants)),
    "taken_intact": all(bool((t == 7.0).all()) for t in taken),
    "replays": sum(g["replays"] for g in wrapped.graph_info()["graphs"]),
}))
"""


@cuda
def test_cufft_plan_cache_cleared_after_capture() -> None:
    """In a process of its own: a graph reading a destroyed plan's memory could leave the process unusable."""
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", FFT_SCENARIO], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["replays"] >= 3 and result["identical"] and result["taken_intact"], result
