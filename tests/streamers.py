"""A streamer for tests: what ``generate()`` (or the decode loop standing in for it) hands one, in order."""

from __future__ import annotations

import torch


class RecordingStreamer:
    """Keeps each ``put``'s tokens and whether ``end()`` came."""

    def __init__(self) -> None:
        self.puts: list[list[int]] = []
        self.ended = False

    def put(self, value: torch.Tensor) -> None:
        self.puts.append(value.flatten().tolist())

    def end(self) -> None:
        self.ended = True
