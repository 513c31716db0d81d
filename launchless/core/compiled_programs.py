"""Compiled programs built off the calls' path: a forward exported in this process, compiled by AOTInductor in a
child process, loaded and bound to the model's own tensors, and kept on disk for the next process.

Inductor's fused kernels are faster than eager's, but ``torch.compile`` makes the calls wait for them. Here the
calls go on (replaying eager-kernel graphs) while a child process compiles: it holds no lock of this process, and a
program that is no longer wanted -- the weights reloaded, the model moved -- is stopped by ending that process. The
program is packaged without its weights (``aot_inductor.package_constants_in_so=False``) and reads the model's own
parameters and buffers (``load_constants(..., user_managed=True)``): an in-place update of a weight is seen, as in
eager; a tensor replaced or moved is not, so whoever holds a program drops it where graphs are dropped.

A package is keyed by what decides its code -- the source of every module class in the model, the names, shapes,
dtypes and devices of its parameters and buffers, the call's input signature, the torch and triton versions and the
GPU's architecture --
so a second process finds it without exporting again. Where nothing can be compiled (no C++ compiler, an export that
fails), the job fails with one line saying why; it never touches the calls.
"""

from __future__ import annotations

import atexit
import hashlib
import inspect
import os
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .status import Label

PACKAGE_CONFIG = {"aot_inductor.package_constants_in_so": False}  # the weights stay the model's own


class JobState(Label):
    """Where a compile stands."""

    COMPILING = "compiling"  # exporting here, or compiling in the child process
    READY = "ready"  # a package on disk, loadable
    FAILED = "failed"  # the export or the compile failed: ``reason`` says why
    CANCELLED = "cancelled"  # no longer wanted (the model changed): the child was ended


def cache_dir() -> Path:
    """Where packages are kept: ``$LAUNCHLESS_CACHE_DIR``, else ``$XDG_CACHE_HOME/launchless``, else
    ``~/.cache/launchless``; compiled programs under ``compiled/``."""
    root = os.environ.get("LAUNCHLESS_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "launchless"
    )
    return Path(root) / "compiled"


def program_key(model: torch.nn.Module, signature: str) -> str:
    """A digest of what decides the compiled code of ``model`` called with inputs of ``signature`` (the cache key;
    the weights' values are not in it: the program reads the model's own tensors)."""
    digest = hashlib.sha256()
    for cls in sorted({type(m) for m in model.modules()}, key=lambda c: f"{c.__module__}.{c.__qualname__}"):
        digest.update(f"{cls.__module__}.{cls.__qualname__}\n".encode())
        digest.update(_source_of(cls).encode())
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}:{tensor.device.type}\n".encode())
    digest.update(f"{signature}\ntorch {torch.__version__}\ntriton {_triton_version()}\n".encode())
    for index in sorted({t.device.index or 0 for t in [*model.parameters(), *model.buffers()] if t.is_cuda}):
        digest.update(f"sm {torch.cuda.get_device_capability(index)}\n".encode())  # kernels built for that GPU
    return digest.hexdigest()[:32]


