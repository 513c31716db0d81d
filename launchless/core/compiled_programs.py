"""Compiled programs built off the calls' path: a forward exported and compiled by AOTInductor in a child process,
loaded and bound to the model's own tensors, and kept on disk for the next process.

Inductor's fused kernels are faster than eager's, but ``torch.compile`` makes the calls wait for them. Here the
calls go on (replaying eager-kernel graphs) while a child process exports and compiles. Nothing of the work runs in
the calls' process: ``torch.export`` swaps the traced model's parameters for fake tensors and turns cuDNN off
process-wide while it traces, and a tracing thread would hold the interpreter lock the calls need. The child gets
the model's structure -- its modules pickled by reference to their classes, every tensor sent as its shape, strides,
dtype and device only, and the call's inputs the same way -- builds it with zeros on the same devices (the export
reads no values, and the program reads none of these), and a program that is no longer wanted -- the weights
reloaded, the model moved -- is stopped by ending that process. The package holds no weights
(``aot_inductor.package_constants_in_so=False``) and reads the model's own parameters and buffers
(``load_constants(..., user_managed=True)``): an in-place update of a weight is seen, as in eager; a tensor
replaced or moved is not, so whoever holds a program drops it where graphs are dropped.

A package is keyed by what decides its code -- the source of every module class in the model, the names, shapes,
dtypes and devices of its parameters and buffers, the call's input signature, the torch and triton versions and the
GPU's architecture --
so a second process finds it without compiling again. Where nothing can be compiled (a class the child cannot
import, no C++ compiler, an export that fails), the job fails with one line saying why; it never touches the calls.
"""

from __future__ import annotations

import atexit
import hashlib
import inspect
import io
import json
import os
import pickle
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
from torch.export.graph_signature import InputKind

from .status import Label

