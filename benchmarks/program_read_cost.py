"""What reading a compiled program costs the calls' process: where its seconds go, and what the calls beside it wait.

With ``kernels="compiled"`` a ready program (compiled in a child process, or found on disk by a second process) is
read in a thread of the calls' process: an inference program by PyTorch's C++ loader; a training program with
Inductor imported, its modules executed, its kernels loaded -- Python work that holds the interpreter lock, beside
calls that need it between their launches. On a zoo workload:

- its program is compiled once (a training program's with ``--training``) into ``--cache``, unless it is there;
- in a fresh process, the read of the program is timed (a training program's after Inductor's imports, timed apart;
  an inference program, an AOTInductor package, needs none), and what it imported;
- in another, the read is profiled (``cProfile`` in the reading thread: the functions with the most time);
- in another, the workload's calls run wrapped (eager-kernel graphs) one after the other, each waited for, while a
  thread reads the program: each call's latency before and during the read (median, 90th percentile, longest) --
  the stalls a read causes;
- in another, the same with the read at Python's switch interval (the library shortens it while it reads,
  ``core.switch_interval``): whether the calls' stalls are waits for the interpreter lock the reading thread holds
  (Python hands it over on request only after the switch interval, 5 ms by default, against calls of a fraction
  of that).

    python benchmarks/program_read_cost.py --workload timm:resnet18 --device cuda --cache /tmp/programs --out /tmp/r
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from diagnostics import keep_report, run_fresh

import launchless as ll
from launchless.apps import zoo
from launchless.apps.bench.serving_buckets import waited_ms
from launchless.core import compiled_programs, switch_interval
from launchless.core.compiled_programs import CompileJob, JobState, compile_in_background

COMPILE_TIMEOUT_S = 1800
BASELINE_CALLS = 300


def _workload(name: str, *, device: str, training: bool) -> zoo.Workload:
    workload = zoo.build(name, device=device)
    workload.model.train(training)
    return workload


def _job(workload: zoo.Workload, *, training: bool) -> CompileJob:
    """The program's job: compiled now, or (on disk) read in a thread at once."""
    signature = f"program-read-cost {workload.name}"
    return compile_in_background(workload.model, workload.args, workload.kwargs, signature=signature, training=training)


def compile_once(name: str, *, device: str, training: bool) -> dict[str, Any]:
    """The program compiled into the cache (at once where it is there already), and what the compile took."""
    job = _job(_workload(name, device=device, training=training), training=training)
    state = job.wait(COMPILE_TIMEOUT_S)
    if state is not JobState.READY:
        raise SystemExit(f"the program of {name} did not compile: {state} ({job.reason})")
    if job._thread is not None:  # an inference program on a GPU: Inductor's format first, then the package read here
        job._thread.join(COMPILE_TIMEOUT_S)
    return {"compiled_s": round(job.seconds, 3), "phases": job.phases, "reason": job.reason}


def read_split(name: str, *, device: str, training: bool) -> dict[str, Any]:
    """A training program's read: Inductor's imports alone, then the read after them. An inference program (an
    AOTInductor package, read by PyTorch's C++ loader) imports nothing: its read alone, and whether Inductor or
    Dynamo was imported by it."""
    workload = _workload(name, device=device, training=training)
    began = time.perf_counter()
    if training:
        import torch._inductor.compile_fx  # noqa: F401 -- what a read imports first
        from torch._inductor import CompiledArtifact  # noqa: F401

    imports_s = time.perf_counter() - began
    job = _job(workload, training=training)
    job.wait()
    return {
        "imports_s": round(imports_s, 3),
        "read_after_imports_s": round(job.load_seconds, 3),
        "state": str(job.state),
        "imported": sorted(m for m in ("torch._inductor", "torch._dynamo") if m in sys.modules),
    }


def read_profiled(name: str, *, device: str, training: bool, top: int) -> dict[str, Any]:
    """The cold read under ``cProfile``, in the thread that reads."""
    workload = _workload(name, device=device, training=training)
    profiler = cProfile.Profile()
    read = CompileJob._read_program

    def profiled(job: CompileJob) -> None:
        profiler.enable()
        try:
            read(job)
        finally:
            profiler.disable()

    CompileJob._read_program = profiled  # type: ignore[method-assign]
    job = _job(workload, training=training)
    job.wait()
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("cumulative").print_stats(top)
    stats.sort_stats("tottime").print_stats(top)
    return {"read_s": round(job.load_seconds, 3), "state": str(job.state), "profile": text.getvalue()}