class CompileJob:
    """One program being compiled for one model and input signature; ``load()`` once it is ``READY``."""

    def __init__(self, key: str, package: Path) -> None:
        self.key, self.package = key, package
        self.state = JobState.READY if package.exists() else JobState.COMPILING
        self.reason = "found on disk" if self.state is JobState.READY else ""
        self.seconds = 0.0  # export and compile, wall time
        self._done = threading.Event()
        self._child: subprocess.Popen | None = None
        self._lock = threading.Lock()
        if self.state is JobState.READY:
            self._done.set()

    def wait(self, timeout: float | None = None) -> JobState:
        """The state once the job has ended (or ``timeout`` seconds have passed)."""
        self._done.wait(timeout)
        return self.state

    def cancel(self, why: str) -> None:
        """No longer wanted: the child process (if any) is ended and nothing is loaded."""
        with self._lock:
            if self.state is not JobState.COMPILING:
                return
            self.state, self.reason = JobState.CANCELLED, why
            if self._child is not None and self._child.poll() is None:
                self._child.kill()
        self._done.set()

    def load(self, model: torch.nn.Module) -> Callable[..., Any]:
        """The compiled program, reading ``model``'s own parameters and buffers (in-place updates are seen)."""
        if self.state is not JobState.READY:
            raise RuntimeError(f"launchless: the compiled program is {self.state} ({self.reason}); nothing to load")
        runner = torch._inductor.aoti_load_package(str(self.package))
        tensors = {**dict(model.named_parameters()), **dict(model.named_buffers())}
        missing = [name for name in runner.get_constant_fqns() if name not in tensors]
        if missing:
            raise RuntimeError(
                f"launchless: the compiled program reads {', '.join(missing[:4])}, which the model does not hold; "
                "it was compiled for another model"
            )
        runner.load_constants(
            {name: tensors[name] for name in runner.get_constant_fqns()}, check_full_update=True, user_managed=True
        )
        return runner

    # ---- the worker thread ----------------------------------------------------------------------------------
    def _run(self, export: Callable[[], Any]) -> None:
        began = time.perf_counter()
        try:
            with tempfile.TemporaryDirectory() as scratch:
                exported = Path(scratch) / "exported.pt2"
                torch.export.save(export(), str(exported))
                built = Path(scratch) / "package.pt2"
                with self._lock:
                    if self.state is not JobState.COMPILING:
                        return
                    self._child = subprocess.Popen(
                        [sys.executable, "-m", __name__, str(exported), str(built)],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.PIPE,
                        text=True,
                    )
                _, errors = self._child.communicate()
                with self._lock:
                    if self.state is not JobState.COMPILING:
                        return
                    if self._child.returncode != 0 or not built.exists():
                        self.state, self.reason = JobState.FAILED, _last_line(errors, self._child.returncode)
                        return
                    self.package.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(built, self.package)  # whole or not at all: a reader never sees half a package
                    self.state, self.reason = JobState.READY, "compiled"
        except Exception as exc:
            with self._lock:
                if self.state is JobState.COMPILING:
                    self.state, self.reason = JobState.FAILED, f"{type(exc).__name__}: {exc}".splitlines()[0]
        finally:
            self.seconds = time.perf_counter() - began
            self._done.set()


_LIVE: weakref.WeakSet[CompileJob] = weakref.WeakSet()
_EXPORT_LOCK = threading.Lock()  # torch.export patches process-wide state while it traces: one export at a time


def compile_in_background(
    model: torch.nn.Module, args: tuple, kwargs: dict | None = None, *, signature: str, directory: Path | None = None
) -> CompileJob:
    """Start compiling ``model`` for calls like ``(args, kwargs)`` (input signature ``signature``) and return at
    once: a package already on disk is ``READY`` without exporting; otherwise a thread exports the forward and a
    child process compiles it. The calls never wait for either."""
    key = program_key(model, signature)
    job = CompileJob(key, (directory or cache_dir()) / f"{key}.pt2")
    if job.state is JobState.READY:
        return job
    _LIVE.add(job)
    worker = threading.Thread(
        target=job._run,
        args=(lambda: _export(model, args, kwargs or {}),),
        name=f"launchless-compile-{key[:8]}",
        daemon=True,
    )
    worker.start()
    return job


@atexit.register
def _end_children() -> None:
    """A process that exits while compiling leaves no compiler running behind it."""
    for job in list(_LIVE):
        job.cancel("the process is exiting")


def _export(model: torch.nn.Module, args: tuple, kwargs: dict) -> Any:
    """The inference forward as an exported program. Grad mode is per thread and on in a new one: the export runs
    under ``no_grad``, and on plain copies of inputs made under ``inference_mode`` (autograd would refuse them)."""
    args, kwargs = torch.utils._pytree.tree_map_only(
        torch.Tensor, lambda t: t.clone() if t.is_inference() else t, (args, kwargs)
    )
    with _EXPORT_LOCK, torch.no_grad():
        return torch.export.export(model, args, kwargs, strict=False)


def _source_of(cls: type) -> str:
    try:
        return inspect.getsource(cls)
    except (OSError, TypeError):  # defined where no source is kept (a notebook cell, C++): its qualified name stands
        return ""


def _triton_version() -> str:
    try:
        import triton

        return str(triton.__version__)
    except ImportError:
        return "none"


def _last_line(errors: str, code: int | None) -> str:
    lines = [line for line in (errors or "").splitlines() if line.strip() and not line.startswith("W")]
    return f"the compiler process ended with code {code}" + (f": {lines[-1].strip()}" if lines else "")


def _compile(exported: str, package: str) -> None:
    """The child process: an exported program in, an AOTInductor package without its weights out."""
    program = torch.export.load(exported)
    torch._inductor.aoti_compile_and_package(program, package_path=package, inductor_configs=dict(PACKAGE_CONFIG))


if __name__ == "__main__":
    _compile(sys.argv[1], sys.argv[2])
