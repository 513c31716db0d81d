"""Region splits inside one forward: graphs captured around the operations that cannot be captured.

Some operations sync with the host inside their own kernel code and still return device tensors whose shapes
follow from their inputs' shapes: ``torch._grouped_mm`` on float32 (the experts of a mixture-of-experts layer)
copies its group offsets to the host, ``torch.histc`` without a range reads the data's minimum and maximum.
Python never sees the values they read, yet one such call refuses the graph of the whole forward. Such an
operation is a *junction*: the forward is captured as a chain of graphs into one memory pool -- the capture
ended before each junction call and begun again after it -- and the junction runs eager between the replays,
on the very tensors the graphs write and read (its result copied into the buffer the next graph reads).

An operation is a junction only when running it again on the same tensors is exactly what eager does:

- every tensor it reads is on the capture device (a graph's buffer, a parameter, an input's static copy); a
  host tensor could hold another value at the next call, unseen;
- it returns device tensors or nothing -- or it is a *guarded host read*: ``.item()``, ``bool(t)``, ``int(t)``,
  ``torch.equal`` on device tensors hand Python one value, which may steer the Python code after it and so the
  kernels the graphs after it froze. Such a read runs again at every replay, on the same tensor, and must return
  the very value it returned at the capture: then the Python code after it took the path the graphs recorded
  (XLM's ``assert lengths.max().item() <= slen``, a mask's ``if mask.all():``). A host tensor (``.cpu()``,
  ``.tolist()``) is not a junction: the host code may keep or copy it back, unseen;
- its output's shape follows from its inputs' shapes and it draws no random numbers: PyTorch tags some of the
  others (``dynamic_output_shape`` for ``nonzero``, ``unique``, ``masked_select``; ``data_dependent_output``;
  ``nondeterministic_seeded``), and the rest is proven on fake tensors (``shape_proof``): a composite such as
  ``where(condition)``, which a dispatch mode sees undecomposed under ``inference_mode``, and another library's
  operation such as ``torchvision::nms`` carry no tag, yet return as many elements as their data says.

Should a junction still return another shape at a replay than at its capture, or a guarded read another value,
the replay raises ``JunctionChanged`` (``JunctionShapeChanged``, ``JunctionValueChanged``) before any output is
handed out; the policy runs that call eager and drops the graph.

Junctions are found by capturing: a capture that fails inside an operation names it (``SegmentingMode`` counts
nothing, it only watches which operation raised); every call of that operation becomes a junction and the
forward is captured again, up to ``MAX_JUNCTION_OPS`` kinds. While the chain is captured, each finished graph
is replayed at once, so the junction after it reads real values, as it will at every replay (a junction such
as ``histc`` fails on uninitialised memory). The chain is then verified against eager like any graph.
"""

from __future__ import annotations

import dataclasses
import math
import traceback
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from ..diagnose.source import locate
from .shape_proof import DATA_DEPENDENT_SHAPE, HOST_VALUE, data_dependence

MAX_JUNCTION_OPS = 8  # kinds of operation one forward may run eager between its graphs
MAX_JUNCTION_CALLS = 512  # calls of them in one forward: each ends a graph (a read in a loop over tokens would not)
_aten = torch.ops.aten
HOST_READS = frozenset(
    {
        _aten._local_scalar_dense.default,
        _aten.item.default,  # under inference_mode a dispatch mode sees .item() and bool(t) undecomposed
        _aten.is_nonzero.default,
        _aten.equal.default,
        _aten.allclose.default,
    }
)
"""Operations that hand the host one Python value read from device tensors: junctions guarded by that value."""
_NOT_JUNCTION_TAGS = {
    torch.Tag.dynamic_output_shape: DATA_DEPENDENT_SHAPE,
    torch.Tag.data_dependent_output: HOST_VALUE,
    torch.Tag.nondeterministic_seeded: "it draws random numbers",
}


def is_capture_error(exc: BaseException) -> bool:
    """Whether ``exc`` is CUDA refusing an operation under stream capture (not a broken forward)."""
    text = str(exc).lower()
    return "captur" in text or "not permitted" in text


@dataclasses.dataclass(frozen=True)
class Site:
    """The operation a capture failed in, and whether it can run eager between two graphs."""

    op: Any  # the OpOverload
    name: str  # e.g. "aten::histc"
    why_not: str  # empty when it can be a junction
    source: str | None  # the line that called it

    @property
    def eligible(self) -> bool:
        return not self.why_not


_SAME_READ = {
    _aten.item.default: _aten._local_scalar_dense.default,
    _aten.is_nonzero.default: _aten._local_scalar_dense.default,
}
"""``.item()`` and ``bool(t)`` as a dispatch mode sees them under inference_mode, named as under no_grad (where they
arrive decomposed): the same read is reported alike in both grad modes."""


