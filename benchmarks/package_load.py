"""Which AOTInductor packages load and run on this machine's GPU: a package built several ways, each loaded several
ways, every load in a process of its own (a crash of PyTorch's C++ loader ends only that process).

``kernels="compiled"`` keeps an inference program as an AOTInductor package only once a process of its own has loaded
and run it (``launchless.core.package_check``); where that fails, the program is kept in Inductor's format and a
second process reads it with seconds of imports. This finds which part fails. A small forward (two linear layers)
is built into a package:

- ``official``: ``torch._inductor.aoti_compile_and_package`` of the exported program (weights inside the package);
- ``launchless``: as the compiler process builds one (``aot_compile`` with ``aot_inductor.package`` and
  ``package_aoti``, every weight an input, the host code at O0);
- ``launchless-O2``: the same with the host code at Inductor's default optimization;

and each is loaded by ``torch._inductor.aoti_load_package`` (Inductor imported), by PyTorch's C++ loader run
single-threaded (as the calls' process reads it) and multi-threaded, then run once on zeros.

    python benchmarks/package_load.py --out /tmp/packages
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

LOADS = ("aoti_load_package", "cpp-single-threaded", "cpp-multi-threaded")
LOAD = r"""
import sys, torch
path, how, weights_inside = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
torch.zeros(1, device="cuda")
x = torch.zeros(4, 64, device="cuda")
inputs = [x] if weights_inside else [torch.zeros(64, 64, device="cuda"), torch.zeros(64, device="cuda"),
                                     torch.zeros(8, 64, device="cuda"), torch.zeros(8, device="cuda"), x]
if how == "aoti_load_package" and weights_inside:
    out = torch._inductor.aoti_load_package(path)(x)
elif how == "aoti_load_package":  # the weights are inputs: the loader Inductor's function builds, called directly
    from torch._inductor.package import load_package
    out = load_package(path, run_single_threaded=True).loader.run(inputs)
else:
    loader = torch._C._aoti.AOTIModelPackageLoader(path, "model", how == "cpp-single-threaded", 1, 0)
    out = loader.run(inputs)
torch.cuda.synchronize()
print("ran")
"""


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).cuda().eval()


def build(folder: Path) -> dict[str, tuple[Path, bool]]:
    """The packages: name -> (path, whether the weights are inside it)."""
    import torch._inductor.config as inductor_config
    from torch._inductor.package import package_aoti

    model, x = _model(), torch.zeros(4, 64, device="cuda")
    built: dict[str, tuple[Path, bool]] = {}
    with torch.no_grad():
        exported = torch.export.export(model, (x,), strict=False)
        official = torch._inductor.aoti_compile_and_package(exported, package_path=str(folder / "official.pt2"))
        built["official"] = (Path(official), True)
        graph_module = exported.graph_module  # its placeholders: the weights, then the input
        examples = [*dict(model.named_parameters()).values(), x]
        for name, level in (("launchless", "O0"), ("launchless-O2", None)):
            patch = {"aot_inductor.compile_wrapper_opt_level": level} if level else {}
            with inductor_config.patch(patch):
                options = {"aot_inductor.package": True}
                files = torch._inductor.aot_compile(graph_module, tuple(examples), options=options)
            built[name] = (Path(package_aoti(str(folder / f"{name}.pt2"), files)), False)
    return built


def load(path: Path, how: str, weights_inside: bool) -> dict[str, Any]:
    """One load and run in a process of its own: ran, or how it ended and its last words."""
    done = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", LOAD, str(path), how, "1" if weights_inside else "0"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    code = done.returncode
    ended = "ran" if code == 0 else (f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}")
    lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
    fatal = [line for line in lines if line.startswith("Fatal Python error")]
    if code == 0:
        return {"ended": ended, "last": ""}
    return {"ended": ended, "last": (fatal or lines or [""])[0 if fatal else -1][:300]}


def native_stack(path: Path, how: str, weights_inside: bool) -> list[str]:
    """The crashing load's native stack under gdb, where gdb is installed (Python's stack names only the loader)."""
    gdb = shutil.which("gdb")
    if gdb is None:
        return ["gdb is not installed"]
    argv = [sys.executable, "-c", LOAD, str(path), how, "1" if weights_inside else "0"]
    done = subprocess.run(
        [gdb, "-batch", "-ex", "run", "-ex", "bt 40", "--args", *argv], capture_output=True, text=True, timeout=300
    )
    lines = done.stdout.splitlines()
    start = next((i for i, line in enumerate(lines) if "SIGSEGV" in line or "signal" in line.lower()), 0)
    return lines[start : start + 60]


def shared_libraries(path: Path) -> list[str]:
    """What the package's host library links to (a second libcuda or libtorch would show here)."""
    import zipfile

    with tempfile.TemporaryDirectory() as folder, zipfile.ZipFile(path) as package:
        package.extractall(folder)
        found = []
        for library in Path(folder).rglob("*.so"):
            done = subprocess.run(["ldd", str(library)], capture_output=True, text=True, timeout=60)
            found += [f"{library.name}: {line.strip()}" for line in done.stdout.splitlines()]
        return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for packages.json")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    diagnosis: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory() as folder:
        for name, (path, inside) in build(Path(folder)).items():
            for how in LOADS:
                rows.append({"package": name, "load": how, **load(path, how, inside)})
                print(f"{name:14} {how:22} {rows[-1]['ended']:16} {rows[-1]['last']}", flush=True)
                if rows[-1]["ended"] != "ran" and not diagnosis:
                    diagnosis = {"package": [name, how], "libraries": shared_libraries(path)}
                    diagnosis["native_stack"] = native_stack(path, how, inside)
                    print("\n".join(diagnosis["libraries"] + diagnosis["native_stack"]), flush=True)
    meta = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "cuda": torch.version.cuda}
    (args.out / "packages.json").write_text(json.dumps({**meta, "rows": rows, "first_crash": diagnosis}, indent=1))


if __name__ == "__main__":
    main()
