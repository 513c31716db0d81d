"""Compiled programs built off the calls' path: a forward exported and compiled by Inductor in a child process,
loaded here and called with the model's own tensors, and kept on disk for the next process.

Inductor's fused kernels are faster than eager's, but ``torch.compile`` makes the calls wait for them. Here the
calls go on (replaying eager-kernel graphs) while a child process exports and compiles. Nothing of the work runs in
the calls' process: ``torch.export`` swaps the traced model's parameters for fake tensors and turns cuDNN off
process-wide while it traces, and a tracing thread would hold the interpreter lock the calls need. The child gets
the model's structure -- its modules pickled by reference to their classes, every tensor sent as its shape, strides,
dtype and device only, and the call's inputs the same way -- and builds it with random values on the same devices
(the export reads no values). It compiles the exported graph with Inductor, every parameter, buffer and tensor
constant an input of the program, and saves it with the order of its inputs: an inference program as an AOTInductor
package (``PackageProgram``: read by PyTorch's C++ loader, Inductor never imported in the calls' process), a training
program as Inductor's ``CompiledArtifact`` (``torch._inductor.standalone_compile``), which autograd differentiates.
The calls' process loads the program (host code and GPU kernels, no weights) and calls it with the model's own
tensors: weights updated in place are seen as in eager, and no weight can be folded into the code. A tensor
replaced or moved is not seen, so whoever holds a program drops it where graphs are dropped; a program that is no
longer wanted while it compiles is stopped by ending the child process.

The child's side is ``core.compiler_process``; a spare compiler process (``SpareCompiler``) started ahead loads what a
compile needs while the calls warm up. Either runs at a lower priority than the calls and off their cores
(``core.compiler_cpus``).

A program is keyed by what decides its code -- the file defining each module class of the model, the names, shapes,
dtypes and devices of its parameters and buffers, the call's input signature, the torch and triton versions and the
GPU's architecture -- so a second process finds it without compiling again. Where nothing can be compiled (a class
the child cannot import, an export or a compile that fails), the job fails with one line saying why; it never
touches the calls.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import importlib
import importlib.metadata
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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree

from .compiler_cpus import CALLS_CORES, compiler_cpus
from .status import Label
from .switch_interval import calls_first


class JobState(Label):
    """Where a compile stands."""

    COMPILING = "compiling"  # the child process exports and compiles
    READY = "ready"  # a program on disk, loadable
    FAILED = "failed"  # the export or the compile failed: ``reason`` says why
    CANCELLED = "cancelled"  # no longer wanted (the model changed): the child was ended


def cache_dir() -> Path:
    """Where programs are kept: ``$LAUNCHLESS_CACHE_DIR``, else ``$XDG_CACHE_HOME/launchless``, else
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
        digest.update(f"{cls.__module__}.{cls.__qualname__}:{_code_of(cls)}\n".encode())
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}:{tensor.device.type}\n".encode())
    digest.update(f"{signature}\ntorch {torch.__version__}\ntriton {_triton_version()}\n".encode())
    for index in sorted({t.device.index or 0 for t in [*model.parameters(), *model.buffers()] if t.is_cuda}):
        digest.update(f"sm {torch.cuda.get_device_capability(index)}\n".encode())  # kernels built for that GPU
    return digest.hexdigest()[:32]


