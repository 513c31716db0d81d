"""CPU tests for launchless.diagnose: dry runs on the meta device, locating and classifying blockers."""

from __future__ import annotations

import inspect
import os
import sysconfig
import traceback

import pytest
import torch
from torch import nn

from launchless.diagnose import blockers, source
from launchless.diagnose.blockers import COPY, DATA_DEPENDENT, HOST_SYNC, Blocker, classify_message, classify_op
from launchless.diagnose.dry_run import dry_run
from launchless.diagnose.source import locate

THIS_FILE = os.path.abspath(__file__)


def line_of(cls: type, needle: str) -> tuple[int, str]:
    """(line number, stripped text) of the only line of ``cls.forward`` that contains ``needle``."""
    lines, start = inspect.getsourcelines(cls.forward)
    hits = [(start + i, text.strip()) for i, text in enumerate(lines) if needle in text]
    assert len(hits) == 1, hits
    return hits[0]


class ItemSync(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        scale = y.abs().max().item()
        return y / scale


class BranchOnTensor(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return x
        return -x


class ArangeCopy(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        return y + torch.arange(x.shape[-1]).to(x.device)


class HostTensor(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.tensor([1.0, 2.0, 3.0, 4.0], device=x.device)


class HostAsTensor(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.as_tensor([1.0, 2.0, 3.0, 4.0], dtype=x.dtype, device=x.device)


class BooleanMask(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[x > 0].sum()


class NonZero(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nonzero(x).float().mean()


class HostScalarCopy(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tensor(2.0).to(x.device)


class Clean(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x)) + torch.zeros(4, device=x.device) + torch.arange(4, device=x.device)


def run(cls: type) -> Blocker | None:
    torch.manual_seed(0)
    return dry_run(cls(), (torch.randn(2, 4),), {})


@pytest.mark.parametrize(
    ("cls", "kind", "needle", "operation"),
    [
        (ItemSync, HOST_SYNC, ".item()", "aten._local_scalar_dense"),
        (BranchOnTensor, HOST_SYNC, "if x.sum() > 0", "aten._local_scalar_dense"),
        (ArangeCopy, COPY, "torch.arange", "aten._to_copy"),
        (HostTensor, COPY, "torch.tensor(", "torch.tensor(host data, device=...)"),
        (HostAsTensor, COPY, "torch.as_tensor(", "torch.as_tensor(host data, device=...)"),
        (NonZero, DATA_DEPENDENT, "torch.nonzero", "aten.nonzero"),
        (BooleanMask, DATA_DEPENDENT, "x[x > 0]", None),
    ],
)
def test_dry_run_names_kind_operation_and_line(cls: type, kind: str, needle: str, operation: str | None) -> None:
    blocker = run(cls)
    assert blocker is not None
    assert blocker.kind == kind
    if operation is not None:
        assert blocker.operation == operation
    loc = blocker.location
    assert loc is not None
    line, code = line_of(cls, needle)
    assert (os.path.abspath(loc.file), loc.line, loc.code) == (THIS_FILE, line, code)
    assert loc.function == "forward"
    assert loc.owner == "user" and loc.caller is None
    assert blocker.fix == blockers.FIXES[kind]
    assert f"{kind}: {blocker.operation} at {loc.file}:{line} in forward (your code): `{code}`" == blocker.describe()


def test_clean_model_has_no_blocker() -> None:
    assert run(Clean) is None


def test_dry_run_finds_a_zero_dim_host_to_device_copy() -> None:
    blocker = run(HostScalarCopy)
    assert blocker is not None and blocker.kind == COPY


def test_dry_run_does_not_modify_the_model() -> None:
    torch.manual_seed(0)
    model = ItemSync()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids = {k: id(v) for k, v in model.state_dict(keep_vars=True).items()}
    assert dry_run(model, (torch.randn(2, 4),), {}) is not None
    after = model.state_dict(keep_vars=True)
    assert {k: id(v) for k, v in after.items()} == ids
    assert all(v.device.type == "cpu" for v in after.values())
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert model.training  # the mode is left alone too


def test_dry_run_leaves_inputs_alone_and_accepts_kwargs() -> None:
    class KW(nn.Module):
        def forward(self, x: torch.Tensor, *, scale: torch.Tensor) -> torch.Tensor:
            return x * scale.sum().item()

    x, scale = torch.randn(2, 4), torch.ones(3)
    blocker = dry_run(KW(), (x,), {"scale": scale})
    assert blocker is not None and blocker.kind == HOST_SYNC
    assert x.device.type == "cpu" and scale.device.type == "cpu"


# ---- locate / classify ------------------------------------------------------------------------


def frame(filename: str, lineno: int, name: str, line: str) -> traceback.FrameSummary:
    return traceback.FrameSummary(filename, lineno, name, line=line)


SITE = sysconfig.get_paths()["purelib"]
TORCH_FILE = os.path.join(os.path.dirname(torch.__file__), "nn", "modules", "module.py")


def test_locate_picks_the_innermost_user_frame() -> None:
    frames = [
        frame("/home/me/app.py", 10, "main", "run()"),
        frame("/home/me/model.py", 20, "forward", "  y = x.item()  "),
        frame(TORCH_FILE, 1, "_call_impl", "return forward_call(*args)"),
    ]
    loc = locate(frames)
    assert loc is not None
    assert (loc.file, loc.line, loc.function, loc.code, loc.owner, loc.caller) == (
        "/home/me/model.py",
        20,
        "forward",
        "y = x.item()",
        "user",
        None,
    )
    assert str(loc) == "/home/me/model.py:20 in forward (your code): `y = x.item()`"


def test_locate_in_library_code_names_the_package_and_the_callers_line() -> None:
    lib = os.path.join(SITE, "somelib", "layers", "attn.py")
    frames = [
        frame("/home/me/app.py", 10, "main", "model(x)"),
        frame(TORCH_FILE, 1, "_call_impl", "return forward_call(*args)"),
        frame("/home/me/model.py", 33, "forward", "return self.attn(x)"),
        frame(TORCH_FILE, 1, "_call_impl", "return forward_call(*args)"),
        frame(lib, 7, "attn", "mask = mask.to(x.device)"),
        frame(TORCH_FILE, 2, "__torch_function__", "..."),
    ]
    loc = locate(frames)
    assert loc is not None
    assert (loc.file, loc.line, loc.owner) == (lib, 7, "somelib")
    assert loc.caller == "/home/me/model.py:33"  # the user line that called into the library
    assert str(loc).endswith(
        "(somelib code): `mask = mask.to(x.device)`, reached from your code at /home/me/model.py:33"
    )


def test_locate_single_module_library_and_dist_packages() -> None:
    frames = [frame("/usr/lib/python3/dist-packages/six.py", 5, "f", "x")]
    loc = locate(frames)
    assert loc is not None and loc.owner == "six" and loc.caller is None


def test_locate_returns_none_when_only_foreign_frames() -> None:
    assert locate([frame(TORCH_FILE, 1, "f", "x"), frame("<string>", 1, "g", "")]) is None
    assert locate([]) is None


def test_site_packages_inside_the_stdlib_dir_is_library_code() -> None:
    stdlib = sysconfig.get_paths()["stdlib"]
    lib = os.path.join(stdlib, "site-packages", "torchvision", "models", "detection", "transform.py")
    assert not source.is_foreign(lib)
    loc = locate([frame("/home/me/model.py", 3, "forward", "self.det(x)"), frame(lib, 9, "normalize", "m = ...")])
    assert loc is not None and loc.owner == "torchvision" and loc.caller == "/home/me/model.py:3"


def test_is_foreign() -> None:
    assert source.is_foreign(TORCH_FILE)
    assert source.is_foreign(blockers.__file__)
    assert source.is_foreign(os.path.join(sysconfig.get_paths()["stdlib"], "contextlib.py"))
    assert source.is_foreign("<frozen runpy>")
    assert not source.is_foreign(THIS_FILE)
    assert not source.is_foreign(os.path.join(SITE, "torchvision", "ops", "boxes.py"))  # not torch's own


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        (
            "Cannot copy between CPU and CUDA tensors during CUDA graph capture unless the CPU tensor is pinned. "
            "Please use tensor.pin_memory() or allocate the tensor with pin_memory=True.",
            COPY,
        ),
        ("CUDA error: operation not permitted when stream is capturing", HOST_SYNC),
        (
            "CUDA error: operation not permitted when stream is capturing\nCUDA kernel errors might be "
            "asynchronously reported at some other API call",
            HOST_SYNC,
        ),
        ("Cannot call CUDAGeneratorImpl::current_seed during CUDA graph capture", blockers.CAPTURE_ERROR),
        ("The register_meta function for torch.nonzero() raises unimplemented by default", DATA_DEPENDENT),
    ],
)
def test_classify_message(message: str, kind: str) -> None:
    assert classify_message(message) == kind


# ---- real models (zoo) ------------------------------------------------------------------------


@pytest.mark.zoo
def test_dry_run_on_torchvision_detector_finds_the_copy_in_torchvision() -> None:
    pytest.importorskip("torchvision")
    from launchless.apps import zoo

    w = zoo.build("tv:fasterrcnn_mobilenet_v3_large_fpn")
    blocker = dry_run(w.model, w.args, w.kwargs)
    assert blocker is not None
    assert blocker.kind == COPY
    loc = blocker.location
    assert loc is not None and loc.owner == "torchvision"
    assert f"{os.sep}torchvision{os.sep}" in loc.file
    assert loc.caller is not None and loc.caller.startswith(THIS_FILE + ":")
    assert "torchvision code" in blocker.describe() and "reached from your code" in blocker.describe()


@pytest.mark.zoo
def test_dry_run_on_timm_resnet18_finds_nothing() -> None:
    pytest.importorskip("timm")
    from launchless.apps import zoo

    w = zoo.build("timm:resnet18")
    assert dry_run(w.model, w.args, w.kwargs) is None


class _CaptureRefusesNonzero(torch.utils._python_dispatch.TorchDispatchMode):
    """Stands in for a capturing stream where it matters here: ``nonzero`` syncs with the host and raises."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.nonzero.default:
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("grad_mode", [torch.no_grad, torch.inference_mode], ids=["no_grad", "inference_mode"])
def test_a_failed_capture_names_the_same_operation_and_kind_in_both_grad_modes(grad_mode) -> None:
    """Under inference_mode a dispatch mode sees ``where(mask)`` whole; the recorder looks into it as no_grad shows."""
    with grad_mode():
        mask = torch.tensor([True, False, True])
        recorder = blockers.FailureRecorder()
        with pytest.raises(RuntimeError, match="not permitted"), _CaptureRefusesNonzero(), recorder:
            torch.where(mask)
    assert recorder.blocker is not None
    assert (recorder.blocker.kind, recorder.blocker.operation) == (DATA_DEPENDENT, "aten.nonzero")
    assert recorder.blocker.location is not None and "torch.where(mask)" in recorder.blocker.location.code


def test_indexing_with_a_boolean_mask_is_a_data_dependent_shape_and_with_positions_is_not() -> None:
    """``x[x > 0]`` reaches CUDA as ``aten.index`` (a nonzero inside it, which the capture fails in): its kind is the
    shape the values choose, not a host sync; indexing by positions can be captured."""
    x = torch.randn(4, 8)
    mask, positions = x > 0, torch.arange(2)
    aten = torch.ops.aten
    assert classify_op(aten.index.Tensor, (x, [mask]), {}) == DATA_DEPENDENT
    assert classify_op(aten.index_put_.default, (x, [mask], torch.tensor(0.0)), {}) == DATA_DEPENDENT
    assert classify_op(aten.index.Tensor, (x, [None, mask[0]]), {}) == DATA_DEPENDENT
    assert classify_op(aten.index.Tensor, (x, [positions]), {}) is None
    assert classify_op(aten.index_put_.default, (x, [positions], torch.tensor(0.0)), {}) is None


def test_histc_reads_its_range_on_the_host_only_when_none_is_given() -> None:
    """``torch.histc`` without a range reads its input's minimum and maximum on the host (a host sync); with one
    -- transformers' experts count their tokens so -- its ``bins`` counts are a device kernel a graph records."""
    x = torch.rand(16)
    histc = torch.ops.aten.histc.default
    assert classify_op(histc, (x,), {"bins": 4}) == HOST_SYNC
    assert classify_op(histc, (x, 4, 0.0, 0.0), {}) == HOST_SYNC
    assert classify_op(histc, (x,), {"bins": 4, "min": 0, "max": 3}) is None
    assert classify_op(histc, (x, 4, 0.0, 1.0), {}) is None
