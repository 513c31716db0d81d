"""CPU tests of pointer indirection's bookkeeping against a stand-in for the CUDA driver (tests only).

The real driver path (capture, rebind, bit-identical replay) is in test_cuda_compiler.py; here a fake
driver serves kernel nodes whose parameter buffers hold placeholder addresses, so the scan (which
words, which offsets) and the rebind (what is written, which nodes are re-set) are checked exactly.
"""

from __future__ import annotations

import ctypes
import types

import pytest
import torch

from launchless.compiler import indirection


class _Params:
    def __init__(self, func: int, table: int) -> None:
        self.func, self.kern, self.kernelParams = func, 0, table


class _FakeDriver:
    CUresult = types.SimpleNamespace(CUDA_SUCCESS=0, CUDA_ERROR_INVALID_VALUE=1)
    CUgraphNodeType = types.SimpleNamespace(
        CU_GRAPH_NODE_TYPE_KERNEL="kernel",
        CU_GRAPH_NODE_TYPE_MEMSET="memset",
        CU_GRAPH_NODE_TYPE_MEMCPY="memcpy",
        CU_GRAPH_NODE_TYPE_GRAPH="graph",
    )

    def __init__(self, kernels: list[list[bytes]], extra_types: list[str] = ()) -> None:
        self.kernels = kernels  # per node: the bytes of each parameter
        self.types = ["kernel"] * len(kernels) + list(extra_types)
        self._keep = []
        self.set_calls: list[tuple[int, list[bytes]]] = []

    def cuGraphGetNodes(self, raw, n):
        nodes = list(range(len(self.types)))
        return (0, [] if n == 0 else nodes, len(nodes))

    def cuGraphNodeGetType(self, node):
        return (0, self.types[node])

    def cuGraphKernelNodeGetParams(self, node):
        buffers = [ctypes.create_string_buffer(b, len(b)) for b in self.kernels[node]]
        table = (ctypes.c_void_p * len(buffers))(*(ctypes.addressof(b) for b in buffers))
        self._keep += [buffers, table]
        return (0, _Params(func=100 + node, table=ctypes.addressof(table)))

    def cuFuncGetParamInfo(self, func, index):
        sizes = [len(b) for b in self.kernels[func - 100]]
        if index >= len(sizes):
            return (1, 0, 0)
        return (0, sum(sizes[:index]), sizes[index])

    def cuGraphExecKernelNodeSetParams(self, exec_, node, params):
        table = ctypes.cast(params.kernelParams, ctypes.POINTER(ctypes.c_void_p))
        sizes = [len(b) for b in self.kernels[node]]
        self.set_calls.append((node, [ctypes.string_at(table[i], s) for i, s in enumerate(sizes)]))
        return (0,)

    def cuGraphMemsetNodeGetParams(self, node):
        return (0, types.SimpleNamespace(dst=self.memset_dst))


class _Graph:
    def raw_cuda_graph(self) -> int:
        return 1

    def raw_cuda_graph_exec(self) -> int:
        return 2


def _word(value: int) -> bytes:
    return value.to_bytes(8, "little")


@pytest.fixture
def placeholders():
    return {0: torch.zeros(64), 3: torch.zeros(16)}


def _install(monkeypatch, driver) -> None:
    monkeypatch.setattr(indirection, "_driver", lambda: driver)


def test_scan_finds_placeholder_words_and_their_offsets(monkeypatch, placeholders) -> None:
    a, b = placeholders[0].data_ptr(), placeholders[3].data_ptr()
    driver = _FakeDriver(
        [
            [_word(a), (7).to_bytes(4, "little"), _word(123456)],  # input 0 as a plain pointer
            [_word(999) + _word(b + 32)],  # input 3, 32 bytes in, inside a 16-byte struct parameter
            [_word(42)],  # a kernel that touches no input: not patched
        ]
    )
    _install(monkeypatch, driver)
    pi = indirection.PointerIndirection(_Graph(), placeholders)
    assert pi.patched_nodes == 2
    sites = {(s.slot, s.param, s.offset, s.delta) for n in pi.nodes for s in n.sites}
    assert sites == {(0, 0, 0, 0), (3, 0, 8, 32)}


def test_rebind_writes_new_addresses_and_resets_only_changed_nodes(monkeypatch, placeholders) -> None:
    a, b = placeholders[0].data_ptr(), placeholders[3].data_ptr()
    driver = _FakeDriver([[_word(a)], [_word(999) + _word(b + 32)]])
    _install(monkeypatch, driver)
    pi = indirection.PointerIndirection(_Graph(), placeholders)
    pi.rebind({0: a, 3: b})
    assert driver.set_calls == []  # nothing moved: no driver call
    new = torch.zeros(16)
    pi.rebind({0: a, 3: new.data_ptr()})
    assert driver.set_calls == [(1, [_word(999) + _word(new.data_ptr() + 32)])]
    pi.rebind({0: a, 3: new.data_ptr()})
    assert len(driver.set_calls) == 1  # unchanged since: nothing to do


def test_an_input_found_in_no_kernel_refuses_indirection(monkeypatch, placeholders) -> None:
    _install(monkeypatch, _FakeDriver([[_word(placeholders[0].data_ptr())]]))
    with pytest.raises(indirection.IndirectionUnavailable, match=r"input\(s\) \[3\] is in no kernel"):
        indirection.PointerIndirection(_Graph(), placeholders)


def test_a_memset_on_a_placeholder_refuses_indirection(monkeypatch, placeholders) -> None:
    driver = _FakeDriver(
        [[_word(placeholders[0].data_ptr())], [_word(placeholders[3].data_ptr())]], extra_types=["memset"]
    )
    driver.memset_dst = placeholders[3].data_ptr()
    _install(monkeypatch, driver)
    with pytest.raises(indirection.IndirectionUnavailable, match="memset node reads or writes"):
        indirection.PointerIndirection(_Graph(), placeholders)


def test_alignment_rule(monkeypatch, placeholders) -> None:
    _install(monkeypatch, _FakeDriver([[_word(placeholders[0].data_ptr())], [_word(placeholders[3].data_ptr())]]))
    pi = indirection.PointerIndirection(_Graph(), placeholders)
    base = pi.base[0]
    assert pi.accepts(0, base + 512) and not pi.accepts(0, base + 4)


def test_missing_bindings_say_how_to_install(monkeypatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_cuda(name, *args, **kwargs):
        if name.startswith("cuda"):
            raise ImportError("No module named 'cuda'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_cuda)
    assert "pip install cuda-bindings" in indirection.unavailable_reason()