class CompileJob:
    """One program being compiled for one model and input signature; ``load()`` once it is ``READY``.

    A ready program is read from disk in the job's thread too (Inductor imported, its kernels loaded: seconds of
    host work), so that the call that swaps it in finds it in memory: ``done`` is set once it is."""

    def __init__(self, key: str, program: Path, device: torch.device | None = None) -> None:
        self.key, self.program = key, program
        self.device = device  # the model's GPU: the program's kernels are loaded there, whichever thread reads it
        # the program read: a package where one is kept, else an inference program in Inductor's format, which a
        # process that ended before its package was built leaves
        kept = [p for p in (program, inductor_program_of(program)) if p.exists() and plan_of(p).exists()]
        self.read_from = kept[0] if kept else program
        self.state = JobState.READY if kept else JobState.COMPILING
        self.reason = "found on disk" if self.state is JobState.READY else ""
        self.seconds = 0.0  # export and compile, wall time
        self.load_seconds = 0.0  # reading the ready program into memory, in the job's thread
        self.phases: dict[str, float] = {}  # the child's seconds per phase: start, build, export, compile, save
        self.format = ""  # how the ready program is kept (``ProgramFormat``), once read
        self.unpackaged = ""  # why an inference program is not an AOTInductor package (read with Inductor imported)
        # a package of the program read (Inductor's format, first) is being built, for later processes
        self.package_pending = False
        self._done = threading.Event()
        self._child: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None  # compiles or reads: joined when the process exits
        self._read: tuple[Any, dict[str, Any], list[torch.Tensor]] | None = None  # (program, plan, made tensors)

    @property
    def done(self) -> bool:
        """The job has ended (ready and read into memory, failed or cancelled): a flag read, for the calls' path."""
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

    def load(self, model: torch.nn.Module) -> CompiledProgram:
        """The compiled program, called with ``model``'s own parameters, buffers and tensor constants. The calls
        load a job once ``done``; before, this waits for the job's thread to have read it (never while holding the
        capture lock, which the read takes)."""
        self._done.wait()
        if self.state is not JobState.READY or self._read is None:
            raise RuntimeError(f"launchless: the compiled program is {self.state} ({self.reason}); nothing to load")
        compiled, plan, made = self._read
        return CompiledProgram(compiled, plan, model, made=made)

    def _read_program(self) -> None:
        """In the job's thread: the ready program into memory; a program that cannot be read fails the job. The
        read is Python beside the calls (Inductor's imports, for its own format): the calls get the interpreter
        lock back sooner meanwhile (``calls_first``)."""
        began = time.perf_counter()
        try:
            from .capture import CAPTURE_LOCK

            plan = json.loads(plan_of(self.read_from).read_text())
            made_path = constants_of(self.read_from)
            made = torch.load(made_path, weights_only=True) if made_path.exists() else []
            on_device = torch.cuda.device(self.device) if self.device is not None else contextlib.nullcontext()
            self.format, self.unpackaged = plan.get("format", ProgramFormat.ARTIFACT), plan.get("unpackaged", "")
            if plan.get("package_follows") and self.reason == "found on disk":
                self.unpackaged = "the process that compiled it ended before its package was built"
            with calls_first():
                if self.format != ProgramFormat.PACKAGE:  # Inductor's imports (seconds) keep no capture waiting
                    from torch._inductor import CompiledArtifact  # noqa: F401
                # it touches the GPU: never while the calls' thread captures a graph
                with CAPTURE_LOCK, on_device:
                    if self.format == ProgramFormat.PACKAGE:
                        program: Any = PackageProgram.load(self.read_from, self.device)
                    else:
                        program = _load_artifact(self.read_from)
            self._read = (program, plan, made)
        except Exception as exc:
            with self._lock:
                self.state = JobState.FAILED
                self.reason = f"the compiled program could not be read: {type(exc).__name__}: {exc}".splitlines()[0]
        finally:
            self.load_seconds = time.perf_counter() - began
            self._done.set()

    # ---- the worker thread ----------------------------------------------------------------------------------
    def _run(
        self,
        model: torch.nn.Module,
        args: tuple,
        kwargs: dict,
        training: bool,
        eager_numerics: bool,
        spare: SpareCompiler | None,
    ) -> None:
        began = time.perf_counter()
        said: _ChildOutput | None = None
        try:
            with tempfile.TemporaryDirectory() as scratch:
                sent = Path(scratch) / "model.pickle"
                with calls_first():  # Python beside the first calls
                    structure = structure_of(model, args, kwargs, training=training, eager_numerics=eager_numerics)
                sent.write_bytes(structure)
                built = Path(scratch) / f"program{self.program.suffix}"
                first = INDUCTOR_FIRST if not training and _inductor_format_first(self.device) else PACKAGE_FIRST
                with self._lock:
                    if self.state is not JobState.COMPILING:
                        return
                    job = [str(sent), str(built), repr(time.time()), str(self.program.parent), first]
                    self._child = spare.take(job) if spare is not None else None
                    if self._child is None:  # no spare, or it has ended: a process of its own
                        self._child = _start_compiler([*job])
                said = _ChildOutput(self._child)
                if training or first == INDUCTOR_FIRST:  # a program in Inductor's format comes
                    _import_the_artifact_reader()  # while it compiles, not on the swap's path
                kept = self._take_the_first(said, built, began)
                if kept is None:
                    return
                self._read_program()  # sets done once read
                if kept is ProgramFormat.ARTIFACT and first == INDUCTOR_FIRST:
                    self._keep_the_package(said, built)  # for later processes, once built
        except Exception as exc:
            with self._lock:
                if self.state is JobState.COMPILING:
                    self.state, self.reason = JobState.FAILED, f"{type(exc).__name__}: {exc}".splitlines()[0]
        finally:
            self.seconds = self.seconds or time.perf_counter() - began
            self._done.set()  # a job that failed or was cancelled (a read one is done already)
            if said is not None:  # the compiler process, done with, is waited for as it exits
                said.finish()

    def _take_the_first(self, said: _ChildOutput, built: Path, began: float) -> ProgramFormat | None:
        """The first program the child says is written -- a package, or Inductor's format where it comes first or
        alone -- moved into the programs' folder: READY, its format returned (None where the child ended without
        one, or the job was cancelled meanwhile)."""
        heard = said.next_line()
        kept = None if heard is None or heard[0] != PROGRAM_READY else ProgramFormat(heard[1])
        # Inductor's format first (beside the package to come), or the one program (a package, or the format kept
        # where no package could be built)
        ahead = kept is ProgramFormat.ARTIFACT and plan_of(inductor_program_of(built)).exists()
        source, target = (
            (inductor_program_of(built), inductor_program_of(self.program)) if ahead else (built, self.program)
        )
        errors = "" if kept is not None else said.finish()  # ended without a program: why, once it has exited
        with self._lock:
            if self.state is not JobState.COMPILING:
                return None
            if kept is None or not source.exists() or not plan_of(source).exists():
                code = self._child.returncode if self._child is not None else None
                self.state, self.reason = JobState.FAILED, _last_line(errors, code)
                return None
            plan = json.loads(plan_of(source).read_text())
            self.phases, self.package_pending = plan.get("phases", {}), bool(plan.get("package_follows"))
            self.read_from = _move_in(source, target)
            self.state, self.reason = JobState.READY, "compiled"
            self.seconds = time.perf_counter() - began
        return kept

    def _keep_the_package(self, said: _ChildOutput, built: Path) -> None:
        """After Inductor's format, swapped in already: the package the child builds next, moved in beside it for
        later processes (which read it without Inductor); where none can be built, why, kept in the format's plan."""
        try:
            heard = said.next_line()
            if heard is not None:  # else the child ended first (this process exits): later ones read Inductor's format
                self._keep(heard, built)
        finally:
            self.package_pending = False

    def _keep(self, heard: tuple[str, str], built: Path) -> None:
        """What the child said after Inductor's format: its package is written (moved in beside it), or why none
        can be (kept in the format's plan, for the processes that read it)."""
        said_what, text = heard
        if said_what == PROGRAM_READY and text == ProgramFormat.PACKAGE and built.exists() and plan_of(built).exists():
            self.phases = json.loads(plan_of(built).read_text()).get("phases", self.phases)
            _move_in(built, self.program)
            return
        if said_what == NO_PACKAGE:
            self.unpackaged = text
            plan = json.loads(plan_of(self.read_from).read_text())
            plan.update(unpackaged=text, package_follows=False)
            written = plan_of(self.read_from).with_suffix(".tmp")
            written.write_text(json.dumps(plan))
            os.replace(written, plan_of(self.read_from))

    def end_child(self) -> None:
        """The compiler process ended, whatever it does: still compiling (``cancel`` first), or exiting after its
        program was taken."""
        child = self._child
        if child is not None and child.poll() is None:
            child.kill()