PACKAGE_CONFIG = {
    "aot_inductor.package_constants_in_so": False,  # the weights stay the model's own
    # Inductor folds a weight whose values are all equal (a fresh norm's ones and zeros) into the code: a program
    # that would not see the weights loaded later. The program reads every weight.
    "joint_graph_constant_folding": False,
}


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
        self.state = JobState.READY if package.exists() and reads_of(package).exists() else JobState.COMPILING
        self.reason = "found on disk" if self.state is JobState.READY else ""
        self.seconds = 0.0  # export and compile, wall time
        self._done = threading.Event()
        self._child: subprocess.Popen | None = None
        self._lock = threading.Lock()
        if self.state is JobState.READY:
            self._done.set()

    @property
    def done(self) -> bool:
        """The job has ended (ready, failed or cancelled): a flag read, for the calls' path."""
        return self._done.is_set()

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
        baked = sorted(set(json.loads(reads_of(self.package).read_text())) - set(runner.get_constant_fqns()))
        if baked:
            raise RuntimeError(
                f"launchless: the compiler folded {', '.join(baked[:4])}{' ...' if len(baked) > 4 else ''} into the "
                "program's code, which would not see them change (a checkpoint loaded later); the program is not used"
            )
        runner.load_constants(
            {name: tensors[name] for name in runner.get_constant_fqns()}, check_full_update=True, user_managed=True
        )
        return runner

    # ---- the worker thread ----------------------------------------------------------------------------------
    def _run(self, model: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        began = time.perf_counter()
        try:
            with tempfile.TemporaryDirectory() as scratch:
                sent = Path(scratch) / "model.pickle"
                sent.write_bytes(structure_of(model, args, kwargs))
                built = Path(scratch) / "package.pt2"
                with self._lock:
                    if self.state is not JobState.COMPILING:
                        return
                    self._child = subprocess.Popen(
                        [sys.executable, "-m", __name__, str(sent), str(built)],
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
                    # whole or not at all, what the program reads first: a reader never sees half a package
                    os.replace(reads_of(built), reads_of(self.package))
                    os.replace(built, self.package)
                    self.state, self.reason = JobState.READY, "compiled"
        except Exception as exc:
            with self._lock:
                if self.state is JobState.COMPILING:
                    self.state, self.reason = JobState.FAILED, f"{type(exc).__name__}: {exc}".splitlines()[0]
        finally:
            self.seconds = time.perf_counter() - began
            self._done.set()


_LIVE: weakref.WeakSet[CompileJob] = weakref.WeakSet()


def compile_in_background(
    model: torch.nn.Module, args: tuple, kwargs: dict | None = None, *, signature: str, directory: Path | None = None
) -> CompileJob:
    """Start compiling ``model`` for calls like ``(args, kwargs)`` (input signature ``signature``) and return at
    once: a package already on disk is ``READY``; otherwise a thread sends the model's structure to a child process,
    which exports and compiles it, and waits for it. The calls never wait for either."""
    key = program_key(model, signature)
    job = CompileJob(key, (directory or cache_dir()) / f"{key}.pt2")
    if job.state is JobState.READY:
        return job
    _LIVE.add(job)
    worker = threading.Thread(
        target=job._run, args=(model, args, kwargs or {}), name=f"launchless-compile-{key[:8]}", daemon=True
    )
    worker.start()
    return job


@atexit.register
def _end_children() -> None:
    """A process that exits while compiling leaves no compiler running behind it."""
    for job in list(_LIVE):
        job.cancel("the process is exiting")


class _StructurePickler(pickle.Pickler):
    """Pickles modules and inputs by reference to their classes, with every tensor as its metadata: what an export
    needs and none of the values (a model of gigabytes is sent in kilobytes)."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            meta = (tuple(obj.shape), obj.stride(), obj.dtype, str(obj.device), obj.requires_grad)
            return _zeros_like_sent, (*meta, isinstance(obj, torch.nn.Parameter))
        return NotImplemented


def structure_of(model: torch.nn.Module, args: tuple, kwargs: dict) -> bytes:
    """What the child process rebuilds the model and the call from: the module search path (the model's classes are
    imported there as here) and the pickled structure. A class defined in ``__main__`` cannot be imported by
    another process: that is said here, before a process is started."""
    in_main = sorted({type(m).__qualname__ for m in model.modules() if type(m).__module__ == "__main__"})
    if in_main:
        raise TypeError(
            f"{', '.join(in_main)} is defined in the script being run (__main__), which a compiler process cannot "
            "import; define the model's classes in a module of their own"
        )
    buffer = io.BytesIO()
    _StructurePickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump((model, args, kwargs))
    return pickle.dumps((list(sys.path), buffer.getvalue()))


def _zeros_like_sent(
    shape: tuple, stride: tuple, dtype: torch.dtype, device: str, requires_grad: bool, parameter: bool
) -> torch.Tensor:
    """A tensor sent by ``_StructurePickler``, rebuilt with its strides on its device in the child: floating point
    values random (no two weights alike: nothing the compiler could take for a constant), others zeros."""
    size = 1 + sum((n - 1) * s for n, s in zip(shape, stride, strict=True)) if all(shape) else 0
    if dtype.is_floating_point or dtype.is_complex:
        storage = torch.randn(size, dtype=dtype, device=device)
    else:
        storage = torch.zeros(size, dtype=dtype, device=device)
    tensor = storage.as_strided(shape, stride)
    if parameter:
        return torch.nn.Parameter(tensor, requires_grad=requires_grad)
    return tensor.requires_grad_(requires_grad)


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


def reads_of(package: Path) -> Path:
    """Beside a package: the names of the parameters and buffers its forward reads. A program whose constants miss
    one of them holds it folded into its code, and is not used."""
    return package.with_suffix(".reads.json")


def _compile(sent: str, package: str) -> None:
    """The child process: the model's structure in, an AOTInductor package without its weights out, and the names
    of the weights the forward reads beside it. The export runs under ``no_grad`` (an inference program)."""
    search_path, structure = pickle.loads(Path(sent).read_bytes())
    sys.path[:] = search_path  # the model's classes are imported from where the calls' process found them
    model, args, kwargs = pickle.loads(structure)
    with torch.no_grad():
        program = torch.export.export(model, args, kwargs, strict=False)
    read = {node.name for node in program.graph.nodes if node.op == "placeholder" and node.users}
    weights = (InputKind.PARAMETER, InputKind.BUFFER)
    reads = sorted(s.target for s in program.graph_signature.input_specs if s.kind in weights and s.arg.name in read)
    reads_of(Path(package)).write_text(json.dumps(reads))
    torch._inductor.aoti_compile_and_package(program, package_path=package, inductor_configs=dict(PACKAGE_CONFIG))


if __name__ == "__main__":
    _compile(sys.argv[1], sys.argv[2])
