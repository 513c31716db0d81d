"""CPU tests of `launchless bench --suite serving`: the suite end to end through the command line with the MLP on a
short trace and a tiny GPT-2 generating a few tokens (on a CPU the launchless modes run eager: rows are written and
compared with eager all the same), transformers' static-cache compile recipe in its own worker, workers that crash or
fail, the trace, and the report from synthetic rows. Expected ratios are recomputed here from the rows' numbers,
never copied from the code's output."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest
import torch

from launchless.apps import cli
from launchless.apps.bench import report, runner, serving_report, worker
from launchless.apps.bench.serving_decode import Generation, first_divergence
from launchless.apps.bench.serving_workloads import batch_trace

MLP = "buckets:mlp"
GPT2 = "decode:gpt2-tiny@b1"
CRASHING = "buckets:test_bench_serving:crashing_model"
FAILING = "buckets:test_bench_serving:failing_model"
COMMON_FIELDS = {
    "workload",
    "part",
    "mode",
    "status",
    "reason",
    "median_ms",
    "identical",
    "compile_s",
    "graphs",
    "wall_s",
}
BUCKET_FIELDS = COMMON_FIELDS | {
    "total_ms",
    "calls",
    "distinct_sizes",
    "first_pass_s",
    "graph_mem_bytes",
    "device_mem_bytes",
    "max_abs_diff",
    "batch_buckets",
}
DECODE_FIELDS = COMMON_FIELDS | {
    "batch",
    "prompt_tokens",
    "new_tokens",
    "tokens_per_s",
    "ttft_ms",
    "generate_ms",
    "first_call_s",
    "runs",
    "first_divergence",
    "dynamic_divergence",
    "interleaved_ms",
    "interleaved_rounds",
    "interleaved_error",
}


# --- builders the workers load by name ------------------------------------------------------------------------


def crashing_model(*, device: torch.device) -> None:
    """The worker dies outright, as a segfault or an out-of-memory kill would end it."""
    os._exit(3)


def failing_model(*, device: torch.device) -> None:
    raise ValueError("this model cannot be built")


@pytest.fixture
def on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The command line runs the suite on the CPU, whatever this machine has."""
    monkeypatch.setattr(worker, "device_type", lambda: "cpu")


@pytest.fixture
def importable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The workers can import this module (they start with the runner's environment)."""
    here = str(Path(__file__).parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p))


# --- the suite, end to end ------------------------------------------------------------------------------------


