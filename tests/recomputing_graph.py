"""A stand-in for a CUDA graph in CPU tests: ``replay()`` runs the captured function again on the static inputs,
into the static outputs (the library itself never captures on a CPU; the ``cuda`` tests run the real graphs).

A CUDA graph replays kernels only: whatever the function changes on the host (a cache layer's length counted in a
Python int) is not changed by a replay. The stand-in puts such state back after each recomputation, so that a test
sees what a graph would leave, and the library's own bookkeeping of that state (advancing the counts after a
replay) is what moves it."""

from __future__ import annotations

import copy

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from launchless.core.capture import CapturedGraph, CaptureFailed, _static_like
from launchless.core.status import Stage
from launchless.diagnose.blockers import DATA_DEPENDENT, HOST_SYNC, classify_op


def _host_holders(fn) -> list:
    """The objects the captured function reaches through its closure -- and the closures of the functions in it (a
    step run inside a mode calls the step) -- whose Python attributes a step may change: a decode step's cache and
    its layers."""
    held, seen, functions = [], set(), [fn]
    while functions:
        f = functions.pop()
        if id(f) in seen:
            continue
        seen.add(id(f))
        cells = [_contents(cell) for cell in getattr(f, "__closure__", None) or ()]
        held += cells
        functions += [x for x in cells if callable(x) and hasattr(x, "__closure__")]
    found = list({id(x): x for x in held if hasattr(x, "layers") and isinstance(x.layers, list)}.values())
    return [*found, *(layer for cache in found for layer in cache.layers)]


def _contents(cell) -> object:
    try:
        return cell.cell_contents
    except ValueError:  # a cell not yet assigned
        return None


def _host_values(holder) -> dict:
    """``holder``'s attributes that hold no tensor (lengths, flags), copied."""
    return {
        name: copy.copy(value)
        for name, value in vars(holder).items()
        if not any(isinstance(leaf, torch.Tensor) for leaf in pytree.tree_leaves(value))
    }


class RecomputingGraph:
    """replay() runs the captured function again on the static inputs, into the static outputs, and leaves the host
    state it changed as it was (as a CUDA graph's replay does)."""

    def __init__(self, fn, flat, static_leaves: list, static_outputs) -> None:
        self.fn, self.flat, self.static_leaves, self.static_outputs = fn, flat, static_leaves, static_outputs
        self.holders = _host_holders(fn)

    def replay(self) -> None:
        kept = [(holder, _host_values(holder)) for holder in self.holders]
        args, kwargs = self.flat.rebuild(self.static_leaves)
        fresh = self.fn(*args, **kwargs)
        for dst, src in zip(pytree.tree_leaves(self.static_outputs), pytree.tree_leaves(fresh), strict=True):
            dst.copy_(src)
        for holder, values in kept:
            vars(holder).update(values)


def _refused_under_capture(func, args: tuple, kwargs: dict) -> bool:
    return classify_op(func, args, kwargs) in (HOST_SYNC, DATA_DEPENDENT)


# What CUDA does to a capture that reads a device value on the host (``.item()``, ``bool(t)``) or makes a shape from
# values (``nonzero``, a boolean mask's rows): it fails. On the CPU every tensor is on the host, so this refuses more
# than a GPU would, never less. The mode is compiled under a pseudo file name, so that the error's innermost frame
# outside PyTorch is the model's line that called the operation, as when CUDA raises it from inside the operation.
_namespace: dict = {"TorchDispatchMode": TorchDispatchMode, "refused": _refused_under_capture}
exec(
    compile(
        "class HostReadsFail(TorchDispatchMode):\n"
        "    def __torch_dispatch__(self, func, types, args=(), kwargs=None):\n"
        "        kwargs = kwargs or {}\n"
        "        if refused(func, args, kwargs):\n"
        "            raise RuntimeError(f'CUDA error: operation not permitted when stream is capturing ({func})')\n"
        "        return func(*args, **kwargs)\n",
        "<cuda capture>",
        "exec",
    ),
    _namespace,
)
_HostReadsFail = _namespace["HostReadsFail"]


def recorded_capture(captures: list, *, host_reads_fail: bool = False):
    """A stand-in for ``core.capture.capture``: warm-up runs as the real one makes them (they write the cache, and a
    forward that writes into its own inputs is refused as the real capture refuses it), then a graph that
    recomputes. ``host_reads_fail``: the last run is the capture's, and a read of a tensor's value on the host in it
    fails the capture as on a GPU."""

    def capture(fn, flat, *, device, pool, warmup=3, **_):
        static = [_static_like(x, x.device) if isinstance(x, torch.Tensor) else x for x in flat.leaves]
        args, kwargs = flat.rebuild(static)
        slots = [i for i, x in enumerate(static) if isinstance(x, torch.Tensor)]
        versions = [static[i]._version for i in slots]
        for run in range(warmup):
            if host_reads_fail and run == warmup - 1:
                try:
                    with _HostReadsFail():
                        outputs = fn(*args, **kwargs)
                except RuntimeError as exc:
                    if "operation not permitted when stream is capturing" not in str(exc):
                        raise
                    raise CaptureFailed(Stage.CAPTURE, exc, str(exc)) from exc
                continue
            outputs = fn(*args, **kwargs)
        if [static[i]._version for i in slots] != versions:
            raise CaptureFailed(Stage.INPUT_MUTATION, None, "the forward writes into its own input in place")
        captures.append(flat)
        graph = RecomputingGraph(fn, flat, static, outputs)
        return CapturedGraph(graph, static, slots, outputs, capture_ms=0.0, pool_growth=0)  # type: ignore[arg-type]

    return capture