def _stats(ms: list[float]) -> dict[str, float]:
    if not ms:  # the read was over before a call
        return {"calls": 0}
    ordered = sorted(ms)
    return {
        "calls": len(ms),
        "median_ms": round(statistics.median(ms), 4),
        "p90_ms": round(ordered[int(0.9 * (len(ordered) - 1))], 4),
        "max_ms": round(ordered[-1], 3),
    }


def calls_during_read(name: str, *, device: str, training: bool) -> dict[str, Any]:
    """The workload's wrapped calls before and while a thread reads the program."""
    workload = _workload(name, device=device, training=False)
    wrapped = ll.wrap(workload.model)

    def call() -> Any:
        return wrapped(*workload.args, **workload.kwargs)

    on = torch.device(device)
    with torch.inference_mode():
        for _ in range(20):
            call()
        before = [waited_ms(call, device=on) for _ in range(BASELINE_CALLS)]
        reading = _workload(name, device=device, training=training)
        began = time.perf_counter()
        job = _job(reading, training=training)
        during = []
        while not job.done:
            during.append(waited_ms(call, device=on))
        read_s = time.perf_counter() - began
    return {
        "read_s": round(read_s, 3),
        "state": str(job.state),
        "switch_interval_s": switch_interval.SHORT_SWITCH_S,
        "before": _stats(before),
        "during": _stats(during),
    }


def calls_during_read_python_switch(name: str, *, device: str, training: bool) -> dict[str, Any]:
    """As ``calls_during_read``, the read at Python's own switch interval."""
    switch_interval.SHORT_SWITCH_S = sys.getswitchinterval()
    return calls_during_read(name, device=device, training=training)


PHASES = {"split": read_split, "calls": calls_during_read, "calls-python-switch": calls_during_read_python_switch}


def _child(phase: str, ns: argparse.Namespace) -> dict[str, Any]:
    """``phase`` in a fresh process (nothing of Inductor imported yet), its result read back."""
    arguments = [__file__, "--phase", phase, "--workload", ns.workload, "--device", ns.device]
    arguments += ["--cache", ns.cache, "--top", str(ns.top)] + (["--training"] if ns.training else [])
    return run_fresh(arguments, env={"LAUNCHLESS_CACHE_DIR": ns.cache})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="timm:resnet18", help="a zoo workload (launchless.apps.zoo)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--training", action="store_true", help="a training program (forward and backward)")
    parser.add_argument("--cache", default="", help="the programs' folder (default: a fresh one under --out)")
    parser.add_argument("--out", default="", help="where the JSON and the profile go (default: printed only)")
    parser.add_argument("--top", type=int, default=30, help="functions listed per profile ordering")
    parser.add_argument("--phase", default="", help=argparse.SUPPRESS)  # a child's one phase
    ns = parser.parse_args()
    if ns.phase:
        os.environ["LAUNCHLESS_CACHE_DIR"] = ns.cache
        if ns.phase == "profile":
            result = read_profiled(ns.workload, device=ns.device, training=ns.training, top=ns.top)
        else:
            result = PHASES[ns.phase](ns.workload, device=ns.device, training=ns.training)
        print(json.dumps(result))
        return
    out = Path(ns.out) if ns.out else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    ns.cache = ns.cache or str((out or Path.cwd()) / "programs")
    os.environ["LAUNCHLESS_CACHE_DIR"] = ns.cache
    report: dict[str, Any] = {
        "workload": ns.workload,
        "device": torch.cuda.get_device_name() if ns.device == "cuda" else ns.device,
        "training": ns.training,
        "torch": torch.__version__,
        "cache": str(compiled_programs.cache_dir()),
        "compile": compile_once(ns.workload, device=ns.device, training=ns.training),
    }
    for phase in ("split", "calls", "calls-python-switch", "profile"):
        report[phase] = _child(phase, ns)
    profile = report["profile"].pop("profile", "")
    stem = f"program-read-{ns.workload.replace(':', '-')}{'-training' if ns.training else ''}"
    keep_report(report, out=ns.out, stem=stem, profile=profile)


if __name__ == "__main__":
    main()
