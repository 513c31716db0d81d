"""Where the compile of an inference program goes: AOTInductor as the compiler process runs it, against Inductor's
own format and AOTInductor with other settings, each in a fresh process with fresh Inductor and Triton caches.

``kernels="compiled"`` swaps Inductor's kernels in once its program is compiled; its compile (AOTInductor, a package
a second process reads without Inductor) has been several times as long as ``torch.compile``'s of the same forward.
The variants, on a zoo workload's forward exported as the compiler process exports it (every weight an input):

- ``aoti``: ``aot_compile`` with ``aot_inductor.package``, the host code at O0 (the compiler process's settings);
- ``aoti-autotune-at-run``: the same with ``triton.autotune_at_compile_time`` off (the kernels' configurations
  tried at the first run instead of while compiling);
- ``aoti-one-thread``: the same as ``aoti`` with one compile thread (whether Inductor's compile workers serve it);
- ``artifact``: ``torch._inductor.standalone_compile``, Inductor's own format (what a training program is, and what
  an inference program on a GPU is swapped in as first).

Each variant's program is then read back and run twice (``read_s``, ``first_run_s``, ``second_run_s``): Inductor's
format tunes its kernels' configurations at its first run -- in the calls' process -- where AOTInductor tuned them
while compiling, so the two compiles compare with their first runs.

``--eager-numerics`` compiles every variant with eager's rounding where Inductor fuses (a decode step's program is
compiled so: its greedy tokens follow eager's), to tell what that costs a compile.

The ``aoti`` variant is also profiled (``cProfile``, the compiling thread): the functions that took the time.

    python benchmarks/program_compile_cost.py --workload hf:gpt2 --out /tmp/compile-cost
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import pstats
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from diagnostics import keep_report, run_fresh

VARIANTS = ("aoti", "aoti-autotune-at-run", "aoti-one-thread", "artifact")
SETTINGS: dict[str, dict[str, Any]] = {
    "aoti": {},
    "aoti-autotune-at-run": {"triton.autotune_at_compile_time": False},
    "aoti-one-thread": {"compile_threads": 1},
    "artifact": {},
}


def _exported(workload: str) -> tuple[torch.fx.GraphModule, list[Any]]:
    """The forward exported under ``no_grad`` and made a program's as the compiler process makes it (every weight an
    input, the call's specialized flags dropped), with its examples in its inputs' order."""
    from launchless.apps import zoo
    from launchless.core.compiler_process import program_inputs

    built = zoo.build(workload, device="cuda" if torch.cuda.is_available() else "cpu")
    model = built.model.eval()
    args, kwargs = tuple(built.args), dict(built.kwargs)
    with torch.no_grad():
        exported = torch.export.export(model, args, kwargs, strict=False)
    graph_module, _, examples, _ = program_inputs(exported, model, args, kwargs)
    return graph_module, examples


def run_variant(workload: str, variant: str, *, profile_top: int, eager_numerics: bool) -> dict[str, Any]:
    import torch._inductor.config as inductor_config
    from torch._inductor.package import package_aoti

    from launchless.core.compiler_process import host_code_unoptimized, numerics_of_eager

    began = time.perf_counter()
    graph_module, examples = _exported(workload)
    export_s = time.perf_counter() - began
    host_code = contextlib.nullcontext() if variant == "artifact" else host_code_unoptimized()
    profiler = cProfile.Profile() if profile_top else None
    with (
        tempfile.TemporaryDirectory() as folder,
        torch.no_grad(),
        inductor_config.patch(SETTINGS[variant]),
        host_code,
        numerics_of_eager(eager_numerics),
    ):
        began = time.perf_counter()
        with profiler if profiler is not None else contextlib.nullcontext():
            if variant == "artifact":
                compiled = torch._inductor.standalone_compile(
                    graph_module, examples, dynamic_shapes="from_example_inputs"
                )
                compiled.save(path=str(Path(folder) / "program.bin"), format="binary")
            else:
                options = {"aot_inductor.package": True}
                files = torch._inductor.aot_compile(graph_module, tuple(examples), options=options)
                package_aoti(str(Path(folder) / "program.pt2"), files)
        compile_s = time.perf_counter() - began
        runs = _read_and_run(Path(folder) / ("program.bin" if variant == "artifact" else "program.pt2"), examples)
    row: dict[str, Any] = {
        "variant": variant,
        "eager_numerics": eager_numerics,
        "export_s": round(export_s, 2),
        "compile_s": round(compile_s, 2),
        **runs,
    }
    if profiler is not None:
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(profile_top)
        row["profile"] = text.getvalue()
    return row


def _read_and_run(program: Path, examples: list[Any]) -> dict[str, float]:
    """The program read as the calls' process reads it, then run twice, each run waited for."""
    from launchless.core.compiled_programs import PackageProgram, _load_artifact

    def waited(step: Any) -> tuple[Any, float]:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        began = time.perf_counter()
        out = step()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return out, round(time.perf_counter() - began, 3)

    device = next((x.device for x in examples if isinstance(x, torch.Tensor) and x.is_cuda), None)
    if program.suffix == ".pt2":
        loaded, read_s = waited(lambda: PackageProgram.load(program, device))
    else:
        loaded, read_s = waited(lambda: _load_artifact(program))
    with torch.no_grad():
        _, first_run_s = waited(lambda: loaded(*examples))
        _, second_run_s = waited(lambda: loaded(*examples))
    return {"read_s": read_s, "first_run_s": first_run_s, "second_run_s": second_run_s}