PROGRAM_READY = "launchless: program ready"
"""What a compiler process says on its standard output, with the program's format, once a program and its plan are
written: the calls' process takes the program then, not when the process has exited (seconds later: Inductor's
compile workers joined, the GPU's context torn down; a package built after Inductor's format, more)."""
NO_PACKAGE = "launchless: no package"
"""What it says, with why, where no package could follow Inductor's format."""
INDUCTOR_FIRST, PACKAGE_FIRST = "inductor-format-first", "package-first"  # the job's last element: the order
INDUCTOR_FORMAT_FIRST_ON = ("cuda",)
"""Where an inference program is compiled in Inductor's format first, swapped in, and packaged after: AOTInductor's
compile also tunes every kernel's configuration and compiles the program's C++ host code before the swap can come
(a resnet18 forward: 44.6 s on an H100 where ``torch.compile``'s whole first call took 7.3 s; a GPT-2 decode step:
43 s where transformers' compiled static-cache recipe took 9.1 s); Inductor's format tunes its kernels at its first
call. The calls' process reads that format with Inductor imported (the imports done while it compiles); a later
process finds the package. Programs on a CPU (only tests compile there: no graph is captured for a model without a
GPU) take the package first: both compile alike there."""


def _inductor_format_first(device: torch.device | None) -> bool:
    return (device.type if device is not None else "cpu") in INDUCTOR_FORMAT_FIRST_ON


