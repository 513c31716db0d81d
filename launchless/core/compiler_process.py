"""The compiler process's side of ``core.compiled_programs``: the model's structure in, an Inductor program and its
plan out.

The calls' process starts this module (``python -m launchless.core.compiler_process``) with a job -- the pickled
structure, where to write the program, when it was started -- or as a spare (``--spare``) that loads what a compile
needs while the calls warm up and then waits for its job on its standard input. Nothing here runs in the calls'
process.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import os
import pickle
import select
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree

from .compiled_programs import (
    INDUCTOR_FIRST,
    NO_PACKAGE,
    PROGRAM_READY,
    SENT,
    SPARE,
    ProgramFormat,
    _attribute,
    constants_of,
    inductor_program_of,
    plan_of,
    saves_training_programs,
)
from .package_check import loader_crashed_here, loader_record, package_runs, remember_if_the_loader_crashes


class _Lines:
    """Lines of the standard input read straight off its file descriptor, so that whether one is waiting can be
    asked without blocking (Python's buffered reader may hold a line that ``select`` no longer sees)."""

    def __init__(self, fd: int = 0) -> None:
        self._fd, self._held = fd, b""

    def waiting(self) -> bool:
        if b"\n" in self._held:
            return True
        ready, _, _ = select.select([self._fd], [], [], 0)
        return bool(ready)

    def read(self) -> str:
        while b"\n" not in self._held:
            chunk = os.read(self._fd, 65536)
            if not chunk:  # the end of the input: what is held is the last line
                line, self._held = self._held, b""
                return line.decode()
            self._held += chunk
        line, _, self._held = self._held.partition(b"\n")
        return line.decode()


Step = tuple[str, Callable[[], Any]]  # a warm step, named as the start phase's parts name it
Mark = tuple[str, float, float]  # what the spare did, from and to (wall seconds)


def _warm_steps(modules: list[str]) -> tuple[list[Step], list[Step]]:
    """What a compile will load: first, whatever the job's time -- the GPU's context and Inductor's compile workers
    (started, not waited for: they boot in processes of their own while the rest loads); then, until the job comes,
    the model's modules and Inductor's compiler."""

    def gpu() -> None:
        if torch.cuda.is_available():
            torch.cuda.init()

    def workers() -> None:
        from torch._inductor.async_compile import AsyncCompile

        AsyncCompile.warm_pool()
        AsyncCompile.use_process_pool()  # the workers start; the compile finds them ready or starting

    imports = [(f"import {module}", functools.partial(importlib.import_module, module)) for module in modules]
    inductor = ("import Inductor", functools.partial(importlib.import_module, "torch._inductor.compile_fx"))
    return [("GPU context", gpu), ("compile workers started", workers)], [*imports, inductor]


def serve_as_spare() -> None:
    """The spare's side: load what the job will need, step by step, until the job comes (a job that comes early
    starts at once: what is not loaded yet, the compile loads as it would have -- but the compile workers, which
    boot beside it, are started first), then compile it; nothing if the input ends first. What it did and when
    (``Mark``) goes to the compile, which tells which of it the job waited for."""
    entered = time.time()
    lines = _Lines()
    warm = json.loads(lines.read() or "null")
    if warm is None:
        return
    marks: list[Mark] = [("interpreter and torch", float(warm.get("spawned", entered)), entered)]
    sys.path[:] = warm["path"]
    at_once, until_the_job = _warm_steps(warm["modules"])
    for name, step in [*at_once, *until_the_job]:
        if lines.waiting() and (name, step) not in at_once:
            break
        began = time.time()
        with contextlib.suppress(Exception):  # what fails here fails the compile, with its own error
            step()
        marks.append((name, began, time.time()))
    line = lines.read()
    if line:
        sent, program, started, kept_in, first = json.loads(line)
        compile_program(
            sent, program, float(started), kept_in=kept_in, marks=marks, inductor_format_first=first == INDUCTOR_FIRST
        )


def start_parts(marks: list[Mark], handed: float, began: float) -> dict[str, float]:
    """Which of the spare's work a job handed at ``handed`` waited for until its compile ``began`` (wall seconds):
    each mark's overlap with that wait, the rest as "job read"; nothing without marks (no spare: the start phase is
    a process's own boot)."""
    if not marks:
        return {}
    parts = {name: min(end, began) - max(start, handed) for name, start, end in marks}
    parts = {name: seconds for name, seconds in parts.items() if seconds > 0}
    rest = (began - handed) - sum(parts.values())
    return {**parts, "job read": rest} if rest > 0 else parts


def random_operations(graph_module: torch.fx.GraphModule) -> list[str]:
    """The operations of ``graph_module`` that draw random numbers (PyTorch tags them ``nondeterministic_seeded``;
    a dropout told ``train=False`` draws none)."""
    found = set()
    for node in graph_module.graph.nodes:
        target = node.target
        if node.op != "call_function" or torch.Tag.nondeterministic_seeded not in getattr(target, "tags", ()):
            continue
        arguments = [argument.name for argument in target._schema.arguments]
        if "train" in arguments:
            index = arguments.index("train")
            train = node.args[index] if index < len(node.args) else node.kwargs.get("train", True)
            if train is False:
                continue
        found.add(str(target))
    return sorted(found)


def _holds(model: torch.nn.Module, spec: Any) -> bool:
    """Whether the model holds the tensor an input spec names (a tensor attribute, not one the forward made)."""
    try:
        _attribute(model, str(spec.target))
    except AttributeError:
        return False
    return True


def _backward_compiled_now(training: bool) -> Any:
    """A training program's backward compiled with its forward: AOTAutograd lowers the backward at the first
    ``backward()`` otherwise, after ``standalone_compile`` has collected what it saves -- a program without its
    backward cannot be saved (newer PyTorch sets this itself; older ones leave the option off; a torch without it
    gets no training job: ``saves_training_programs``)."""
    import torch._functorch.config as config

    if not training or not saves_training_programs():
        return contextlib.nullcontext()
    return config.patch(force_non_lazy_backward_lowering=True)


def numerics_of_eager(on: bool) -> Any:
    """Inductor's options that keep eager's rounding where it fuses (``compile_in_background``'s
    ``eager_numerics``), those this PyTorch has (the division option's name changed between releases)."""
    import torch._inductor.config as config

    if not on:
        return contextlib.nullcontext()
    known = config.get_config_copy()
    wanted = ("emulate_precision_casts", "eager_numerics.division_rounding", "emulate_divison_rounding")
    return config.patch({name: True for name in wanted if name in known})


def host_code_unoptimized() -> Any:
    """A package's host code (the C++ that allocates and launches its kernels) compiled without optimizations: it
    runs at capture only (its graph replays the kernels), and an optimizing C++ compile of it costs the swap
    seconds."""
    import torch._inductor.config as config

    if "aot_inductor.compile_wrapper_opt_level" not in config.get_config_copy():
        return contextlib.nullcontext()
    return config.patch({"aot_inductor.compile_wrapper_opt_level": "O0"})


def _build_package(
    graph_module: torch.fx.GraphModule, examples: list[Any], program: str | Path, *, eager_numerics: bool
) -> None:
    """AOTInductor's package of ``graph_module`` at ``program``, every weight an input as ``examples`` has them."""
    from torch._inductor.package import package_aoti

    with torch.no_grad(), numerics_of_eager(eager_numerics), host_code_unoptimized():
        files = torch._inductor.aot_compile(graph_module, tuple(examples), options={"aot_inductor.package": True})
    assert isinstance(files, (list, dict)), type(files)  # with aot_inductor.package: the files to pack
    package_aoti(str(program), files)


def _build_probe(module: torch.nn.Module, x: torch.Tensor, path: Path) -> None:
    """A probe package built as programs are (``package_check.remember_if_the_loader_crashes``)."""
    with torch.no_grad():
        exported = torch.export.export(module, (x,), strict=False)
    _build_package(exported.graph_module, [*dict(module.named_parameters()).values(), x], path, eager_numerics=False)


def _package_or_why(
    graph_module: torch.fx.GraphModule,
    examples: list[Any],
    program: str,
    *,
    kept_in: Path,
    eager_numerics: bool,
    phase: Callable[[str], None] = lambda name: None,
) -> str:
    """An inference program compiled by AOTInductor into a package at ``program``, kept once a process of its own
    has loaded and run it (``package_check``): "" where it is, else why not -- AOTInductor cannot build one (its host
    code needs a C++ compiler, and the CUDA toolkit's headers for a GPU), the package does not load and run, or
    PyTorch's loader was found crashing on this machine before (the program is then kept in Inductor's own format
    only, which a process reads with Inductor imported: seconds). ``kept_in``: the programs' folder, where a
    crashing loader is recorded. ``phase(name)`` closes each part's seconds (``compile``, ``check``, ``probe`` where
    the check crashed)."""
    record = loader_record(kept_in)
    why = loader_crashed_here(record)
    if why is not None:
        return why
    try:
        _build_package(graph_module, examples, program, eager_numerics=eager_numerics)
        phase("compile")
    except Exception as exc:
        phase("compile")
        return f"AOTInductor could not build a package ({type(exc).__name__}: {exc})".splitlines()[0]
    check = package_runs(Path(program), examples)
    phase("check")
    if check.passed:
        return ""
    Path(program).unlink(missing_ok=True)
    why = check.why
    if check.crashed:
        devices = [x.device for x in examples if isinstance(x, torch.Tensor) and x.is_cuda]
        device = devices[0] if devices else torch.device("cpu")
        if remember_if_the_loader_crashes(record, check, device, build=_build_probe):
            why += "; a two-layer probe package crashed it too: packages are no longer built here"
        phase("probe")
    return why


def _packaged(
    graph_module: torch.fx.GraphModule,
    examples: list[Any],
    program: str,
    *,
    kept_in: Path,
    eager_numerics: bool,
    phase: Callable[[str], None] = lambda name: None,
) -> tuple[ProgramFormat, str]:
    """An inference program at ``program``: AOTInductor's package (``_package_or_why``), else Inductor's own format
    there: the format kept and why not a package (``phase`` closes "compile (Inductor's format)" too)."""
    why = _package_or_why(graph_module, examples, program, kept_in=kept_in, eager_numerics=eager_numerics, phase=phase)
    if not why:
        return ProgramFormat.PACKAGE, ""
    _inductor_format(graph_module, examples, Path(program), eager_numerics=eager_numerics)
    phase("compile (Inductor's format)")
    return ProgramFormat.ARTIFACT, why


def _inductor_format(
    graph_module: torch.fx.GraphModule, examples: list[Any], path: Path, *, eager_numerics: bool
) -> None:
    """The inference program in Inductor's own format (``CompiledArtifact``) at ``path``."""
    with torch.no_grad(), numerics_of_eager(eager_numerics):
        compiled = torch._inductor.standalone_compile(graph_module, examples, dynamic_shapes="from_example_inputs")
    compiled.save(path=str(path), format="binary")


def program_inputs(
    exported: torch.export.ExportedProgram, model: torch.nn.Module, args: tuple, kwargs: dict
) -> tuple[torch.fx.GraphModule, list[list[Any]], list[Any], list[torch.Tensor]]:
    """The exported forward's graph made a program's: every weight an input (a tied weight, lifted twice, one input),
    the call's flags specialized into the code dropped (Inductor takes no booleans), the tensors the forward makes kept
    beside it. Returns the graph, how the calls' process finds each input (``["input", i]`` the call's i-th leaf,
    ``["tensor", name]`` the model's, ``["made", i]`` the i-th made tensor), the examples in the same order, and the
    made tensors."""
    from torch.export.graph_signature import ConstantArgument, InputKind

    flat = pytree.tree_leaves((args, kwargs))
    graph_module = exported.graph_module
    placeholders = {node.name: node for node in graph_module.graph.nodes if node.op == "placeholder"}
    inputs: list[list[Any]] = []
    examples: list[Any] = []
    made: list[torch.Tensor] = []  # tensors the forward makes, kept beside the program
    owned = {
        id(t): name
        for name, t in [
            *model.named_parameters(remove_duplicate=False),
            *model.named_buffers(remove_duplicate=False),
        ]
    }
    user = 0
    held: dict[int, torch.fx.Node] = {}  # each of the model's tensors once: the placeholder that takes it

    def once(node: torch.fx.Node, value: torch.Tensor) -> bool:
        """Whether ``value`` (one of the model's tensors) is not an input yet; where it is -- a tied weight, a cache
        tensor a layer reaches by another path, which the export lifts twice -- ``node``'s uses take the first
        placeholder (a compiler refuses two inputs that alias where one is written)."""
        first = held.setdefault(id(value), node)
        if first is node:
            return True
        node.replace_all_uses_with(first)
        graph_module.graph.erase_node(node)
        return False

    for spec in exported.graph_signature.input_specs:
        node = placeholders[spec.arg.name]
        if spec.kind is InputKind.USER_INPUT and isinstance(spec.arg, ConstantArgument) and not node.users:
            # a flag or a number of the call, specialized into the code (the signature holds its value): no input
            # of the program (Inductor takes no booleans)
            graph_module.graph.erase_node(node)
            user += 1
        elif spec.kind is InputKind.USER_INPUT:
            inputs.append(["input", user])
            examples.append(flat[user])
            user += 1
        elif spec.kind is InputKind.CONSTANT_TENSOR and spec.target in exported.constants and not _holds(model, spec):
            value = exported.constants[spec.target]
            if id(value) in owned:  # one of the model's own tensors reached by another path (a tied weight)
                if once(node, value):
                    inputs.append(["tensor", owned[id(value)]])
                    examples.append(value)
                continue
            if any(value is t for t in SENT):  # state the calls' process holds outside the model's modules
                raise TypeError(
                    f"the forward reads a tensor held outside the model's parameters and buffers ({spec.target}, "
                    "an object's attribute): a compiled program cannot follow it"
                )
            # a tensor the forward makes itself (``torch.tensor(0.5)``, a mask of the config's sizes): not the model's,
            # so it is kept with the program (its value does not depend on the weights)
            inputs.append(["made", len(made)])
            examples.append(value)
            made.append(value)
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            value = _attribute(model, str(spec.target))
            if once(node, value):
                inputs.append(["tensor", spec.target])
                examples.append(value)
        else:
            raise TypeError(
                f"the exported forward takes a {spec.kind.name.lower()} input ({spec.target}), which a "
                "compiled program is not given"
            )
    graph_module.recompile()
    return graph_module, inputs, examples, made


def compile_program(
    sent: str,
    program: str,
    started: float,
    *,
    kept_in: str | None = None,
    marks: list[Mark] | None = None,
    inductor_format_first: bool = False,
) -> None:
    """The child process: the model's structure in, the compiled program and its plan out (``PROGRAM_READY`` said on
    its standard output once both are written). An inference program is exported and compiled under ``no_grad``; a
    training program with autograd on, so that Inductor compiles its backward too (AOTAutograd's forward and
    backward, called through autograd as the model is). Every weight is an input of the program, none a constant of
    its code. The plan names the operations that draw random numbers (dropout in training): Inductor draws them
    otherwise than eager. ``started``: the wall time the parent started it at; the plan keeps the seconds of each
    phase. ``kept_in``: the folder the calls' process keeps programs in (``program`` is built in a scratch folder
    first), where a crashing package loader is recorded. ``marks``: what a spare did before (``start_parts`` of the
    start phase, as "start: <part>"). ``inductor_format_first``: an inference program is compiled in Inductor's
    format first, at ``inductor_program_of(program)`` (its compile is the shorter: the calls swap it in sooner), then
    as a package at ``program`` for later processes, each said when written (``NO_PACKAGE`` and why where no package
    can be had)."""
    began = time.time()
    phases = {"start": began - started}  # the interpreter and torch imported (a spare: what the job waited for)
    phases.update({f"start: {name}": s for name, s in start_parts(marks or [], started, began).items()})
    mark = time.perf_counter()

    def phase(name: str) -> None:
        nonlocal mark
        now = time.perf_counter()
        phases[name] = phases.get(name, 0.0) + now - mark  # "save" comes once per program delivered
        mark = now

    search_path, structure, training, eager_numerics = pickle.loads(Path(sent).read_bytes())
    sys.path[:] = search_path  # the model's classes are imported from where the calls' process found them
    model, args, kwargs = pickle.loads(structure)
    phase("build")
    grad_mode = torch.enable_grad if training else torch.no_grad
    with grad_mode():
        exported = torch.export.export(model, args, kwargs, strict=False)
    phase("export")
    graph_module, inputs, examples, made = program_inputs(exported, model, args, kwargs)
    common = {
        "inputs": inputs,
        "in_spec": pytree.treespec_dumps(exported.call_spec.in_spec),
        "out_spec": pytree.treespec_dumps(exported.call_spec.out_spec),
        "training": training,
        "random": random_operations(exported.graph_module),
    }

    def deliver(path: Path, kept: ProgramFormat, unpackaged: str = "", *, package_follows: bool = False) -> None:
        """``path``'s plan (and the tensors the forward makes) written beside it, then the calls' process told: it
        takes the program at once (this process's exit -- Inductor's compile workers joined, the GPU's context torn
        down -- takes seconds more; a package built after an artifact, more still)."""
        if made:
            torch.save(made, constants_of(path))
        phase("save")
        plan = {
            **common,
            "phases": {name: round(seconds, 3) for name, seconds in phases.items()},
            "format": kept,
            "unpackaged": unpackaged,
            "package_follows": package_follows,
        }
        plan_of(path).write_text(json.dumps(plan))
        _say(f"{PROGRAM_READY} {kept}")

    if training:  # autograd differentiates it: Inductor's forward and backward, kept as a ``CompiledArtifact``
        with grad_mode(), _backward_compiled_now(training), numerics_of_eager(eager_numerics):
            compiled = torch._inductor.standalone_compile(graph_module, examples, dynamic_shapes="from_example_inputs")
        phase("compile")
        compiled.save(path=program, format="binary")
        deliver(Path(program), ProgramFormat.ARTIFACT)
        return
    folder = Path(kept_in) if kept_in is not None else Path(program).parent
    if not inductor_format_first:  # an AOTInductor package, Inductor's format where none can be had
        kept, why = _packaged(
            graph_module, examples, program, kept_in=folder, eager_numerics=eager_numerics, phase=phase
        )
        deliver(Path(program), kept, why)
        return
    # Inductor's format first, swapped in while the package (which another process reads without Inductor) is built
    why = loader_crashed_here(loader_record(folder)) or ""
    _inductor_format(graph_module, examples, inductor_program_of(Path(program)), eager_numerics=eager_numerics)
    phase("compile (Inductor's format)")
    deliver(inductor_program_of(Path(program)), ProgramFormat.ARTIFACT, why, package_follows=not why)
    if why:
        return
    why = _package_or_why(graph_module, examples, program, kept_in=folder, eager_numerics=eager_numerics, phase=phase)
    if why:
        Path(program).unlink(missing_ok=True)
        _say(f"{NO_PACKAGE} {' '.join(why.split())}")
    else:
        deliver(Path(program), ProgramFormat.PACKAGE)


def _say(line: str) -> None:
    """A line to the calls' process, on this process's standard output (``compiled_programs._ChildOutput``)."""
    os.write(1, f"{line}\n".encode())


if __name__ == "__main__":
    if sys.argv[1:] == [SPARE]:
        serve_as_spare()
    else:
        first = sys.argv[5] == INDUCTOR_FIRST
        compile_program(sys.argv[1], sys.argv[2], float(sys.argv[3]), kept_in=sys.argv[4], inductor_format_first=first)
