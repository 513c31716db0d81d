"""CPU tests for the `launchless bench` outputs: stats, Markdown, JSON, rich table and chart from synthetic rows.

Expected numbers are recomputed here from the synthetic medians (plain math), never copied from the code's output.
"""

from __future__ import annotations

import io
import json
import math
import re
import statistics

import pytest
from rich.console import Console

from launchless.apps.bench import bench_report, report, stats

ENV = {
    "date": "2026-11-29T18:00:00+00:00",
    "gpu": "NVIDIA H200",
    "driver": "575.57.08",
    "torch": "2.14.1+cu129",
    "triton": "3.6.0",
    "cuda": "12.9",
    "python": "3.12.3",
}
SUITE = "quick"


def row(
    workload: str,
    mode: str,
    median: float | None = None,
    *,
    status: str = "ok",
    reason: str | None = None,
    floor: float | None = None,
    corr: str = "bit-identical",
    diff: float | None = None,
    kind: str = "inference",
    first: float | None = 50.0,
    mem: float | None = 512.0,
) -> dict:
    ok = status == "ok"
    return {
        "workload": workload,
        "mode": mode,
        "kind": kind,
        "status": status,
        "reason": reason,
        "median_ms": median if ok else None,
        "min_ms": median * 0.95 if ok and median is not None else None,
        "calls": 100 if ok else None,
        "first_call_ms": first if ok else None,
        "peak_mem_mb": mem if ok else None,
        "kernel_floor_ms": floor if ok else None,
        "correctness": {"status": corr if ok else "n/a", "max_abs_diff": diff},
        "wall_s": 3.0,
    }


# Medians in ms per (workload, mode); None = no row at all for that pair.
MEDIANS = {
    "timm:resnet18": {"eager": 2.0, "compile": 1.6, "reduce-overhead": 0.8, "hand-graph": 0.7, "launchless": 0.72},
    "hf:bert-base": {"eager": 4.0, "compile": None, "reduce-overhead": 1.5, "hand-graph": 1.3, "launchless": 1.25},
    "train:resnet18": {"eager": 9.0, "compile": 7.5, "reduce-overhead": 6.0, "hand-graph": None, "launchless": 6.5},
    "timm:vit_tiny": {"eager": None, "compile": 3.0, "reduce-overhead": 2.0, "hand-graph": 1.9, "launchless": 1.8},
}
FLOORS = {"timm:resnet18": 0.5, "hf:bert-base": None, "train:resnet18": 5.0, "timm:vit_tiny": 1.0}
SKIP_REASON = "torch.compile: dynamic control flow in BertSelfAttention (modeling_bert.py:412)"
ERROR_REASON = "CaptureError: aten::nonzero syncs with the host (vit.py:88)"
HAND_SKIP_REASON = "hand-graph: optimizer.step cannot be captured without capturable=True"


def make_rows() -> list[dict]:
    rows = []
    for workload, per_mode in MEDIANS.items():
        kind = "training" if workload.startswith("train:") else "inference"
        for mode, median in per_mode.items():
            if median is None:
                continue
            corr = "reference" if mode == "eager" else ("differs" if mode == "compile" else "bit-identical")
            diff = 2.1e-06 if corr == "differs" else None
            floor = FLOORS[workload] if mode in ("eager", "launchless") else None
            rows.append(row(workload, mode, median, floor=floor, corr=corr, diff=diff, kind=kind))
    rows.append(row("hf:bert-base", "compile", status="skipped", reason=SKIP_REASON))
    rows.append(row("timm:vit_tiny", "eager", status="error", reason=ERROR_REASON))
    rows.append(row("train:resnet18", "hand-graph", status="skipped", reason=HAND_SKIP_REASON, kind="training"))
    return rows


def ran(workload: str, mode: str) -> float | None:
    return MEDIANS[workload].get(mode)


def expected_speedups(baseline: str, mode: str) -> dict[str, float]:
    out = {}
    for workload in MEDIANS:
        base, this = ran(workload, baseline), ran(workload, mode)
        if base is not None and this is not None:
            out[workload] = base / this
    return out


def direct_geomean(values: list[float]) -> float:
    return math.prod(values) ** (1 / len(values))


# --- stats ----------------------------------------------------------------------------------------------------


def test_geomean_matches_direct_computation() -> None:
    values = [1.5, 0.25, 3.0, 7.0]
    assert stats.geomean(values) == pytest.approx(direct_geomean(values), rel=1e-12)
    assert stats.geomean([2.0, 0.5]) == pytest.approx(1.0)


def test_geomean_ignores_missing_and_non_positive() -> None:
    assert stats.geomean([None, 4.0, 0.0, -3.0, 9.0, float("nan")]) == pytest.approx(direct_geomean([4.0, 9.0]))
    assert stats.geomean([]) is None
    assert stats.geomean([None, 0.0, -1.0]) is None


def test_median_and_min() -> None:
    times = [3.0, 1.0, 2.5, 8.0, 2.0, 1.5]
    median, low = stats.median_and_min(times)
    assert median == statistics.median(times)
    assert low == min(times)
    assert stats.median_and_min([4.0]) == (4.0, 4.0)
    with pytest.raises(ValueError):
        stats.median_and_min([])


