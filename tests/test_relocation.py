"""CPU tests for launchless.core.relocation: noticing when parameters or buffers move."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from launchless.core import relocation
from launchless.core.relocation import RelocationWatch


def linear_bn() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))


class BufferOnly(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("offset", torch.arange(3.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.offset


class WithBufferChild(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.shift = BufferOnly()
        self.fc = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.shift(x))


def many_tensors() -> nn.Sequential:
    """10 Linear layers: 20 tensors, more than the 8 the default mode spot-checks."""
    return nn.Sequential(*[nn.Linear(2, 2) for _ in range(10)])


@pytest.fixture(params=[False, True], ids=["default", "full"])
def full(request) -> bool:
    return request.param


@pytest.fixture(params=[linear_bn, WithBufferChild], ids=["linear_bn", "buffer_child"])
def model(request) -> nn.Module:
    return request.param()


def test_not_moved_on_repeated_calls(model: nn.Module, full: bool) -> None:
    watch = RelocationWatch(model, full=full)
    assert [watch.moved() for _ in range(5)] == [False] * 5


@pytest.mark.parametrize("convert", ["half", "double", "to_float16"])
def test_dtype_conversion_moves_once(model: nn.Module, full: bool, convert: str) -> None:
    watch = RelocationWatch(model, full=full)
    if convert == "to_float16":
        model.to(torch.float16)
    else:
        getattr(model, convert)()
    assert watch.moved() is True
    assert watch.moved() is False  # the watch follows the new tensors
    assert watch.moved() is False


def test_no_op_conversion_is_not_a_move(model: nn.Module, full: bool) -> None:
    watch = RelocationWatch(model, full=full)
    model.float()  # already float32: Module._apply runs (and bumps the epoch) but nothing moves
    model.to("cpu")
    assert watch.moved() is False


def test_buffer_only_submodule_is_watched(full: bool) -> None:
    model = WithBufferChild()
    watch = RelocationWatch(model, full=full)
    assert any(t is model.shift.offset for t in watch._tensors)
    model.shift.offset = torch.zeros(3)  # replacing a registered buffer via setattr
    assert watch.moved() is True
    assert watch.moved() is False


def test_new_parameter_via_setattr_moves(model: nn.Module, full: bool) -> None:
    linear = model[0] if isinstance(model, nn.Sequential) else model.fc
    watch = RelocationWatch(model, full=full)
    linear.weight = nn.Parameter(torch.randn_like(linear.weight))
    assert watch.moved() is True
    assert watch.moved() is False


def test_load_state_dict_assign_moves_but_copy_does_not(model: nn.Module, full: bool) -> None:
    watch = RelocationWatch(model, full=full)
    state = {k: v.clone() + 1 for k, v in model.state_dict().items()}
    model.load_state_dict(state)  # copies into the existing tensors
    assert watch.moved() is False
    model.load_state_dict(state, assign=True)
    assert watch.moved() is True
    assert watch.moved() is False


def test_submodule_swap_moves(full: bool) -> None:
    model = linear_bn()
    watch = RelocationWatch(model, full=full)
    model[0] = nn.Linear(4, 4)
    assert watch.moved() is True
    assert watch.moved() is False
    assert any(t is model[0].weight for t in watch._tensors)  # the new submodule is watched


def test_in_place_update_does_not_move(model: nn.Module, full: bool) -> None:
    watch = RelocationWatch(model, full=full)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    assert watch.moved() is False


@pytest.mark.parametrize("where", ["first", "last"])
def test_default_mode_spot_checks_first_and_last_tensor(where: str) -> None:
    model = many_tensors()
    watch = RelocationWatch(model)
    t = model[0].weight if where == "first" else model[-1].bias
    t.data = t.data.clone()  # announces no event: only the address check sees it
    assert watch.moved() is True
    assert watch.moved() is False


def test_full_mode_catches_data_assignment_outside_the_spot_check() -> None:
    model = many_tensors()
    default, full = RelocationWatch(model), RelocationWatch(model, full=True)
    # 20 tensors, spot check picks round(i * 19 / 7): index 7 (model[3].bias) is not among them.
    assert not any(t is model[3].bias for t in default._spot)
    model[3].bias.data = model[3].bias.data.clone()
    assert full.moved() is True
    assert default.moved() is False  # the documented price of the cheap default check


def test_full_mode_catches_direct_parameters_dict_write() -> None:
    model = many_tensors()
    default, full = RelocationWatch(model), RelocationWatch(model, full=True)
    model[0]._parameters["weight"] = nn.Parameter(torch.randn(2, 2))  # bypasses every hook
    assert full.moved() is True
    assert full.moved() is False
    assert default.moved() is False  # documented: only address_check="full" sees such writes


def test_swap_tensors_on_a_spot_checked_tensor_is_caught(full: bool) -> None:
    model = many_tensors()
    watch = RelocationWatch(model, full=full)
    torch.utils.swap_tensors(model[0].weight, nn.Parameter(torch.randn(2, 2)))
    assert watch.moved() is True


def test_requires_grad_follows_the_tensors() -> None:
    model = linear_bn()
    watch = RelocationWatch(model)
    assert watch.requires_grad() is True
    model.requires_grad_(False)
    assert watch.requires_grad() is False
    model[2].bias.requires_grad_(True)
    assert watch.requires_grad() is True
    assert RelocationWatch(BufferOnly()).requires_grad() is False


def test_cuda_device_is_none_on_cpu(model: nn.Module) -> None:
    assert RelocationWatch(model).cuda_device is None
    assert RelocationWatch(nn.Identity()).cuda_device is None


def test_model_without_tensors() -> None:
    model = nn.Sequential(nn.ReLU(), nn.Identity())
    watch = RelocationWatch(model)
    assert watch.moved() is False
    model.double()
    assert watch.moved() is False
    model.append(nn.Linear(2, 2))  # the first tensors appear: the graph would now read them
    assert watch.moved() is True


def test_module_apply_still_works_and_is_wrapped_once() -> None:
    RelocationWatch(nn.Linear(1, 1))  # installs the process-wide hooks
    wrapper = torch.nn.Module._apply
    assert getattr(wrapper, "_launchless_bumps", False) is True
    assert not getattr(wrapper.__wrapped__, "_launchless_bumps", False)
    assert wrapper.__name__ == "_apply"

    model = linear_bn()
    epoch = relocation._epoch
    model.double()
    assert relocation._epoch > epoch
    assert all(t.dtype == torch.float64 for t in model.state_dict().values() if t.is_floating_point())
    assert model[1].num_batches_tracked.dtype == torch.int64  # _apply semantics kept: integer buffers untouched
    out = model.eval()(torch.randn(3, 4, dtype=torch.float64))
    assert out.dtype == torch.float64


def test_installing_again_does_not_wrap_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    RelocationWatch(nn.Linear(1, 1))
    wrapper = torch.nn.Module._apply
    monkeypatch.setattr(relocation, "_installed", False)  # as if a second copy of the module installed
    relocation._install()
    assert torch.nn.Module._apply is wrapper
    assert not getattr(torch.nn.Module._apply.__wrapped__, "_launchless_bumps", False)
    RelocationWatch(nn.Linear(1, 1))
    assert torch.nn.Module._apply is wrapper


class SlicesItsLayers(nn.Module):
    """Like transformers' Mistral: ``self.layers[:n]`` builds (registers) a new ModuleList on every call."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers[:2]:
            x = layer(x)
        return x


