"""CPU tests for launchless.runtime: options, pass-through, and every path that needs no GPU."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
from torch import nn

from launchless import ConfigError, GraphedModule, NoCudaError, wrap

LOGGER = "launchless"
GRAD_REASON = "grad mode is on"
TRAIN_REASON = "training mode"


class Net(nn.Module):
    """A small model with a custom attribute and method, a buffer and a BatchNorm (train/eval matter)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.bn = nn.BatchNorm1d(3)
        self.register_buffer("shift", torch.arange(3.0))
        self.label = "net"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.fc(x)) + self.shift

    def describe(self, prefix: str) -> str:
        return f"{prefix}:{self.label}"


def net() -> Net:
    torch.manual_seed(0)
    return Net()


def launchless_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER]


def eager_count(m: GraphedModule, needle: str) -> int:
    return sum(n for reason, n in m.graph_info()["eager_calls"].items() if needle in reason)


# ---- options ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "needles"),
    [
        ({"cuda_graph": "yes"}, ["cuda_graph='yes'", "False", "True", "'auto'"]),
        ({"cuda_graph": 1}, ["cuda_graph=1", "False", "True", "'auto'"]),
        ({"cuda_graph": None}, ["cuda_graph=None"]),
        ({"capture_after": 0}, ["capture_after=0", "integer >= 1"]),
        ({"capture_after": True}, ["capture_after=True", "integer >= 1"]),
        ({"capture_after": 2.5}, ["capture_after=2.5", "integer >= 1"]),
        ({"max_graphs": 0}, ["max_graphs=0", "integer >= 1"]),
        ({"warmup": 0}, ["warmup=0", "integer >= 1"]),
        ({"verify": "x"}, ["verify='x'", "'on'", "'strict'", "'off'"]),
        ({"verify": True}, ["verify=True", "'on'", "'strict'", "'off'"]),
        ({"outputs": "x"}, ["outputs='x'", "'clone'", "'static'"]),
        ({"memory_pool": "global"}, ["memory_pool='global'", "'own'", "'shared'"]),
        ({"kernels": "fused"}, ["kernels='fused'", "'eager'", "'compiled'"]),
        ({"memory_pool": "shared", "outputs": "static"}, ["memory_pool='shared' needs outputs='clone'"]),
        ({"tolerance_ulps": -1}, ["tolerance_ulps=-1", ">= 0"]),
        ({"tolerance_ulps": float("nan")}, ["tolerance_ulps=nan", ">= 0"]),
    ],
)
def test_bad_options_name_the_valid_values(options: dict, needles: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        wrap(net(), **options)
    assert all(n in str(info.value) for n in needles), str(info.value)
    assert isinstance(info.value, ValueError)
    with pytest.raises(ConfigError):
        GraphedModule(net(), **options)


@pytest.mark.parametrize("value", ["64", None])
def test_non_numeric_tolerance_is_a_config_error(value) -> None:
    with pytest.raises(ConfigError, match="tolerance_ulps"):
        wrap(net(), tolerance_ulps=value)


@pytest.mark.parametrize("mode", [False, True, "auto"])
def test_valid_modes_are_accepted(mode) -> None:
    m = wrap(net(), cuda_graph=mode, capture_after=1, max_graphs=1, warmup=1, verify="strict", outputs="static")
    assert m.graph_info()["mode"] is mode or m.graph_info()["mode"] == mode
    assert f"cuda_graph={mode!r}" in repr(m)


def test_wrap_rejects_non_modules_and_double_wrapping() -> None:
    with pytest.raises(ConfigError, match=r"takes a torch.nn.Module, got function"):
        wrap(lambda x: x)
    wrapped = wrap(net())
    with pytest.raises(ConfigError, match="already wrapped"):
        wrap(wrapped)


def test_wrapping_a_function_names_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"takes a torch\.nn\.Module, got function; wrap the module itself"):
        wrap(lambda x: x)


# ---- eager mode and pass-through --------------------------------------------------------------


def test_cuda_graph_false_is_plain_eager() -> None:
    model = net().eval()
    m = wrap(model, cuda_graph=False)
    x = torch.randn(5, 4)
    with torch.no_grad():
        assert torch.equal(m(x), model(x))
    y = m(x)  # grad mode: autograd still works through the wrapper
    assert y.requires_grad
    y.sum().backward()
    assert model.fc.weight.grad is not None
    info = m.graph_info()
    assert info["graphs"] == [] and info["fallbacks"] == [] and info["eager_calls"] == {}


