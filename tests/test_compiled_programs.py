"""Compiled programs built off the calls' path (``core.compiled_programs``): the key, the disk cache, a real
Inductor compile in a child process on the CPU, a program called with the model's own weights, cancelling, and
a compile that fails saying why."""

from __future__ import annotations

import contextvars
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from launchless.core import compiled_programs, compiler_cpus, compiler_process, package_check
from launchless.core.compiled_programs import JobState, cache_dir, compile_in_background, program_key

needs_compiler = pytest.mark.skipif(shutil.which("g++") is None, reason="Inductor's CPU kernels need a C++ compiler")
saves_training = pytest.mark.skipif(
    not compiled_programs.saves_training_programs(),
    reason="this torch cannot compile a training program's backward with its forward (the job is refused at once)",
)
COMPILE_S = 600  # a cold Inductor compile on two CPU cores


class Net(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, width, 3, padding=1)
        self.norm = nn.BatchNorm2d(width)
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.norm(self.conv(x))).mean((2, 3)))


class Keywords(nn.Module):
    """Keyword arguments (a flag among them), a tensor constant (not a buffer) and a dict of outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.scale = torch.tensor(2.0)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None = None, k: int = 2, extra: None = None, flag: bool = False
    ) -> dict:
        y = self.lin(x) * self.scale * k
        if flag:  # a flag of the call (transformers' use_cache, return_dict): specialized, no input of the program
            y = y + 1
        if mask is not None:
            y = y * mask
        return {"y": y, "s": y.sum(-1)}


class Broken(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # data-dependent control flow: export refuses it
            return self.lin(x)
        return x


def test_the_key_follows_the_code_shapes_and_signature_not_the_weights() -> None:
    torch.manual_seed(0)
    a, b = Net().eval(), Net().eval()
    assert program_key(a, "(float32[2x3x8x8]@cpu)") == program_key(b, "(float32[2x3x8x8]@cpu)")
    with torch.no_grad():
        a.conv.weight.add_(1.0)  # values: the program reads the model's own tensors
    assert program_key(a, "(float32[2x3x8x8]@cpu)") == program_key(b, "(float32[2x3x8x8]@cpu)")
    assert program_key(a, "(float32[4x3x8x8]@cpu)") != program_key(a, "(float32[2x3x8x8]@cpu)")
    assert program_key(Net(width=8), "(float32[2x3x8x8]@cpu)") != program_key(a, "(float32[2x3x8x8]@cpu)")
    assert program_key(a.double(), "(float32[2x3x8x8]@cpu)") != program_key(b, "(float32[2x3x8x8]@cpu)")


def test_the_cache_folder_follows_the_environment(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("LAUNCHLESS_CACHE_DIR", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine" / "compiled"
    monkeypatch.delenv("LAUNCHLESS_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "launchless" / "compiled"


class RoundingChain(nn.Module):
    """bfloat16 elementwise operations that Inductor fuses into one kernel: eager rounds after each, a fused kernel
    computes in float32 and rounds once, unless asked for eager's numerics."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.randn(4096, dtype=torch.bfloat16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = (x * self.a + 0.3) * 1.7 - x
        return y / 3.0 + y * y


