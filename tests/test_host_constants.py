"""CPU tests of host constants (``core.host_constants``): host-to-device copies recorded on a warm-up run and
served from the recorded device tensors on the next run, refused when the host value changes, and host sources
that outlive the call watched. The ``meta`` device stands in for the GPU (the copies are the same aten ops)."""

from __future__ import annotations

import pytest
import torch

from launchless.core.host_constants import (
    MAX_BYTES,
    HostCopyRecorder,
    HostCopyReplayer,
    HostSources,
    HostValueChanged,
)

DEVICE = torch.device("meta")


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = torch.arange(4.0)  # a host tensor the module holds
        self.scale = 2.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size = torch.tensor([x.shape[0], x.shape[1]], dtype=torch.float32)  # made from Python values each call
        buffer = torch.empty(4, device=x.device)
        buffer.copy_(self.table * self.scale)  # copy_ from the host
        return x.sum() + size.to(x.device).sum() + buffer.sum() + self.table.to(x.device)[0]


def test_copies_are_recorded_then_served_from_the_device() -> None:
    model, x = Model(), torch.empty(3, 5, device=DEVICE)
    with HostCopyRecorder() as recorder:
        model(x)
    copies = recorder.copies
    assert len(copies) == 3 and all(r.device == DEVICE for r in copies.results)
    assert [tuple(s.shape) for s in copies.sources] == [(4,), (2,), (4,)]  # copy_, size, table: call order
    with HostCopyReplayer(copies) as replayer:
        model(x)
    replayer.check_all_used()
    assert replayer.position == 3


def test_a_host_value_that_changes_between_runs_is_refused() -> None:
    model, x = Model(), torch.empty(3, 5, device=DEVICE)
    with HostCopyRecorder() as recorder:
        model(x)
    model.scale = 3.0  # e.g. a value read from a clock or a counter
    with pytest.raises(HostValueChanged, match="differs between two runs"), HostCopyReplayer(recorder.copies):
        model(x)


def test_fewer_copies_at_capture_are_refused() -> None:
    with HostCopyRecorder() as recorder:
        torch.ones(2).to(DEVICE)
        torch.ones(3).to(DEVICE)
    with HostCopyReplayer(recorder.copies) as replayer:
        torch.ones(2).to(DEVICE)
    with pytest.raises(HostValueChanged, match="2 host tensors"):
        replayer.check_all_used()


def test_only_sources_that_outlive_the_call_are_watched_and_a_write_is_seen() -> None:
    model, x = Model(), torch.empty(3, 5, device=DEVICE)
    with HostCopyRecorder() as recorder:
        model(x)
    sources = HostSources(recorder.copies)
    assert sources and len(sources._watched) == 1, "only the module's own table outlives the call"
    assert not sources.changed()
    model.table.add_(1)
    assert sources.changed()
    replaced = HostSources(recorder.copies)
    model.table = torch.arange(4.0)  # the old tensor is freed
    assert replaced.changed()