def _move_in(source: Path, to: Path) -> Path:
    """A program's files moved from the child's scratch folder to ``to`` in the programs' folder, whole or not at
    all, its plan first: a reader never sees half a program."""
    to.parent.mkdir(parents=True, exist_ok=True)
    os.replace(plan_of(source), plan_of(to))
    if constants_of(source).exists():
        os.replace(constants_of(source), constants_of(to))
    os.replace(source, to)
    return to


class _ChildOutput:
    """What a compiler process says: its standard output read line by line for ``PROGRAM_READY``, its errors
    collected by a thread of their own meanwhile (a process blocked writing to a full pipe would never finish)."""

    def __init__(self, child: subprocess.Popen) -> None:
        self._child = child
        self._errors: list[str] = []
        self._drain = threading.Thread(target=self._collect_errors, name="launchless-compiler-errors", daemon=True)
        self._drain.start()

    def _collect_errors(self) -> None:
        if self._child.stderr is not None:
            self._errors.append(self._child.stderr.read())

    def next_line(self) -> tuple[str, str] | None:
        """The next thing the process says of its programs -- (``PROGRAM_READY``, the format) or (``NO_PACKAGE``,
        why) -- read as it comes; None where it ends, or closes its output, first. Anything else it prints is passed
        over."""
        if self._child.stdout is None:
            return None
        for line in self._child.stdout:
            for said in (PROGRAM_READY, NO_PACKAGE):
                if line.startswith(f"{said} "):
                    return said, line[len(said) + 1 :].rstrip("\n")
        return None

    def finish(self) -> str:
        """Its errors, once it has exited (the rest of its output read and dropped)."""
        if self._child.stdout is not None:
            with contextlib.suppress(OSError, ValueError):
                self._child.stdout.read()
        self._child.wait()
        self._drain.join()
        return "".join(self._errors)


def _import_the_artifact_reader() -> None:
    """Inductor's imports, which reading a program in its format needs (a second of Python), done while the program
    compiles -- beside the calls, which get the interpreter lock back sooner meanwhile (``calls_first``) -- so that
    the read, once the program is ready, is the read alone. Where they fail, the read fails saying why."""
    with calls_first(), contextlib.suppress(Exception):
        import torch._inductor.config  # noqa: F401
        from torch._inductor import CompiledArtifact  # noqa: F401


def _load_artifact(path: Path) -> Any:
    """A training program (Inductor's ``CompiledArtifact``: Python and Triton kernels, autograd's forward and
    backward), read in the calls' process: Inductor imported there (seconds, the bulk of the read). Each GPU kernel
    the program declares asks Inductor whether its compile workers may be used, which starts them (a process per
    core, each importing torch) -- in the calls' process, beside the calls, for kernels already built: one compile
    thread reads them here."""
    import torch._inductor.config as inductor_config
    from torch._inductor import CompiledArtifact

    with inductor_config.patch(compile_threads=1):
        return CompiledArtifact.load(path=str(path), format="binary")