def operation_name(func: Any) -> str:
    """An operation as messages name it: "aten::histc"."""
    schema = getattr(_SAME_READ.get(func, func), "_schema", None)
    return str(schema.name) if schema is not None else str(func)


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [x for x in pytree.tree_leaves(tree) if isinstance(x, torch.Tensor)]


def _on(device: torch.device, t: torch.Tensor) -> bool:
    return t.device.type == device.type and (device.index is None or t.device.index == device.index)


def site_of(func: Any, args: tuple, kwargs: dict, device: torch.device) -> Site:
    """What ``func`` called with ``args`` is, as a junction candidate (outputs are checked when it runs). A host
    read of device tensors is one, guarded by the value it returns (``HOST_READS``)."""
    on_host = any(not _on(device, t) for t in _tensors((args, kwargs)))
    if func in HOST_READS:
        why_not = "it reads a host tensor, whose value may change between calls unseen" if on_host else ""
    else:
        why_not = next((why for tag, why in _NOT_JUNCTION_TAGS.items() if tag in getattr(func, "tags", ())), "")
        if not why_not and on_host:
            why_not = "it reads a host tensor, whose value may change between calls unseen"
        if not why_not:
            why_not = data_dependence(func, args, kwargs)
    location = locate(traceback.extract_stack())
    return Site(func, operation_name(func), why_not, str(location) if location else None)


class JunctionChanged(RuntimeError):
    """A junction returned at a replay what the graphs after it were not captured for. Raised before any output is
    handed out, so the call can run eager instead."""


class JunctionShapeChanged(JunctionChanged):
    """A junction returned another shape or dtype at a replay than at its capture: its output's shape depends on
    values after all, and the graphs after it read buffers of the captured shape."""


class JunctionValueChanged(JunctionChanged):
    """A guarded host read returned another value at a replay than at its capture: the Python code after it may
    take another path than the one the graphs after it recorded."""