def test_the_suite_runs_end_to_end_on_cpu_through_the_command_line(tmp_path: Path, on_cpu: None) -> None:
    modes = ["eager", "graph-per-size", "buckets", "buckets-auto", "launchless"]
    argv = ["bench", "--suite", "serving", "--workloads", MLP, GPT2, "--modes", *modes]
    argv += ["--iters", "10", "--timeout", "120", "--out", str(tmp_path)]
    assert cli.main(argv) == 0
    doc = json.loads((tmp_path / "serving.json").read_text())
    assert doc["suite"] == "serving"
    environment = doc["environment"]
    assert environment["device"] == "cpu" and environment["torch"] == torch.__version__
    trace = batch_trace(10)
    assert environment["trace"]["calls"] == 10 and environment["trace"]["rows"] == sum(trace)
    rows = doc["rows"]
    expected = [(MLP, m) for m in ("eager", "graph-per-size", "buckets", "buckets-auto")]
    expected += [(GPT2, "eager"), (GPT2, "launchless")]
    assert [(r["workload"], r["mode"]) for r in rows] == expected  # each workload only in its part's modes
    for row in rows:
        assert row["status"] == "ok", row
        assert set(row) == (BUCKET_FIELDS if row["part"] == "buckets" else DECODE_FIELDS)
        assert row["identical"] is True and row["compile_s"] >= 0 and row["graphs"] is None  # no CUDA graphs here
    for row in rows[:4]:  # on a CPU every launchless mode runs eager: bit for bit eager's outputs
        assert row["calls"] == 10 and row["distinct_sizes"] == len(set(trace))
        assert 0 < row["median_ms"] <= row["total_ms"] and row["first_pass_s"] > 0
        assert row["max_abs_diff"] == 0.0 and row["graph_mem_bytes"] is None and row["device_mem_bytes"] is None
    by_mode = {r["mode"]: r for r in rows[:4]}
    assert by_mode["buckets"]["batch_buckets"]["sizes"] == [1, 2, 4, 8, 16, 32]
    assert by_mode["buckets-auto"]["batch_buckets"]["automatic"] is True
    assert by_mode["eager"]["batch_buckets"] is None and by_mode["graph-per-size"]["batch_buckets"] is None
    for row in rows[4:]:
        assert row["batch"] == 1 and row["new_tokens"] == 4 and row["runs"] == 3
        assert row["tokens_per_s"] == pytest.approx(1e3 / row["median_ms"])
        assert 0 < row["ttft_ms"] < row["generate_ms"] and row["first_divergence"] is None
        assert row["interleaved_ms"] is None and row["interleaved_rounds"] is None  # no race without graphs
        assert row["interleaved_error"] is None

    md = (tmp_path / "serving.md").read_text()
    assert "## Batch buckets" in md and "## Decode" in md and "device cpu" in md
    assert f"- `{MLP}` · buckets: not judged: graph memory not measured (no CUDA graphs on a CPU)" in md
    assert f"- `{GPT2}` · launchless: not judged: static-compile did not run" in md
    assert "- none: every workload ran in every mode of its part" in md
    png = (tmp_path / "serving.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000


def test_static_compile_runs_transformers_recipe_in_a_worker_of_its_own(tmp_path: Path) -> None:
    (row,) = runner.run_mode("static-compile", [GPT2], 1, 240, tmp_path, worker=[*runner.WORKER, "--device", "cpu"])
    assert row["status"] == "ok", row
    assert row["tokens_per_s"] > 0 and row["identical"] is True  # greedy tokens survive the compiled forward
    assert row["compile_s"] > 0.5  # a cold torch.compile of the forward, in the worker's fresh caches


def test_a_worker_that_crashes_or_a_model_that_fails_costs_one_workload(tmp_path: Path, importable: None) -> None:
    names = [CRASHING, MLP, FAILING, GPT2]
    paths = runner.measure_suite("serving", names, ["eager"], out_dir=tmp_path, iters=4, timeout_s=60, device="cpu")
    rows = json.loads(paths["json"].read_text())["rows"]
    assert [(r["workload"], r["status"]) for r in rows] == [
        (CRASHING, "error"),
        (MLP, "ok"),
        (FAILING, "error"),
        (GPT2, "ok"),
    ]
    assert "the worker exited with code 3" in rows[0]["reason"] and "worker-eager.log" in rows[0]["reason"]
    assert rows[2]["reason"] == "ValueError: this model cannot be built"
    assert set(rows[0]) == BUCKET_FIELDS and rows[0]["total_ms"] is None
    assert rows[1]["total_ms"] > 0 and rows[3]["tokens_per_s"] > 0
    md = paths["md"].read_text()
    assert f"- `{FAILING}` · eager: ValueError: this model cannot be built" in md


# --- the trace and the token check ----------------------------------------------------------------------------


def test_the_trace_is_seeded_and_skewed_towards_small_batches() -> None:
    trace = batch_trace(4000)
    assert trace == batch_trace(4000) and trace[:200] == batch_trace(200)
    assert set(trace) == set(range(1, 33))
    harmonic = sum(1 / k for k in range(1, 33))
    counts = Counter(trace)
    for size in (1, 2, 8, 32):  # P(size = k) = (1/k) / H_32
        assert counts[size] / len(trace) == pytest.approx(1 / size / harmonic, abs=0.02), size
    assert batch_trace(200, seed=1) != batch_trace(200)


def test_the_first_divergence_is_the_earliest_new_token_that_left_eagers() -> None:
    reference = torch.tensor([[5, 6, 7, 8], [1, 2, 3, 4]])

    def generation(tokens: list[list[int]]) -> Generation:
        return Generation(seconds=1.0, first_token_s=0.1, tokens=torch.tensor(tokens))

    same = generation([[5, 6, 7, 8], [1, 2, 3, 4]])
    assert first_divergence(reference, [same, same]) is None
    late, early = generation([[5, 6, 7, 9], [1, 2, 3, 4]]), generation([[5, 6, 7, 8], [1, 0, 3, 4]])
    assert first_divergence(reference, [same, late]) == 3
    assert first_divergence(reference, [late, early, same]) == 1


# --- the report from synthetic rows ---------------------------------------------------------------------------

RESNET, BERT = "buckets:resnet18@64", "buckets:distilbert-tiny"
GPT2_B1, LLAMA_B1, GPT2_B8 = "decode:gpt2-124m@b1", "decode:llama-850m@b1", "decode:gpt2-124m@b8"
MIB = 2**20


def _bucket_row(workload: str, mode: str, total_ms: float | None, memory_mib: float | None) -> dict:
    ok = total_ms is not None
    return {
        "workload": workload,
        "part": "buckets",
        "mode": mode,
        "status": "ok" if ok else "error",
        "reason": None if ok else "the worker exited with code 1",
        "median_ms": total_ms / 10 if ok else None,
        "identical": mode != "reduce-overhead" if ok else None,
        "compile_s": 0.5 if ok else None,
        "graphs": 3 if ok else None,
        "total_ms": total_ms,
        "calls": 10,
        "distinct_sizes": 6,
        "first_pass_s": 1.0,
        "graph_mem_bytes": None if memory_mib is None else int(memory_mib * MIB),
        "device_mem_bytes": None if memory_mib is None else int(2 * memory_mib * MIB),
        "max_abs_diff": 2.5e-7 if mode == "reduce-overhead" else 0.0,
        "batch_buckets": None,
        "wall_s": 2.0,
    }


def _decode_row(workload: str, mode: str, tokens_per_s: float, compile_s: float) -> dict:
    return {
        "workload": workload,
        "part": "decode",
        "mode": mode,
        "status": "ok",
        "reason": None,
        "median_ms": 1e3 / tokens_per_s,
        "identical": mode != "static-compile",
        "compile_s": compile_s,
        "graphs": 0,
        "batch": int(workload.rsplit("@b", 1)[1]),
        "prompt_tokens": 64,
        "new_tokens": 128,
        "tokens_per_s": tokens_per_s,
        "ttft_ms": 12.0,
        "generate_ms": 300.0,
        "first_call_s": compile_s + 0.3,
        "runs": 3,
        "first_divergence": None if mode != "static-compile" else 17,
        "wall_s": 9.0,
    }


# (workload, mode) -> trace ms and graph MiB; None time = an error row
BUCKET_NUMBERS = {
    (RESNET, "eager"): (300.0, 0.0),
    (RESNET, "graph-per-size"): (100.0, 800.0),
    (RESNET, "buckets"): (105.0, 150.0),
    (RESNET, "buckets-auto"): (125.0, 100.0),
    (RESNET, "reduce-overhead"): (90.0, 1000.0),
    (BERT, "graph-per-size"): (None, None),
    (BERT, "buckets"): (40.0, 20.0),
}
# (workload, mode) -> tokens per second and compile seconds
DECODE_NUMBERS = {
    (GPT2_B1, "eager"): (200.0, 0.0),
    (GPT2_B1, "static-compile"): (500.0, 40.0),
    (GPT2_B1, "launchless"): (550.0, 4.0),
    (LLAMA_B1, "static-compile"): (300.0, 60.0),
    (LLAMA_B1, "launchless"): (250.0, 2.0),
    (GPT2_B8, "static-compile"): (2000.0, 45.0),
    (GPT2_B8, "launchless"): (1000.0, 5.0),
}


# GPT-2 at batch 1 raced in one process: ms per decode step; it turns the separate rows' verdict round
GPT2_B1_INTERLEAVED = {"eager": 5.0, "static-compile": 2.0, "launchless": 2.5}


def _rows() -> list[dict]:
    rows = [_bucket_row(w, m, total, memory) for (w, m), (total, memory) in BUCKET_NUMBERS.items()]
    rows += [_decode_row(w, m, tokens, compile_s) for (w, m), (tokens, compile_s) in DECODE_NUMBERS.items()]
    for row in rows:
        if (row["workload"], row["mode"]) == (GPT2_B1, "launchless"):
            row.update(interleaved_ms=GPT2_B1_INTERLEAVED, interleaved_rounds=7)
        if (row["workload"], row["mode"]) == (LLAMA_B1, "launchless"):  # its own row stands; the race failed
            row.update(interleaved_error="AcceleratorError: CUDA error: an illegal memory access was encountered")
    return rows


def test_the_report_sets_each_mode_against_its_parts_baseline_and_judges_the_targets(tmp_path: Path) -> None:
    environment = {"date": "2026-12-01T00:00:00+00:00", "gpu": "NVIDIA H200", "torch": "2.14.1", "device": "cuda"}
    environment["trace"] = {"calls": 200, "law": "P(size = k) proportional to 1/k", "seed": 0}
    paths = report.write_all(tmp_path, environment, serving_report.SUITE, _rows())
    summary = json.loads(paths["json"].read_text())["summary"]
    buckets = summary["ratios"]["buckets"][RESNET]
    for (workload, mode), (total, memory) in BUCKET_NUMBERS.items():
        if workload == RESNET:  # graph-per-size's time over this one's; this one's memory over graph-per-size's
            assert buckets[mode] == pytest.approx(
                {"speed_vs_graph_per_size": 100.0 / total, "memory_vs_graph_per_size": memory / 800.0}
            ), mode
    assert summary["ratios"]["buckets"][BERT]["buckets"] == {
        "speed_vs_graph_per_size": None,
        "memory_vs_graph_per_size": None,
    }
    decode = summary["ratios"]["decode"]
    assert decode[GPT2_B1]["launchless"] == pytest.approx(  # tokens from the race (2.0 / 2.5), not 550 / 500
        {"tokens_per_s_vs_static_compile": 2.0 / 2.5, "compile_s_vs_static_compile": 4.0 / 40.0}
    )
    assert decode[GPT2_B1]["eager"]["tokens_per_s_vs_static_compile"] == pytest.approx(2.0 / 5.0)
    assert decode[GPT2_B8]["launchless"] == pytest.approx(
        {"tokens_per_s_vs_static_compile": 1000.0 / 2000.0, "compile_s_vs_static_compile": 5.0 / 45.0}
    )

    verdicts = {(v["workload"], v["mode"]): v for v in summary["verdicts"]}
    judged = [(RESNET, "buckets"), (RESNET, "buckets-auto"), (BERT, "buckets")]
    judged += [(GPT2_B1, "launchless"), (LLAMA_B1, "launchless")]  # batch 8 is compared, not judged
    assert sorted(verdicts) == sorted(judged)
    assert verdicts[(RESNET, "buckets")]["met"] is True  # 100/105 >= 0.9 and 150/800 <= 0.25
    assert verdicts[(RESNET, "buckets-auto")]["met"] is False  # 100/125 = 0.8 < 0.9
    assert verdicts[(BERT, "buckets")]["met"] is None
    assert verdicts[(GPT2_B1, "launchless")]["met"] is False  # raced: 2.0/2.5 < 1, though 550/500 >= 1 apart
    assert verdicts[(LLAMA_B1, "launchless")]["met"] is False  # 250/300 < 1

    md = paths["md"].read_text()
    speed, memory = f"{100 / 105:.2f}×", f"{150 / 800:.2f}×"
    assert f"| `{RESNET}` | buckets | 105 | 10.5 | {speed} | 150.0 | {memory} | 300.0 | 3 | 0.5 | = |" in md
    reduce_overhead = f"{100 / 90:.2f}× | 1000.0 | {1000 / 800:.2f}× | 2000.0"
    assert f"| `{RESNET}` | reduce-overhead | 90.0 | 9.00 | {reduce_overhead} | 3 | 0.5 | ≠ 2.5e-07 |" in md
    assert f"| `{RESNET}` | eager | 300 | 30.0 | {100 / 300:.2f}× | 0.0 | {0 / 800:.2f}× | 0.0 | 3 | 0.5 | = |" in md
    assert f"| `{BERT}` | graph-per-size | error |" in md
    launchless = f"550.0 | {1e3 / 550:.2f} | 12.0 | {2 / 2.5:.2f}× | 4 | {4 / 40:.2f}×"
    assert f"| `{GPT2_B1}` | 1 | launchless | {launchless} | 0 | = |" in md
    static_compile = "500.0 | 2.00 | 12.0 | 1.00× | 40 | 1.00×"  # the baseline against itself
    assert f"| `{GPT2_B1}` | 1 | static-compile | {static_compile} | 0 | ≠ from token 17 |" in md
    assert f"- `{RESNET}` · buckets: **met**: {speed} the speed of graph-per-size (target ≥ 0.90×), {memory}" in md
    assert f"- `{RESNET}` · buckets-auto: **not met**: {100 / 125:.2f}× the speed of graph-per-size" in md
    assert f"- `{BERT}` · buckets: not judged: graph-per-size did not run" in md
    assert "Raced in one process (the launchless worker, once its row was measured): 7 rounds" in md
    assert f"| `{GPT2_B1}` | 5.00 | 2.00 | 2.50 | {2 / 2.5:.2f}× |" in md  # eager, static-compile, launchless
    assert f"| `{GPT2_B8}` |" not in md.split("Raced in one process")[1].split("## Targets")[0]  # not raced
    assert f"- `{GPT2_B1}` · launchless: **not met**: {2 / 2.5:.2f}× the tokens per second of static-compile" in md
    assert f"- `{LLAMA_B1}` · launchless: **not met**: {250 / 300:.2f}× the tokens per second of static-compile" in md
    assert f"- `{BERT}` · graph-per-size: the worker exited with code 1" in md
    assert f"- `{LLAMA_B1}` · the modes' race: AcceleratorError: CUDA error: an illegal memory access" in md
    assert paths["png"].read_bytes().startswith(b"\x89PNG")


# --- the command line -----------------------------------------------------------------------------------------


def test_a_run_cut_short_names_the_modes_that_left_no_row() -> None:
    rows = [_decode_row(GPT2_B1, "eager", 200.0, 0.0), _decode_row(GPT2_B1, "launchless", 550.0, 4.0)]
    md = serving_report.markdown({"modes": ["eager", "static-compile", "launchless"]}, rows)
    assert f"- `{GPT2_B1}` · static-compile: no row (the run ended first)" in md
    assert "every workload ran" not in md
    whole = serving_report.markdown({"modes": ["eager", "launchless"]}, rows)
    assert "- none: every workload ran in every mode of its part" in whole and "no row" not in whole


def test_the_serving_command_line_refuses_what_cannot_run(capsys: pytest.CaptureFixture[str], on_cpu: None) -> None:
    bad = [
        (["--workloads", "mlp"], "start with 'buckets:'"),
        (["--workloads", "buckets:vgg"], "unknown batch-bucket workload 'buckets:vgg'"),
        (["--workloads", "buckets:no_such_module:build"], "cannot load the builder"),
        (["--workloads", "decode:gpt2-huge@b1"], "unknown decode workload 'decode:gpt2-huge@b1'"),
        (["--workloads", "decode:gpt2-tiny@b0"], "the batch must be 1 or more"),
        (["--modes", "hand-graph"], "unknown mode(s) hand-graph"),
        (["--iters", "0"], "argument --iters: 0: pass 1 or more"),
        (["--balance-from", "bench.json"], "--balance-from deals the standard suites' workloads"),
        (["--gpus", "0"], "--gpus names GPUs and none is visible here"),
    ]
    for extra, message in bad:
        with pytest.raises(SystemExit) as exc:
            cli.main(["bench", "--suite", "serving", "--workloads", MLP, *extra])
        assert exc.value.code == 2 and message in capsys.readouterr().err, extra


def test_a_split_mode_serves_a_larger_call_as_calls_of_its_largest_bucket() -> None:
    """A server capping its largest bucket at 8 rows serves 20 rows as 8 + 8 + 4, the outputs' rows joined in order:
    eager's results of those three calls bit for bit (on a CPU the wrapper runs eager), which are the 20-row call's
    within rounding (a matrix product may sum in another order for another row count)."""
    from launchless.apps.bench.serving_buckets import server
    from launchless.apps.bench.serving_workloads import SPLIT_8, bucket_builder

    model, make_inputs = bucket_builder(MLP)(device=torch.device("cpu"))
    seen: list[int] = []
    model.register_forward_pre_hook(lambda _, args, kwargs: seen.append(args[0].shape[0]), with_kwargs=True)
    inputs = make_inputs(20)
    (x,), kwargs = inputs
    with torch.no_grad():
        whole = model(x, **kwargs)
        pieces = torch.cat([model(x[start : start + 8], **kwargs) for start in (0, 8, 16)])
        seen.clear()
        mode_server = server(SPLIT_8, model)
        got = mode_server.serve(inputs)
    assert seen == [8, 8, 4] and torch.equal(got, pieces)
    torch.testing.assert_close(got, whole)
    assert mode_server.wrapped.graph_info()["batch_buckets"]["sizes"] == [1, 2, 4, 8]


def test_the_serving_list_names_the_parts_workloads_and_modes(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "--suite", "serving", "--list"]) == 0
    listed = capsys.readouterr().out
    assert "buckets:resnet18@64" in listed and "buckets:package.module:function" in listed
    assert "decode:llama-850m@b<batch>" in listed
    modes = "eager, graph-per-size, buckets, buckets-auto, buckets-split-16, buckets-split-8, reduce-overhead"
    assert f"buckets modes: {modes}" in listed
    assert "decode modes: eager, static-compile, launchless" in listed


