"""CPU tests for launchless.core.signature: input flattening, rebuilding and cache keys."""

from __future__ import annotations

import pytest
import torch
from torch.utils import _pytree as pytree

from launchless.core.signature import (
    Signature,
    TensorSpec,
    UnhashableInput,
    autocast_context,
    flatten_inputs,
    signature_of,
    tensor_spec,
)


def key(*args, **kwargs) -> Signature:
    return signature_of(flatten_inputs(args, kwargs))


def assert_same_tree(a, b) -> None:
    """Same structure, and every leaf the very same object (rebuild must not copy or reorder)."""
    assert pytree.tree_structure(a) == pytree.tree_structure(b)
    la, lb = pytree.tree_leaves(a), pytree.tree_leaves(b)
    assert len(la) == len(lb)
    assert all(x is y for x, y in zip(la, lb, strict=True))


@pytest.fixture
def cuda_autocast_off():
    """signature_of reads CUDA's autocast state; restore it whatever a test does to it."""
    enabled, dtype = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
    yield
    torch.set_autocast_enabled("cuda", enabled)
    torch.set_autocast_dtype("cuda", dtype)


# ---- flattening ---------------------------------------------------------------------------------


def test_fast_path_for_tensors_and_scalars() -> None:
    x, y = torch.randn(2, 3), torch.randn(3)
    args, kwargs = (x, 3, 0.5, True, None, "s"), {"y": y, "k": 7}
    flat = flatten_inputs(args, kwargs)
    assert flat.structure == ("fast", 6, ("y", "k"))
    assert flat.leaves == [*args, *kwargs.values()]
    new_args, new_kwargs = flat.rebuild(flat.leaves)
    assert new_args == args and all(a is b for a, b in zip(new_args, args, strict=True))
    assert new_kwargs.keys() == kwargs.keys() and all(new_kwargs[k] is kwargs[k] for k in kwargs)


def test_fast_path_rebuild_puts_new_leaves_in_place() -> None:
    flat = flatten_inputs((torch.zeros(1), 1), {"b": torch.zeros(2)})
    new = [torch.ones(1), 2, torch.ones(2)]
    args, kwargs = flat.rebuild(new)
    assert args[0] is new[0] and args[1] == 2 and kwargs["b"] is new[2]


def test_nested_inputs_take_the_pytree_path() -> None:
    x, y, z = torch.randn(2), torch.randn(3), torch.randn(4)
    args, kwargs = ([x, (y, 2)],), {"d": {"z": z, "n": 1.5}}
    flat = flatten_inputs(args, kwargs)
    ref_leaves, ref_spec = pytree.tree_flatten((args, kwargs))
    assert flat.structure == ref_spec
    assert all(a is b for a, b in zip(flat.leaves, ref_leaves, strict=True))
    assert_same_tree(flat.rebuild(flat.leaves), (args, kwargs))
    new = [torch.ones_like(t) if isinstance(t, torch.Tensor) else t for t in flat.leaves]
    new_args, new_kwargs = flat.rebuild(new)
    assert new_args[0][0] is new[0] and new_args[0][1][0] is new[1] and new_kwargs["d"]["z"] is new[3]


def test_fast_and_pytree_structures_differ() -> None:
    x = torch.randn(2)
    assert key(x) != key([x])
    assert key(x) != key((x,))


# ---- what the key depends on ----------------------------------------------------------------------


def test_equal_for_fresh_tensors_with_the_same_spec() -> None:
    assert key(torch.randn(2, 3), n=1) == key(torch.zeros(2, 3), n=1)
    assert hash(key(torch.randn(2, 3))) == hash(key(torch.ones(2, 3)))
    assert key([torch.randn(2)], {"a": 1}) == key([torch.zeros(2)], {"a": 1})


@pytest.mark.parametrize(
    ("a", "b"),
    [
        pytest.param(torch.zeros(2, 3), torch.zeros(3, 2), id="shape"),
        pytest.param(torch.zeros(3, 2), torch.zeros(2, 3).t(), id="stride-transposed"),
        pytest.param(
            torch.zeros(2, 3, 4, 5),
            torch.zeros(2, 3, 4, 5).to(memory_format=torch.channels_last),
            id="stride-channels_last",
        ),
        pytest.param(torch.zeros(2), torch.zeros(2, dtype=torch.float64), id="dtype"),
        pytest.param(torch.zeros(2), torch.zeros(2, device="meta"), id="device"),
        pytest.param(torch.zeros(2), torch.zeros(2, requires_grad=True), id="requires_grad"),
    ],
)
def test_tensor_spec_differences_change_the_key(a: torch.Tensor, b: torch.Tensor) -> None:
    assert key(a) != key(b)
    assert key(x=a) != key(x=b)
    assert key([a]) != key([b])


