"""CPU tests of the benchmark's pure parts: workload registry, worker supervision, CLI refusals."""

from __future__ import annotations

import json
import os
import sys
import weakref

import pytest
import torch

from launchless.apps import cli, zoo
from launchless.apps.bench import modes, runner, stats, workloads
from launchless.apps.bench.runner import run_mode, run_parts
from launchless.apps.bench.worker import empty_row
from launchless.apps.workers import GpusUnavailable, check_gpus, deal, split_cores

FAKE_WORKER = r"""
import argparse, json, sys, time
p = argparse.ArgumentParser()
for flag in ("--mode", "--iters", "--out"):
    p.add_argument(flag)
p.add_argument("--workloads", nargs="+")
a = p.parse_args(sys.argv[1:])
for name in a.workloads:
    if name == "{crash}":
        sys.exit(3)
    if name == "{hang}":
        time.sleep(30)
    with open(a.out, "a") as f:
        os = __import__("os")
        row = {{"workload": name, "mode": a.mode, "status": "ok", "pid": os.getpid(),
               "gpu": os.environ.get("CUDA_VISIBLE_DEVICES"), "cores": sorted(os.sched_getaffinity(0))}}
        if {env}:
            names = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "LAUNCHLESS_CACHE_DIR")
            row["caches"] = {{k: os.environ[k] for k in names}}
            row["caches"]["root"] = os.path.dirname(os.environ["TRITON_CACHE_DIR"])
            assert os.path.isdir(row["caches"]["root"])
        f.write(json.dumps(row) + "\n")
"""
NAMES = ["timm:resnet18", "hf:gpt2", "train:resnet18"]


def _worker(crash: str = "", hang: str = "", env: bool = False) -> list[str]:
    return [sys.executable, "-c", FAKE_WORKER.format(crash=crash, hang=hang, env=env)]


def test_suites_and_registry() -> None:
    assert [w.name for w in workloads.suite("quick")] == ["timm:resnet18", "train:resnet18"]
    standard = workloads.suite("standard")
    assert len(standard) == 14 and len(workloads.WORKLOADS) == 43  # plain-SGD training variants run by name
    grace = workloads.suite("grace")  # GraCE's workloads: each says whether it is GraCE's own or a stand-in
    assert len(grace) == 17 and all(w.origin for w in grace) and {w.zoo for w in grace} <= set(zoo.names())
    compiler = workloads.suite("compiler")  # inference workloads plus the models host copies keep out of capture
    assert {w.kind for w in compiler} == {"inference"} and len(compiler) == 21
    assert set(workloads.DETECTORS) <= {w.name for w in compiler}, "the detectors target needs all six measured"
    assert {w.zoo for w in compiler} <= set(zoo.names())
    training = [w.name for w in workloads.suite("training")]  # the training issue's per-step comparison
    assert training == [
        "train:resnet18",
        "train:mobilenetv3_small_100-adamw",
        "train:resnet50@b8-bf16",
        "train:bert-base@b8",
    ]
    assert workloads.get("train:bert-base@b8").task == "sequence-classification"
    assert {w.zoo for w in standard} <= set(zoo.names())
    assert {w.kind for w in standard} == {"inference", "training"}
    with pytest.raises(workloads.UnknownWorkload, match="choose from: timm:resnet18"):
        workloads.get("nope")
    with pytest.raises(workloads.UnknownWorkload, match="choose from: quick, standard, training, compiler"):
        workloads.suite("huge")


def test_all_workloads_measured_in_order(tmp_path) -> None:
    advanced = []
    rows = run_mode("eager", NAMES, 3, 20, tmp_path, lambda: advanced.append(1), worker=_worker())
    assert [r["workload"] for r in rows] == NAMES and len(advanced) == 3
    assert len({r["pid"] for r in rows}) == 1  # one process per mode


def test_rows_left_by_an_earlier_run_in_the_same_folder_are_ignored(tmp_path) -> None:
    stale = {"workload": "timm:vit_tiny_patch16_224", "mode": "eager", "status": "ok", "pid": -1}
    (tmp_path / "rows-eager-0.jsonl").write_text(json.dumps(stale) + "\n")
    rows = run_mode("eager", NAMES, 3, 20, tmp_path, worker=_worker())
    assert [r["workload"] for r in rows] == NAMES and all(r["pid"] != -1 for r in rows)


