"""The matrix as files: ``conformance.json`` (a list of rows), ``conformance.md`` (the table, per task, with the
summary against the targets) and ``conformance.png`` (speed-up over eager per model, coloured by status)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

Row = Mapping[str, Any]
ACCELERATED = ("graph", "split")
COLOURS = {"graph": "C2", "split": "C0", "eager": "C7", "error": "C3"}


def summary(rows: Sequence[Row]) -> dict[str, Any]:
    """What the matrix says against its targets: accelerated and verified, fast enough, never slower."""
    total = len(rows)
    counts = {status: sum(r["status"] == status for r in rows) for status in (*ACCELERATED, "eager", "error")}
    accelerated = [r for r in rows if r["status"] in ACCELERATED and r["verified"]]
    fast = [r for r in rows if (r.get("speedup") or 0) >= 1.2 and r["status"] in ACCELERATED and r["verified"]]
    slower = [r["model"] for r in rows if r.get("speedup") is not None and r["speedup"] < 1.0]
    speedups = [r["speedup"] for r in accelerated if r.get("speedup")]
    return {
        "models": total,
        "tasks": len({r["task"] for r in rows}),
        "counts": counts,
        "accelerated_verified": len(accelerated),
        "accelerated_verified_share": round(len(accelerated) / total, 4) if total else None,
        "at_least_1_2x": len(fast),
        "at_least_1_2x_share": round(len(fast) / total, 4) if total else None,
        "slower_than_eager": slower,
        "geomean_speedup_accelerated": round(math.exp(sum(map(math.log, speedups)) / len(speedups)), 3)
        if speedups
        else None,
        "not_identical_to_eager": [r["model"] for r in rows if r["status"] != "error" and not r["identical_to_eager"]],
        "eager": {r["model"]: r.get("reason") for r in rows if r["status"] in ("eager", "error")},
    }


def write_json(path: Path, environment: Mapping[str, Any], rows: Sequence[Row]) -> None:
    """A list of rows; each carries the GPU, versions and date it was measured with (its own, where it has them:
    a merged matrix keeps each part's)."""
    env = {k: environment.get(k) for k in ("date", "gpu", "driver", "cuda", "torch", "triton", "python")}
    path.write_text(json.dumps([{**env, **row} for row in rows], indent=1) + "\n", encoding="utf-8")


def environment_of(rows: Sequence[Row]) -> dict[str, Any]:
    """Where the rows were measured (the first row's record; the latest date among them)."""
    keys = ("date", "gpu", "driver", "cuda", "torch", "triton", "python")
    env = {k: next((r[k] for r in rows if r.get(k)), None) for k in keys}
    dates = [r["date"] for r in rows if r.get("date")]
    env["date"] = max(dates) if dates else None
    return env


def _num(value: Any, digits: int = 2, suffix: str = "") -> str:
    return "—" if value is None else f"{value:.{digits}f}{suffix}"


def _cell(text: Any) -> str:
    return "" if text is None else str(text).replace("|", "\\|").replace("\n", " ")


def markdown(environment: Mapping[str, Any], rows: Sequence[Row]) -> str:
    s = summary(rows)
    env = ", ".join(f"{k} {environment[k]}" for k in ("gpu", "driver", "cuda", "torch", "triton") if environment.get(k))
    lines = [
        '# Conformance: every model through `launchless.wrap(model, cuda_graph="auto")`',
        "",
        f"{environment.get('date', '')} · {env} · batch 1, random weights, `torch.no_grad()`",
        "",
        f"- {s['models']} models, {s['tasks']} tasks: {s['counts']['graph']} whole graph, {s['counts']['split']} "
        f"split, {s['counts']['eager']} eager, {s['counts']['error']} errors.",
        f"- Accelerated with a verified result: {s['accelerated_verified']} "
        f"({_num(100 * (s['accelerated_verified_share'] or 0), 1)} %); at ≥1.2× over eager back to back: "
        f"{s['at_least_1_2x']} ({_num(100 * (s['at_least_1_2x_share'] or 0), 1)} %); geometric mean over the "
        f"accelerated: {_num(s['geomean_speedup_accelerated'])}×.",
        f"- Slower than eager: {', '.join(s['slower_than_eager']) or 'none'}. Not bit-identical to eager on the "
        f"fresh-input check: {', '.join(s['not_identical_to_eager']) or 'none'}.",
        "",
        "Speed-up: eager's median over launchless's, CUDA events back to back, and waited-for (the GPU idle before"
        " each call). Capture: the first call's wall time (warm-up, capture and verification, or the split "
        "search). Share: the pieces' part of the eager forward's GPU time (split rows).",
        "",
    ]
    for task in dict.fromkeys(r["task"] for r in rows):
        lines += [
            f"## {task}",
            "",
            "| model | status | verified | identical | speed-up | waited | eager ms | capture s | graph MB | share "
            "| eager because |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in (r for r in rows if r["task"] == task):
            verified = f"{'yes' if r['verified'] else 'no'}" + (f" ({r['verification']})" if r["verification"] else "")
            why = r.get("reason") if r["status"] in ("eager", "error") or r.get("split_by") == "operation" else None
            if why and r.get("source"):
                why = f"{why} at {r['source']}"
            lines.append(
                "| "
                + " | ".join(
                    [
                        _cell(r["model"]),
                        r["status"],
                        _cell(verified),
                        "—" if r["identical_to_eager"] is None else ("yes" if r["identical_to_eager"] else "no"),
                        _num(r.get("speedup"), 2, "×"),
                        _num(r.get("speedup_waited"), 2, "×"),
                        _num(r.get("eager_ms"), 3),
                        _num(r.get("capture_s"), 1),
                        _num(r.get("graph_mb"), 1),
                        _num(None if r.get("captured_share") is None else 100 * r["captured_share"], 0, " %"),
                        _cell(why),
                    ]
                )
                + " |"
            )
        lines.append("")
    return "\n".join(lines)


def chart(path: Path, environment: Mapping[str, Any], rows: Sequence[Row]) -> None:
    """Horizontal bars of speed-up over eager (log scale), one per model, grouped by task, coloured by status."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    tasks = list(dict.fromkeys(r["task"] for r in rows))
    shown = sorted((r for r in rows if r.get("speedup")), key=lambda r: tasks.index(r["task"]))
    fig = Figure(figsize=(8.0, max(3.0, 0.22 * len(shown) + 1.5)), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ys = list(range(len(shown)))[::-1]
    ax.barh(ys, [r["speedup"] for r in shown], color=[COLOURS.get(r["status"], "C7") for r in shown])
    ax.set_yticks(ys)
    ax.set_yticklabels([f"{r['model']} ({r['task']})" for r in shown], fontsize=6)
    ax.set_xscale("log")
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.axvline(1.2, color="grey", linewidth=0.6, linestyle="--")
    ax.set_xlabel("speed-up over eager, batch 1, back to back (×, log scale)")
    ax.set_title(f"launchless conformance · {environment.get('gpu', '')} · {environment.get('date', '')}", fontsize=9)
    ax.legend(handles=[Patch(color=c, label=s) for s, c in COLOURS.items()], fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, format="png")


def write_all(out_dir: Path, environment: Mapping[str, Any], rows: Sequence[Row]) -> dict[str, Path]:
    paths = {"json": out_dir / "conformance.json", "md": out_dir / "conformance.md", "png": out_dir / "conformance.png"}
    write_json(paths["json"], environment, rows)
    paths["md"].write_text(markdown(environment, rows), encoding="utf-8")
    chart(paths["png"], environment, rows)
    return paths