def test_speedups_vs_eager_only_where_both_ran() -> None:
    got = stats.speedups(make_rows(), "eager")
    for mode in ("eager", "compile", "reduce-overhead", "hand-graph", "launchless"):
        want = expected_speedups("eager", mode)
        assert got[mode].keys() == want.keys(), mode
        for workload, value in want.items():
            assert got[mode][workload] == pytest.approx(value), (mode, workload)
    # eager errored on vit_tiny, so no mode has a speed-up there; bert compile was skipped.
    assert all("timm:vit_tiny" not in per_workload for per_workload in got.values())
    assert "hf:bert-base" not in got["compile"]


def test_speedups_vs_reduce_overhead() -> None:
    got = stats.speedups(make_rows(), "reduce-overhead")
    want = expected_speedups("reduce-overhead", "launchless")
    assert set(want) == set(MEDIANS)  # reduce-overhead ran everywhere, so vit_tiny counts here
    assert got["launchless"] == pytest.approx(want)


def test_summary_values() -> None:
    rows = make_rows()
    summ = stats.summary(rows)
    assert set(summ) == {
        "geomean_vs_eager",
        "geomean_vs_reduce_overhead",
        "floor_ratio",
        "worst_vs_best_pytorch",
        "geomean_first_call_vs_reduce_overhead",
        "latency_geomean_vs_eager",
        "latency_geomean_vs_reduce_overhead",
        "latency_worst_vs_best_pytorch",
    }
    assert summ["latency_geomean_vs_reduce_overhead"] == {}  # these rows predate the latency measure
    for mode in ("compile", "reduce-overhead", "hand-graph", "launchless"):
        want = direct_geomean(list(expected_speedups("eager", mode).values()))
        assert summ["geomean_vs_eager"][mode] == pytest.approx(want), mode
        want_ro = direct_geomean(list(expected_speedups("reduce-overhead", mode).values()))
        assert summ["geomean_vs_reduce_overhead"][mode] == pytest.approx(want_ro), mode
    assert summ["geomean_vs_eager"]["eager"] == pytest.approx(1.0)
    # floor ratio: each row's median over its own floor, only where a floor was measured.
    for mode in ("eager", "launchless"):
        ratios = [
            MEDIANS[w][mode] / FLOORS[w] for w in MEDIANS if MEDIANS[w].get(mode) is not None and FLOORS[w] is not None
        ]
        assert summ["floor_ratio"][mode] == pytest.approx(direct_geomean(ratios)), mode
    assert "compile" not in summ["floor_ratio"]  # no compile row has a floor


def test_latency_is_compared_on_its_own_times_and_shown_with_what_it_adds() -> None:
    # back-to-back, launchless-compile and reduce-overhead tie; waited for, reduce-overhead's host work shows
    times = {  # workload: {mode: (back-to-back median, latency)}
        "a": {"compile": (2.0, 2.4), "reduce-overhead": (1.0, 1.5), "launchless-compile": (1.0, 1.1)},
        "b": {"compile": (4.0, 4.2), "reduce-overhead": (3.0, 3.6), "launchless-compile": (3.0, 3.3)},
        "c": {"compile": (1.0, 1.1), "reduce-overhead": (1.0, 1.2), "launchless-compile": (1.0, 1.25)},
    }
    rows = []
    for workload, per_mode in times.items():
        for mode, (median, latency) in per_mode.items():
            rows.append({**row(workload, mode, median), "latency_ms": latency})
    summ = stats.summary(rows)
    assert summ["geomean_vs_reduce_overhead"]["launchless-compile"] == pytest.approx(1.0)
    want = direct_geomean([1.5 / 1.1, 3.6 / 3.3, 1.2 / 1.25])
    assert summ["latency_geomean_vs_reduce_overhead"]["launchless-compile"] == pytest.approx(want)
    assert summ["latency_worst_vs_best_pytorch"]["launchless-compile"] == pytest.approx(1.1 / 1.25)
    md = bench_report.markdown({"gpu": "H200"}, "compiler", rows)
    assert "## One call waited for" in md
    assert "| `a` | 2.40 (+0.400) | 1.50 (+0.500) | 1.10 (+0.100) |" in md
    line = next(x for x in md.splitlines() if x.startswith("- **launchless-compile**"))
    assert f"latency {want:.2f}× vs reduce-overhead (3)" in line, line
    # a row that lost its latency (older JSON merged in) is left out of the mean, not counted as zero
    del rows[-1]["latency_ms"]
    assert stats.summary(rows)["latency_geomean_vs_reduce_overhead"]["launchless-compile"] == pytest.approx(
        direct_geomean([1.5 / 1.1, 3.6 / 3.3])
    )


def test_summary_of_nothing_is_empty() -> None:
    assert all(v == {} for v in stats.summary([]).values())
    only_skips = [row("a", "eager", status="skipped", reason="no GPU")]
    assert stats.summary(only_skips)["geomean_vs_eager"] == {}