def test_the_worker_frees_a_workloads_compiled_model_before_measuring_the_next(tmp_path, monkeypatch) -> None:
    import torch

    from launchless.apps.bench import worker

    alive_at_start = []
    previous: list = []

    class Compiled:  # what a backend hands Dynamo: held by Dynamo's caches until reset, in a reference cycle
        def __init__(self, gm) -> None:
            self.gm, self.cycle = gm, self
            previous.append(weakref.ref(self))

        def __call__(self, *args):
            return self.gm(*args)

    def fake_measure(w, mode, iters, *, profile_dir=None) -> dict:
        alive_at_start.append(previous[-1]() is not None if previous else None)
        torch.compile(torch.nn.Linear(2, 2), backend=lambda gm, example: Compiled(gm))(torch.ones(1, 2))
        return {"workload": w.name, "mode": mode}

    monkeypatch.setattr(worker, "measure", fake_measure)
    worker.run("compile", ["timm:resnet18", "hf:gpt2"], 3, str(tmp_path / "rows.jsonl"))
    assert alive_at_start == [None, False]
    assert previous[-1]() is None  # the last one too, when the worker ends


def test_a_crashed_worker_costs_one_workload(tmp_path) -> None:
    rows = run_mode("compile", NAMES, 3, 20, tmp_path, worker=_worker(crash="hf:gpt2"))
    assert [r["workload"] for r in rows] == NAMES
    assert rows[1]["status"] == "error" and "exited with code 3" in rows[1]["reason"]
    assert rows[0]["status"] == rows[2]["status"] == "ok" and rows[0]["pid"] != rows[2]["pid"]


def test_a_worker_that_asks_for_a_fresh_process_after_a_whole_row_costs_no_workload(tmp_path) -> None:
    """A worker whose CUDA context a device-side assert ended writes its row and exits with ``FRESH_PROCESS``: the
    next name goes to a new worker, and nothing is charged to it."""
    from launchless.apps.workers import FRESH_PROCESS, run_workers

    script = (
        "import json, sys\n"
        "out, names = sys.argv[1], sys.argv[2:]\n"
        "for name in names:\n"
        "    open(out, 'a').write(json.dumps({'key': name, 'pid': __import__('os').getpid()}) + '\\n')\n"
        f"    if name == 'b': sys.exit({FRESH_PROCESS})\n"
    )
    failed: list[str] = []
    rows = run_workers(
        ["a", "b", "c"],
        command=lambda rest, jsonl: [sys.executable, "-c", script, str(jsonl), *rest],
        out=tmp_path,
        label="-fresh",
        key="key",
        failed_row=lambda name, why: failed.append(name) or {"key": name, "failed": why},
        timeout_s=20,
    )
    assert [r["key"] for r in rows] == ["a", "b", "c"] and not failed
    assert rows[0]["pid"] == rows[1]["pid"] != rows[2]["pid"]


def test_a_hung_worker_times_out_and_the_rest_still_run(tmp_path) -> None:
    rows = run_mode("hand-graph", NAMES, 3, 2, tmp_path, worker=_worker(hang="timm:resnet18"))
    assert rows[0]["status"] == "error" and "timed out after 2 s" in rows[0]["reason"]
    assert [r["status"] for r in rows[1:]] == ["ok", "ok"]


def test_empty_row_has_every_report_field() -> None:
    row = empty_row("train:resnet18", "launchless", "skipped", "why")
    assert row["kind"] == "training" and row["reason"] == "why" and row["correctness"]["status"] == "n/a"
    assert all(k in row for k in ("median_ms", "min_ms", "first_call_ms", "peak_mem_mb", "kernel_floor_ms"))


def test_unavailable_modes_say_why() -> None:
    with pytest.raises(modes.ModeUnavailable, match="unknown mode"):
        modes.inference("warp-speed", None, (), {})


def test_bench_cli(capsys) -> None:
    assert cli.main(["bench", "--list"]) == 0
    listed = capsys.readouterr().out
    assert "train:resnet50@b8" in listed and "reduce-overhead" in listed
    assert cli.main(["bench", "--suite", "quick"]) == 2  # no GPU here: clear message, non-zero
    assert "needs a CUDA GPU" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", "--modes", "turbo"])
    assert exc.value.code == 2 and "unknown mode(s) turbo" in capsys.readouterr().err


