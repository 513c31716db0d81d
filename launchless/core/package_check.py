"""Whether an AOTInductor package loads and runs here, asked of a process of its own before any process relies on it.

The calls' process reads an inference program with PyTorch's C++ loader (``compiled_programs.PackageProgram``); a
package that crashes that loader -- a fault in native code, which no ``except`` catches -- would take the user's
process with it. So the compiler process, once it has built a package, starts this module: a process with the same
imports as the calls' process (torch and the loader, not Inductor) that loads the package and runs it once on zeros
of the inputs' shapes, strides, dtypes and devices (zeros are valid token ids and positions as well as values), and
exits. Only a package that came through is kept; otherwise the program is kept in Inductor's format, the reason
given (the signal or error, and the last line the process wrote)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

CHECK_TIMEOUT_S = 300  # a load and one run; a GPU's first kernels load in seconds


def package_runs(path: Path, examples: Sequence[Any]) -> str:
    """Empty where the package at ``path`` loads and runs on zeros shaped as ``examples`` in a process of its own;
    else why not."""
    specs = path.with_name(path.name + ".inputs.json")
    specs.write_text(json.dumps([_spec(x) for x in examples]))
    try:  # started as the compiler process was (its environment and folder): launchless imports alike
        done = subprocess.run(
            [sys.executable, "-X", "faulthandler", "-m", __name__, str(path), str(specs)],
            capture_output=True,
            text=True,
            timeout=CHECK_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return f"a process that loaded and ran the package did not end within {CHECK_TIMEOUT_S} s"
    finally:
        specs.unlink(missing_ok=True)
    if done.returncode == 0:
        return ""
    how = f"signal {signal.Signals(-done.returncode).name}" if done.returncode < 0 else f"exit status {done.returncode}"
    return f"a process that loaded and ran the package ended with {how} ({_last_words(done.stderr)})"


def _spec(value: Any) -> dict[str, Any]:
    if isinstance(value, torch.Tensor):
        return {
            "shape": list(value.shape),
            "stride": list(value.stride()),
            "dtype": str(value.dtype).removeprefix("torch."),
            "device": str(value.device),
        }
    return {"value": value}


def _zeros(spec: dict[str, Any]) -> Any:
    if "value" in spec:
        return spec["value"]
    dtype = getattr(torch, spec["dtype"])
    return torch.empty_strided(spec["shape"], spec["stride"], dtype=dtype, device=spec["device"]).zero_()


def _last_words(stderr: str) -> str:
    """The line that says what went wrong: a fatal error's, an exception's, else the last one written."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for line in lines:
        if line.startswith("Fatal Python error"):
            return line
    return lines[-1] if lines else "nothing written"


def _check(path: Path, specs: Path) -> None:
    """This process's side: load the package as the calls' process does and run it once."""
    from .compiled_programs import PackageProgram

    inputs = [_zeros(spec) for spec in json.loads(specs.read_text())]
    devices = [x.device for x in inputs if isinstance(x, torch.Tensor) and x.is_cuda]
    program = PackageProgram.load(path, devices[0] if devices else None)
    program(*inputs)
    if devices:
        torch.cuda.synchronize(devices[0])


if __name__ == "__main__":
    _check(Path(sys.argv[1]), Path(sys.argv[2]))