def test_only_ok_rows_count_even_with_a_median() -> None:
    """A pair that errored after timing (say, failed correctness) still carries numbers; they must not count."""
    failed = row("w", "launchless", 0.25, floor=0.2) | {"status": "error", "reason": "output differs"}
    rows = [row("w", "eager", 1.0), failed, row("w", "compile", 0.5)]
    assert stats.speedups(rows, "eager") == {"eager": {"w": 1.0}, "compile": {"w": 1.0 / 0.5}}
    assert "launchless" not in stats.summary(rows)["floor_ratio"]


def test_repeated_pair_keeps_the_last_row() -> None:
    rows = [row("w", "eager", 1.0), row("w", "launchless", 0.8), row("w", "launchless", 0.4)]
    assert stats.speedups(rows, "eager")["launchless"] == {"w": pytest.approx(1.0 / 0.4)}


def test_mode_order_is_first_appearance() -> None:
    rows = [row("w1", "launchless", 1.0), row("w1", "eager", 2.0), row("w2", "compile", 1.0), row("w2", "eager", 1.0)]
    assert stats.ordered_modes(rows) == ["launchless", "eager", "compile"]
    assert stats.ordered_workloads(rows) == ["w1", "w2"]


# --- Markdown -------------------------------------------------------------------------------------------------


def md_table_rows(md: str, first_cell: str) -> list[list[str]]:
    """Cells of the Markdown table rows whose first cell is ``first_cell``."""
    out = []
    for line in md.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            if cells and cells[0] == first_cell:
                out.append(cells)
    return out


def test_markdown_header_has_environment() -> None:
    md = bench_report.markdown(ENV, SUITE, make_rows())
    header = md.splitlines()[2]
    for key in ("date", "gpu", "driver", "torch", "triton", "cuda"):
        assert ENV[key] in header, key
    assert SUITE in md.splitlines()[0]


def test_markdown_main_table() -> None:
    rows = make_rows()
    md = bench_report.markdown(ENV, SUITE, rows)
    modes = stats.ordered_modes(rows)
    header = md_table_rows(md, "workload")[0]
    # stable column order: modes as they first appear in the rows
    assert [h.split(" ")[0] for h in header[2 : 2 + len(modes)]] == modes
    for workload in MEDIANS:
        cells = md_table_rows(md, f"`{workload}`")
        assert len(cells) == 2, workload  # main table and first-call table
        main = dict(zip(header, cells[0], strict=True))
        for mode in modes:
            cell = main[f"{mode} ms (× eager)"]
            speedup = expected_speedups("eager", mode).get(workload)
            if speedup is not None:
                assert f"({speedup:.2f}×)" in cell, (workload, mode, cell)
            elif ran(workload, mode) is None:
                assert cell in ("—", "skipped", "error"), (workload, mode, cell)
    bert = dict(zip(header, md_table_rows(md, "`hf:bert-base`")[0], strict=True))
    assert bert["compile ms (× eager)"] == "skipped"
    vit = dict(zip(header, md_table_rows(md, "`timm:vit_tiny`")[0], strict=True))
    assert vit["eager ms (× eager)"] == "error"
    assert "×" not in vit["launchless ms (× eager)"]  # no eager baseline, so no speed-up
    train = dict(zip(header, md_table_rows(md, "`train:resnet18`")[0], strict=True))
    assert train["kind"] == "training"


def test_markdown_floor_and_correctness_columns() -> None:
    md = bench_report.markdown(ENV, SUITE, make_rows())
    header = md_table_rows(md, "workload")[0]
    res = dict(zip(header, md_table_rows(md, "`timm:resnet18`")[0], strict=True))
    assert float(res["eager floor ms"]) == pytest.approx(FLOORS["timm:resnet18"])
    assert res["best floor ms"].endswith("(eager)")  # eager and launchless share the floor; first wins
    assert "compile ≠ 2.1e-06" in res["correctness"]
    assert "launchless =" in res["correctness"]
    bert = dict(zip(header, md_table_rows(md, "`hf:bert-base`")[0], strict=True))
    assert bert["eager floor ms"] == "—"  # no floor measured
    assert bert["correctness"] == "all ="


def test_markdown_first_call_table() -> None:
    rows = [row("w", "eager", 1.0, first=12.5, mem=300.0), row("w", "launchless", 0.5, first=480.0, mem=1234.0)]
    md = bench_report.markdown(ENV, SUITE, rows)
    cells = md_table_rows(md, "`w`")[1]
    assert cells[1:] == ["12.5 ms / 300 MB", "480 ms / 1234 MB"]


def test_markdown_summary_and_skips() -> None:
    rows = make_rows()
    md = bench_report.markdown(ENV, SUITE, rows)
    summary_part = md.split("## Summary")[1].split("## Skipped")[0]
    for mode in ("compile", "reduce-overhead", "hand-graph", "launchless"):
        line = next(ln for ln in summary_part.splitlines() if ln.startswith(f"- **{mode}**"))
        speedups = expected_speedups("eager", mode)
        assert f"{direct_geomean(list(speedups.values())):.2f}× vs eager ({len(speedups)})" in line, line
    skips = md.split("## Skipped and failed")[1]
    for reason in (SKIP_REASON, ERROR_REASON, HAND_SKIP_REASON):
        assert reason in skips
    assert "`timm:vit_tiny` · eager · error" in skips
    assert len([ln for ln in skips.splitlines() if ln.startswith("- ")]) == 3