def test_merge_partial_runs(tmp_path) -> None:
    import json
    from pathlib import Path

    from launchless.apps.bench.runner import merge

    run = json.loads(Path("benchmarks/results/2026-11-29-bench-standard.json").read_text())
    workloads = ["timm:resnet18", "train:resnet18"]
    full = dict(run, rows=[r for r in run["rows"] if r["workload"] in workloads])  # a run of these two
    halves = []
    for i, workload in enumerate(workloads):
        part = dict(full, rows=[r for r in full["rows"] if r["workload"] == workload])
        part["environment"] = dict(full["environment"], wall_s=100.0 + i)
        halves.append(tmp_path / f"part{i}.json")
        halves[-1].write_text(json.dumps(part))
    assert merge([str(p) for p in halves], str(tmp_path / "merged")) == 0
    merged = json.loads((tmp_path / "merged" / "bench.json").read_text())
    assert len(merged["rows"]) == len(full["rows"]) and merged["summary"] == stats.summary(full["rows"])
    assert (tmp_path / "merged" / "bench.md").read_text().count("`train:resnet18`") >= 1
    assert merged["environment"]["wall_s"] == 201.0  # the run's time is the sum of its parts
    assert "run took 201 s" in (tmp_path / "merged" / "bench.md").read_text()
    assert "merged from 2 runs (part0, part1)" in (tmp_path / "merged" / "bench.md").read_text()
    other = dict(full, environment=dict(full["environment"], gpu="Other GPU"))
    halves[1].write_text(json.dumps(other))
    with pytest.raises(ValueError, match="different GPUs"):
        merge([str(p) for p in halves], str(tmp_path / "bad"))


def test_weights_from_an_earlier_run_deal_longest_first_so_the_gpus_finish_together(tmp_path) -> None:
    # round-robin puts both slow ones on one GPU: 300 s against 30 s
    names = ["slow1", "fast1", "slow2", "fast2"]
    weights = {"slow1": 150, "slow2": 150, "fast1": 15, "fast2": 15}
    assert deal(names, 2) == [["slow1", "slow2"], ["fast1", "fast2"]]
    assert deal(names, 2, weights) == [["slow1", "fast1"], ["slow2", "fast2"]]  # 165 s each, suite order kept
    # a workload the earlier run did not have weighs the mean (82.5 s)
    assert deal([*names, "new"], 2, weights) == [["slow1", "new"], ["fast1", "slow2", "fast2"]]
    rows = [
        {"workload": "a", "mode": "compile", "wall_s": 10.0},
        {"workload": "a", "mode": "launchless-compile", "wall_s": 30.0},
        {"workload": "b", "mode": "compile", "wall_s": 7.0},  # not run in the mode asked for: all its modes count
        {"workload": "c", "mode": "launchless-compile", "wall_s": None},  # an error row: no time, no weight
    ]
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"rows": rows}))
    assert runner.balance_weights(str(path), ["launchless-compile"]) == {"a": 30.0, "b": 7.0}
    assert runner.balance_weights(str(path), ["compile", "launchless-compile"]) == {"a": 40.0, "b": 7.0}
    path.write_text("{}")
    with pytest.raises(runner.BalanceFileUnreadable, match="leave --balance-from out"):
        runner.balance_weights(str(path), ["compile"])
    with pytest.raises(SystemExit) as exit_info:  # the command line says so before it looks for a GPU
        cli.main(["bench", "--suite", "compiler", "--balance-from", str(tmp_path / "missing.json")])
    assert exit_info.value.code == 2