def test_registrations_inside_a_compiled_forward_do_not_recompile_it() -> None:
    from torch._dynamo.testing import CompileCounter

    RelocationWatch(nn.Linear(1, 1))  # installs the process-wide hooks
    model, x = SlicesItsLayers(), torch.randn(2, 4)
    epoch = relocation._epoch
    model(x)
    assert relocation._epoch > epoch  # eager registrations are still counted
    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter)
    compiled(x)
    epoch = relocation._epoch
    for _ in range(12):
        out = compiled(x)
    assert counter.frame_count == 1  # torch 2.11 guarded the counter: a recompile per call up to the limit
    assert relocation._epoch == epoch  # a bump per call would force the full address check on every call
    assert torch.equal(out, model(x))
    torch._dynamo.reset()


def test_the_python_pointer_check_matches_torchs_where_a_build_lacks_it() -> None:
    """CPU wheels up to torch 2.13 have no ``_tensors_data_ptrs_at_indices_equal`` (a CUDA-module function)."""
    from launchless.core.relocation import _ptrs_equal_python

    tensors = [torch.randn(2), torch.randn(3), torch.randn(4)]
    ptrs = [t.data_ptr() for t in tensors]
    moved = [tensors[0], torch.randn(3), tensors[2]]
    for check in {_ptrs_equal_python, relocation.ptrs_equal}:
        assert check(tensors, ptrs, [0, 1, 2]) and check(moved, ptrs, [0, 2])
        assert not check(moved, ptrs, [0, 1]) and check(moved, ptrs, [])