def test_the_report_names_launchless_generations_that_went_through_generates_own_loop(tmp_path: Path) -> None:
    environment = {"date": "2026-12-01T00:00:00+00:00", "gpu": "NVIDIA H200", "torch": "2.14.1", "device": "cuda"}
    environment["trace"] = {"calls": 200, "law": "P(size = k) proportional to 1/k", "seed": 0}
    rows = _rows()
    for row in rows:
        if row["mode"] == "launchless" and row["workload"] == GPT2_B1:
            row.update(loop_generations=2, through_generate={"a cache was passed in": 3})
        elif row["mode"] == "launchless":
            row.update(loop_generations=4, through_generate={})
    md = report.write_all(tmp_path, environment, serving_report.SUITE, rows)["md"].read_text()
    lines = [line for line in md.splitlines() if "decoded through generate()'s own loop" in line]
    why = "a cache was passed in (3 calls)"
    assert lines == [f"- `{GPT2_B1}`: launchless decoded through generate()'s own loop: {why}"]


@pytest.mark.parametrize("divergence_before", [None, 3], ids=["eagers-tokens-before", "tokens-differ-before"])
def test_the_report_races_compiled_decode_steps_and_says_when_they_were_swapped_in(
    tmp_path: Path, divergence_before: int | None
) -> None:
    environment = {"date": "2026-12-04T00:00:00+00:00", "gpu": "NVIDIA H200", "torch": "2.14.1", "device": "cuda"}
    rows = _rows()
    for row in rows:
        if (row["workload"], row["mode"]) == (GPT2_B1, "launchless"):
            row["interleaved_ms"] = {**GPT2_B1_INTERLEAVED, "launchless-compiled-kernels": 1.25}
            row.update(
                compiled_first_call_s=0.5,
                compiled_swap_s=21.0,
                compiled_identical=False,
                compiled_divergence_before=divergence_before,
                compiled_divergence_after=37,
                compiled_timeline=[[0.0, 2.0], [21.0, 1.25]],
                compiled_kernels=[
                    {
                        "kernels": "compiled",
                        "reason": "",
                        "compile_phases": {"start": 0.0, "build": 0.12, "export": 2.3, "compile": 9.74},
                    }
                ],
            )
    paths = report.write_all(tmp_path, environment, serving_report.SUITE, rows)
    text = paths["md"].read_text()
    ratio = GPT2_B1_INTERLEAVED["static-compile"] / 1.25
    assert "launchless-compiled-kernels × static-compile tokens/s" in text and f"{ratio:.2f}×" in text
    phases = "start 0.0, build 0.1, export 2.3, compile 9.7"
    static = next(r for r in rows if (r["workload"], r["mode"]) == (GPT2_B1, "static-compile"))
    static_tokens = "=" if static.get("first_divergence") is None else f"≠ from token {static['first_divergence']}"
    before = "=" if divergence_before is None else f"**≠ from token {divergence_before}**"
    row = f"| `{GPT2_B1}` | compiled | 0.50 | 40.30 | 21.00 | {phases} | {before} | ≠ from token 37 | {static_tokens} |"
    assert row in text
    # judged at every batch: 2.0 / 1.25 = 1.6x static-compile's tokens per second, a start-up of 0.5 - 0.3 s against
    # static-compile's 40 s; met only where every call before the decision had eager's tokens
    verdict = next(
        v
        for v in json.loads(paths["json"].read_text())["summary"]["verdicts"]
        if (v["workload"], v["mode"]) == (GPT2_B1, "launchless-compiled-kernels")
    )
    assert verdict["met"] is (divergence_before is None)
    assert verdict["detail"].startswith(
        "1.60× the tokens per second of static-compile (target ≥ 1.20×), 0.01× its start-up time (target ≤ 0.05×), "
    )
    assert verdict["detail"].endswith(
        "eager's tokens before the decision" if divergence_before is None else "tokens ≠ from token 3"
    )
    # the chart has the raced mode's bar: batch 1 at 1.25 ms a step is 800 tokens per second
    figure = serving_report.chart(tmp_path / "again.png", rows, environment)
    axes = figure.axes[-1]
    bars = [c for c in axes.containers if c.get_label() == "launchless-compiled-kernels"]
    assert len(bars) == 1 and [round(b.get_height()) for b in bars[0]] == [800]
