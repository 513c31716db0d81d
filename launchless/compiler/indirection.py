"""Pointer indirection (GraCE's PI): point a graph's kernels at the caller's tensors instead of copying.

A captured graph reads its inputs from placeholders, so every replay first copies each changing input
in -- for a large input (a video clip, a long sequence) that copy is much of the replay. Instead: keep
the graph's template (``CUDAGraph(keep_graph=True)``), walk its kernel nodes (``cuGraphGetNodes``),
read each kernel's parameter bytes (``cuGraphKernelNodeGetParams`` for the values, ``cuFuncGetParamInfo``
for each parameter's offset and size) and note every 8-byte word that holds an address inside a
placeholder. On replay, write the new tensor's address (plus the same offset) into a private copy of
those parameter buffers and call ``cuGraphExecKernelNodeSetParams`` on the instantiated graph -- only
for nodes whose addresses changed. The parameter buffers are built once, at capture.

Refused (the caller keeps copying) when cuda-bindings or PyTorch's ``keep_graph`` is missing, when a
placeholder's address is not found in any kernel's parameters (read through a pointer table, as
batched GEMMs do), or when a memcpy/memset node or a child graph touches a placeholder. A new address
that is less aligned than the captured one (compiled kernels specialise on alignment) is copied for
that call. Every PI graph is verified like any other before it is trusted.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Any

import torch

_WORD = 8
_ALIGN = 16  # Triton and cuBLAS kernels specialise on 16-byte alignment of their pointers


class IndirectionUnavailable(Exception):
    """Pointer indirection cannot serve this graph; the message says why (the caller copies instead)."""


def _driver() -> Any:
    try:
        from cuda.bindings import driver
    except ImportError as exc:
        raise IndirectionUnavailable(f"cuda-bindings is not installed ({exc}); pip install cuda-bindings") from exc
    return driver


def unavailable_reason() -> str | None:
    """None when this process can use pointer indirection, else why not."""
    try:
        _driver()
    except IndirectionUnavailable as exc:
        return str(exc)
    graph_cls = torch.cuda.CUDAGraph
    if not hasattr(graph_cls, "raw_cuda_graph_exec") or not hasattr(graph_cls, "instantiate"):
        return f"torch {torch.__version__} has no CUDAGraph.raw_cuda_graph_exec (needs torch >= 2.9)"
    return None


def _check(result: tuple, what: str) -> tuple:
    driver = _driver()
    if result[0] != driver.CUresult.CUDA_SUCCESS:
        raise IndirectionUnavailable(f"{what} failed: {result[0]}")
    return result[1:]


@dataclass
class _Site:
    """One word in one kernel parameter that holds ``placeholder + delta``."""

    slot: int
    param: int
    offset: int  # byte offset of the word inside that parameter's buffer
    delta: int  # address minus the placeholder's start


@dataclass
class _KernelNode:
    node: Any
    params: Any  # a CUDA_KERNEL_NODE_PARAMS whose kernelParams point at ``buffers``
    buffers: list[ctypes.Array]
    pointers: ctypes.Array
    sites: list[_Site] = field(default_factory=list)


def _address(handle: Any) -> int:
    """The integer behind a cuda-bindings handle or pointer field (they expose int() or getPtr())."""
    if handle is None:
        return 0
    try:
        return int(handle)
    except TypeError:
        return int(handle.getPtr())


def _function(driver: Any, params: Any) -> Any:
    func = getattr(params, "func", None)
    if func is not None and _address(func):
        return func
    kern = getattr(params, "kern", None)
    if kern is not None and _address(kern):
        (func,) = _check(driver.cuKernelGetFunction(kern), "cuKernelGetFunction")
        return func
    raise IndirectionUnavailable("a kernel node names neither a function nor a library kernel")


def _param_layout(driver: Any, func: Any) -> list[tuple[int, int]]:
    """(offset, size) of each parameter of ``func``, in order."""
    layout = []
    while True:
        result = driver.cuFuncGetParamInfo(func, len(layout))
        if result[0] != driver.CUresult.CUDA_SUCCESS:
            return layout  # CUDA_ERROR_INVALID_VALUE past the last parameter
        layout.append((int(result[1]), int(result[2])))


def _read_kernel(driver: Any, node: Any, ranges: list[tuple[int, int, int]]) -> _KernelNode | None:
    """The node's parameter buffers, copied, with every word pointing into a placeholder; None if none."""
    (params,) = _check(driver.cuGraphKernelNodeGetParams(node), "cuGraphKernelNodeGetParams")
    table = _address(params.kernelParams)
    if not table:
        raise IndirectionUnavailable("a kernel takes its parameters through `extra` (a packed buffer)")
    layout = _param_layout(driver, _function(driver, params))
    originals = ctypes.cast(table, ctypes.POINTER(ctypes.c_void_p))
    buffers, sites = [], []
    for index, (_, size) in enumerate(layout):
        buffer = (ctypes.c_char * size).from_buffer_copy(ctypes.string_at(originals[index], size))
        buffers.append(buffer)
        for offset in range(0, size - _WORD + 1, _WORD):
            word = int.from_bytes(bytes(buffer[offset : offset + _WORD]), "little")
            for slot, start, nbytes in ranges:
                if start <= word < start + max(nbytes, 1):
                    sites.append(_Site(slot, index, offset, word - start))
    if not sites:
        return None
    pointers = (ctypes.c_void_p * len(buffers))(*(ctypes.addressof(b) for b in buffers))
    params.kernelParams = ctypes.addressof(pointers)
    return _KernelNode(node, params, buffers, pointers, sites)