@needs_compiler
def test_a_program_compiled_in_a_child_reads_the_models_own_weights_and_is_found_again(tmp_path) -> None:
    torch.manual_seed(0)
    model = Net().eval()
    with torch.inference_mode():  # as a caller makes its inputs; the export runs in a thread of its own
        x = torch.randn(2, 3, 8, 8)
    job = compile_in_background(model, (x,), signature="(float32[2x3x8x8]@cpu)", directory=tmp_path)
    assert job.state is JobState.COMPILING  # returned at once
    assert job.wait(COMPILE_S) is JobState.READY, job.reason
    assert job.program.exists() and job.seconds > 0
    assert set(job.phases) == {"start", "build", "export", "compile", "check", "save"} and all(
        s >= 0 for s in job.phases.values()
    )
    program = job.load(model)
    with torch.inference_mode():
        for _ in range(3):
            x = torch.randn(2, 3, 8, 8)
            torch.testing.assert_close(program(x), model(x), rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        model.conv.weight.mul_(2.0)  # an in-place update (a checkpoint loaded into the same tensors)
        model.norm.running_mean.add_(0.5)
    with torch.inference_mode():
        torch.testing.assert_close(program(x), model(x), rtol=1e-5, atol=1e-5)
    again = compile_in_background(Net().eval(), (x,), signature="(float32[2x3x8x8]@cpu)", directory=tmp_path)
    assert again.state is JobState.READY and again.reason == "found on disk"  # another process: no export
    assert again.wait(COMPILE_S) is JobState.READY and again.done and again.load_seconds > 0  # read in its thread
    assert job.load_seconds > 0  # a compiled one is read there too, before it is done


READS_WITHOUT_INDUCTOR = """
import json, sys
from pathlib import Path
import torch
from launchless.core.compiled_programs import JobState, compile_in_background
sys.path.insert(0, sys.argv[3])
Net = getattr(__import__(sys.argv[2], fromlist=["Net"]), "Net")  # the class as the test imported it: the same key

torch.manual_seed(1)
model = Net().eval()
x = torch.randn(2, 3, 8, 8)
job = compile_in_background(model, (x,), signature="(float32[2x3x8x8]@cpu)", directory=Path(sys.argv[1]))
state = job.wait(60)
program = job.load(model)
with torch.inference_mode():
    same = bool(torch.allclose(program(x), model(x), rtol=1e-5, atol=1e-5))
print(json.dumps({"state": str(state), "reason": job.reason, "read_s": job.load_seconds, "same": same,
                  "inductor": sorted(m for m in ("torch._inductor", "torch._dynamo") if m in sys.modules)}))
"""


@needs_compiler
def test_a_second_process_reads_an_inference_program_without_importing_inductor(tmp_path) -> None:
    """An inference program is an AOTInductor package, which PyTorch's C++ loader reads in milliseconds: the
    calls' process imports neither Inductor nor Dynamo (seconds of imports holding the interpreter lock the calls
    need)."""
    model = Net().eval()
    job = compile_in_background(
        model, (torch.randn(2, 3, 8, 8),), signature="(float32[2x3x8x8]@cpu)", directory=tmp_path
    )
    assert job.wait(COMPILE_S) is JobState.READY, job.reason
    assert job.program.suffix == ".pt2" and job.format == compiled_programs.ProgramFormat.PACKAGE, job.unpackaged
    done = subprocess.run(
        [sys.executable, "-c", READS_WITHOUT_INDUCTOR, str(tmp_path), Net.__module__, str(Path(__file__).parent)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    second = json.loads(done.stdout.strip().splitlines()[-1])
    assert second["state"] == "ready" and second["reason"] == "found on disk", second
    assert second["same"] and second["inductor"] == [], second
    assert second["read_s"] < 1.0, second


@needs_compiler
def test_where_no_package_can_be_built_the_program_is_inductors_own_saying_why(tmp_path, monkeypatch) -> None:
    """AOTInductor's host code needs a C++ compiler (and the CUDA toolkit's headers for a GPU): where it cannot
    build, the inference program is kept in Inductor's own format, read with Inductor imported."""

    def no_headers(*args: object, **kwargs: object) -> None:
        raise RuntimeError("cuda_runtime_api.h: No such file or directory\ncompilation terminated.")

    monkeypatch.setattr(torch._inductor, "aot_compile", no_headers)
    model = Net(width=8).eval()
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        exported = torch.export.export(model, (x,), strict=False)
    examples = [*(dict(model.named_parameters()) | dict(model.named_buffers())).values(), x]
    names = [spec.target for spec in exported.graph_signature.input_specs if spec.target]
    assert names == [*dict(model.named_parameters()), *dict(model.named_buffers())]  # the order the examples take
    path = tmp_path / "program.pt2"
    from torch._inductor import config as inductor_config

    def built_and_read() -> tuple[compiled_programs.ProgramFormat, str, Any]:
        with inductor_config.patch(compile_threads=1):  # the child's side: no compile workers in this process
            kept, why = compiler_process._packaged(
                exported.graph_module, examples, str(path), kept_in=tmp_path, eager_numerics=False
            )
        return kept, why, compiled_programs._load_artifact(path)

    # in a context of its own (as the child and the reading thread have): Inductor's settings are context
    # variables, which a compile and a read leave set
    kept, why, program = contextvars.copy_context().run(built_and_read)
    assert kept is compiled_programs.ProgramFormat.ARTIFACT
    assert why == "AOTInductor could not build a package (RuntimeError: cuda_runtime_api.h: No such file or directory"
    with torch.no_grad():
        torch.testing.assert_close(program(*examples)[0], model(x), rtol=1e-5, atol=1e-5)


@needs_compiler
def test_a_package_that_does_not_load_and_run_in_a_process_of_its_own_is_not_kept(tmp_path, monkeypatch) -> None:
    """A package that crashes PyTorch's loader would take the calls' process with it (a fault in native code): the
    compiler process has a process of its own load and run each package first, and keeps Inductor's format where
    that process fails, saying how."""
    model = Net(width=8).eval()
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        exported = torch.export.export(model, (x,), strict=False)
    examples = [*(dict(model.named_parameters()) | dict(model.named_buffers())).values(), x]
    path = tmp_path / "program.pt2"
    from torch._inductor import config as inductor_config

    def built(checked: str) -> tuple[compiled_programs.ProgramFormat, str, list[str]]:
        parts: list[str] = []
        check = package_check.PackageCheck(checked)  # a check that failed without a signal: no probe
        monkeypatch.setattr(compiler_process, "package_runs", lambda program, inputs: check)
        with inductor_config.patch(compile_threads=1):  # the child's side: no compile workers in this process
            kept, why = compiler_process._packaged(
                exported.graph_module, examples, str(path), kept_in=tmp_path, eager_numerics=False, phase=parts.append
            )
        return kept, why, parts

    failed = "a process that loaded and ran the package ended with exit status 1 (RuntimeError: no such file)"
    kept, why, parts = contextvars.copy_context().run(built, failed)
    assert kept is compiled_programs.ProgramFormat.ARTIFACT and why == failed
    assert parts == ["compile", "check", "compile (Inductor's format)"]
    program = contextvars.copy_context().run(compiled_programs._load_artifact, path)  # Inductor's format, in place
    with torch.no_grad():
        torch.testing.assert_close(program(*examples)[0], model(x), rtol=1e-5, atol=1e-5)
    kept, why, parts = contextvars.copy_context().run(built, "")
    assert kept is compiled_programs.ProgramFormat.PACKAGE and why == "" and parts == ["compile", "check"]


CRASHED = "a process that loaded and ran the package ended with signal SIGSEGV (Fatal Python error: Segmentation fault)"


@pytest.mark.parametrize("probe_crashes", [True, False], ids=["loader-at-fault", "program-at-fault"])
def test_a_loader_that_crashes_on_a_probe_package_too_is_recorded_for_the_machine(
    tmp_path, monkeypatch, probe_crashes: bool
) -> None:
    """A check that ended by a signal has a two-layer probe package checked on the same device: where that crashes
    too, the record says so for later compiles here; where it runs, the program alone was at fault."""
    record = package_check.loader_record(tmp_path)
    built: list[tuple[int, Path]] = []

    def build(module: nn.Module, x: torch.Tensor, path: Path) -> None:
        built.append((x.shape[-1], path))
        path.write_bytes(b"a probe package")

    probed = package_check.PackageCheck(CRASHED, crashed=True) if probe_crashes else package_check.PackageCheck("")
    monkeypatch.setattr(package_check, "package_runs", lambda path, examples: probed)
    reported = package_check.PackageCheck("a process ... ended with exit status 1 (RuntimeError: bad input)")
    assert not package_check.remember_if_the_loader_crashes(record, reported, torch.device("cpu"), build=build)
    assert built == [] and not record.exists()  # an error the loader reported: no probe
    crashed = package_check.PackageCheck(CRASHED, crashed=True)
    remembered = package_check.remember_if_the_loader_crashes(record, crashed, torch.device("cpu"), build=build)
    assert remembered is probe_crashes and len(built) == 1 and built[0][0] == 8
    assert record.exists() is probe_crashes and not list(tmp_path.glob("*.tmp"))
    why = package_check.loader_crashed_here(record)
    if probe_crashes:
        assert why is not None and why.startswith(f"PyTorch's package loader crashed on this machine ({CRASHED})")
        assert why.endswith(f"(`launchless cache --forget-loader`, or deleting {record}, tries packages again)"), why
    else:
        assert why is None


def test_the_loader_record_is_one_per_host_gpu_and_torch_build(tmp_path, monkeypatch) -> None:
    """A cache folder shared by machines (a home directory on a network disk, containers that share a host name)
    keeps a record per host and GPU, and another torch another record."""
    here = package_check.loader_record(tmp_path)
    assert here == package_check.loader_record(tmp_path) and here.parent == tmp_path
    seen = {here}
    monkeypatch.setattr(package_check.platform, "node", lambda: "another-host")
    seen.add(package_check.loader_record(tmp_path))
    monkeypatch.setattr(package_check.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(package_check.torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    seen.add(package_check.loader_record(tmp_path))
    monkeypatch.setattr(package_check.torch, "__version__", "2.99.0")
    seen.add(package_check.loader_record(tmp_path))
    assert len(seen) == 4


@needs_compiler
def test_a_machine_whose_loader_crashed_builds_no_package_and_says_why(tmp_path, monkeypatch) -> None:
    """After a crash of the check and of the probe, the program is Inductor's format and the record is written;
    the next compile skips AOTInductor's build and check at once, naming the record."""
    model = Net(width=8).eval()
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        exported = torch.export.export(model, (x,), strict=False)
    examples = [*(dict(model.named_parameters()) | dict(model.named_buffers())).values(), x]
    crashed = package_check.PackageCheck(CRASHED, crashed=True)
    monkeypatch.setattr(compiler_process, "package_runs", lambda program, inputs: crashed)
    monkeypatch.setattr(package_check, "package_runs", lambda program, inputs: crashed)  # the probe's check
    monkeypatch.setattr(compiler_process, "_build_probe", lambda module, x, path: path.write_bytes(b"probe"))
    from torch._inductor import config as inductor_config

    def built(name: str) -> tuple[compiled_programs.ProgramFormat, str, list[str]]:
        parts: list[str] = []
        with inductor_config.patch(compile_threads=1):
            scratch = tmp_path / "scratch"  # where the compiler process builds a program before it is kept
            scratch.mkdir(exist_ok=True)
            kept, why = compiler_process._packaged(
                exported.graph_module,
                examples,
                str(scratch / name),
                kept_in=tmp_path,
                eager_numerics=False,
                phase=parts.append,
            )
        return kept, why, parts

    kept, why, parts = contextvars.copy_context().run(built, "first.pt2")
    assert kept is compiled_programs.ProgramFormat.ARTIFACT
    assert why == f"{CRASHED}; a two-layer probe package crashed it too: packages are no longer built here"
    assert parts == ["compile", "check", "probe", "compile (Inductor's format)"]
    record = package_check.loader_record(tmp_path)
    assert record.exists() and not list((tmp_path / "scratch").glob("package-loader-*"))  # beside the kept programs
    kept, why, parts = contextvars.copy_context().run(built, "second.pt2")
    assert kept is compiled_programs.ProgramFormat.ARTIFACT and why == package_check.loader_crashed_here(record)
    assert parts == ["compile (Inductor's format)"]  # no AOTInductor compile, no check
    program = contextvars.copy_context().run(compiled_programs._load_artifact, tmp_path / "scratch" / "second.pt2")
    with torch.no_grad():
        torch.testing.assert_close(program(*examples)[0], model(x), rtol=1e-5, atol=1e-5)


@needs_compiler
def test_the_compiler_process_reads_the_loader_record_where_the_programs_are_kept(tmp_path) -> None:
    """The compiler process builds a program in a scratch folder; the record it reads (and would write) is the one
    beside the programs: a machine whose loader crashed before gets Inductor's format at once, no package built."""
    record = package_check.loader_record(tmp_path)
    record.write_text(json.dumps({"why": CRASHED, "probe": CRASHED, "at": "2026-12-07T09:40:00+00:00"}))
    model = Net(width=8).eval()
    x = torch.randn(2, 3, 8, 8)
    job = compile_in_background(model, (x,), signature="(float32[2x3x8x8]@cpu)", directory=tmp_path)
    assert job.wait(COMPILE_S) is JobState.READY, job.reason
    assert job.format == compiled_programs.ProgramFormat.ARTIFACT
    assert job.unpackaged == package_check.loader_crashed_here(record)
    assert "compile (Inductor's format)" in job.phases and "compile" not in job.phases and "check" not in job.phases
    with torch.no_grad():
        torch.testing.assert_close(job.load(model)(x), model(x), rtol=1e-5, atol=1e-5)


@needs_compiler
def test_the_package_check_runs_a_package_and_names_what_stops_one(tmp_path) -> None:
    from launchless.core.package_check import package_runs

    model = Net(width=8).eval()
    x = torch.randn(2, 3, 8, 8)
    job = compile_in_background(model, (x,), signature="(float32[2x3x8x8]@cpu)", directory=tmp_path)
    assert job.wait(COMPILE_S) is JobState.READY, job.reason
    assert job.format == compiled_programs.ProgramFormat.PACKAGE, job.unpackaged
    examples = [*(dict(model.named_parameters()) | dict(model.named_buffers())).values(), x]
    assert package_runs(job.program, examples) == package_check.PackageCheck("")  # loaded and run in a process
    broken = tmp_path / "broken.pt2"
    broken.write_bytes(b"PK not a package")
    check = package_runs(broken, examples)
    assert check.why.startswith("a process that loaded and ran the package ended with exit status 1 ("), check
    assert not check.passed and not check.crashed  # an error the loader reported, not a fault
    assert not list(tmp_path.glob("*.inputs.json"))  # the inputs' description is removed after


@pytest.mark.parametrize("training", [False, True], ids=["package", "artifact"])
def test_a_program_on_disk_that_cannot_be_read_fails_its_job_saying_so(tmp_path, training: bool) -> None:
    if training and not compiled_programs.saves_training_programs():
        pytest.skip("this torch compiles no training program")
    model = Net().eval()
    x = torch.randn(2, 3, 8, 8)
    key = compiled_programs.program_key(model, "(float32[2x3x8x8]@cpu)" + (" training" if training else ""))
    path = compiled_programs.program_path(tmp_path, key, training=training)
    path.write_bytes(b"not a program")  # a file cut short, or of another torch
    kind = compiled_programs.ProgramFormat.ARTIFACT if training else compiled_programs.ProgramFormat.PACKAGE
    compiled_programs.plan_of(path).write_text(json.dumps({"format": kind}))
    job = compile_in_background(model, (x,), signature="(float32[2x3x8x8]@cpu)", training=training, directory=tmp_path)
    assert job.wait(COMPILE_S) is JobState.FAILED and job.done
    assert job.reason.startswith("the compiled program could not be read:"), job.reason
    with pytest.raises(RuntimeError, match="nothing to load"):
        job.load(model)


@saves_training
def test_reading_a_program_never_starts_inductors_compile_workers_in_the_calls_process(tmp_path, monkeypatch) -> None:
    """Each GPU kernel a training program declares asks Inductor whether its compile workers may be used, which
    starts them (a process per core): the read, beside the calls, runs with one compile thread; the setting is
    restored after."""
    from torch._inductor import CompiledArtifact
    from torch._inductor import config as inductor_config
    from torch._inductor.async_compile import get_compile_threads

    seen: list[int] = []

    def load(*, path: str, format: str) -> object:
        seen.append(get_compile_threads())  # what a kernel's declaration asks
        return object()

    monkeypatch.setattr(CompiledArtifact, "load", staticmethod(load))
    # a machine of several cores, seen from every thread (a setting is per thread in newer PyTorch, its default not)
    monkeypatch.setattr(inductor_config._config["compile_threads"], "default", 4)
    model = Net().eval()
    key = compiled_programs.program_key(model, "(float32[2x3x8x8]@cpu) training")
    path = compiled_programs.program_path(tmp_path, key, training=True)
    path.write_bytes(b"a program")
    compiled_programs.plan_of(path).write_text(json.dumps({"format": compiled_programs.ProgramFormat.ARTIFACT}))
    x = torch.randn(2, 3, 8, 8)
    job = compile_in_background(model, (x,), signature="(float32[2x3x8x8]@cpu)", training=True, directory=tmp_path)
    assert job.wait(COMPILE_S) is JobState.READY, job.reason
    assert seen == [1]
    assert get_compile_threads() == 4


@needs_compiler
@pytest.mark.skipif(
    torch.torch_version.TorchVersion(torch.__version__) < (2, 14),
    reason="Inductor's C++ kernels keep eager's bfloat16 rounding (emulate_precision_casts) in torch 2.14; 2.9's "
    "reject the option (CppVecOverrides.to_dtype raises), 2.11's fuse the casts away (2.10, 2.12, 2.13 not seen)",
)
def test_a_program_with_eager_numerics_rounds_as_eager_does_and_is_another_program(tmp_path) -> None:
    torch.manual_seed(0)
    model = RoundingChain().eval()
    x = torch.randn(8, 4096, dtype=torch.bfloat16)
    fused = compile_in_background(model, (x,), signature="bf16 chain", directory=tmp_path)
    eager_like = compile_in_background(model, (x,), signature="bf16 chain", eager_numerics=True, directory=tmp_path)
    assert eager_like.program != fused.program  # two programs on disk, never one taken for the other
    assert fused.wait(COMPILE_S) is JobState.READY, fused.reason
    assert eager_like.wait(COMPILE_S) is JobState.READY, eager_like.reason
    with torch.no_grad():
        x = torch.randn(8, 4096, dtype=torch.bfloat16)
        want = model(x)
        assert not torch.equal(fused.load(model)(x), want)  # rounded once: the test can tell the two apart
        assert torch.equal(eager_like.load(model)(x), want)


@needs_compiler
def test_a_cancelled_compile_ends_its_child_and_leaves_nothing(tmp_path) -> None:
    model = Net(width=12).eval()
    job = compile_in_background(
        model, (torch.randn(1, 3, 8, 8),), signature="(float32[1x3x8x8]@cpu)", directory=tmp_path
    )
    job.cancel("the weights were reloaded with assign=True")
    assert job.wait(COMPILE_S) is JobState.CANCELLED and job.reason == "the weights were reloaded with assign=True"
    deadline = time.monotonic() + 30  # the worker notices at its next step: it starts no child, or ends its own
    while job._child is not None and job._child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert job._child is None or job._child.poll() is not None
    assert not job.program.exists()
    with pytest.raises(RuntimeError, match="cancelled"):
        job.load(model)


@needs_compiler
def test_cancelling_while_the_child_compiles_ends_that_process(tmp_path) -> None:
    job = compile_in_background(
        Net(width=20).eval(), (torch.randn(1, 3, 8, 8),), signature="(float32[1x3x8x8]@cpu)", directory=tmp_path
    )
    deadline = time.monotonic() + COMPILE_S
    while job._child is None and job.state is JobState.COMPILING and time.monotonic() < deadline:
        time.sleep(0.01)
    assert job._child is not None, job.reason  # the compiler process runs
    if hasattr(os, "getpriority"):  # below the calls, its compile workers on all cores but the calls' two
        with job._lock:  # set under the lock the child is started under
            assert os.getpriority(os.PRIO_PROCESS, job._child.pid) >= compiled_programs.COMPILER_NICENESS
    threads = compiled_programs._compiler_environment()["TORCHINDUCTOR_COMPILE_THREADS"]
    cpus = compiled_programs.compiler_cpus()
    assert int(threads) == (
        len(cpus) if cpus is not None else max(1, len(os.sched_getaffinity(0)) - compiler_cpus.CALLS_CORES)
    )
    if cpus is not None:
        assert os.sched_getaffinity(job._child.pid) == cpus
    job.cancel("the model was moved to another device")
    assert job._child.wait(30) != 0  # ended, not finished
    assert job.wait(COMPILE_S) is JobState.CANCELLED and not job.program.exists()


def test_the_compiler_leaves_whole_physical_cores_to_the_calls() -> None:
    """Eight logical CPUs, two a physical core (0 with 4, 1 with 5, ...): the compiler gets all but the last
    ``CALLS_CORES`` cores, both halves of each left out; Linux's CPU lists read as sets."""
    assert compiler_cpus.cpu_list("0-3,8,10-11") == {0, 1, 2, 3, 8, 10, 11}

    def siblings(cpu: int) -> set[int]:
        return {cpu % 4, cpu % 4 + 4}

    cores = compiler_cpus.physical_cores(set(range(8)), siblings=siblings)
    assert cores == [frozenset({0, 4}), frozenset({1, 5}), frozenset({2, 6}), frozenset({3, 7})]
    assert compiler_cpus.physical_cores({0, 1, 4}, siblings=siblings) == [frozenset({0, 4}), frozenset({1})]
    assert compiler_cpus.CALLS_CORES == 2  # the compiler's share below: the first two cores
    left = set().union(*cores[: len(cores) - compiler_cpus.CALLS_CORES])
    assert left == {0, 1, 4, 5}


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="this system sets no CPU affinity")
def test_a_compiler_process_runs_on_the_compilers_cpus_only(monkeypatch) -> None:
    """A spare compiler (as a job's own process) is put on the compiler's CPUs as it starts; its compile workers,
    started later, inherit them."""
    cpu = min(os.sched_getaffinity(0))
    monkeypatch.setattr(compiled_programs, "compiler_cpus", lambda: frozenset({cpu}))
    spare = compiled_programs.SpareCompiler(Net(width=4).eval())
    try:
        child = spare._child
        assert child is not None and child.poll() is None
        assert os.sched_getaffinity(child.pid) == {cpu}
    finally:
        spare.end()


def test_a_forward_that_cannot_be_exported_fails_saying_why(tmp_path) -> None:
    job = compile_in_background(Broken(), (torch.randn(2, 4),), signature="(float32[2x4]@cpu)", directory=tmp_path)
    assert job.wait(COMPILE_S) is JobState.FAILED
    assert job.reason and "compiled" not in job.reason, job.reason
    assert not job.program.exists()


def test_jobs_still_compiling_are_cancelled_when_the_process_exits(tmp_path) -> None:
    job = compiled_programs.CompileJob("k", tmp_path / "k.pt2")
    compiled_programs._LIVE.add(job)
    compiled_programs._end_children()
    assert job.state is JobState.CANCELLED and job.reason == "the process is exiting"


@needs_compiler
def test_an_exiting_process_ends_the_compiler_and_waits_for_the_jobs_thread(tmp_path) -> None:
    """A daemon thread left inside torch when the interpreter finalizes ends the process with ``terminate called
    without an active exception``: the exit hook ends the compiler and waits for the thread."""
    job = compile_in_background(
        Net(width=24).eval(), (torch.randn(1, 3, 8, 8),), signature="(float32[1x3x8x8]@cpu)", directory=tmp_path
    )
    deadline = time.monotonic() + COMPILE_S
    while job._child is None and job.state is JobState.COMPILING and time.monotonic() < deadline:
        time.sleep(0.01)
    assert job._child is not None, job.reason
    compiled_programs._end_children()
    assert job._thread is not None and not job._thread.is_alive()
    assert job._child.poll() is not None and job.state is JobState.CANCELLED and job.done


def _compiler_variant(monkeypatch: pytest.MonkeyPatch, variant: str) -> None:
    """The compiler processes started are ``tests/compiler_variants.py``'s ``variant``."""
    monkeypatch.setattr(compiled_programs, "COMPILER_MODULE", "compiler_variants")
    monkeypatch.setenv("LAUNCHLESS_TEST_COMPILER", variant)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]))


def _plan(program: Path) -> dict[str, Any]:
    return json.loads(compiled_programs.plan_of(program).read_text())


@needs_compiler
def test_inductors_format_comes_first_and_its_package_is_kept_after_it_for_the_next_process(
    tmp_path, monkeypatch
) -> None:
    """On a GPU an inference program is compiled in Inductor's format first (its compile is the shorter), read and
    swapped in while the child builds the package, which a later process reads without Inductor."""
    monkeypatch.setattr(compiled_programs, "INDUCTOR_FORMAT_FIRST_ON", ("cpu",))  # as on a GPU
    model, x = Net(width=12).eval(), torch.randn(2, 3, 8, 8)
    job = compile_in_background(model, (x,), signature="(float32[2x3x8x8]@cpu)", directory=tmp_path)
    assert job.wait(COMPILE_S) is JobState.READY, job.reason
    inductor = compiled_programs.inductor_program_of(job.program)
    assert job.read_from == inductor and job.format == "artifact" and job.unpackaged == ""  # a package follows
    with torch.inference_mode():
        torch.testing.assert_close(job.load(model)(x), model(x), rtol=1e-5, atol=1e-5)
    assert job._thread is not None
    job._thread.join(COMPILE_S)
    assert _plan(job.program)["format"] == "package" and _plan(inductor)["package_follows"]
    phases = list(job.phases)
    assert phases.index("compile (Inductor's format)") < phases.index("compile") < phases.index("check")
    later = compile_in_background(Net(width=12).eval(), (x,), signature="(float32[2x3x8x8]@cpu)", directory=tmp_path)
    assert later.wait(COMPILE_S) is JobState.READY and later.reason == "found on disk"
    assert later.read_from == later.program and later.format == "package"


@needs_compiler
def test_a_process_that_ends_before_the_package_leaves_inductors_format_which_the_next_reads_saying_why(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.setattr(compiled_programs, "INDUCTOR_FORMAT_FIRST_ON", ("cpu",))
    _compiler_variant(monkeypatch, "slow-package")
    model, x = Net(width=14).eval(), torch.randn(2, 3, 8, 8)
    job = compile_in_background(model, (x,), signature="(float32[2x3x8x8]@cpu)", directory=tmp_path)
    assert job.wait(COMPILE_S) is JobState.READY, job.reason
    compiled_programs._end_children()  # the process exits while the package is built
    assert job._child is not None and job._child.poll() is not None and not job.program.exists()
    later = compile_in_background(Net(width=14).eval(), (x,), signature="(float32[2x3x8x8]@cpu)", directory=tmp_path)
    assert later.wait(COMPILE_S) is JobState.READY and later.read_from == job.read_from
    assert later.unpackaged == "the process that compiled it ended before its package was built"
    with torch.inference_mode():
        torch.testing.assert_close(later.load(model)(x), model(x), rtol=1e-5, atol=1e-5)


@needs_compiler
def test_where_no_package_can_follow_inductors_format_its_plan_says_why(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(compiled_programs, "INDUCTOR_FORMAT_FIRST_ON", ("cpu",))
    _compiler_variant(monkeypatch, "no-package")
    model, x = Net(width=10).eval(), torch.randn(2, 3, 8, 8)
    job = compile_in_background(model, (x,), signature="(float32[2x3x8x8]@cpu)", directory=tmp_path)
    assert job.wait(COMPILE_S) is JobState.READY, job.reason
    assert job._thread is not None
    job._thread.join(COMPILE_S)
    why = "AOTInductor could not build a package (RuntimeError: cuda_runtime_api.h: No such file or directory)"
    assert job.unpackaged == why and not job.program.exists()
    assert _plan(job.read_from)["unpackaged"] == why and not _plan(job.read_from)["package_follows"]
    later = compile_in_background(Net(width=10).eval(), (x,), signature="(float32[2x3x8x8]@cpu)", directory=tmp_path)
    assert later.wait(COMPILE_S) is JobState.READY and later.unpackaged == why


@needs_compiler
def test_the_program_is_taken_when_the_compiler_says_it_is_ready_not_when_the_process_has_exited(
    tmp_path, monkeypatch
) -> None:
    """A compiler process's exit takes seconds after its program is written (Inductor's compile workers joined, the
    GPU's context torn down): the calls' process takes the program at its ready line; the process, still exiting,
    is waited for by the job's thread and ended with the process that started it."""
    _compiler_variant(monkeypatch, "linger")
    model = Net(width=20).eval()
    x = torch.randn(1, 3, 8, 8)
    job = compile_in_background(model, (x,), signature="(float32[1x3x8x8]@cpu)", directory=tmp_path)
    assert job.wait(COMPILE_S) is JobState.READY, job.reason
    assert job._child is not None and job._child.poll() is None  # ready while the compiler process lingers
    with torch.inference_mode():
        torch.testing.assert_close(job.load(model)(x), model(x), rtol=1e-5, atol=1e-5)
    assert job._thread is not None and job._thread.is_alive()  # it waits for the process to exit
    compiled_programs._end_children()
    assert job._child.poll() is not None and not job._thread.is_alive()
    assert job.state is JobState.READY  # a program taken is not cancelled by the exit


def test_inductors_imports_for_a_program_in_its_format_are_done_while_it_compiles(tmp_path, monkeypatch) -> None:
    """A program in Inductor's format (training, or an inference program compiled in that format first, as on a GPU)
    is read with Inductor imported: the imports are done while the child compiles, not on the swap's path; a package
    needs none."""
    imported: list[str] = []
    monkeypatch.setattr(compiled_programs, "_import_the_artifact_reader", lambda: imported.append("imported"))
    monkeypatch.setattr(compiled_programs, "COMPILER_MODULE", "launchless_no_such_compiler")  # ends at once
    model, x = Net().eval(), torch.randn(1, 3, 8, 8)

    def job(signature: str, *, training: bool = False) -> compiled_programs.CompileJob:
        started = compile_in_background(model, (x,), signature=signature, training=training, directory=tmp_path)
        assert started.wait(120) is JobState.FAILED and "launchless_no_such_compiler" in started.reason
        return started

    job("(package)")
    assert imported == []
    monkeypatch.setattr(compiled_programs, "INDUCTOR_FORMAT_FIRST_ON", ("cpu",))  # as on a GPU
    job("(Inductor's format first)")
    assert imported == ["imported"]
    if compiled_programs.saves_training_programs():
        monkeypatch.setattr(compiled_programs, "INDUCTOR_FORMAT_FIRST_ON", ("cuda",))
        job("(training)", training=True)
        assert imported == ["imported"] * 2


@needs_compiler
def test_two_models_compiling_at_once_both_get_their_program(tmp_path) -> None:
    """Each job exports and compiles in a process of its own."""
    models = [Net(width=10).eval(), Net(width=16).eval()]
    x = torch.randn(1, 3, 8, 8)
    jobs = [compile_in_background(m, (x,), signature="(float32[1x3x8x8]@cpu)", directory=tmp_path) for m in models]
    assert [job.wait(COMPILE_S) for job in jobs] == [JobState.READY, JobState.READY], [j.reason for j in jobs]
    with torch.inference_mode():
        for job, model in zip(jobs, models, strict=True):
            torch.testing.assert_close(job.load(model)(x), model(x), rtol=1e-5, atol=1e-5)


@needs_compiler
def test_nothing_is_exported_in_the_calls_process(tmp_path, monkeypatch) -> None:
    """torch.export swaps the traced model's parameters for fake tensors and turns cuDNN off process-wide while it
    traces: it runs in the child, never beside the calls."""

    def refuse(*args, **kwargs):
        raise AssertionError("exported in the calls' process")

    monkeypatch.setattr(torch.export, "export", refuse)
    job = compile_in_background(
        Net(width=10).eval(), (torch.randn(1, 3, 8, 8),), signature="(float32[1x3x8x8]@cpu)", directory=tmp_path
    )
    assert job.wait(COMPILE_S) is JobState.READY, job.reason


def test_a_model_whose_classes_live_in_the_script_run_fails_saying_where_to_put_them(tmp_path) -> None:
    script_class = type("ScriptNet", (Net,), {"__module__": "__main__"})
    job = compile_in_background(
        script_class().eval(), (torch.randn(1, 3, 8, 8),), signature="(float32[1x3x8x8]@cpu)", directory=tmp_path
    )
    assert job.wait(COMPILE_S) is JobState.FAILED
    assert "ScriptNet is defined in the script being run (__main__)" in job.reason
    assert "define the model's classes in a module of their own" in job.reason


@needs_compiler
def test_no_weight_is_folded_into_the_code_and_a_plan_for_another_model_is_refused(tmp_path) -> None:
    """Every weight is an input of the program: a fresh norm (weights all ones and zeros, values a compiler could
    fold) still follows a checkpoint loaded into it later. A program whose plan names a tensor the model lacks was
    compiled for another model."""
    torch.manual_seed(0)
    model = Net(width=6).eval()
    x = torch.randn(1, 3, 8, 8)
    job = compile_in_background(model, (x,), signature="(float32[1x3x8x8]@cpu)", directory=tmp_path)
    assert job.wait(COMPILE_S) is JobState.READY, job.reason
    program = job.load(model)
    with torch.no_grad():
        model.norm.weight.mul_(3.0)
        model.norm.running_var.mul_(2.0)
        model.conv.bias.add_(1.0)
        torch.testing.assert_close(program(x), model(x), rtol=1e-5, atol=1e-5)
    plan = compiled_programs.plan_of(job.program)
    assert ["tensor", "conv.weight"] in json.loads(plan.read_text())["inputs"]
    changed = json.loads(plan.read_text())
    changed["inputs"] = [["tensor", "norm.extra"] if i == ["tensor", "conv.weight"] else i for i in changed["inputs"]]
    plan.write_text(json.dumps(changed))
    again = compile_in_background(model, (x,), signature="(float32[1x3x8x8]@cpu)", directory=tmp_path)
    assert again.wait(COMPILE_S) is JobState.READY  # the program and its plan as another process finds them
    with pytest.raises(RuntimeError, match=r"reads norm\.extra, which the model does not hold"):
        again.load(model)


@needs_compiler
def test_a_program_is_called_as_the_model_is_keywords_in_any_order_and_outputs_in_its_structure(tmp_path) -> None:
    model = Keywords().eval()
    x, mask = torch.randn(3, 4), torch.rand(3, 4)
    job = compile_in_background(
        model, (x,), {"mask": mask, "k": 3, "extra": None, "flag": True}, signature="keywords", directory=tmp_path
    )
    assert job.wait(COMPILE_S) is JobState.READY, job.reason
    program = job.load(model)
    with torch.no_grad():
        x, mask = torch.randn(3, 4), torch.rand(3, 4)
        got, want = program(x, flag=True, extra=None, k=3, mask=mask), model(x, mask=mask, k=3, flag=True)
    assert set(got) == {"y", "s"}
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@needs_compiler
def test_a_transformers_forward_compiles_and_returns_its_model_output(tmp_path) -> None:
    """A model of a library, not ours: its classes imported in the child from where this process found them, a
    keyword flag among the inputs, and a ``ModelOutput`` rebuilt from the program's outputs."""
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=100, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.randint(0, 100, (1, 8))
    job = compile_in_background(model, (ids,), {"use_cache": False}, signature="gpt2", directory=tmp_path)
    assert job.wait(COMPILE_S) is JobState.READY, job.reason
    program = job.load(model)
    with torch.no_grad():
        ids = torch.randint(0, 100, (1, 8))  # a fresh call
        got, want = program(ids, use_cache=False), model(ids, use_cache=False)
    assert type(got) is type(want)
    torch.testing.assert_close(got.logits, want.logits, rtol=1e-5, atol=1e-5)


class Dropping(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.lin(x))


@needs_compiler
@saves_training
def test_a_training_program_is_differentiated_by_autograd_and_updates_the_running_statistics(tmp_path) -> None:
    """A training program: Inductor's forward and backward, called through autograd as the model is; its gradients
    and the batch norm's running statistics (updated in place in the model's own buffers) as eager's, within
    rounding."""
    torch.manual_seed(0)
    model = Net(width=6).train()
    x = torch.randn(2, 3, 8, 8)
    job = compile_in_background(model, (x,), signature="(float32[2x3x8x8]@cpu)", training=True, directory=tmp_path)
    inference = compiled_programs.program_key(model, "(float32[2x3x8x8]@cpu)")
    assert job.key != inference  # an inference program is another program
    assert job.wait(COMPILE_S) is JobState.READY, job.reason
    program = job.load(model)
    assert program.training and program.random_operations == []
    x = torch.randn(2, 3, 8, 8)
    stats = model.norm.running_mean.clone()
    out = program(x)
    assert out.requires_grad
    cotangent = torch.randn_like(out)
    out.backward(cotangent)
    compiled_grads = [p.grad.clone() for p in model.parameters()]
    compiled_stats = model.norm.running_mean.clone()
    assert not torch.equal(compiled_stats, stats)
    model.zero_grad(set_to_none=True)
    model.norm.running_mean.copy_(stats)
    model.norm.num_batches_tracked.sub_(1)
    want = model(x)
    want.backward(cotangent)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(model.norm.running_mean, compiled_stats, rtol=1e-5, atol=1e-6)
    for got, p in zip(compiled_grads, model.parameters(), strict=True):
        torch.testing.assert_close(got, p.grad, rtol=1e-4, atol=1e-5)


def test_the_operations_that_draw_random_numbers_are_named() -> None:
    exported = torch.export.export(Dropping().train(), (torch.randn(2, 4),), strict=False)
    assert any(
        "dropout" in name or "bernoulli" in name for name in compiler_process.random_operations(exported.graph_module)
    )
    quiet = torch.export.export(Dropping().eval(), (torch.randn(2, 4),), strict=False)
    assert compiler_process.random_operations(quiet.graph_module) == []


@needs_compiler
def test_a_spare_compiler_started_ahead_takes_the_first_job_and_a_later_one_starts_its_own(tmp_path) -> None:
    """The spare loads torch, the model's modules and Inductor while the calls warm up; the first compile is given
    to it (no interpreter started then); the next starts a process of its own, as does a job whose spare has
    ended."""
    torch.manual_seed(0)
    model = Net(width=4).eval()
    spare = compiled_programs.SpareCompiler(model)
    waiting = spare._child
    assert waiting is not None and waiting.poll() is None
    x = torch.randn(1, 3, 8, 8)
    job = compile_in_background(model, (x,), signature="(float32[1x3x8x8]@cpu)", directory=tmp_path, spare=spare)
    assert job.wait(COMPILE_S) is JobState.READY, job.reason
    assert job._child is waiting and spare._child is None  # the spare did the job
    assert spare.take(["a", "b", "0"]) is None  # taken once
    parts = {name.removeprefix("start: "): s for name, s in job.phases.items() if name.startswith("start: ")}
    assert parts.get("interpreter and torch", 0) > 0, job.phases  # the job came while the spare booted
    assert abs(sum(parts.values()) - job.phases["start"]) < 0.05, job.phases
    ended = compiled_programs.SpareCompiler(model)
    ended.end()
    other = compile_in_background(
        model, (x,), signature="(float32[1x3x8x8]@cpu) again", directory=tmp_path, spare=ended
    )
    assert other.wait(COMPILE_S) is JobState.READY, other.reason
    assert other._child is not None and other._child is not waiting


def test_a_spare_dropped_unused_ends_its_process() -> None:
    spare = compiled_programs.SpareCompiler(Net(width=4))
    child = spare._child
    assert child is not None and child.poll() is None
    del spare
    import gc

    gc.collect()
    assert child.wait(30) != 0  # ended, not finished


def test_the_start_phase_is_split_into_what_of_the_spares_work_the_job_waited_for() -> None:
    marks = [("interpreter and torch", 0.0, 2.0), ("GPU context", 2.0, 3.0), ("import timm", 3.0, 3.5)]
    assert compiler_process.start_parts(marks, 1.5, 3.2) == pytest.approx(
        {"interpreter and torch": 0.5, "GPU context": 1.0, "import timm": 0.2}
    )
    assert compiler_process.start_parts(marks, 4.0, 4.3) == pytest.approx({"job read": 0.3}), "all done before"
    assert compiler_process.start_parts([], 1.0, 1.0) == {}


def test_the_spare_sees_a_job_waiting_even_when_it_came_with_the_warm_up_line() -> None:
    """Both lines in the pipe at once (the job came before the spare read its warm-up line): the job is seen waiting,
    so the spare stops warming up and compiles at once; the end of the input ends it."""
    read, write = os.pipe()
    try:
        lines = compiler_process._Lines(read)
        assert not lines.waiting()
        os.write(write, b'{"path": [], "modules": []}\n["sent", "program", "1.0"]\n')
        assert lines.read() == '{"path": [], "modules": []}'
        assert lines.waiting()  # held from the same read: a buffered reader would hide it from select
        assert json.loads(lines.read()) == ["sent", "program", "1.0"]
        assert not lines.waiting()
        os.close(write)
        write = -1
        assert lines.waiting() and lines.read() == ""  # the end of the input
    finally:
        os.close(read)
        if write >= 0:
            os.close(write)


class Made(nn.Module):
    """A forward that makes a tensor of its own (export lifts it as a constant the model does not hold)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * torch.tensor([0.5, 1.0, 2.0, 4.0])


@needs_compiler
def test_a_tensor_the_forward_makes_is_part_of_the_program_and_the_weights_stay_inputs(tmp_path) -> None:
    torch.manual_seed(0)
    model = Made().eval()
    x = torch.randn(3, 4)
    job = compile_in_background(model, (x,), signature="(float32[3x4]@cpu)", directory=tmp_path)
    assert job.wait(COMPILE_S) is JobState.READY, job.reason
    program = job.load(model)
    inputs = json.loads(compiled_programs.plan_of(job.program).read_text())["inputs"]
    assert ["tensor", "lin.weight"] in inputs and ["made", 0] in inputs  # the made tensor kept beside the program
    assert compiled_programs.constants_of(job.program).exists()
    with torch.no_grad():
        model.lin.weight.mul_(3.0)  # the weights are still read from the model
        x = torch.randn(3, 4)
        torch.testing.assert_close(program(x), model(x), rtol=1e-5, atol=1e-5)


class Holder:
    """An object (not a module) holding a tensor the forward reads: a cache's counter, say."""

    def __init__(self) -> None:
        self.count = torch.zeros(4)


class ReadsHeld(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.holder = Holder()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) + self.holder.count


@needs_compiler
def test_a_tensor_held_outside_the_models_parameters_and_buffers_fails_the_compile_saying_so(tmp_path) -> None:
    """Its value lives in the calls' process, where no plan can name it: a program with the compiler's copy of it
    would compute with a stale value, so the compile fails with the reason (the calls keep eager's kernels)."""
    model = ReadsHeld().eval()
    job = compile_in_background(model, (torch.randn(2, 4),), signature="(float32[2x4]@cpu)", directory=tmp_path)
    assert job.wait(COMPILE_S) is JobState.FAILED
    assert "reads a tensor held outside the model's parameters and buffers" in job.reason, job.reason
    assert not job.program.exists()


def test_a_training_program_this_torch_cannot_save_fails_at_once_saying_why(tmp_path, monkeypatch) -> None:
    """A torch whose AOTAutograd lowers the backward only at the first ``backward()`` (2.9) saves a training program
    without it, and the save fails inside the compiler process with an assertion that names nothing: no process is
    started, and the job says why."""
    monkeypatch.setattr(compiled_programs, "saves_training_programs", lambda: False)
    started = []
    monkeypatch.setattr(compiled_programs, "_start_compiler", lambda arguments: started.append(arguments))
    model = Net(width=6).train()
    job = compile_in_background(model, (torch.randn(2, 3, 8, 8),), signature="s", training=True, directory=tmp_path)
    assert job.done and job.wait(0) is JobState.FAILED and not started
    assert f"this torch ({torch.__version__}) cannot compile a training program's backward" in job.reason
    assert "keeps eager's kernels" in job.reason