def test_large_host_tensors_are_data_not_constants() -> None:
    big = torch.zeros(MAX_BYTES // 4 + 1)
    with HostCopyRecorder() as recorder:
        big.to(DEVICE)
        torch.zeros(8).to(DEVICE)
    assert len(recorder.copies) == 1


@pytest.mark.parametrize("grad_mode", [torch.no_grad, torch.inference_mode])
def test_tensors_made_from_python_values_on_the_device_are_recorded_too(grad_mode) -> None:
    from launchless.core.host_constants import recording, replaying

    def forward() -> torch.Tensor:
        a = torch.tensor([3.0, 4.0], device=DEVICE)  # the copy happens below the dispatcher's Python key
        b = torch.as_tensor([1, 2], device=DEVICE)
        c = torch.tensor(torch.ones(2), device=DEVICE)  # from a tensor: an ordinary _to_copy
        return a, b, c

    with grad_mode(), recording() as recorder:
        forward()
        torch.arange(3).to(DEVICE)
    assert [s.tolist() for s in recorder.copies.sources] == [[3.0, 4.0], [1, 2], [1.0, 1.0], [0, 1, 2]]
    with grad_mode(), replaying(recorder.copies) as replayer:
        a, b, c = forward()
        torch.arange(3).to(DEVICE)
    replayer.check_all_used()
    assert (a.device, b.dtype, c.shape) == (DEVICE, torch.int64, (2,))


def test_host_operands_of_device_ops_are_recorded_and_served_from_the_device() -> None:
    from launchless.core.host_constants import recording, replaying

    table = torch.randn(6, 4, device=DEVICE)

    def forward() -> tuple[torch.Tensor, torch.Tensor]:
        picked = table[:, [1, 3]]  # an index list made on the host: the op copies it to the device itself
        rows = table[torch.arange(3)]  # a host index tensor
        return picked, rows

    with recording() as recorder:
        forward()
    copies = recorder.copies
    assert copies.ops == [("aten::index", 2), ("aten::index", 1)], copies.ops  # (self, None, list) and (self, rows)
    assert all(r.device == DEVICE for r in copies.results)
    with replaying(copies) as replayer:
        picked, rows = forward()
    replayer.check_all_used()
    assert picked.shape == (6, 2) and rows.shape == (3, 4)


@pytest.mark.parametrize("grad_mode", [torch.no_grad, torch.inference_mode])
def test_the_recorded_warm_up_takes_the_path_the_capture_takes(grad_mode) -> None:
    """Library code may take another path while the stream is capturing (transformers builds its attention mask
    there, with a constant made on the host, instead of checking on the host that none is needed): the warm-up
    that records the host copies runs on that path, so the capture meets only copies it recorded."""
    from launchless.core.capture import _recorded_warmup
    from launchless.core.capture_path import pretend_capturing
    from launchless.core.host_constants import replaying

    def forward(x: torch.Tensor) -> torch.Tensor:
        if torch.cuda.is_current_stream_capturing():  # as transformers' masking asks
            return torch.where(x > 0, torch.tensor(0.0, device=x.device), x)
        return x

    x, asked = torch.empty(4, device=DEVICE), torch.cuda.is_current_stream_capturing
    with grad_mode():
        copies = _recorded_warmup(forward, (x,), {})
        assert [s.tolist() for s in copies.sources] == [0.0]
        with pretend_capturing(), replaying(copies) as replayer:  # the capture: asked, it is capturing
            forward(x)
        replayer.check_all_used()
    assert torch.cuda.is_current_stream_capturing is asked  # told yes only while recording


@pytest.mark.parametrize("grad_mode", [torch.no_grad, torch.inference_mode])
def test_a_move_inside_an_operation_made_of_others_is_recorded_in_both_grad_modes(grad_mode) -> None:
    """``torch.tensor(mid - 1).type_as(positions)`` (SEW-D's and DeBERTa-v2's relative buckets) moves a host
    scalar to the device inside ``type_as``: under ``no_grad`` a dispatch mode sees the ``_to_copy`` it is made
    of, under ``inference_mode`` the ``type_as`` whole. Both must record the same copy, or the capture under
    ``inference_mode`` meets a host copy the warm-up did not record and the model loses its graph."""
    from launchless.core.host_constants import recording, replaying

    positions = torch.zeros(3, 3, dtype=torch.long, device=DEVICE)

    def forward() -> tuple[torch.Tensor, torch.Tensor]:
        mid = torch.tensor(4 - 1).type_as(positions)  # a 0-dim host tensor moved by an operation made of others
        other = torch.ones(2, dtype=torch.float64).to(positions)  # Tensor.to(other): aten::to.other, made of others
        return mid, other

    with grad_mode(), recording() as recorder:
        forward()
    assert [s.tolist() for s in recorder.copies.sources] == [3, [1.0, 1.0]]
    assert all(op == "aten::_to_copy" for op, _ in recorder.copies.ops), recorder.copies.ops
    with grad_mode(), replaying(recorder.copies) as replayer:
        mid, other = forward()
    replayer.check_all_used()
    assert (mid.device, mid.dtype, other.device, other.dtype) == (DEVICE, torch.long, DEVICE, torch.long)


def test_an_operation_made_of_others_runs_the_kernel_eager_runs_not_a_python_decomposition(monkeypatch) -> None:
    """torch registers Python decompositions for some composite operations (``matmul``); ``OpOverload.decompose``
    prefers them, but eager runs the C++ kernel in both grad modes, and a capture that ran another could round
    otherwise than the eager it is verified against."""
    from torch._C import DispatchKey

    from launchless.core.host_constants import recording

    def refuse(*args, **kwargs):
        raise AssertionError("the Python decomposition ran")

    monkeypatch.setitem(torch.ops.aten.matmul.default.py_kernels, DispatchKey.CompositeImplicitAutograd, refuse)
    a, b = torch.randn(2, 3, 4), torch.randn(4, 5)
    with torch.inference_mode(), recording():
        out = torch.matmul(a, b)  # seen whole under inference_mode: decomposed by the mode
    assert torch.equal(out, torch.matmul(a, b))


def test_an_operation_made_of_others_with_a_kernel_of_its_own_for_the_device_is_left_whole() -> None:
    """``_fused_rms_norm`` is made of others but has a fused CUDA kernel, which eager runs on the GPU in both grad
    modes (under ``no_grad`` its autograd kernel calls it): its parts would round otherwise. ``linear`` has none."""
    from launchless.core.composites import has_kernel_of_its_own, run_decomposed

    aten = torch.ops.aten
    assert has_kernel_of_its_own(aten._fused_rms_norm.default, {"cuda"})
    assert not has_kernel_of_its_own(aten.linear.default, {"cuda"})
    assert not has_kernel_of_its_own(aten.type_as.default, {"cpu", "cuda"})
    x = torch.randn(2, 8, 4)  # native_channel_shuffle: made of others, with a CPU kernel of its own
    assert run_decomposed(None, aten.native_channel_shuffle.default, (x, 2), {}) is NotImplemented