class PackageProgram:
    """An inference program: an AOTInductor package (a shared library of the program's host code and its GPU
    kernels), run by PyTorch's C++ loader -- a shared library loaded, without importing Inductor in the calls' process
    (a ``CompiledArtifact`` costs the process seconds of imports there, holding the interpreter lock the calls
    need). Its runner runs single-threaded, on the caller's current stream, which a CUDA graph can capture."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    @classmethod
    def load(cls, path: Path, device: torch.device | None) -> PackageProgram:
        index = -1 if device is None else (device.index if device.index is not None else torch.cuda.current_device())
        try:
            loader = torch._C._aoti.AOTIModelPackageLoader(str(path), "model", True, 1, index)
        except TypeError:  # another PyTorch's constructor: its own loading function (which imports Inductor)
            from torch._inductor.package import load_package

            loader = load_package(str(path), run_single_threaded=True).loader
        return cls(loader)

    def __call__(self, *inputs: torch.Tensor) -> list[torch.Tensor]:
        return self.loader.run(list(inputs))


class ProgramFormat(Label):
    """How a program is kept on disk and read (its plan says which)."""

    PACKAGE = "package"  # inference: an AOTInductor package (``PackageProgram``)
    ARTIFACT = "artifact"  # training: Inductor's ``CompiledArtifact``, which autograd differentiates


def program_path(directory: Path, key: str, *, training: bool) -> Path:
    """Where the program of ``key`` is kept (the file's suffix is its format's: a package's loader wants ``.pt2``)."""
    return directory / f"{key}{'.bin' if training else '.pt2'}"


def inductor_program_of(program: Path) -> Path:
    """Beside an inference program's package: the same program in Inductor's format, compiled first and swapped in
    while the package is built (``INDUCTOR_FORMAT_FIRST_ON``)."""
    return program.with_name(f"{program.stem}-inductor.bin")


_LIVE: weakref.WeakSet[CompileJob] = weakref.WeakSet()
COMPILER_NICENESS = 10  # the compiler runs at a lower priority than the calls


def _compiler_environment() -> dict[str, str]:
    """The child's environment: as many Inductor compile workers as the compiler has CPUs (``compiler_cpus``; all
    but ``CALLS_CORES`` where it has no CPUs of its own), so that the calls beside it keep their host time (a
    caller's own setting stands)."""
    cpus = compiler_cpus()
    if cpus is not None:
        threads = len(cpus)
    else:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        threads = max(1, cores - CALLS_CORES)
    env = dict(os.environ)
    env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(threads))
    return env


def _start_compiler(arguments: list[str]) -> subprocess.Popen:
    """A compiler process, at a lower priority than the calls: ``[sent, built, started, kept_in]`` compiles at once;
    ``["--spare"]`` loads what it can and waits for its job on its standard input."""
    child = subprocess.Popen(
        [sys.executable, "-m", COMPILER_MODULE, *arguments],
        stdin=subprocess.PIPE if arguments == [SPARE] else subprocess.DEVNULL,
        stdout=subprocess.PIPE,  # says PROGRAM_READY
        stderr=subprocess.PIPE,
        text=True,
        env=_compiler_environment(),
    )
    _yield_to_the_calls(child.pid)
    return child


SPARE = "--spare"
COMPILER_MODULE = "launchless.core.compiler_process"  # the child's side: export and compile


class SpareCompiler:
    """A compiler process started ahead of its job -- when a model is wrapped to get compiled kernels -- so that
    the interpreter, torch, the GPU's context, the model's modules and Inductor's compile workers are loaded while
    the calls warm up, and a compile begins with the export (seconds sooner). It serves one job; ``end()`` (or the
    process exiting) stops it if none came."""

    def __init__(self, model: torch.nn.Module) -> None:
        modules = sorted({type(m).__module__ for m in model.modules()} - {"__main__"})
        spawned = time.time()  # its boot is the first part of a start phase it makes a job wait for
        self._child: subprocess.Popen | None = _start_compiler([SPARE])
        weakref.finalize(self, _end_waiting, self._child)  # dropped unused (its model released): it goes too
        try:
            self._send({"path": list(sys.path), "modules": modules, "spawned": spawned})
        except OSError:  # it could not start (nothing to warm): a job starts its own process
            self.end()
        _SPARES.add(self)

    def _send(self, message: Any) -> None:
        child = self._child
        if child is None or child.stdin is None:
            raise OSError("the spare compiler has ended")
        child.stdin.write(json.dumps(message) + "\n")
        child.stdin.flush()

    def take(self, job: list[str]) -> subprocess.Popen | None:
        """The process, given ``job``; None where it has ended (or was taken)."""
        child, self._child = self._child, None
        if child is None or child.poll() is not None or child.stdin is None:
            return None
        try:
            child.stdin.write(json.dumps(job) + "\n")
            child.stdin.close()
        except OSError:  # it ended meanwhile
            child.kill()
            return None
        child.stdin = None  # given: nothing more is written to it
        return child

    def end(self) -> None:
        child, self._child = self._child, None
        if child is not None and child.poll() is None:
            child.kill()
            child.wait()


