"""CPU tests of the conformance matrix: rows classified from ``graph_info()``, the report files, ``launchless
verify`` with a model of the user's own, and -- as far as a CPU allows -- every zoo model built with its inputs
and diagnosed on the meta device (a model that stops building is caught here, not on the GPU)."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
import torch

from launchless.apps import cli, zoo
from launchless.apps.conformance import report
from launchless.apps.conformance.check import classify_info, dry_check, empty_row
from launchless.apps.conformance.user_model import ModelSpecError, load


def _info(**overrides) -> dict:
    info = {"graphs": [], "split": None, "fallbacks": [], "eager_calls": {}, "pool_bytes": 0}
    return info | overrides


def _classified(info: dict) -> dict:
    row = empty_row("m", "task")
    classify_info(row, info)
    return row


def test_a_whole_graph_row() -> None:
    graph = {"replays": 3, "verification": {"status": "bit-identical", "passed": True}}
    row = _classified(_info(graphs=[graph], pool_bytes=3 * 2**20))
    assert (row["status"], row["verified"], row["verification"], row["graph_mb"]) == ("graph", True, "bit-identical", 3)


def test_a_split_row_and_a_dropped_split_row() -> None:
    split = {
        "pieces": [{"module": "backbone", "graphs": 1, "pool_bytes": 2**20}, {"module": "head", "graphs": 0}],
        "eager": [{"module": "(root)", "reason": "host copy", "source": "det.py:9"}],
        "signatures": [
            {"status": "verified", "verification": {"status": "bit-identical"}, "captured_share": 0.8, "detail": ""}
        ],
    }
    row = _classified(_info(split=split))
    assert row["status"] == "split" and row["verified"] and row["pieces"] == ["backbone"]
    assert (row["captured_share"], row["graph_mb"], row["source"]) == (0.8, 1.0, "det.py:9")
    split["signatures"][0] |= {"status": "dropped", "detail": "not faster than eager"}
    row = _classified(_info(split=split))
    assert row["status"] == "eager" and not row["verified"]
    assert row["reason"] == "host copy; split dropped: not faster than eager"


def test_a_region_split_row_names_the_operations_run_eager_between_graphs() -> None:
    region = {
        "graphs": 5,
        "eager_ops": [{"op": "aten::_grouped_mm", "source": "moe.py:332"}] * 4,
        "source": "moe.py:332",
    }
    graph = {"replays": 3, "verification": {"status": "bit-identical", "passed": True}, "region_split": region}
    row = _classified(_info(graphs=[graph]))
    assert (row["status"], row["split_by"], row["verified"]) == ("split", "operation", True)
    assert row["pieces"] == ["5 graphs"]
    assert row["eager_parts"] == ["aten::_grouped_mm"] and row["source"] == "moe.py:332"
    assert "aten::_grouped_mm" in report.markdown({}, [row | {"speedup": 2.0}])


def test_an_eager_row_names_the_reason_and_line() -> None:
    fallback = {"reason": "host sync", "source": "m.py:3"}
    row = _classified(_info(fallbacks=[fallback]))
    assert (row["status"], row["reason"], row["source"]) == ("eager", "host sync", "m.py:3")


def _row(model: str, task: str, status: str, speedup: float | None, verified: bool = True) -> dict:
    row = empty_row(model, task)
    row.update(status=status, verified=verified, speedup=speedup, identical_to_eager=status != "error")
    return row


def test_the_report_files_and_the_summary_against_the_targets(tmp_path) -> None:
    rows = [
        _row("a", "classification", "graph", 3.0),
        _row("b", "detection", "split", 1.1),
        _row("c", "detection", "eager", 0.98, verified=False),
        _row("d", "video", "error", None, verified=False),
    ]
    s = report.summary(rows)
    assert s["counts"] == {"graph": 1, "split": 1, "eager": 1, "error": 1}
    assert (s["accelerated_verified"], s["at_least_1_2x"], s["slower_than_eager"]) == (2, 1, ["c"])
    environment = {"date": "2026-12-01", "gpu": "NVIDIA H200", "torch": "2.11"}
    paths = report.write_all(tmp_path, environment, rows)
    data = json.loads(paths["json"].read_text())
    assert isinstance(data, list) and [r["model"] for r in data] == ["a", "b", "c", "d"]
    assert all({"model", "task", "status", "verified", "speedup", "gpu", "torch"} <= set(r) for r in data)
    md = paths["md"].read_text()
    assert "## detection" in md and "| b | split |" in md and "Slower than eager: c" in md
    assert paths["png"].stat().st_size > 1000


def test_verify_loads_a_users_module_function_and_diagnoses_it_without_a_gpu(tmp_path, monkeypatch, capsys) -> None:
    (tmp_path / "my_models.py").write_text(
        textwrap.dedent(
            """
            import torch

            class Net(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.fc = torch.nn.Linear(4, 4)

                def forward(self, x):
                    return self.fc(x) * x.sum().item()  # a host sync

            def build():
                return Net(), lambda: ((torch.randn(2, 4),), {})
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    model, make, task = load("my_models:build", device="cpu")
    assert isinstance(model, torch.nn.Module) and not model.training and task == "user"
    args, kwargs = make()
    assert args[0].shape == (2, 4) and kwargs == {}
    row = dry_check(model, make(), name="my_models:build", task=task)
    assert row["blocker"] and "host sync" in row["blocker"], row
    if not torch.cuda.is_available():
        assert cli.main(["verify", "my_models:build"]) == 2
        assert "host sync" in capsys.readouterr().out
    with pytest.raises(ModelSpecError, match="is not a zoo workload"):
        load("no_such_thing", device="cpu")
    with pytest.raises(ModelSpecError, match="cannot load"):
        load("no_such_module_here:build", device="cpu")
    sys.modules.pop("my_models", None)


def test_a_users_builder_that_raises_or_returns_no_pair_is_an_argument_error(tmp_path, monkeypatch, capsys) -> None:
    """The user's function is their code: what it raised (or that it returned no (model, inputs) pair) is said in
    one line with exit code 2, not a traceback of launchless's."""
    (tmp_path / "broken_models.py").write_text(
        "def needs_an_argument(size):\n    return None\n\ndef one_thing():\n    return 'model'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for spec, said in (
        ("broken_models:needs_an_argument", "raised TypeError"),
        ("broken_models:one_thing", "returned str where a pair (model, inputs) was expected"),
    ):
        with pytest.raises(SystemExit) as exited:
            cli.main(["verify", spec])
        assert exited.value.code == 2
        err = capsys.readouterr().err
        assert said in err and "Traceback" not in err, err
    sys.modules.pop("broken_models", None)


def test_conformance_list_shows_what_the_arguments_chose_and_refuses_unknown_names(capsys) -> None:
    assert cli.main(["conformance", "--tasks", "detection", "--list"]) == 0
    listed = capsys.readouterr().out
    assert listed.startswith("detection: ") and "classification" not in listed
    for arguments, said in ((["--models", "nosuch"], "unknown model(s) nosuch"), (["--tasks", "x"], "unknown task")):
        with pytest.raises(SystemExit) as exited:
            cli.main(["conformance", *arguments, "--list"])
        assert exited.value.code == 2 and said in capsys.readouterr().err


def test_conformance_refuses_gpus_that_are_not_there_before_any_worker_starts(monkeypatch, capsys) -> None:
    from launchless.apps.conformance import runner

    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 2)
    monkeypatch.setattr("torch.cuda.get_device_name", lambda i: "NVIDIA H200")
    monkeypatch.setattr(runner, "run_matrix", lambda *a, **k: pytest.fail("a worker started"))
    for gpus, said in ((["0", "3"], r"has 2 GPU(s) (0..1)"), (["1", "1"], "name each at most once")):
        with pytest.raises(SystemExit) as exited:
            cli.main(["conformance", "--models", "timm:resnet18", "--gpus", *gpus])
        assert exited.value.code == 2 and said in capsys.readouterr().err