@pytest.mark.parametrize(
    ("a", "b"),
    [
        pytest.param(1, 2, id="value"),
        pytest.param(1, True, id="int-vs-bool"),
        pytest.param(1, 1.0, id="int-vs-float"),
        pytest.param(True, 1.0, id="bool-vs-float"),
        pytest.param("a", "b", id="str"),
        pytest.param(None, 0, id="none-vs-0"),
    ],
)
def test_non_tensor_values_and_types_change_the_key(a, b) -> None:
    x = torch.zeros(1)  # 1 == True == 1.0 in Python, but each may make eager take another path
    assert key(x, a) != key(x, b)
    assert key(x, k=a) != key(x, k=b)
    assert key([x, a]) != key([x, b])


def test_kwarg_names_and_positional_vs_keyword_change_the_key() -> None:
    x = torch.zeros(2)
    assert key(a=x) != key(b=x)
    assert key(x) != key(a=x)
    assert key(x, 1) != key(x, k=1)


def test_key_is_tensor_spec_of_each_leaf() -> None:
    x = torch.zeros(2, 3).t()
    sig = key(x, 4)
    assert sig.leaves[0] == TensorSpec(torch.Size([3, 2]), (1, 3), torch.float32, torch.device("cpu"), False)
    assert sig.leaves[0] == tensor_spec(x)
    assert sig.leaves[1] == ("value", int, 4)


@pytest.mark.parametrize("bad", [{1, 2}, bytearray(b"ab")], ids=["set", "bytearray"])
def test_unhashable_non_tensor_input_raises_with_the_fix(bad) -> None:
    with pytest.raises(UnhashableInput) as info:
        key(torch.zeros(1), bad)
    msg = str(info.value)
    assert type(bad).__name__ in msg
    assert "pass it as a tensor, or as a hashable value" in msg
    assert isinstance(info.value, TypeError)


def test_unhashable_custom_object_raises() -> None:
    class Config:
        __hash__ = None  # type: ignore[assignment]

    with pytest.raises(UnhashableInput, match="Config"):
        key(torch.zeros(1), cfg=Config())


def test_signed_zero_scalars_get_different_keys() -> None:
    x = torch.ones(1)
    eager_pos, eager_neg = x * 0.0, x * -0.0
    assert torch.signbit(eager_pos) != torch.signbit(eager_neg)  # eager results differ bit-wise
    assert key(x, 0.0) != key(x, -0.0)


# ---- autocast -------------------------------------------------------------------------------------


def test_autocast_context_for_cpu_follows_torch_autocast() -> None:
    assert autocast_context("cpu")[:2] == (False, None)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert autocast_context("cpu")[:2] == (True, torch.bfloat16)
        assert autocast_context("cpu")[:2] == (True, torch.get_autocast_dtype("cpu"))
    assert autocast_context("cpu")[:2] == (False, None)


def test_cpu_autocast_does_not_change_the_cuda_key() -> None:
    """Graphs are CUDA graphs: only CUDA's autocast state selects their kernels."""
    x = torch.zeros(2)
    plain = key(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert key(x) == plain


def test_cuda_autocast_state_changes_the_key(cuda_autocast_off) -> None:
    x = torch.zeros(2)
    plain = key(x)
    assert plain.context[:2] == (False, None)
    # The autocast state is thread-local and can be set without a GPU.
    torch.set_autocast_enabled("cuda", True)
    torch.set_autocast_dtype("cuda", torch.bfloat16)
    bf16 = key(x)
    torch.set_autocast_dtype("cuda", torch.float16)
    fp16 = key(x)
    assert bf16.context[:2] == (True, torch.bfloat16) and fp16.context[:2] == (True, torch.float16)
    assert len({plain, bf16, fp16}) == 3
    assert "autocast=torch.bfloat16" in bf16.describe()


# ---- describe -------------------------------------------------------------------------------------


def test_describe_names_dtype_shape_device_and_values() -> None:
    text = key(torch.zeros(2, 3), torch.zeros((), dtype=torch.int64), torch.zeros(4, requires_grad=True), 5).describe()
    assert text.startswith("(") and text.endswith(")")
    assert "float32[2x3]@cpu" in text
    assert "int64[scalar]@cpu" in text
    assert "float32[4]@cpu, requires_grad" in text
    assert "int=5" in text
    assert "autocast" not in text