_SPARES: weakref.WeakSet[SpareCompiler] = weakref.WeakSet()


def _end_waiting(child: subprocess.Popen) -> None:
    """A spare that still waits for its job is ended (one that was given a job finishes it)."""
    if child.poll() is None and child.stdin is not None:
        child.kill()
        child.wait()


def _yield_to_the_calls(pid: int) -> None:
    """The compiler at a lower priority than the calls and off their cores (``compiler_cpus``), set right after it
    starts, before it starts its compile workers, which inherit both; where the system does not allow it, it runs as
    it is."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, pid, COMPILER_NICENESS)
    cpus = compiler_cpus()
    if cpus is not None:
        with contextlib.suppress(AttributeError, OSError):
            os.sched_setaffinity(pid, cpus)


def compile_in_background(
    model: torch.nn.Module,
    args: tuple,
    kwargs: dict | None = None,
    *,
    signature: str,
    training: bool = False,
    eager_numerics: bool = False,
    directory: Path | None = None,
    spare: SpareCompiler | None = None,
) -> CompileJob:
    """Start compiling ``model`` for calls like ``(args, kwargs)`` (input signature ``signature``) and return at
    once: a program already on disk is ``READY``; otherwise a thread sends the model's structure to a child process,
    which exports and compiles it, and waits for it. The calls never wait for either. ``training``: a program that
    autograd differentiates (Inductor's compiled backward), for a training step; else an inference program.
    ``eager_numerics``: Inductor rounds as eager does where it fuses low-precision operations (each operation's
    result rounded to its dtype, divisions rounded as eager's), for programs whose outputs feed a decision eager
    made (a greedy token): closer to eager's values, not nearer to exact ones.
    ``spare``: a compiler process started ahead (``SpareCompiler``), used if it is still waiting."""
    kind = (" training" if training else "") + (" eager numerics" if eager_numerics else "")
    key = program_key(model, signature + kind)
    device = gpu_of(model)
    job = CompileJob(key, program_path(directory or cache_dir(), key, training=training), device)
    if training and job.state is JobState.COMPILING and not saves_training_programs():
        job.state, job.reason = JobState.FAILED, TRAINING_PROGRAMS_UNSAVED.format(version=torch.__version__)
        job._done.set()
        return job
    if job.state is JobState.READY:  # read into memory beside the calls, as a compiled one is
        job._thread = threading.Thread(target=job._read_program, name=f"launchless-read-{key[:8]}", daemon=True)
    else:
        job._thread = threading.Thread(
            target=job._run,
            args=(model, args, kwargs or {}, training, eager_numerics, spare),
            name=f"launchless-compile-{key[:8]}",
            daemon=True,
        )
    _LIVE.add(job)
    job._thread.start()
    return job


def gpu_of(model: torch.nn.Module) -> torch.device | None:
    """The CUDA device of ``model``'s first parameter or buffer on one; None for a model with nothing on a GPU (no
    graph is captured for it: nothing of it compiles)."""
    return next((t.device for t in (*model.parameters(), *model.buffers()) if t.is_cuda), None)


TRAINING_PROGRAMS_UNSAVED = (
    "this torch ({version}) cannot compile a training program's backward together with its forward, which a program "
    "kept on disk needs (AOTAutograd's force_non_lazy_backward_lowering, torch 2.10 and newer): the step keeps "
    "eager's kernels"
)


def saves_training_programs() -> bool:
    """Whether this torch can compile a training program's backward with its forward (AOTAutograd lowers it at the
    first ``backward()`` otherwise, after the program was saved without it; ``compiler_process``)."""
    import torch._functorch.config as config

    return hasattr(config, "force_non_lazy_backward_lowering")


EXIT_WAIT_S = 30.0
"""How long an exiting process waits, in all, for its jobs' threads to end (a program being read finishes its read)."""