def test_workloads_are_dealt_over_gpus_and_each_part_is_pinned(tmp_path) -> None:
    assert deal(["a", "b", "c", "d", "e"], 2) == [["a", "c", "e"], ["b", "d"]]
    assert deal(["a"], 2) == [["a"]]  # no empty part
    cores = split_cores(2)
    if all(c is not None for c in cores):
        assert not cores[0] & cores[1] and len(cores[0]) == len(cores[1]) >= 1
    names = [*NAMES, "hf:bert-base"]

    def run(mode, part, gpu, cores):
        return run_mode(mode, part, 3, 20, tmp_path, worker=_worker(), gpu=gpu, cores=cores)

    rows = run_parts(names, ["eager", "compile"], [3, 5], run)
    assert [(r["workload"], r["mode"]) for r in rows] == [(n, m) for n in names for m in ("eager", "compile")]
    by_name = {r["workload"]: r for r in rows if r["mode"] == "eager"}
    assert [by_name[n]["gpu"] for n in names] == ["3", "5", "3", "5"]  # every mode of a workload on one GPU
    assert all(r["gpu"] == by_name[r["workload"]]["gpu"] for r in rows)
    if all(c is not None for c in cores):
        assert [set(by_name[n]["cores"]) for n in names[:2]] == cores
    serial = run_parts(NAMES, ["eager"], None, run)
    assert [r["gpu"] for r in serial] == [None] * 3  # one GPU: nothing set, nothing pinned


def test_a_part_that_fails_stops_the_run_with_its_error(tmp_path) -> None:
    def run(mode, part, gpu, cores):
        if gpu == 1:
            raise OSError("disk full")
        return []

    with pytest.raises(OSError, match="disk full"):
        run_parts(NAMES, ["eager"], [0, 1], run)


def test_bench_refuses_gpus_that_are_not_there(monkeypatch) -> None:
    monkeypatch.setattr("torch.cuda.device_count", lambda: 2)
    monkeypatch.setattr("torch.cuda.get_device_name", lambda i: "NVIDIA H200")
    check_gpus([0, 1])
    with pytest.raises(GpusUnavailable, match=r"has 2 GPU\(s\) \(0..1\)"):
        check_gpus([0, 2])
    with pytest.raises(GpusUnavailable, match="at most once"):
        check_gpus([1, 1])
    monkeypatch.setattr("torch.cuda.get_device_name", lambda i: f"GPU model {i}")
    with pytest.raises(GpusUnavailable, match="mixes GPU models"):
        check_gpus([0, 1])


def test_each_mode_compiles_into_fresh_caches_that_are_gone_afterwards(tmp_path, monkeypatch) -> None:
    """On disk, Inductor's and Triton's caches outlive a process: one mode must not find another's kernels."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/shared/cache")  # a user's own setting is not inherited
    seen = {}
    for mode in ("compile", "reduce-overhead"):
        (row,) = run_mode(mode, ["timm:resnet18"], 3, 20, tmp_path, worker=_worker(env=True))
        seen[mode] = row
        assert row["caches"]["LAUNCHLESS_CACHE_DIR"].endswith("decisions")
        assert all(v.startswith(row["caches"]["root"]) for k, v in row["caches"].items() if k != "root")
        assert not os.path.exists(row["caches"]["root"])  # removed when the mode is done
    a, b = (seen[m]["caches"]["TORCHINDUCTOR_CACHE_DIR"] for m in ("compile", "reduce-overhead"))
    assert a != b and "/shared/cache" not in (a, b)


def test_the_second_process_mode_runs_on_the_caches_its_first_left_then_they_are_gone(tmp_path) -> None:
    """``launchless-compiled-kernels-on-disk`` measures a user's next process: its workers find the programs (and
    Inductor's and Triton's caches) the compiled-kernels mode's process left; every other mode starts empty."""
    caches = runner.CacheRoots()
    seen = {}
    for mode in ("launchless", modes.COMPILED_KERNELS, modes.COMPILED_KERNELS_ON_DISK):
        (row,) = run_mode(mode, ["timm:resnet18"], 3, 20, tmp_path, worker=_worker(env=True), caches=caches)
        seen[mode] = row["caches"]
        if mode == modes.COMPILED_KERNELS:
            assert os.path.isdir(row["caches"]["root"])  # kept for the second process
        else:
            assert not os.path.exists(row["caches"]["root"])  # nothing comes for it later
    first, second = seen[modes.COMPILED_KERNELS], seen[modes.COMPILED_KERNELS_ON_DISK]
    assert second == first and seen["launchless"]["root"] != first["root"]
    (row,) = run_mode(
        modes.COMPILED_KERNELS, ["timm:resnet18"], 3, 20, tmp_path, worker=_worker(env=True), caches=caches
    )
    assert os.path.isdir(row["caches"]["root"])
    caches.close()  # the suite ended without its second process: nothing is left behind
    assert not os.path.exists(row["caches"]["root"])


