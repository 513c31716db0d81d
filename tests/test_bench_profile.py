"""``launchless bench --profile``: where a pair's calls spend their time, written beside its figures."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from launchless.apps import cli
from launchless.apps.bench import measure, runner, worker


def test_a_profile_names_the_host_functions_and_the_operations_of_the_calls(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args, **kwargs: None)  # the calls run on the CPU here
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
    runner.run_suite("quick", ["timm:resnet18"], ["eager"], str(tmp_path), 3, 10.0, profile=True)
    (command,) = commands
    assert command[command.index("--profile-dir") + 1] == str(Path(tmp_path) / "profiles")
    commands.clear()
    runner.run_suite("quick", ["timm:resnet18"], ["eager"], str(tmp_path), 3, 10.0)
    assert "--profile-dir" not in commands[0]


@pytest.mark.parametrize("suite", ["serving", "multigpu"])
def test_a_suite_without_profiles_refuses_the_flag(suite: str, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["bench", "--suite", suite, "--profile"])
    assert exited.value.code == 2
    assert f"the {suite} suite has no profile" in capsys.readouterr().err