@atexit.register
def _end_children() -> None:
    """A process that exits while compiling leaves no compiler running behind it, and no thread of its own inside
    torch: a daemon thread still running when the interpreter finalizes is stopped where it next waits for the
    interpreter, and stopped inside torch's C++ code that ends the process with ``terminate called without an
    active exception``. Each job is cancelled (its compiler process killed), then its thread is waited for: a
    compile's returns at once, a read ends with its read."""
    jobs = list(_LIVE)
    for job in jobs:
        job.cancel("the process is exiting")
        job.end_child()  # one whose program was taken may still be exiting: its job's thread waits for it
    for spare in list(_SPARES):
        spare.end()
    deadline = time.monotonic() + EXIT_WAIT_S
    for job in jobs:
        if job._thread is not None and job._thread is not threading.current_thread():
            job._thread.join(max(0.0, deadline - time.monotonic()))


class _StructurePickler(pickle.Pickler):
    """Pickles modules and inputs by reference to their classes, with every tensor as its metadata: what an export
    needs and none of the values (a model of gigabytes is sent in kilobytes)."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            meta = (tuple(obj.shape), obj.stride(), obj.dtype, str(obj.device), obj.requires_grad)
            return _zeros_like_sent, (*meta, isinstance(obj, torch.nn.Parameter))
        if isinstance(obj, torch.nn.Module) and getattr(obj.__dict__.get("forward"), ROUTING, False):
            # a forward put on the instance while a wrapper routes its calls (``generate()`` decoding through
            # graphs): the module is sent as its class defines it
            reduced = list(obj.__reduce_ex__(pickle.HIGHEST_PROTOCOL))
            reduced[2] = {k: v for k, v in dict(reduced[2]).items() if k != "forward"}
            return tuple(reduced)
        return NotImplemented


ROUTING = "_launchless_routing"
"""Marks a ``forward`` a wrapper puts on a module instance for a while to route its calls: not part of the model."""


def structure_of(
    model: torch.nn.Module, args: tuple, kwargs: dict, *, training: bool = False, eager_numerics: bool = False
) -> bytes:
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
    return pickle.dumps((list(sys.path), buffer.getvalue(), training, eager_numerics))


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
    # detached: not a view of its storage, as the calls' process's tensor is not (a compile that writes into an
    # input refuses inputs sharing storage where some are views and some are not: a tied weight, a cache tensor
    # reached by two paths)
    tensor = storage.as_strided(shape, stride).detach()
    rebuilt = (
        torch.nn.Parameter(tensor, requires_grad=requires_grad) if parameter else tensor.requires_grad_(requires_grad)
    )
    SENT.append(rebuilt)
    return rebuilt


SENT: list[torch.Tensor] = []  # in the compiler process: every tensor rebuilt from the calls' process (state, not made)


def _code_of(cls: type) -> str:
    """A digest of the file that defines ``cls`` (any change to it makes another program), read once per file
    version: a class's own source would need Python to parse its whole module (tens of milliseconds a class, on the
    call that starts the compile)."""
    try:
        path = inspect.getsourcefile(cls) or ""
        stat = os.stat(path)
    except (OSError, TypeError):  # defined where no file is kept (a notebook cell, C++): its qualified name stands
        return ""
    return _file_digest(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=512)
def _file_digest(path: str, mtime_ns: int, size: int) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def _triton_version() -> str:
    """Read from the installed package's metadata: importing triton would cost the call that starts a compile
    tens of milliseconds."""
    try:
        return importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        return "none"


def _last_line(errors: str, code: int | None) -> str:
    lines = [line for line in (errors or "").splitlines() if line.strip() and not line.startswith("W")]
    return f"the compiler process ended with code {code}" + (f": {lines[-1].strip()}" if lines else "")


class CompiledProgram:
    """A compiled forward, called as the model is: the call's arguments flattened as at the export, the model's
    tensors put in the places the plan gives them, the outputs rebuilt into the model's structure."""

    def __init__(
        self, compiled: Any, plan: dict[str, Any], model: torch.nn.Module, *, made: Sequence[torch.Tensor] = ()
    ) -> None:
        self.compiled = compiled
        self.training = bool(plan.get("training"))  # autograd differentiates it (Inductor's compiled backward)
        self.random_operations: list[str] = list(plan.get("random", []))  # drawn otherwise than eager draws them
        self.in_spec = pytree.treespec_loads(plan["in_spec"])
        self.out_spec = pytree.treespec_loads(plan["out_spec"])
        _, keywords = pytree.tree_unflatten(
            [None] * self.in_spec.num_leaves, self.in_spec
        )  # the export's (args, kwargs)
        self.kwarg_names = list(keywords)
        self.slots: list[torch.Tensor | int] = []  # a tensor (the model's, or made), or a call argument's index
        for kind, target in plan["inputs"]:
            if kind == "input":
                self.slots.append(int(target))
                continue
            if kind == "made":  # a tensor the forward makes itself, kept beside the program
                self.slots.append(made[int(target)])
                continue
            try:
                tensor = _attribute(model, target)
            except AttributeError:
                raise RuntimeError(
                    f"launchless: the compiled program reads {target}, which the model does not hold; it was "
                    "compiled for another model"
                ) from None
            self.slots.append(tensor)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        ordered = {name: kwargs[name] for name in self.kwarg_names}  # the export's order, whatever the call's
        flat, spec = pytree.tree_flatten((args, ordered))
        if spec != self.in_spec:
            raise TypeError(
                f"launchless: the compiled program takes arguments structured as {self.in_spec}, not {spec}"
            )
        inputs = [flat[slot] if isinstance(slot, int) else slot for slot in self.slots]
        return pytree.tree_unflatten(list(self.compiled(*inputs)), self.out_spec)