def _touches(driver: Any, node: Any, kind: Any, ranges: list[tuple[int, int, int]]) -> bool:
    """Whether a non-kernel node reads or writes a placeholder (then PI would leave it stale)."""
    types = driver.CUgraphNodeType
    if kind == types.CU_GRAPH_NODE_TYPE_MEMSET:
        (p,) = _check(driver.cuGraphMemsetNodeGetParams(node), "cuGraphMemsetNodeGetParams")
        addresses = [_address(p.dst)]
    elif kind == types.CU_GRAPH_NODE_TYPE_MEMCPY:
        (p,) = _check(driver.cuGraphMemcpyNodeGetParams(node), "cuGraphMemcpyNodeGetParams")
        addresses = [_address(p.srcDevice), _address(p.dstDevice)]
    else:  # a child graph is not walked: assume it might
        return kind == types.CU_GRAPH_NODE_TYPE_GRAPH
    return any(start <= a < start + nbytes for a in addresses for _, start, nbytes in ranges)


class PointerIndirection:
    """Rebinds the placeholders of one instantiated graph to new addresses, node by node."""

    def __init__(self, graph: torch.cuda.CUDAGraph, placeholders: dict[int, torch.Tensor]) -> None:
        """``graph``: captured with ``keep_graph=True`` and instantiated (its template is read here)."""
        driver = _driver()
        ranges = [(slot, t.data_ptr(), t.untyped_storage().nbytes()) for slot, t in placeholders.items()]
        raw = graph.raw_cuda_graph()
        (_, count) = _check(driver.cuGraphGetNodes(raw, 0), "cuGraphGetNodes")
        (nodes, _) = _check(driver.cuGraphGetNodes(raw, count), "cuGraphGetNodes")
        kernel = driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL
        self.nodes: list[_KernelNode] = []
        for node in nodes:
            (kind,) = _check(driver.cuGraphNodeGetType(node), "cuGraphNodeGetType")
            if kind == kernel:
                found = _read_kernel(driver, node, ranges)
                if found is not None:
                    self.nodes.append(found)
            elif _touches(driver, node, kind, ranges):
                raise IndirectionUnavailable(f"a {kind} node reads or writes an input placeholder")
        seen = {site.slot for n in self.nodes for site in n.sites}
        missing = sorted(set(placeholders) - seen)
        if missing:
            raise IndirectionUnavailable(
                f"the address of input(s) {missing} is in no kernel's parameters (read through a pointer table?)"
            )
        self.base = {slot: t.data_ptr() for slot, t in placeholders.items()}
        self.current = dict(self.base)
        self.by_slot: dict[int, list[tuple[_KernelNode, _Site]]] = {}
        for n in self.nodes:
            for site in n.sites:
                self.by_slot.setdefault(site.slot, []).append((n, site))
        self.exec = graph.raw_cuda_graph_exec()
        self.patched_nodes = len(self.nodes)

    def accepts(self, slot: int, address: int) -> bool:
        """A new address must be at least as aligned as the captured one (kernels specialise on it)."""
        base = self.base[slot]
        return address % _ALIGN == 0 or address % _ALIGN == base % _ALIGN

    def rebind(self, addresses: dict[int, int]) -> None:
        """Point the graph at ``addresses`` (slot -> data_ptr); only changed slots touch the driver."""
        dirty: dict[int, _KernelNode] = {}
        for slot, address in addresses.items():
            if self.current.get(slot) == address:
                continue
            self.current[slot] = address
            for node, site in self.by_slot.get(slot, ()):
                ctypes.memmove(
                    ctypes.addressof(node.buffers[site.param]) + site.offset,
                    (address + site.delta).to_bytes(_WORD, "little"),
                    _WORD,
                )
                dirty[id(node)] = node
        if dirty:
            driver = _driver()
            for node in dirty.values():
                _check(
                    driver.cuGraphExecKernelNodeSetParams(self.exec, node.node, node.params),
                    "cuGraphExecKernelNodeSetParams",
                )


class IndirectGraph:
    """A captured graph replayed through pointer indirection: the caller's tensors are read in place.

    Duck-types ``CapturedGraph.replay_cloned`` so verification and timing treat both alike. An input
    whose new address is less aligned than the captured one is copied into its placeholder instead."""

    def __init__(self, captured: Any) -> None:
        self.captured = captured
        self.slots = list(captured.tensor_slots)
        self.pi = PointerIndirection(captured.graph, {i: captured.static_leaves[i] for i in self.slots})
        self.replays = 0
        self.copied_bytes = 0  # bytes copied on replays that had to fall back to the placeholder

    def replay_cloned(self, leaves: list) -> Any:
        addresses = {}
        for i in self.slots:
            t = leaves[i]
            address = t.data_ptr()
            if self.pi.accepts(i, address):
                addresses[i] = address
            else:  # copied into the placeholder, which the graph is then pointed back at
                self.captured.static_leaves[i].copy_(t, non_blocking=True)
                self.copied_bytes += t.nbytes
                addresses[i] = self.pi.base[i]
        self.pi.rebind(addresses)
        self.captured.graph.replay()
        self.replays += 1
        return self.captured.fresh_outputs(leaves)

    def reset(self) -> None:
        """Point the graph back at its placeholders (before anyone replays it the copying way)."""
        self.pi.rebind(dict(self.pi.base))