def test_the_race_runs_on_the_compiler_backends_caches_and_needs_no_mode_before_it(tmp_path) -> None:
    """The race times what the separate modes compiled: its workers find launchless-compile's caches, which are kept
    for it and gone after it; named alone, it compiles in caches of its own."""
    caches = runner.CacheRoots()
    seen = {}
    for mode in ("launchless-compile", modes.RACED):
        (row,) = run_mode(mode, ["timm:resnet18"], 3, 20, tmp_path, worker=_worker(env=True), caches=caches)
        seen[mode] = row["caches"]
        if mode == "launchless-compile":
            assert os.path.isdir(row["caches"]["root"])  # kept for the race
    assert seen[modes.RACED] == seen["launchless-compile"]
    assert not os.path.exists(seen[modes.RACED]["root"])  # the race was the last to need them
    assert modes.order_problem([modes.RACED]) is None
    (alone,) = run_mode(modes.RACED, ["timm:resnet18"], 3, 20, tmp_path, worker=_worker(env=True))
    assert not os.path.exists(alone["caches"]["root"])


def test_the_second_process_mode_needs_its_first_before_it(capsys) -> None:
    for named in ([modes.COMPILED_KERNELS_ON_DISK], [modes.COMPILED_KERNELS_ON_DISK, modes.COMPILED_KERNELS]):
        with pytest.raises(SystemExit) as exc:
            cli.main(["bench", "--suite", "kernels", "--modes", *named])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and "measures a second process" in err
        assert f"--modes ... {modes.COMPILED_KERNELS} {modes.COMPILED_KERNELS_ON_DISK}" in err


def test_serving_runs_split_by_mode_merge_into_the_serving_report_with_its_targets(tmp_path) -> None:
    import json
    from pathlib import Path

    from launchless.apps.bench.runner import merge

    run = json.loads(Path("benchmarks/results/2026-12-01-serving-decode.json").read_text())
    others = dict(run, rows=[r for r in run["rows"] if r["mode"] != "launchless"])  # eager, static-compile
    launchless = dict(run, rows=[r for r in run["rows"] if r["mode"] == "launchless"])
    parts = [tmp_path / "others.json", tmp_path / "launchless.json"]
    parts[0].write_text(json.dumps(others))
    parts[1].write_text(json.dumps(launchless))
    assert merge([str(parts[1])], str(tmp_path / "alone")) == 0
    alone = json.loads((tmp_path / "alone" / "serving.json").read_text())
    assert all(v["met"] is None and "did not run" in v["detail"] for v in alone["summary"]["verdicts"])
    assert merge([str(p) for p in parts], str(tmp_path / "merged")) == 0
    merged = json.loads((tmp_path / "merged" / "serving.json").read_text())
    modes = {(r["workload"], r["mode"]) for r in merged["rows"]}
    assert ("decode:llama-850m@b1", "launchless") in modes and ("decode:llama-850m@b1", "static-compile") in modes
    verdicts = {v["workload"]: v for v in merged["summary"]["verdicts"]}
    assert set(verdicts) == {"decode:gpt2-124m@b1", "decode:llama-850m@b1"}  # the target is set at batch 1
    assert all(v["met"] is True and "1.00×" in v["detail"] for v in verdicts.values())  # judged with static-compile
    assert "## Targets" in (tmp_path / "merged" / "serving.md").read_text()
    standard = json.loads(Path("benchmarks/results/2026-11-29-bench-standard.json").read_text())
    parts[0].write_text(json.dumps(standard))
    with pytest.raises(ValueError, match="different suites"):
        merge([str(p) for p in parts], str(tmp_path / "bad"))


