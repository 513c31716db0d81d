"""GPU tests carry the `cuda` marker and are skipped where no CUDA device is present."""

from __future__ import annotations

import pytest
import torch


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run these on the device)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