def same_value(a: object, b: object) -> bool:
    """Whether two values a host read returned are the same to the Python code that reads them: equal, of one
    type, a float's sign included (``-0.0`` and ``0.0`` divide otherwise) and NaN the same as NaN."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    return a == b


class NotAJunction(Exception):
    """A junction candidate that returned something a replay could not reproduce (a host value)."""


class Junction:
    """One call of a junction operation between two graphs: the tensors it reads are the graphs' own. A guarded host
    read keeps the value it returned (``read``); any other junction, the tensors it wrote (``outputs``)."""

    __slots__ = ("args", "func", "kwargs", "name", "outputs", "read", "source")

    def __init__(self, func: Any, args: tuple, kwargs: dict, out: Any, device: torch.device, source: str | None):
        self.func, self.args, self.kwargs, self.name, self.source = func, args, kwargs, operation_name(func), source
        self.outputs: list[torch.Tensor] = []
        self.read: bool | int | float | complex | None = None
        if func in HOST_READS:
            self.read = out
            return
        leaves = pytree.tree_leaves(out)
        if any(not (x is None or (isinstance(x, torch.Tensor) and _on(device, x))) for x in leaves):
            kinds = sorted({type(x).__name__ if not isinstance(x, torch.Tensor) else str(x.device) for x in leaves})
            raise NotAJunction(
                f"{operation_name(func)} returns {', '.join(kinds)}, which the host code after it may read"
            )
        self.outputs = [x for x in leaves if isinstance(x, torch.Tensor)]

    @property
    def guarded(self) -> bool:
        """Whether this is a host read: run again at each replay, it must return the captured value."""
        return self.func in HOST_READS

    def run(self) -> None:
        """Run the operation again on the same tensors; its results go where the next graph reads them (a host
        read's value is compared with the captured one instead)."""
        if self.guarded:
            value = self.func(*self.args, **self.kwargs)
            if not same_value(value, self.read):
                where = f" at {self.source}" if self.source else ""
                raise JunctionValueChanged(
                    f"launchless: {self.name}{where} read {value!r} on replay, {self.read!r} when captured: the "
                    "Python code after it may take another path than the graphs after it recorded"
                )
            return
        fresh = _tensors(self.func(*self.args, **self.kwargs))
        for static, new in zip(self.outputs, fresh, strict=True):
            if new is static or (new.data_ptr() == static.data_ptr() and new.shape == static.shape):
                continue  # in place: it wrote the graph's buffer itself
            if new.shape != static.shape or new.dtype != static.dtype:  # excluded by the proof; checked cheaply
                raise JunctionShapeChanged(
                    f"launchless: {self.name} returned {tuple(new.shape)} {new.dtype} on replay, "
                    f"{tuple(static.shape)} {static.dtype} when captured: its output's shape depends on the values "
                    "it reads"
                )
            static.copy_(new)

    def row(self) -> dict[str, Any]:
        row: dict[str, Any] = {"op": self.name, "source": self.source}
        if self.guarded:  # JSON has no complex number
            row["value_read"] = repr(self.read) if isinstance(self.read, complex) else self.read
        return row


def op_names(junctions: Iterable[Junction]) -> str:
    """The operations run eager between graphs, each once: "aten::histc, aten::_grouped_mm"."""
    return ", ".join(dict.fromkeys(j.name for j in junctions))


def guard_note(junctions: Iterable[Junction]) -> str:
    """What a chain with host reads checks at every replay (empty without one), for its log line."""
    reads = [j for j in junctions if j.guarded]
    if not reads:
        return ""
    return (
        f"; {len(reads)} value(s) read on the host ({op_names(reads)}) are read again at every replay and must be "
        "the ones captured, else that call runs eager and the graphs go"
    )


class SegmentedGraph:
    """Graphs captured one after another into one pool with junctions between them; replays like one graph.

    Graphs sharing a pool must be replayed in the order they were captured (a later one may reuse memory an
    earlier one freed): ``replay`` always runs the whole chain. A replay stopped at a junction
    (``JunctionChanged``) gives the CUDA generator of ``device`` back the offset the replay found (each replay of a
    graph that draws random numbers moves it on): the call then runs eager from where it began, drawing what eager
    draws."""

    def __init__(self, device: torch.device | None = None) -> None:
        self.graphs: list[torch.cuda.CUDAGraph] = []
        self.empty: list[bool] = []  # a graph with no kernel (two junctions in a row) is not replayed
        self.junctions: list[Junction] = []
        self.generator: torch.Generator | None = None
        if device is not None and device.type == "cuda":
            index = device.index if device.index is not None else torch.cuda.current_device()
            self.generator = torch.cuda.default_generators[index]

    def replay(self) -> None:
        generator = self.generator
        offset = generator.get_offset() if generator is not None else 0  # an int: no tensor on the replay path
        try:
            self._replay()
        except JunctionChanged:
            if generator is not None:
                generator.set_offset(offset)
            raise

    def _replay(self) -> None:
        graphs, empty = self.graphs, self.empty
        if not empty[0]:
            graphs[0].replay()
        # dispatched as eager had it (below autocast); inference mode, where the buffers of a chain captured under
        # inference_mode may be written (as those captured under no_grad may)
        with torch.inference_mode(), torch.autocast("cuda", enabled=False):
            for junction, graph, nothing in zip(self.junctions, graphs[1:], empty[1:], strict=True):
                junction.run()
                if not nothing:
                    graph.replay()

    def reset(self) -> None:
        for graph in self.graphs:
            graph.reset()


class SegmentingMode(TorchDispatchMode):
    """Active while a forward is captured as a chain: runs the junction operations eager between two graphs,
    and remembers which operation a failed capture failed in (``site``)."""

    def __init__(
        self,
        chain: SegmentedGraph,
        *,
        junction_ops: frozenset[Any],
        device: torch.device,
        begin: Callable[[], None],
    ) -> None:
        super().__init__()
        self.chain, self.junction_ops, self.device, self.begin = chain, junction_ops, device, begin
        self.site: Site | None = None
        self.capturing = False  # whether the chain's last graph is being captured

    def start(self) -> None:
        """Begin the chain's next graph (``begin``, the capture primitive's: it appends the graph to the chain)."""
        self.begin()
        self.capturing = True

    def end(self) -> None:
        """End the graph being captured and run it once: what comes next reads its results."""
        graph = self.chain.graphs[-1]
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            graph.capture_end()
        self.capturing = False
        if any("empty" in str(w.message).lower() for w in said):
            self.chain.empty[-1] = True
        else:
            graph.replay()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        # a host read of a host tensor is host code as any other: only reads of the graphs' tensors are junctions
        if func in self.junction_ops and not (
            func in HOST_READS and any(not _on(self.device, t) for t in _tensors((args, kwargs)))
        ):
            if len(self.chain.junctions) >= MAX_JUNCTION_CALLS:
                raise NotAJunction(
                    f"{operation_name(func)} is called more than {MAX_JUNCTION_CALLS} times in one forward: as many "
                    "graphs would cost more than they save"
                )
            location = locate(traceback.extract_stack())
            self.end()
            out = func(*args, **kwargs)
            self.chain.junctions.append(
                Junction(func, args, kwargs, out, self.device, str(location) if location else None)
            )
            self.start()
            return out
        try:
            return func(*args, **kwargs)
        except Exception as exc:
            if self.site is None and is_capture_error(exc):
                self.site = site_of(func, args, kwargs, self.device)
            raise