class Decoder(nn.Module):
    """As transformers' decoders do: a container of its own layers built every call, and hooks registered on a
    layer and removed inside the forward (to collect what it returns)."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))

    def forward(self, x):
        seen = []
        handle = self.layers[0].register_forward_hook(lambda mod, args, out: seen.append(out))
        for layer in nn.ModuleList(self.layers[:2]):
            x = layer(x)
        handle.remove()
        return x


@pytest.mark.parametrize("full", [False, True])
def test_containers_built_and_hooks_that_come_and_go_inside_a_forward_are_cheap_and_not_moves(full: bool) -> None:
    model = Decoder()
    watch = RelocationWatch(model, full=full)
    structure = relocation._structure
    snapshots = []
    original = watch._snapshot
    watch._snapshot = lambda: (snapshots.append(1), original())
    for _ in range(3):
        model(torch.randn(2, 4))
        assert not watch.moved()
    assert relocation._structure == structure, "a container of the model's own layers is not its tree"
    assert not snapshots, "the module tree was walked again"
    elsewhere = nn.ModuleList([nn.Linear(2, 2)])  # a tree nobody watches
    elsewhere.append(nn.Linear(2, 2))
    assert not watch.moved() and not snapshots


class Router(nn.Module):
    """As Switch Transformers' router does on every call: its classifier set again, converted to the dtype it has."""

    def __init__(self) -> None:
        super().__init__()
        self.classifier = nn.Linear(4, 4)
        self.dtype = torch.float32

    def forward(self, x):
        self.classifier = self.classifier.to(self.dtype)
        return self.classifier(x)


class Routed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed, self.router, self.head = nn.Linear(4, 4), Router(), nn.Linear(4, 4)

    def forward(self, x):
        return self.head(self.router(self.embed(x)))


@pytest.mark.parametrize("full", [False, True])
def test_a_module_set_again_to_itself_in_every_forward_is_not_a_move_nor_a_walk(full: bool) -> None:
    model = Routed()
    watch = RelocationWatch(model, full=full)
    other = RelocationWatch(Decoder())  # another model's watch: told nothing of this one's modules
    snapshots = []
    original = watch._snapshot
    watch._snapshot = lambda: (snapshots.append(1), original())
    structure = relocation._structure
    for _ in range(3):
        model(torch.randn(2, 4))
        assert not watch.moved() and not other.moved()
    assert relocation._structure > structure, "the router's registrations are structure events"
    assert not snapshots, "the module tree was walked again"
    model.router.dtype = torch.float64  # now the forward converts it: a move, seen once
    model.router.classifier.double()
    model.head.double()
    model.embed.double()
    model(torch.randn(2, 4, dtype=torch.float64))
    assert watch.moved() and snapshots == [1]
    assert not watch.moved()
    model.router.classifier = nn.Linear(4, 4).double()  # another module in its place
    assert watch.moved()


def test_hooks_kept_after_a_forward_or_registered_globally_are_moves() -> None:
    from torch.nn.modules import module as torch_module

    model = Decoder()
    watch = RelocationWatch(model)
    handle = model.layers[1].register_forward_hook(lambda mod, args, out: None)
    assert watch.moved() and not watch.moved()
    handle.remove()
    assert watch.moved()
    global_handle = torch_module.register_module_forward_hook(lambda mod, args, out: None)
    try:
        assert watch.moved() and not watch.moved()
    finally:
        global_handle.remove()
    assert watch.moved()
    model.layers[2].weight = nn.Parameter(torch.ones(4, 4))  # a parameter of the tree replaced
    assert watch.moved()
