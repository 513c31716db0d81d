"""Whether an AOTInductor package loads and runs here, asked of a process of its own before any process relies on it.

The calls' process reads an inference program with PyTorch's C++ loader (``compiled_programs.PackageProgram``); a
package that crashes that loader -- a fault in native code, which no ``except`` catches -- would take the user's
process with it. So the compiler process, once it has built a package, starts this module: a process with the same
imports as the calls' process (torch and the loader, not Inductor) that loads the package and runs it once on zeros
of the inputs' shapes, strides, dtypes and devices (zeros are valid token ids and positions as well as values), and
exits. Only a package that came through is kept; otherwise the program is kept in Inductor's format, the reason
given (the signal or error, and the last line the process wrote).

A loader that crashes on one package may crash on every package (a torch build whose loader faults here, as one
machine's torch 2.11 did on CPU and GPU packages alike). Where a check ends by a signal, a two-layer probe package is
built and checked on the same device; where it crashes too, the loader is recorded as crashing on this machine
(``loader_record``: beside the programs, keyed by the host, the GPU, the interpreter and torch's build), and later
compiles there skip the package -- tens of seconds of AOTInductor's compile and a check each -- for Inductor's format
at once, saying so. ``launchless cache --forget-loader`` (or deleting the record) tries packages again; another torch,
GPU or host makes a record of its own."""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

CHECK_TIMEOUT_S = 300  # a load and one run; a GPU's first kernels load in seconds


@dataclass(frozen=True)
class PackageCheck:
    """How a process of its own fared with a package."""

    why: str  # empty where it loaded and ran the package; else how it ended and its last words
    crashed: bool = False  # it ended by a signal: a fault in native code, not an error the loader reported

    @property
    def passed(self) -> bool:
        return not self.why


def package_runs(path: Path, examples: Sequence[Any]) -> PackageCheck:
    """Whether the package at ``path`` loads and runs on zeros shaped as ``examples`` in a process of its own."""
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
        return PackageCheck(f"a process that loaded and ran the package did not end within {CHECK_TIMEOUT_S} s")
    finally:
        specs.unlink(missing_ok=True)
    if done.returncode == 0:
        return PackageCheck("")
    ended, words = how_it_ended(done.returncode), last_words(done.stderr)
    why = f"a process that loaded and ran the package ended with {ended} ({words})"
    return PackageCheck(why, crashed=done.returncode < 0)


def how_it_ended(returncode: int) -> str:
    """``signal SIGSEGV`` for a process a signal ended, else ``exit status N``."""
    return f"signal {signal.Signals(-returncode).name}" if returncode < 0 else f"exit status {returncode}"


def loader_record(folder: Path) -> Path:
    """Where a crashing loader is recorded, beside the programs in ``folder``: one file per host, GPU, interpreter and
    torch build (a shared cache folder serves several machines, whose containers may share a host name; another torch
    brings another loader)."""
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    what = [platform.node(), gpu, sys.executable, torch.__version__, str(torch.version.git_version)]
    what.append(str(torch.version.cuda))
    digest = hashlib.sha256("\n".join(what).encode()).hexdigest()[:16]
    return folder / f"package-loader-{digest}.json"


def loader_records(folder: Path) -> list[Path]:
    """Every crashing loader recorded in ``folder`` (one per host, interpreter and torch build that met one)."""
    return sorted(folder.glob("package-loader-*.json"))


def loader_crashed_here(record: Path) -> str | None:
    """Why packages are not built on this machine, where a crashing loader was recorded; None where none was."""
    try:
        seen = json.loads(record.read_text())
    except (OSError, ValueError):
        return None
    return (
        f"PyTorch's package loader crashed on this machine ({seen.get('why', '?')}), on a two-layer probe package "
        f"too, on {seen.get('at', '?')}; programs here are kept in Inductor's format (`launchless cache "
        f"--forget-loader`, or deleting {record}, tries packages again)"
    )


def remember_if_the_loader_crashes(
    record: Path,
    check: PackageCheck,
    device: torch.device,
    *,
    build: Callable[[torch.nn.Module, torch.Tensor, Path], None],
) -> bool:
    """After a check that ended by a signal: build a two-layer probe package on ``device`` (``build(module, input,
    path)``, every parameter an input before ``input``, as programs are built) and check it; where it crashes too,
    the loader is at fault, not the program, and ``record`` says so for later compiles on this machine. Whether it
    was recorded."""
    if not check.crashed:
        return False
    probe = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8)).to(device).eval()
    x = torch.zeros(2, 8, device=device)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "probe.pt2"
        try:
            build(probe, x, path)
        except Exception:  # no package to check: nothing learnt about the loader
            return False
        probed = package_runs(path, [*dict(probe.named_parameters()).values(), x])
    if not probed.crashed:
        return False
    when = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    record.parent.mkdir(parents=True, exist_ok=True)
    temporary = record.with_name(f"{record.name}.{os.getpid()}.tmp")  # two compilers may record at once
    temporary.write_text(json.dumps({"why": check.why, "probe": probed.why, "at": when, "torch": torch.__version__}))
    temporary.replace(record)
    return True


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


def last_words(stderr: str) -> str:
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
