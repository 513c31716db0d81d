"""Library code that takes another path while a stream is capturing.

Some libraries skip a host check under capture (transformers' SDPA mask check cannot sync while
capturing), so the graph computes through a different path than eager and may differ in the last
bits. ``record_capture_branches`` notes every caller that asked ``is_current_stream_capturing()``
and was told yes; ``pretend_capturing`` makes eager take the capture path, which proves that such a
branch -- not the graph -- explains a difference. Both patch only the Python-level function, under
launchless's capture lock.
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Iterator

import torch

from ..diagnose.source import is_foreign


def _targets() -> list[tuple[object, str]]:
    return [(torch.cuda, "is_current_stream_capturing"), (torch.cuda.graphs, "is_current_stream_capturing")]


@contextlib.contextmanager
def _patched(replacement) -> Iterator[None]:
    saved = [(owner, name, getattr(owner, name)) for owner, name in _targets()]
    for owner, name, _ in saved:
        setattr(owner, name, replacement)
    try:
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


@contextlib.contextmanager
def pretend_capturing() -> Iterator[None]:
    """Eager code asking whether the stream is capturing is told yes."""
    with _patched(lambda: True):
        yield


@contextlib.contextmanager
def record_capture_branches(found: list[str]) -> Iterator[None]:
    """Append the call chain (innermost first, 3 frames outside torch) of each caller told "capturing"."""
    original = torch.cuda.is_current_stream_capturing

    def recording() -> bool:
        answer = original()
        if answer:
            frames = [f for f in traceback.extract_stack()[:-1] if not is_foreign(f.filename)][-3:]
            chain = " <- ".join(f"{f.filename}:{f.lineno}" for f in reversed(frames))
            if chain and chain not in found:
                found.append(chain)
        return answer

    with _patched(recording):
        yield