def test_a_run_cut_short_merges_with_the_rows_its_workers_wrote(tmp_path) -> None:
    """A device call's time ran out in the middle of a worker: its report lacks the rows the worker had written to
    its rows-*.jsonl; named after the report, they join it (a line cut short by the end is left out)."""
    import json
    from pathlib import Path

    from launchless.apps.bench.runner import merge

    run = json.loads(Path("benchmarks/results/2026-12-01-serving-decode.json").read_text())
    written = [r for r in run["rows"] if r["mode"] == "launchless"]
    cut = dict(run, rows=[r for r in run["rows"] if r["mode"] != "launchless"])
    (tmp_path / "serving.json").write_text(json.dumps(cut))
    rows = tmp_path / "rows-launchless-0.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in written) + '{"workload": "decode:gpt2-1')  # cut short
    assert merge([str(tmp_path / "serving.json"), str(rows)], str(tmp_path / "merged")) == 0
    merged = json.loads((tmp_path / "merged" / "serving.json").read_text())
    assert sorted((r["workload"], r["mode"]) for r in merged["rows"]) == sorted(
        (r["workload"], r["mode"]) for r in run["rows"]
    )
    assert merged["environment"]["gpu"] == run["environment"]["gpu"]
    with pytest.raises(ValueError, match=r"need a bench\.json"):
        merge([str(rows)], str(tmp_path / "alone"))


def test_a_mode_that_changes_while_it_runs_is_called_until_it_decides(monkeypatch) -> None:
    """Compiled kernels swap in while the calls go on: the bench calls until the swap is decided, records each
    call's latency against wall time, and when it happened."""
    import time

    import torch

    from launchless.apps.bench import measure

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    calls = {"n": 0}

    def call() -> None:
        calls["n"] += 1
        time.sleep(0.002 if calls["n"] <= 40 else 0.0005)  # faster once the compiled graph replays

    def settled() -> dict | None:
        return {"kernels": "compiled", "reason": "", "compile_s": 1.5} if calls["n"] >= 40 else None

    row = measure.early_calls(modes.Prepared(call, settled=settled), time.perf_counter())
    assert row["kernels"] == "compiled" and row["compile_s"] == 1.5
    assert calls["n"] == 40 + measure.AFTER_SETTLED
    assert row["during_compile_ms"] >= 2.0 and 0 < row["swap_s"] < row["timeline"][-1][0]
    assert len(row["timeline"]) == calls["n"] + 1 and row["early_calls"] == calls["n"]  # the first call, then these
    undecided = measure.early_calls(modes.Prepared(call), time.perf_counter())
    assert set(undecided) == {"timeline", "early_calls", "early_ms"}
    assert len(undecided["timeline"]) == measure.EARLY_CALLS + 1
    assert 0.5 <= undecided["early_ms"] < 2.0  # the median call: every one after the 40th sleeps 0.5 ms
    began = time.perf_counter()  # a training step's calls pause after each (fewer steps for eager to repeat)
    paused = measure.early_calls(modes.Prepared(call), began, pause_s=0.01)
    assert time.perf_counter() - began >= paused["early_calls"] * 0.01
    assert paused["early_ms"] < 10.0  # a call's own time: the pause after it is not on its clock


def test_the_calls_go_on_until_the_package_of_a_program_swapped_in_in_inductors_format_is_kept(monkeypatch) -> None:
    """A program swapped in in Inductor's format is packaged after, for a second process: the bench calls until the
    package is kept (or given up, saying why), so that the second process finds it and the steady state is timed
    after it; when it was kept is in the row."""
    import time

    import torch

    from launchless.apps.bench import measure

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    calls = {"n": 0}

    def call() -> None:
        calls["n"] += 1
        time.sleep(0.0005)

    def settled(*, given_up: bool = False) -> dict | None:
        if calls["n"] < 10:
            return None
        pending = calls["n"] < 100
        why = "AOTInductor could not build a package" if given_up and not pending else None
        return {"kernels": "compiled", "reason": "", "package_pending": pending, "unpackaged": why}

    row = measure.early_calls(modes.Prepared(call, settled=settled), time.perf_counter())
    assert calls["n"] == 100 and row["swap_s"] < row["package_s"] <= row["timeline"][-1][0] and not row["unpackaged"]
    calls["n"] = 0
    row = measure.early_calls(modes.Prepared(call, settled=lambda: settled(given_up=True)), time.perf_counter())
    assert calls["n"] == 100 and row["unpackaged"] == "AOTInductor could not build a package"
    calls["n"] = 0
    monkeypatch.setattr(measure, "PACKAGE_S", 0.0)  # not waited for past its bound: no package_s
    row = measure.early_calls(modes.Prepared(call, settled=settled), time.perf_counter())
    assert calls["n"] == 10 + measure.AFTER_SETTLED and row["package_s"] is None


