"""The stream launchless warms up and captures on: one per CUDA device for the process, shared by every entry point,
public as ``launchless.capture_stream()`` so that what remembers its construction stream (DistributedDataParallel)
can be built under it."""

from __future__ import annotations

import threading

import torch

from ..errors import ConfigError, NoCudaError

_LOCK = threading.Lock()
_side_streams: dict[int, torch.cuda.Stream] = {}


def side_stream(device: torch.device) -> torch.cuda.Stream:
    """The stream captures and their warm-ups run on: one per device for the process, never a new one per
    capture. The caching allocator reuses a freed block only for the stream it was allocated on, so the blocks of
    a graph evicted from a shared pool were never reused by a capture on a fresh stream: the pool grew by 6 MiB
    with every new batch size of a small MLP (``max_graphs=2``, an H200) until the last graph in it went."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    with _LOCK:
        if index not in _side_streams:
            _side_streams[index] = torch.cuda.Stream(index)
        return _side_streams[index]


def capture_stream(device: torch.device | int | str | None = None) -> torch.cuda.Stream:
    """The stream launchless warms up and captures on for ``device`` (the current CUDA device when None): one per
    device for the process, shared by ``wrap``, ``graphed_step`` and the compiler backend.

    Build under it what remembers the stream it was created on. ``DistributedDataParallel`` does: its gradient
    accumulators are made when it is constructed and keep that stream, so every backward run on another stream
    synchronises them across streams, which can break a captured backward (PyTorch asks that a DDP whose backward
    is captured be constructed on the capture's stream)::

        with torch.cuda.stream(launchless.capture_stream()):
            model = DistributedDataParallel(model, device_ids=[rank])
    """
    if not torch.cuda.is_available():
        raise NoCudaError("launchless.capture_stream() needs a CUDA device, and torch sees none")
    target = torch.device("cuda", device) if isinstance(device, int) else torch.device(device or "cuda")
    if target.type != "cuda":
        raise ConfigError(f"launchless.capture_stream(device={device!r}): graphs are captured on CUDA devices only")
    return side_stream(target)