def _attribute(model: torch.nn.Module, target: str) -> torch.Tensor:
    value: Any = model
    for part in target.split("."):
        value = getattr(value, part)
    if not isinstance(value, torch.Tensor):
        raise AttributeError(target)
    return value


def constants_of(program: Path) -> Path:
    """Beside a program: the tensors its forward makes itself (lifted by the export), where it makes any."""
    return program.with_suffix(".constants.pt")


def plan_of(program: Path) -> Path:
    """Beside a program: the order of its inputs (a model tensor by name, or a call's flattened argument by index)
    and the structure of the call's arguments and of its outputs."""
    return program.with_suffix(".plan.json")


@dataclass(frozen=True)
class KeptProgram:
    """A compiled program on disk, as ``launchless cache`` lists it: its files (the program, its plan, the tensors
    its forward makes), what its plan says, their size and when it was written."""

    path: Path
    training: bool | None  # None where its plan cannot be read (removed, or written by another launchless)
    format: str
    unpackaged: str
    size_bytes: int
    modified: float

    @property
    def files(self) -> list[Path]:
        return _files_of(self.path)


def _files_of(program: Path) -> list[Path]:
    """A kept program's files on disk: the program, its plan, the tensors its forward makes."""
    return [p for p in (program, plan_of(program), constants_of(program)) if p.exists()]


def kept_programs(directory: Path) -> list[KeptProgram]:
    """The programs kept in ``directory`` (``cache_dir()`` where launchless keeps them), newest first."""
    found = []
    for path in [*directory.glob("*.pt2"), *directory.glob("*.bin")]:
        try:
            plan = json.loads(plan_of(path).read_text())
        except (OSError, ValueError):
            plan = None
        files = _files_of(path)
        found.append(
            KeptProgram(
                path=path,
                training=None if plan is None else bool(plan.get("training")),
                format="" if plan is None else str(plan.get("format", ProgramFormat.ARTIFACT)),
                unpackaged="" if plan is None else str(plan.get("unpackaged", "")),
                size_bytes=sum(p.stat().st_size for p in files),
                modified=max(p.stat().st_mtime for p in files),
            )
        )
    return sorted(found, key=lambda kept: kept.modified, reverse=True)


def stray_files(directory: Path) -> list[Path]:
    """Plans and made tensors in ``directory`` whose program is not there (a process that ended between moving a
    program's files in): nothing reads them."""
    programs = {p.stem for p in [*directory.glob("*.pt2"), *directory.glob("*.bin")]}
    beside = [*directory.glob("*.plan.json"), *directory.glob("*.constants.pt")]
    return sorted(p for p in beside if p.name.split(".", 1)[0] not in programs)