def test_markdown_reason_made_one_line_and_pipe_safe() -> None:
    rows = [row("w", "eager", 1.0), row("w", "compile", status="error", reason="Traceback\n  a | b\nBoom")]
    md = bench_report.markdown(ENV, SUITE, rows)
    assert "- `w` · compile · error: Traceback a | b Boom" in md
    # the table row still has one cell per column
    header = md_table_rows(md, "workload")[0]
    assert len(md_table_rows(md, "`w`")[0]) == len(header)


def test_markdown_without_problems_or_gpu() -> None:
    md = bench_report.markdown({}, SUITE, [row("w", "eager", 1.0), row("w", "launchless", 0.5)])
    assert "none: every listed workload ran" in md
    assert "GPU n/a" in md


# --- JSON -----------------------------------------------------------------------------------------------------


def test_json_round_trips_with_summary(tmp_path) -> None:
    rows = make_rows()
    path = report.write_all(tmp_path, ENV, SUITE, rows)["json"]
    assert path.name == "bench.json"
    doc = json.loads(path.read_text(encoding="utf-8"))
    assert set(doc) == {"environment", "suite", "rows", "summary"}
    assert doc["environment"] == ENV
    assert doc["suite"] == SUITE
    assert doc["rows"] == rows
    want = direct_geomean(list(expected_speedups("eager", "launchless").values()))
    assert doc["summary"]["geomean_vs_eager"]["launchless"] == pytest.approx(want)
    assert doc["summary"] == json.loads(json.dumps(stats.summary(rows)))


# --- chart ----------------------------------------------------------------------------------------------------

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_chart_writes_png_with_missing_modes(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "bench.png"
    bench_report.chart(path, make_rows(), ENV)
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC)
    assert len(data) > 1000


