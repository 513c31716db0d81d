"""CPU tests of ``core.workspaces``: PyTorch's map of cuBLAS workspaces is emptied before and after a capture, also
one that fails, so that the graph owns the workspace it records (the GPU side: the cuBLAS hazards in
``tests/hazards/test_severity1_wrong_values.py``)."""

from __future__ import annotations

import pytest
import torch

import launchless
from launchless.core import workspaces


@pytest.fixture
def clears(monkeypatch) -> list[str]:
    said: list[str] = []
    monkeypatch.setattr(torch._C, "_cuda_clearCublasWorkspaces", lambda: said.append("clear"), raising=False)
    return said


def test_the_map_is_emptied_before_and_after_the_capture(clears) -> None:
    with launchless.own_blas_workspaces():
        clears.append("capture")
    assert clears == ["clear", "capture", "clear"]


def test_a_capture_that_fails_leaves_the_map_without_its_workspace_too(clears) -> None:
    with pytest.raises(RuntimeError, match="capture failed"), workspaces.own_blas_workspaces():
        raise RuntimeError("capture failed")
    assert clears == ["clear", "clear"]


def test_a_torch_without_the_function_captures_as_before(monkeypatch) -> None:
    monkeypatch.delattr(torch._C, "_cuda_clearCublasWorkspaces", raising=False)
    with workspaces.own_blas_workspaces():
        pass
