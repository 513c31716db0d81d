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
- ``official-cpu``: ``aoti_compile_and_package`` of the forward on the CPU (whether the loader fails whatever the
  device);

and each is loaded by ``torch._inductor.aoti_load_package`` (Inductor imported), by PyTorch's C++ loader run
single-threaded (as the calls' process reads it) and multi-threaded, then run once on zeros.

    python benchmarks/package_load.py --out /tmp/packages
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from launchless.core.package_check import how_it_ended, last_words

LOADS = ("aoti_load_package", "cpp-single-threaded", "cpp-multi-threaded")
LOAD = r"""
import sys, torch
path, how, weights_inside, device = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4]
torch.zeros(1, device="cuda")  # the GPU's context made first, as in the calls' process
x = torch.zeros(4, 64, device=device)
inputs = [x] if weights_inside else [torch.zeros(64, 64, device=device), torch.zeros(64, device=device),
                                     torch.zeros(8, 64, device=device), torch.zeros(8, device=device), x]
if how == "aoti_load_package" and weights_inside:
    out = torch._inductor.aoti_load_package(path)(x)
elif how == "aoti_load_package":  # the weights are inputs: the loader Inductor's function builds, called directly
    from torch._inductor.package import load_package
    out = load_package(path, run_single_threaded=True).loader.run(inputs)
else:
    index = 0 if device == "cuda" else -1  # the device index the loader takes: -1 for the CPU
    loader = torch._C._aoti.AOTIModelPackageLoader(path, "model", how == "cpp-single-threaded", 1, index)
    out = loader.run(inputs)
torch.cuda.synchronize()
print("ran")
"""


def _model(device: str) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).to(device).eval()


def build(folder: Path) -> dict[str, tuple[Path, bool, str]]:
    """The packages: name -> (path, whether the weights are inside it, the device it runs on)."""
    import torch._inductor.config as inductor_config
    from torch._inductor.package import package_aoti

    model, x = _model("cuda"), torch.zeros(4, 64, device="cuda")
    built: dict[str, tuple[Path, bool, str]] = {}
    with torch.no_grad():
        for device in ("cuda", "cpu"):  # a package for the CPU: whether the loader fails whatever the device
            on = (model.to(device), (x.to(device),))
            exported = torch.export.export(*on, strict=False)
            name = "official" if device == "cuda" else "official-cpu"
            official = torch._inductor.aoti_compile_and_package(exported, package_path=str(folder / f"{name}.pt2"))
            built[name] = (Path(official), True, device)
        model = model.to("cuda")
        exported = torch.export.export(model, (x,), strict=False)
        graph_module = exported.graph_module  # its placeholders: the weights, then the input
        examples = [*dict(model.named_parameters()).values(), x]
        for name, level in (("launchless", "O0"), ("launchless-O2", None)):
            patch = {"aot_inductor.compile_wrapper_opt_level": level} if level else {}
            with inductor_config.patch(patch):
                options = {"aot_inductor.package": True}
                files = torch._inductor.aot_compile(graph_module, tuple(examples), options=options)
            built[name] = (Path(package_aoti(str(folder / f"{name}.pt2"), files)), False, "cuda")
    return built


def load(path: Path, how: str, weights_inside: bool, device: str) -> dict[str, Any]:
    """One load and run in a process of its own: ran, or how it ended and its last words."""
    done = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", LOAD, str(path), how, "1" if weights_inside else "0", device],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode == 0:
        return {"ended": "ran", "last": ""}
    return {"ended": how_it_ended(done.returncode), "last": last_words(done.stderr)[:300]}


def native_stack(path: Path, how: str, weights_inside: bool, device: str) -> list[str]:
    """The crashing load's native stack under gdb, where gdb is installed (Python's stack names only the loader)."""
    gdb = shutil.which("gdb")
    if gdb is None:
        return ["gdb is not installed"]
    argv = [sys.executable, "-c", LOAD, str(path), how, "1" if weights_inside else "0", device]
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
            needs = sorted(set(re.findall(rb"GLIBCXX_3\.4\.\d+", library.read_bytes())), key=_version_key)
            found.append(f"{library.name}: needs up to {needs[-1].decode() if needs else 'no GLIBCXX symbol'}")
        return found


def _version_key(symbol: bytes) -> tuple[int, ...]:
    return tuple(int(part) for part in symbol.split(b"_", 1)[1].split(b"."))


def toolchain() -> dict[str, str]:
    """The C++ compiler that built the packages' host code and the C++ runtime this process loaded with torch: a
    host library built against a newer runtime than the one loaded, or another ABI, may crash its loader."""
    compiler = shutil.which("c++") or shutil.which("g++") or ""
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout if compiler else ""
    maps = Path("/proc/self/maps").read_text() if Path("/proc/self/maps").exists() else ""
    runtimes = sorted({line.split()[-1] for line in maps.splitlines() if "libstdc++" in line})
    return {
        "compiler": f"{compiler}: {version.splitlines()[0] if version else '?'}",
        "runtime_loaded": ", ".join(runtimes) or "?",
        "cxx11_abi": str(torch._C._GLIBCXX_USE_CXX11_ABI),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for packages.json")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    diagnosis: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory() as folder:
        for name, (path, inside, device) in build(Path(folder)).items():
            for how in LOADS:
                rows.append({"package": name, "load": how, **load(path, how, inside, device)})
                print(f"{name:14} {how:22} {rows[-1]['ended']:16} {rows[-1]['last']}", flush=True)
                if rows[-1]["ended"] != "ran" and not diagnosis:
                    diagnosis = {"package": [name, how], "libraries": shared_libraries(path)}
                    diagnosis["native_stack"] = native_stack(path, how, inside, device)
                    print("\n".join(diagnosis["libraries"] + diagnosis["native_stack"]), flush=True)
    meta = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "cuda": torch.version.cuda}
    meta["toolchain"] = toolchain()
    (args.out / "packages.json").write_text(json.dumps({**meta, "rows": rows, "first_crash": diagnosis}, indent=1))


if __name__ == "__main__":
    main()