def test_a_long_timeline_keeps_the_first_call_and_the_median_of_each_span() -> None:
    from launchless.apps.bench.measure import TIMELINE_POINTS, thinned

    points = [(0.0, 5000.0)] + [(1.0 + i * 0.001, 1.0 if i % 2 else 3.0) for i in range(10_000)]
    kept = thinned(points)
    assert kept[0] == [0.0, 5000.0] and len(kept) <= TIMELINE_POINTS + 1
    assert all(ms in (1.0, 3.0) for _, ms in kept[1:])
    assert thinned(points[:10]) == [[round(t, 4), ms] for t, ms in points[:10]]


def test_compiled_kernels_run_in_their_own_suite_unless_asked_for() -> None:
    assert modes.COMPILED_KERNELS in modes.default_modes(workloads.KERNELS)
    kernels = list(modes.default_modes(workloads.KERNELS))
    assert kernels.index(modes.COMPILED_KERNELS) < kernels.index(modes.COMPILED_KERNELS_ON_DISK)
    assert modes.order_problem(kernels) is None
    assert not set(modes.KERNEL_MODES) & set(modes.default_modes(workloads.STANDARD))
    assert [w.name for w in workloads.suite(workloads.KERNELS)] == [
        "timm:resnet18", "timm:efficientnet_b0", "hf:gpt2", "hf:t5-small", "train:resnet18"
    ]  # fmt: skip


def test_a_workload_builds_in_its_own_dtype() -> None:
    """pyhpc's models compute in float64: the workload says so and its inputs are built so (others stay float32)."""
    ocean = workloads.get("grace:ocean-equation-of-state")
    assert ocean.torch_dtype is torch.float64 and workloads.get("timm:resnet18").torch_dtype is torch.float32
    built = zoo.build(ocean.zoo, batch=ocean.batch, dtype=ocean.torch_dtype)
    assert all(x.dtype is torch.float64 for x in built.args)
    assert built.model(*built.args).dtype is torch.float64


def test_the_race_warms_every_mode_then_times_them_in_rotating_rounds(monkeypatch) -> None:
    """Each mode prepared once, called until compiled and captured, then ``RACE_ROUNDS`` rounds with the order
    rotating (no mode always first, after an idle GPU); per mode the median of its rounds, not their mean."""
    from types import SimpleNamespace

    from launchless.apps.bench import measure
    from launchless.timing import Timing

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(measure, "_build", lambda w: SimpleNamespace(model=torch.nn.Identity(), args=(), kwargs={}))
    called: list[str] = []
    timed: list[str] = []
    base = {"compile": 1.0, "reduce-overhead": 2.0, "launchless-compile": 3.0}

    def prepared(mode, model, args, kwargs):
        def call() -> None:
            called.append(mode)

        return modes.Prepared(call)

    def cuda_time(fn, *, warmup, iters):
        fn()
        mode = called[-1]
        timed.append(mode)
        slow = 50.0 if timed.count(mode) == 1 else 0.0  # each mode's first round is slow
        return Timing(base[mode] + slow, base[mode], iters)

    monkeypatch.setattr(modes, "inference", prepared)
    monkeypatch.setattr(measure, "cuda_time", cuda_time)
    row = measure.measure(workloads.get("timm:resnet18"), modes.RACED, iters=35)
    contestants = measure.race_contestants("inference")
    assert list(contestants) == list(base)
    rounds = [timed[i : i + 3] for i in range(0, len(timed), 3)]
    assert len(rounds) == measure.RACE_ROUNDS and all(sorted(r) == sorted(base) for r in rounds)
    assert [r[0] for r in rounds[:3]] == list(contestants)  # the order rotates
    assert row["raced_ms"] == base  # the median of the rounds: the slow first round does not count
    assert all(len(v) == measure.RACE_ROUNDS for v in row["raced_rounds_ms"].values())
    assert row["raced_calls_per_round"] == 10 and row["mode"] == modes.RACED and row["status"] == "ok"
    assert called[: 3 * measure.RACE_WARMUP] == [m for m in contestants for _ in range(measure.RACE_WARMUP)]
