"""What a result was measured on: GPU, driver and library versions (every benchmark records it)."""

from __future__ import annotations

import datetime
import platform
import subprocess

import torch


def _driver() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        )
        return out.stdout.strip().splitlines()[0]
    except Exception:
        return None


def gpu_name() -> str | None:
    """The GPU this process runs on (None without one): a row says where it was measured, as runs of one report may
    come from several machines."""
    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


def describe() -> dict:
    try:
        import triton

        triton_version = triton.__version__
    except Exception:
        triton_version = None
    cuda = torch.cuda.is_available()
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": gpu_name(),
        "driver": _driver() if cuda else None,
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "triton": triton_version,
        "python": platform.python_version(),
    }