def test_models_run_task_by_task_and_a_resumed_run_keeps_earlier_rows(tmp_path) -> None:
    from launchless.apps.conformance.command import interleaved
    from launchless.apps.conformance.runner import run_matrix

    assert interleaved({"a": ["a1", "a2", "a3"], "b": ["b1"], "c": ["c1", "c2"]}) == [
        "a1",
        "b1",
        "c1",
        "a2",
        "c2",
        "a3",
    ]
    first, second = _row("a1", "a", "graph", 2.0), _row("b1", "b", "split", 1.5)
    first |= {"gpu": "NVIDIA H200", "torch": "2.11.0", "date": "2026-12-01T01:00:00+00:00"}
    second |= {"gpu": "NVIDIA H200", "torch": "2.11.0", "date": "2026-12-01T02:00:00+00:00"}
    (tmp_path / "rows-20261201T010000-0.jsonl").write_text(json.dumps(first) + "\n")
    (tmp_path / "rows-20261201T020000-0.jsonl").write_text(json.dumps(second) + "\n")
    paths = run_matrix(["b1", "a1"], str(tmp_path), resume=True)  # nothing left to check: no GPU needed
    data = json.loads(paths["json"].read_text())
    assert [r["model"] for r in data] == ["b1", "a1"] and data[1]["date"].startswith("2026-12-01T01")
    assert "2026-12-01T02:00:00+00:00 · gpu NVIDIA H200" in paths["md"].read_text()


def test_every_task_the_matrix_needs_is_in_the_zoo() -> None:
    tasks = zoo.tasks()
    assert sum(map(len, tasks.values())) >= 80 and len(tasks) >= 9, {t: len(n) for t, n in tasks.items()}


@pytest.mark.zoo
@pytest.mark.parametrize("name", zoo.names())
def test_every_zoo_model_builds_and_is_diagnosed_on_the_cpu(name: str) -> None:
    if not zoo.available(name):
        pytest.skip(f"{name} needs a package that is not installed")
    workload = zoo.build(name)
    row = dry_check(workload.model, workload.inputs(), name=name, task="any")
    assert row["built"] and (row["blocker"] is None or isinstance(row["blocker"], str))
