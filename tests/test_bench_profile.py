"""``launchless bench --profile``: where a pair's calls spend their time, written beside its figures."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from launchless.apps import cli
from launchless.apps.bench import measure, runner, worker


def test_a_profile_names_the_host_functions_and_the_operations_of_the_calls(tmp_path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
    x = torch.randn(4, 8)

    def call() -> torch.Tensor:
        with torch.no_grad():
            return model(x)

    path = measure.write_profile(call, measure.profile_path(tmp_path / "profiles", "tv:fcos@b2", "launchless"))
    assert path == tmp_path / "profiles" / "tv_fcos@b2--launchless.txt"
    text = path.read_text()
    for part in ("cProfile of 10 calls, by tottime", "by cumulative", "torch.profiler over 10 calls, by GPU time"):
        assert part in text
    assert "call" in text and "aten::addmm" in text  # the caller's function and the operation it ran


def test_the_runner_hands_the_profile_folder_to_every_worker(tmp_path, monkeypatch) -> None:
    commands: list[list[str]] = []

    def run_mode(mode, names, iters, timeout_s, out, advance, worker_command, **_):
        commands.append(worker_command)
        return [worker.empty_row(name, mode, "skipped", "not run here") for name in names]

    monkeypatch.setattr(runner, "run_mode", run_mode)
    runner.measure_suite("quick", ["timm:resnet18"], ["eager"], out_dir=tmp_path, iters=3, timeout_s=10.0, profile=True)
    (command,) = commands
    assert command[command.index("--profile-dir") + 1] == str(Path(tmp_path) / "profiles")
    commands.clear()
    runner.measure_suite("quick", ["timm:resnet18"], ["eager"], out_dir=tmp_path, iters=3, timeout_s=10.0)
    assert "--profile-dir" not in commands[0]


def test_the_multigpu_suite_refuses_the_flag(capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["bench", "--suite", "multigpu", "--profile"])
    assert exited.value.code == 2
    assert "the multigpu suite's run in torchrun groups" in capsys.readouterr().err


def test_a_decode_rows_profile_is_of_the_modes_generations(tmp_path) -> None:
    """The serving suite's decode rows profile their mode's generations (here eager's, on the CPU: tiny GPT-2)."""
    pytest.importorskip("transformers")
    from launchless.apps.bench.serving_decode import PROFILED_GENERATIONS, measure_decode

    row = measure_decode("decode:gpt2-tiny@b1", "eager", device=torch.device("cpu"), profile_dir=tmp_path)
    assert row["identical"]
    text = (tmp_path / "decode_gpt2-tiny@b1--eager.txt").read_text()
    assert f"cProfile of {PROFILED_GENERATIONS} calls" in text and "generate" in text