def test_attribute_and_method_pass_through() -> None:
    model = net()
    m = wrap(model)
    assert m.label == "net"
    assert m.describe("p") == "p:net"
    assert m.fc is model.fc and m.shift is model.shift
    assert m.model is model
    with pytest.raises(AttributeError, match="no_such_attribute"):
        _ = m.no_such_attribute


def test_state_dict_and_named_parameters_have_the_models_names() -> None:
    model = net()
    m = wrap(model)
    assert list(m.state_dict()) == list(model.state_dict())
    assert not any(k.startswith("model.") for k in m.state_dict())
    assert [n for n, _ in m.named_parameters()] == [n for n, _ in model.named_parameters()]
    assert [n for n, _ in m.named_buffers()] == [n for n, _ in model.named_buffers()]
    assert [id(p) for p in m.parameters()] == [id(p) for p in model.parameters()]


def test_load_state_dict_goes_to_the_model() -> None:
    model, other = net(), Net()
    m = wrap(model)
    result = m.load_state_dict(other.state_dict())
    assert list(result.missing_keys) == [] and list(result.unexpected_keys) == []
    assert all(torch.equal(model.state_dict()[k], v) for k, v in other.state_dict().items())
    result = m.load_state_dict({"fc.weight": torch.zeros(3, 4)}, strict=False)
    assert "fc.bias" in result.missing_keys and torch.equal(model.fc.weight, torch.zeros(3, 4))


def test_state_dict_round_trip_through_a_parent_module() -> None:
    parent = nn.Sequential(wrap(nn.Linear(2, 2)), nn.ReLU())
    parent.load_state_dict(parent.state_dict())
    assert [n for n, _ in parent.named_parameters()] == list(parent.state_dict()) == ["0.weight", "0.bias"]
    plain = nn.Linear(2, 2)
    plain.load_state_dict({k.removeprefix("0."): v for k, v in parent.state_dict().items()})
    assert torch.equal(plain.weight, parent[0].weight)


def test_wrapped_model_can_be_deep_copied() -> None:
    m = wrap(net())
    clone = copy.deepcopy(m)
    assert list(clone.state_dict()) == list(m.state_dict())


def test_train_and_eval_propagate() -> None:
    model = net()
    m = wrap(model)
    m.eval()
    assert not model.training and not model.bn.training
    m.train()
    assert model.training and model.bn.training


# ---- graphs requested on a CPU ------------------------------------------------------------------


def test_cuda_graph_true_on_cpu_raises_no_cuda_error() -> None:
    model = net().eval()
    m = wrap(model, cuda_graph=True)
    with torch.no_grad(), pytest.raises(NoCudaError) as info:
        m(torch.randn(2, 4))
    msg = str(info.value)
    assert "Net.forward" in msg and "move the model to the GPU" in msg and "cuda_graph=False" in msg
    with torch.no_grad(), pytest.raises(NoCudaError):  # refused once, refused again
        m(torch.randn(2, 4))
    assert [f["reason"] for f in m.graph_info()["fallbacks"]] == ["no CUDA device"]


def test_auto_on_cpu_runs_eager_and_logs_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    model = net().eval()
    m = wrap(model, cuda_graph="auto", capture_after=3)
    xs = [torch.randn(2, 4) for _ in range(6)]
    with torch.no_grad():
        for i, x in enumerate(xs):
            assert torch.equal(m(x), model(x))
            if i < 2:  # below capture_after nothing is attempted yet
                assert launchless_records(caplog) == [] and m.graph_info()["fallbacks"] == []
    records = launchless_records(caplog)
    assert len(records) == 1
    assert records[0].levelno == logging.INFO
    assert "move the model to the GPU" in records[0].getMessage()
    assert "Running eager for this input signature" in records[0].getMessage()
    fallbacks = m.graph_info()["fallbacks"]
    assert len(fallbacks) == 1
    assert fallbacks[0]["reason"] == "no CUDA device"
    assert fallbacks[0]["signature"] == "(float32[2x4]@cpu)"
    assert "move the model to the GPU" in fallbacks[0]["message"]
    assert m.graph_info()["graphs"] == []


