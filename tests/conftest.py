"""GPU tests carry the `cuda` marker and are skipped where no CUDA device is present."""

from __future__ import annotations

import logging

import pytest
import torch


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run these on the device)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def keep_root_logging():
    """The CLI's main() calls logging.basicConfig; leave the root logger as the test found it."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in list(root.handlers):
        if h not in handlers:
            root.removeHandler(h)
    root.setLevel(level)


@pytest.fixture
def judged_faster(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every speed verdict of a wrapped model's capture and of its splits says "faster" (both sides still run once,
    as the real judge runs them): for GPU tests whose subject is not speed (eviction, retries, draws, semantics), so
    that a GPU loaded by other work cannot drop the graph they check. Tests of the judge itself patch it their way."""
    from launchless.runtime import capture_flow, split
    from launchless.timing import SpeedVerdict

    def faster(eager, candidate, **_options) -> SpeedVerdict:
        eager(), candidate()
        return SpeedVerdict(2.0, 1.0, None, None, "")

    monkeypatch.setattr(capture_flow, "judge_speed", faster)
    monkeypatch.setattr(split, "judge_speed", faster)