def _child(workload: str, variant: str, *, profile_top: int, eager_numerics: bool) -> dict[str, Any]:
    """One variant in a process of its own, its Inductor and Triton caches fresh (nothing compiled before)."""
    with tempfile.TemporaryDirectory() as caches:
        env = {"TORCHINDUCTOR_CACHE_DIR": f"{caches}/inductor", "TRITON_CACHE_DIR": f"{caches}/triton"}
        arguments = [__file__, "--variant", variant, "--workload", workload, "--top", str(profile_top)]
        arguments += ["--eager-numerics"] if eager_numerics else []
        return {"variant": variant} | run_fresh(arguments, env=env, timeout=900)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="hf:gpt2", help="a zoo workload (launchless.apps.zoo)")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--top", type=int, default=40, help="functions in the aoti variant's profile")
    parser.add_argument("--out", default="", help="where the JSON and the profile go (default: printed only)")
    parser.add_argument(
        "--eager-numerics", action="store_true", help="compile with eager's rounding, as a decode step's program is"
    )
    parser.add_argument("--variant", default="", help=argparse.SUPPRESS)  # a child's one variant
    ns = parser.parse_args()
    if ns.variant:
        print(json.dumps(run_variant(ns.workload, ns.variant, profile_top=ns.top, eager_numerics=ns.eager_numerics)))
        return
    numerics = {"eager_numerics": ns.eager_numerics}
    rows = []
    for variant in ns.variants:
        rows.append(_child(ns.workload, variant, profile_top=0, **numerics))
        done = rows[-1]
        if "error" in done:
            print(f"{variant:22} {done['error']}", flush=True)
        else:
            print(f"{variant:22} compile {done['compile_s']} s, first run {done['first_run_s']} s", flush=True)
    profiled = _child(ns.workload, "aoti", profile_top=ns.top, **numerics) if "aoti" in ns.variants else {}
    profile = profiled.pop("profile", "")
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    report = {"workload": ns.workload, "device": device, "torch": torch.__version__, **numerics, "rows": rows}
    stem = f"compile-cost-{ns.workload.replace(':', '-')}" + ("-eager-numerics" if ns.eager_numerics else "")
    keep_report(report | {"profiled": profiled}, out=ns.out, stem=stem, profile=profile, profile_name="aoti-profile")


if __name__ == "__main__":
    main()