def test_chart_of_a_suite_without_eager_compares_with_reduce_overhead(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    rows = [
        row("a", "compile", 2.0),
        row("a", "reduce-overhead", 1.0, floor=0.5),
        row("a", "launchless-compile", 0.8),
        row("b", "reduce-overhead", 3.0),
        row("b", "launchless-compile", 3.3),
    ]
    fig = bench_report.chart(tmp_path / "bench.png", rows, ENV)
    ax = fig.axes[0]
    assert ax.get_title() == "speed-up over reduce-overhead"
    assert fig.texts[0].get_text().startswith("launchless bench: speed-up over reduce-overhead")  # the suptitle
    heights = sorted(round(bar.get_height() + bar.get_y(), 6) for bar in ax.patches)
    assert heights == sorted([0.5, 1.25, round(3.0 / 3.3, 6)])  # compile on a; launchless-compile on a and b
    assert [line.get_label() for line in ax.collections] == ["launch-free limit (reduce-overhead / its kernel floor)"]


@pytest.mark.parametrize(
    "rows",
    [
        [],
        [row("w", "eager", 1.0)],
        [row("w", "eager", 1.0, floor=0.25)],
        [row("w", "eager", status="error", reason="x"), row("w", "launchless", 0.5)],
        [row("w", "launchless", 0.5), row("w", "eager", 1.0), row("v", "eager", 2.0), row("v", "compile", 4.0)],
    ],
    ids=["empty", "eager-only", "eager-floor-only", "no-baseline", "slowdown"],
)
def test_chart_degenerate_inputs(tmp_path, rows: list[dict]) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "bench.png"
    bench_report.chart(path, rows, {})
    assert path.read_bytes().startswith(PNG_MAGIC)


def test_write_all(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    rows = make_rows()
    paths = report.write_all(tmp_path / "out", ENV, SUITE, rows)
    assert {p.name for p in paths.values()} == {"bench.json", "bench.md", "bench.png"}
    assert json.loads(paths["json"].read_text(encoding="utf-8"))["rows"] == rows
    assert paths["md"].read_text(encoding="utf-8") == bench_report.markdown(ENV, SUITE, rows)
    assert paths["png"].read_bytes().startswith(PNG_MAGIC)


# --- rich -----------------------------------------------------------------------------------------------------


def render(table) -> str:
    console = Console(record=True, width=200)
    console.print(table)
    return console.export_text()


def test_rich_table_renders_workloads_and_modes() -> None:
    rows = make_rows()
    text = render(bench_report.rich_table(ENV, SUITE, rows))
    for workload in MEDIANS:
        assert workload in text
    for mode in stats.ordered_modes(rows):
        assert mode in text
    speedup = expected_speedups("eager", "launchless")["timm:resnet18"]
    assert f"({speedup:.2f}×)" in text
    assert ENV["gpu"] in text
    assert "skipped" in text and "error" in text


def test_rich_table_colours_speedups() -> None:
    rows = [row("w", "eager", 1.0), row("w", "fast", 0.5), row("w", "slow", 2.0)]
    console = Console(record=True, width=200, color_system="standard", force_terminal=True, file=io.StringIO())
    console.print(bench_report.rich_table(ENV, SUITE, rows))
    text = console.export_text(styles=True)
    green, red = "\x1b[32m", "\x1b[31m"
    assert f"{green} ({1.0 / 0.5:.2f}×)" in text  # faster than eager
    assert f"{green} ({1.0:.2f}×)" in text  # eager itself: 1.0 counts as not slower
    assert f"{red} ({1.0 / 2.0:.2f}×)" in text  # slower than eager


def test_header_says_when_parts_ran_at_once_on_several_gpus() -> None:
    env = {"date": "2026-11-29", "gpu": "NVIDIA H200", "wall_s": 412.0}
    assert "run took 412 s" in bench_report.header_line(env) and "GPUs" not in bench_report.header_line(env)
    line = bench_report.header_line({**env, "gpus_at_once": 2})
    assert line.endswith("workloads dealt over 2 GPUs run at once (CPU cores split)")


def test_the_compiler_path_criteria_worst_against_pytorch_and_first_call_time() -> None:
    """The compiler path's bars: no workload slower than the faster PyTorch compile mode by more than 3 %, compile time
    relative to reduce-overhead."""
    rows = [
        row("a", "compile", 1.0, first=10_000.0),
        row("a", "reduce-overhead", 0.5, first=8_000.0),
        row("a", "launchless-compile", 0.4, first=12_000.0),
        row("b", "compile", 0.9, first=4_000.0),
        row("b", "reduce-overhead", 1.2, first=5_000.0),
        row("b", "launchless-compile", 1.0, first=5_000.0),  # slower than compile on this one
        row("c", "compile", 1.0),  # no reduce-overhead row: left out of both
        row("c", "launchless-compile", 0.1),
    ]
    worst = stats.vs_best_pytorch(rows)
    assert worst == {"launchless-compile": {"a": pytest.approx(0.5 / 0.4), "b": pytest.approx(0.9)}}
    summ = stats.summary(rows)
    assert summ["worst_vs_best_pytorch"] == {"launchless-compile": pytest.approx(0.9)}
    first = summ["geomean_first_call_vs_reduce_overhead"]
    assert first["launchless-compile"] == pytest.approx(direct_geomean([12_000 / 8_000, 5_000 / 5_000]))
    assert first["compile"] == pytest.approx(direct_geomean([10_000 / 8_000, 4_000 / 5_000]))
    line = next(
        ln for ln in bench_report.markdown(ENV, SUITE, rows).splitlines() if ln.startswith("- **launchless-compile")
    )
    assert "worst workload 0.90× the faster of compile and reduce-overhead" in line
    assert f"first call {first['launchless-compile']:.2f}× reduce-overhead's" in line


def test_the_compiled_kernels_section_reads_its_targets_off_the_rows(tmp_path) -> None:
    """When the compiled graph swapped in, what the calls cost meanwhile, and each target against the rows of the same
    run: the ratios recomputed here from the synthetic figures."""
    rows = [
        {**row("timm:resnet18", "launchless", 0.475, floor=0.40, first=120.0), "latency_ms": 0.50},
        {**row("timm:resnet18", "launchless-compile", 0.291, floor=0.27, first=30_000.0)},
        {**row("timm:resnet18", "reduce-overhead", 0.301, floor=0.264, first=25_000.0)},
        {
            **row("timm:resnet18", "launchless-compiled-kernels", 0.300, floor=0.27, first=130.0),
            "during_compile_ms": 0.52,
            "swap_s": 41.0,
            "compile_s": 38.5,
            "kernels": "compiled",
            "kernels_reason": "",
            "timeline": [[0.0, 130.0], [0.2, 0.52], [41.0, 0.31], [41.1, 0.30]],
        },
        {**row("hf:gpt2", "launchless", 1.81, first=200.0), "latency_ms": 1.9},
        {
            **row("hf:gpt2", "launchless-compiled-kernels", 1.80, first=210.0),
            "during_compile_ms": 1.95,
            "swap_s": None,
            "kernels": "eager",
            "kernels_reason": "the compiled program is not as accurate as eager: its error ...",
            "timeline": [[0.0, 210.0], [0.3, 1.9]],
        },
    ]
    from launchless.apps.bench import kernels_report

    by_key = stats.index(rows)
    met = kernels_report.targets("timm:resnet18", by_key)
    assert met["vs_launchless_compile"] == pytest.approx(0.300 / 0.291)
    assert met["vs_best_floor"] == pytest.approx(0.300 / 0.264)  # the best floor of any mode: reduce-overhead's
    assert met["targets"] == {
        "steady within 1.05x launchless-compile": 0.300 / 0.291 <= 1.05,
        "steady within 1.10x the best kernel floor": 0.300 / 0.264 <= 1.10,
        "first call within 1.2x launchless's": 130.0 <= 1.2 * 120.0,
        "first call at most 1/20 reduce-overhead's": 130.0 <= 25_000.0 / 20,
        "calls while compiling at most 10% slower": 0.52 <= 1.1 * 0.50,
        "swapped before reduce-overhead's compile ends": 41.0 <= 25.0,
    }
    assert kernels_report.targets("hf:gpt2", by_key)["targets"]["swapped before reduce-overhead's compile ends"] is None
    paced = [{**r, "early_ms": 0.45} if r["mode"] == "launchless" else r for r in rows]  # its early calls, paced alike
    during = kernels_report.targets("timm:resnet18", stats.index(paced))["targets"]
    assert during["calls while compiling at most 10% slower"] is (0.52 <= 1.1 * 0.45) is False
    text = bench_report.markdown(ENV, "kernels", rows)
    assert "## Compiled kernels without the compile wait" in text
    assert "eager (the compiled program is not as accurate as eager" in text
    resnet18 = next(line for line in text.splitlines() if line.startswith("| `timm:resnet18` | compiled"))
    assert resnet18.rstrip(" |").endswith(f"{41.0 / 25.0:.2f}×")  # the swap against reduce-overhead's first call
    rows[3] = {
        **rows[3],
        "compile_phases": {
            "start": 2.1, "start: GPU context": 1.2, "start: import Inductor": 0.9, "build": 0.4, "export": 1.3,
            "compile": 8.42,
        },
    }  # fmt: skip
    second = {
        **rows[3],
        "mode": "launchless-compiled-kernels-on-disk",
        "program": "found on disk",
        "swap_s": 0.4,
        "compile_phases": {},
        "read_s": 0.31,
        "program_format": "package",
        "proof_phases": {"read": 0.02, "capture": 0.05, "accuracy": 0.3, "speed": 0.13},
    }
    text = bench_report.markdown(ENV, "kernels", [*rows, second])
    assert "| `timm:resnet18` second process | compiled (program from disk) |" in text
    assert (
        "- `timm:resnet18`: start 2.1 (GPU context 1.2, import Inductor 0.9), build 0.4, export 1.3, compile 8.4 s"
        in (text)
    ), text
    assert (
        "- `timm:resnet18` (second process): read 0.31 s; the program kept as package; its proof's parts (seconds "
        "inside the calls): read 0.02, capture 0.05, accuracy 0.30, speed 0.13"
    ) in text, text
    met = kernels_report.targets("timm:resnet18", stats.index([*rows, second]))
    assert met["second_process"]["swap_s"] == 0.4
    assert met["targets"]["a second process replays compiled kernels within 1 s"] is True
    compiled_again = {**second, "program": "compiled"}  # nothing found on disk: the target is missed
    met = kernels_report.targets("timm:resnet18", stats.index([*rows, compiled_again]))
    assert met["targets"]["a second process replays compiled kernels within 1 s"] is False
    assert "a second process" not in str(kernels_report.targets("hf:gpt2", by_key)["targets"])  # not run there
    paths = report.write_all(tmp_path, ENV, "kernels", rows)
    assert paths["timeline"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "timeline" not in report.write_all(tmp_path / "quick", ENV, "quick", rows)


def test_a_training_steps_compiled_kernels_are_held_to_compiles_kernel_floor() -> None:
    """``graphed_step(kernels="compiled")``: no launchless-compile row for a training step; its own target is the
    kernel floor of compile's step, in its own column of the targets table."""
    from launchless.apps.bench import kernels_report

    rows = [
        {**row("timm:resnet18", "launchless-compile", 0.291, floor=0.27), "latency_ms": 0.3},
        {**row("timm:resnet18", "launchless-compiled-kernels", 0.300, floor=0.27), "kernels": "compiled"},
        {**row("train:resnet18", "compile", 2.2, floor=1.34), "kind": "training"},
        {**row("train:resnet18", "launchless", 1.55, floor=1.5), "kind": "training"},
        {
            **row("train:resnet18", "launchless-compiled-kernels", 1.40, floor=1.33),
            "kind": "training",
            "kernels": "compiled",
        },
    ]
    by_key = stats.index(rows)
    met = kernels_report.targets("train:resnet18", by_key)
    assert met["vs_compiled_floor"] == pytest.approx(1.40 / 1.34)
    assert met["targets"]["training step within 1.05x compile's kernel floor"] is (1.40 / 1.34 <= 1.05)
    assert met["targets"]["steady within 1.05x launchless-compile"] is None  # not a mode of training steps
    assert (
        "training step within 1.05x compile's kernel floor"
        not in kernels_report.targets("timm:resnet18", by_key)["targets"]
    )
    table = "\n".join(kernels_report.markdown_lines(rows))
    header = next(line for line in table.splitlines() if line.startswith("| workload | steady within"))
    assert header.endswith("| training step within 1.05x compile's kernel floor |")
    resnet = next(
        line
        for line in table.splitlines()
        if line.startswith("| `timm:resnet18` | yes") or line.startswith("| `timm:resnet18` | **no**")
    )
    assert resnet.count("|") == header.count("|")  # the inference row has a cell for the training target too


def test_the_report_says_where_each_workload_comes_from_where_its_entry_says() -> None:
    """The grace suite marks each workload GraCE's own or a stand-in: the report lists that, and nothing for
    workloads that say nothing."""
    from launchless.apps.bench import workloads

    grace = [w for w in workloads.suite(workloads.GRACE)]
    assert grace and all(w.origin for w in grace)
    rows = [row(w.name, mode, 1.0) for w in grace for mode in ("eager", "launchless")]
    md = bench_report.markdown(ENV, workloads.GRACE, rows)
    section = md.split("## Where the workloads come from", 1)[1]
    for w in grace:
        assert f"- `{w.name}`: {w.origin}" in section
    assert sum("GraCE's own" in w.origin for w in grace) >= 4
    assert "## Where the workloads come from" not in bench_report.markdown(ENV, SUITE, make_rows())


def test_a_trace_says_which_kernels_ran_inside_graphs_and_what_the_copies_moved() -> None:
    """A kernel whose correlation id points to a graph launch ran inside the graph; one launched by the host itself
    (through the runtime or the driver, as Triton launches), or whose launch the trace lacks, ran outside. Copies
    count their bytes whoever launched them."""
    from launchless.apps.bench.measure import trace_counts

    def kernel(name: str, correlation: int) -> dict:
        return {"cat": "kernel", "name": name, "args": {"correlation": correlation}}

    events = [
        {"cat": "cuda_runtime", "name": "cudaGraphLaunch", "args": {"correlation": 1}},
        kernel("gemm", 1),
        kernel("relu", 1),
        kernel("softmax", 1),
        {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "args": {"correlation": 2}},
        kernel("argmax", 2),  # one kernel outside the graph
        {"cat": "cuda_runtime", "name": "cudaMemcpyAsync", "args": {"correlation": 3}},
        {"cat": "gpu_memcpy", "name": "Memcpy DtoD", "args": {"bytes": 4096, "correlation": 3}},
        {"cat": "gpu_memset", "name": "Memset", "args": {"bytes": 64}},
    ]
    assert trace_counts(events, calls=2) == (0.75, 2048.0)
    driver = [*events, {"cat": "cuda_driver", "name": "cuLaunchKernelEx", "args": {"correlation": 4}}, kernel("t", 4)]
    assert trace_counts(driver, calls=2)[0] == 0.6  # Triton launches through the driver
    assert trace_counts([*events, kernel("unknown", 9)], calls=2)[0] == 0.6  # a launch the trace lacks: outside
    eager = [e for e in events if e.get("name") != "cudaGraphLaunch"]
    assert trace_counts(eager, calls=1)[0] == 0.0
    assert trace_counts([], calls=1) == (None, 0.0)


def test_the_report_shows_kernels_inside_graphs_and_bytes_copied_where_measured() -> None:
    rows = [row("timm:resnet18", "eager", 2.0), row("timm:resnet18", "launchless", 0.7)]
    assert "Kernels inside graphs" not in bench_report.markdown(ENV, SUITE, rows)
    rows[0].update(graph_coverage=0.0, copy_bytes=0.0)
    rows[1].update(graph_coverage=0.994, copy_bytes=602112.0)
    text = bench_report.markdown(ENV, SUITE, rows)
    section = text[text.index("## Kernels inside graphs and bytes copied") :]
    assert "| `timm:resnet18` | 0% / 0 B | 99% / 602 kB |" in section


def test_the_grace_report_holds_launchless_graph_path_to_gracess_targets() -> None:
    """The grace report reads each workload on launchless's graph path -- launchless-compile's row for inference,
    launchless's (graphed_step) for training -- and holds it to GraCE's four targets: the population's geomean over
    reduce-overhead, the detectors', the worst workload against the faster of compile and reduce-overhead, and the
    first call against reduce-overhead's. The derived mode is never written to the record."""
    from launchless.apps.bench import workloads
    from launchless.apps.bench.bench_report import GRACE_TARGETS as GRACE

    detector, text, trained = workloads.MASK_RCNN, "grace:xlnet@b8", "grace:xlnet-train@b8"
    beside = "tv:fcos_resnet50_fpn"  # a detector run by name beside the suite: its target, not the population's
    rows = []
    for name, kind, ro, compiled, launchless, compile_ in (
        (detector, "inference", 10.0, 5.0, 9.0, 8.0),  # graph path: launchless-compile 5.0 (2.0x RO)
        (beside, "inference", 8.0, 4.0, 9.0, 8.0),  # 2.0x RO: the detectors' geomean stays 2.0
        (text, "inference", 4.0, 4.0, 2.0, 3.0),  # 1.0x RO, and 0.75x the faster compile (3.0): the worst
        (trained, "training", 9.0, 99.0, 3.0, 12.0),  # graph path: launchless 3.0 (3.0x RO), not launchless-compile
    ):
        rows += [
            row(name, "eager", 20.0, kind=kind, first=10.0),
            row(name, "compile", compile_, kind=kind, first=1000.0),
            row(name, "reduce-overhead", ro, kind=kind, first=1000.0),
            row(name, "launchless-compile", compiled, kind=kind, first=4000.0),
            row(name, "launchless", launchless, kind=kind, first=500.0),
        ]
    md = bench_report.markdown(ENV, workloads.GRACE, rows)
    targets = md.split("## Targets", 1)[1].split("\n## ", 1)[0]
    population = (2.0 * 1.0 * 3.0) ** (1 / 3)
    first_call = (4.0 * 4.0 * 4.0 * 0.5) ** (1 / 4)  # launchless-compile's 4 s thrice, graphed_step's 0.5 s once
    lines = {t.measured: next(line for line in targets.splitlines() if t.measured in line) for t in GRACE.values()}
    assert f"{population:.2f}×" in lines["reduce-overhead's speed, geomean over GraCE's population"]
    assert lines["reduce-overhead's speed, geomean over GraCE's population"].endswith("| yes |")
    assert "2.00×" in lines["reduce-overhead's speed, geomean over the torchvision detectors"]
    assert lines["reduce-overhead's speed, geomean over the torchvision detectors"].endswith("| yes |")
    assert "0.75×" in lines["the speed of the faster of compile and reduce-overhead, worst workload"]
    assert lines["the speed of the faster of compile and reduce-overhead, worst workload"].endswith("| **no** |")
    assert f"{first_call:.2f}×" in lines["reduce-overhead's first call (its compile), geomean"]
    assert lines["reduce-overhead's first call (its compile), geomean"].endswith("| **no** |")  # 2.38 > 2.21
    grace = len(workloads.suite(workloads.GRACE))
    assert f"Detectors measured: 2 of {len(workloads.DETECTORS)}. GraCE's population measured: 3 of {grace}." in targets
    assert "launchless-graph-path" in md.split("## Summary", 1)[0]  # a column of its own in the tables
    assert "## Targets" not in bench_report.markdown(ENV, SUITE, make_rows())
    assert all(r["mode"] != stats.GRAPH_PATH for r in rows)  # derived for the report, not added to the record


def test_the_grace_targets_read_a_race_where_the_workload_was_raced() -> None:
    """Where compile, reduce-overhead and the graph path were raced in one process, the targets take their speed from
    the race (separate processes cannot tell modes a few percent apart); the race has a section of its own and no
    column among the modes."""
    from launchless.apps.bench import workloads
    from launchless.apps.bench.modes import RACED

    text, trained = "grace:xlnet@b8", "grace:xlnet-train@b8"
    rows = []
    for name, kind, ro, compiled, launchless, compile_ in (
        (text, "inference", 4.0, 4.0, 2.0, 3.0),  # apart: 0.75x the faster compile
        (trained, "training", 9.0, 99.0, 3.0, 12.0),
    ):
        rows += [
            row(name, "compile", compile_, kind=kind, first=1000.0),
            row(name, "reduce-overhead", ro, kind=kind, first=1000.0),
            row(name, "launchless-compile", compiled, kind=kind, first=4000.0),
            row(name, "launchless", launchless, kind=kind, first=500.0),
        ]
    raced = {"status": "ok", "reason": None, "mode": RACED}
    rows += [
        {**raced, "workload": text, "kind": "inference"}
        | {"raced_ms": {"compile": 3.0, "reduce-overhead": 4.0, "launchless-compile": 2.9}},
        {**raced, "workload": trained, "kind": "training"}
        | {"raced_ms": {"compile": 12.0, "reduce-overhead": 9.0, "launchless": 3.6}},
    ]
    md = bench_report.markdown(ENV, workloads.GRACE, rows)
    targets = md.split("## Targets", 1)[1].split("\n## ", 1)[0]
    worst = next(line for line in targets.splitlines() if "worst workload" in line)
    assert f"{3.0 / 2.9:.2f}×" in worst and worst.endswith("| yes |")  # the race's 2.9 ms, not the row's 4.0
    population = next(line for line in targets.splitlines() if "GraCE's population" in line)
    assert f"{((4.0 / 2.9) * (9.0 / 3.6)) ** 0.5:.2f}×" in population
    assert "Raced in one process: 2 of 2 workloads." in targets
    section = md.split("## Raced in one process", 1)[1].split("\n## ", 1)[0]
    assert f"| `{text}` | 3.00 | 4.00 | 2.90 | {4.0 / 2.9:.2f}× | {3.0 / 2.9:.2f}× |" in section
    assert f"{RACED} ms" not in md.split("## Summary", 1)[0]  # no column of its own
    failed = [
        {**r, "status": "error", "reason": "out of memory"} if r["mode"] == RACED and r["workload"] == text else r
        for r in rows
    ]
    md = bench_report.markdown(ENV, workloads.GRACE, failed)
    targets = md.split("## Targets", 1)[1].split("\n## ", 1)[0]
    assert "0.75×" in next(line for line in targets.splitlines() if "worst workload" in line)  # the modes' own rows
    assert f"- `{text}` · {RACED} · error: out of memory" in md.split("## Skipped and failed", 1)[1]