def test_auto_counts_each_signature_separately(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    m = wrap(net().eval(), cuda_graph="auto", capture_after=2)
    with torch.no_grad():
        m(torch.randn(2, 4))
        m(torch.randn(3, 4))
        assert m.graph_info()["fallbacks"] == []  # two signatures seen once each
        m(torch.randn(3, 4))
        assert [f["signature"] for f in m.graph_info()["fallbacks"]] == ["(float32[3x4]@cpu)"]
        m(torch.randn(2, 4))
    assert len(m.graph_info()["fallbacks"]) == 2
    assert len(launchless_records(caplog)) == 1  # one line per reason, not per signature


def test_grad_and_training_mode_run_eager_and_are_counted(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    model = net()
    m = wrap(model, cuda_graph=True)
    x = torch.randn(4, 4)
    model.train()
    with torch.no_grad():
        out = m(x)  # training mode wins even under no_grad; no NoCudaError
    assert out.shape == (4, 3)
    model.eval()
    for _ in range(2):
        y = m(x)  # grad mode on and the parameters require grad
        assert torch.equal(y, model(x)) and y.requires_grad
    assert eager_count(m, TRAIN_REASON) == 1
    assert eager_count(m, GRAD_REASON) == 2
    records = launchless_records(caplog)
    assert len(records) == 2  # one line per reason
    assert all(r.levelno == logging.WARNING for r in records)  # cuda_graph=True: louder
    assert m.graph_info()["fallbacks"] == []


def test_input_requiring_grad_runs_eager() -> None:
    model = net().eval().requires_grad_(False)
    m = wrap(model, cuda_graph=True)
    x = torch.randn(2, 4, requires_grad=True)
    y = m(x)
    assert y.requires_grad
    assert eager_count(m, GRAD_REASON) == 1
    with torch.no_grad(), pytest.raises(NoCudaError):  # nothing requires grad: a graph is attempted
        m(x)


def test_nested_input_requiring_grad_runs_eager() -> None:
    class ListIn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 3)

        def forward(self, xs: list[torch.Tensor]) -> torch.Tensor:
            return self.fc(xs[0])

    model = ListIn().eval().requires_grad_(False)
    m = wrap(model, cuda_graph=True)
    x = torch.randn(2, 4, requires_grad=True)
    y = m([x])
    assert y.requires_grad
    assert eager_count(m, GRAD_REASON) == 1


def test_first_grad_mode_call_after_a_swap_runs_eager() -> None:
    model = net().eval().requires_grad_(False)
    m = wrap(model, cuda_graph="auto")
    x = torch.randn(2, 4)
    m(x)  # grad mode on, nothing requires grad: not an eager-for-grad call
    assert eager_count(m, GRAD_REASON) == 0
    model.fc = nn.Linear(4, 3)  # new parameters, requiring grad
    y = m(x)
    assert y.requires_grad
    assert eager_count(m, GRAD_REASON) == 1


def test_unhashable_input_runs_eager_with_the_reason() -> None:
    class WithOptions(nn.Module):
        def forward(self, x: torch.Tensor, options: set) -> torch.Tensor:
            return x * len(options)

    m = wrap(WithOptions().eval(), cuda_graph=True)
    with torch.no_grad():
        out = m(torch.ones(2), options={"a", "b"})
    assert torch.equal(out, torch.full((2,), 2.0))
    assert eager_count(m, "not hashable") == 1


# ---- explicit capture, invalidation, info, release ----------------------------------------------


def test_capture_graph_needs_graphs_on_and_eval() -> None:
    x = torch.randn(2, 4)
    with pytest.raises(ConfigError, match="cuda_graph=True or 'auto'"):
        wrap(net().eval(), cuda_graph=False).capture_graph(x)
    with pytest.raises(ConfigError, match=r"\.eval\(\)"):
        wrap(net(), cuda_graph="auto").capture_graph(x)


def test_capture_graph_on_cpu_raises_even_in_auto() -> None:
    m = wrap(net().eval(), cuda_graph="auto")
    with pytest.raises(NoCudaError, match="move the model to the GPU"):
        m.capture_graph(torch.randn(2, 4))


def test_relocation_is_counted_as_an_invalidation() -> None:
    model = net().eval()
    m = wrap(model, cuda_graph="auto", capture_after=1)
    with torch.no_grad():
        m(torch.randn(2, 4))
        assert m.graph_info()["invalidations"] == 0 and len(m.graph_info()["fallbacks"]) == 1
        m(torch.randn(2, 4))
        assert m.graph_info()["invalidations"] == 0
        model.double()
        out = m(torch.randn(2, 4, dtype=torch.float64))
    assert out.dtype == torch.float64
    info = m.graph_info()
    assert info["invalidations"] == 1
    # refusals are forgotten with the graphs: only the new float64 signature was refused since
    assert [f["signature"] for f in info["fallbacks"]] == ["(float64[2x4]@cpu)"]


def test_graph_info_structure() -> None:
    m = wrap(net().eval(), cuda_graph="auto", max_graphs=5)
    info = m.graph_info()
    assert set(info) == {
        "mode",
        "max_graphs",
        "capture_after",
        "graphs",
        "pool_bytes",
        "fallbacks",
        "eager_calls",
        "evictions",
        "calls_over_max_graphs",
        "invalidations",
        "split",
        "batch_buckets",
        "decode",
        "memory_pool",
        "compiled_kernels",
        "library_rewrites",
        "eager_lane",
    }
    assert info["mode"] == "auto" and info["max_graphs"] == 5 and info["split"] is None
    assert wrap(net().eval(), cuda_graph=False).graph_info()["library_rewrites"] == {}
    assert info["compiled_kernels"] is None  # kernels="eager"
    assert wrap(net().eval(), kernels="compiled").graph_info()["compiled_kernels"] == []
    assert info["batch_buckets"] is None and info["decode"] is None and info["memory_pool"] == "own"
    assert (info["graphs"], info["pool_bytes"], info["fallbacks"], info["eager_calls"]) == ([], 0, [], {})
    assert (info["evictions"], info["invalidations"], info["calls_over_max_graphs"]) == (0, 0, None)
    with torch.no_grad():
        for _ in range(3):
            m(torch.randn(2, 4))
    (entry,) = m.graph_info()["fallbacks"]
    assert set(entry) == {"signature", "stage", "reason", "message", "operation", "source", "transient"}


def test_release_graphs_on_cpu_forgets_refusals_without_touching_cuda() -> None:
    initialised = torch.cuda.is_initialized()
    m = wrap(net().eval(), cuda_graph="auto", capture_after=2)
    x = torch.randn(2, 4)
    with torch.no_grad():
        m(x)
        m(x)
    assert len(m.graph_info()["fallbacks"]) == 1
    m.release_graphs()
    assert m.graph_info()["fallbacks"] == [] and m.graph_info()["graphs"] == []
    assert torch.cuda.is_initialized() == initialised
    with torch.no_grad():
        m(x)  # counting starts again: one call is below capture_after
    assert m.graph_info()["fallbacks"] == []


def test_a_wrapped_model_is_freed_without_a_garbage_collection() -> None:
    """No reference cycle through the wrapper: its graphs and pools go as soon as the last reference does, not at
    some later cyclic collection (which could also fire in the middle of another capture)."""
    import gc
    import weakref

    m = wrap(net().eval(), cuda_graph="auto")
    m._model_split.forward = m._model_split._new(None)  # the model and how to make pieces, not the wrapper
    ref = weakref.ref(m)
    enabled = gc.isenabled()
    gc.disable()
    try:
        del m
        assert ref() is None, "the wrapper sits in a reference cycle"
    finally:
        if enabled:
            gc.enable()


def test_batch_buckets_are_checked_where_wrap_is_called_and_kept_by_copies() -> None:
    with pytest.raises(ConfigError, match="batch_buckets holds \\[0\\]"):
        wrap(net().eval(), batch_buckets=[0, 4])
    with pytest.raises(ConfigError, match="batch_buckets='auto'"):
        wrap(net().eval(), batch_buckets="automatic")
    assert wrap(net().eval(), batch_buckets="auto").graph_info()["batch_buckets"]["automatic"]
    m = wrap(net().eval(), batch_buckets=[8, 1, 4])
    assert m.graph_info()["batch_buckets"]["sizes"] == [1, 4, 8]
    assert copy.deepcopy(m).graph_info()["batch_buckets"]["sizes"] == [1, 4, 8]


def test_a_model_without_a_cuda_device_is_not_padded() -> None:
    """Buckets pad only calls that can replay a graph: on the CPU a call runs as given."""
    model = net().eval()
    m = wrap(model, batch_buckets=[4, 8])
    x = torch.randn(3, 4)
    with torch.no_grad():
        for _ in range(4):
            assert torch.equal(m(x), model(x))
    info = m.graph_info()["batch_buckets"]
    assert (info["padded_calls"], info["exact_calls"], info["proofs"]) == (0, 0, {})
