"""CPU tests for the `launchless` command."""

from __future__ import annotations

import pytest
import torch

from launchless.apps import zoo
from launchless.apps.cli import main


def test_demo_list_prints_every_workload(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--list"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines() == zoo.names()


def test_unknown_model_exits_2_naming_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["demo", "--model", "nope"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "unknown model 'nope'" in err
    assert all(name in err for name in zoo.names())


@pytest.mark.parametrize("argv", [[], ["bench", "--suite", "huge"], ["demo", "--batch", "two"]])
def test_bad_command_lines_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert "usage: launchless" in capsys.readouterr().err


@pytest.mark.zoo
def test_demo_without_cuda_explains_what_it_would_capture(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("timm")
    if torch.cuda.is_available():
        pytest.skip("this checks the CPU path of the demo")
    monkeypatch.setenv("COLUMNS", "200")  # rich would wrap the table at 80 columns
    assert main(["demo"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "No CUDA device here" in out
    assert "timm:resnet18" in out and "ResNet" in out
    assert "float32[1x3x224x224]@cpu" in out  # the input signature
    assert "no blocker found" in out
    assert "capture would fail" not in out


@pytest.mark.zoo
def test_demo_without_cuda_names_the_blocker(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torchvision")
    if torch.cuda.is_available():
        pytest.skip("this checks the CPU path of the demo")
    monkeypatch.setenv("COLUMNS", "400")
    assert main(["demo", "--model", "tv:fasterrcnn_mobilenet_v3_large_fpn"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "capture would fail" in out
    assert "CPU<->GPU copy" in out and "torchvision code" in out
    assert "create the tensor on the GPU" in out  # the fix


def test_demo_reports_a_missing_model_library(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(zoo, "available", lambda name: False)
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["demo", "--model", "timm:resnet18"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "timm:resnet18 needs its model library" in out
    assert "pip install 'launchless[zoo]'" in out


def test_version_names_launchless_and_torch(capsys) -> None:
    import torch

    import launchless
    from launchless.apps import cli

    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"launchless {launchless.__version__} (torch {torch.__version__})"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{not json", "not JSON (Expecting property name enclosed in double quotes at line 1)"),
        ('{"rows": []}', "not a bench.json (no suite, environment)"),
        (None, "cannot be read (No such file or directory)"),
    ],
)
def test_bench_merge_of_a_file_that_is_not_a_bench_json_exits_2_naming_it(tmp_path, capsys, text, says) -> None:
    from launchless.apps import cli

    path = tmp_path / "bench.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["bench", "--merge", str(path), "--out", str(tmp_path / "out")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"--merge {path}: {says}" in err and "pass the bench.json files" in err, err


@pytest.mark.parametrize(
    ("files", "says"),
    [
        (None, "no such folder; pass the --out folders of launchless differential run"),
        ({}, "no rows*.jsonl in"),
        ({"rows-timm-1of1-p0-0.jsonl": '{"key": "a"}\n{bad\n'}, "rows-timm-1of1-p0-0.jsonl:2: not a JSON row"),
        ({"rows-timm-1of1-p0-0.jsonl": '{"key": "a", "rows": [{"entry": "x"}]}\n'}, "is not a row a run wrote"),
    ],
)
def test_differential_merge_of_what_a_run_did_not_write_exits_2_naming_it(tmp_path, capsys, files, says) -> None:
    from launchless.apps import cli

    folder = tmp_path / "runs"
    if files is not None:
        folder.mkdir()
        for name, text in files.items():
            (folder / name).write_text(text)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["differential", "merge", str(folder), "--out", str(tmp_path / "out")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()


def test_a_row_line_being_written_is_left_for_the_next_read(tmp_path) -> None:
    """A worker's last line without its newline is still being written (or was cut by a kill): not read yet, and
    not an error; a complete line that is not JSON is, naming the file and line."""
    from launchless.apps.workers import read_rows

    path = tmp_path / "rows.jsonl"
    path.write_text('{"key": "a"}\n{"key": "b", "ro')
    assert read_rows(path) == [{"key": "a"}]
    path.write_text('{"key": "a"}\n{"key": "b"}\n')
    assert read_rows(path, seen=1) == [{"key": "b"}]
    path.write_text('{"key": "a"}\nnot json\n')
    with pytest.raises(ValueError, match=r"rows.jsonl:2: not a JSON row"):
        read_rows(path)


def test_differential_run_of_a_model_not_in_the_population_exits_2_saying_how_to_list_it(capsys) -> None:
    from launchless.apps import cli

    with pytest.raises(SystemExit) as exit_:
        cli.main(["differential", "run", "--library", "torchvision", "--models", "nosuch", "--out", "x", "--list"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--models: not in the population: nosuch; `launchless differential run --library torchvision --list`" in err
