"""A number out of range on the command line is an argparse error, exit code 2, naming what to pass -- before a run
starts (a worker count of 0 used to end in a traceback on the GPU, 0 timed calls in rows that measured nothing)."""

from __future__ import annotations

import pytest

from launchless.apps import cli


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["bench", "--iters", "0"], "argument --iters: 0: pass 1 or more"),
        (["bench", "--timeout", "-5"], "argument --timeout: -5: pass a number of seconds above 0"),
        (["bench", "--iters", "many"], "argument --iters: 'many' is not a whole number"),
        (["conformance", "--iters", "0", "--list"], "argument --iters: 0: pass 1 or more"),
        (["verify", "hf:gpt2", "--iters", "0"], "argument --iters: 0: pass 1 or more"),
        (["differential", "run", "--library", "timm", "--processes", "0", "--list", "--out", "x"], "--processes: 0"),
        (["differential", "run", "--library", "timm", "--timeout", "0", "--list", "--out", "x"], "--timeout: 0"),
        (["demo", "--batch", "0"], "argument --batch: 0: pass 1 or more"),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, list) else None,
)
def test_a_number_out_of_range_is_refused_before_anything_runs(argv: list[str], said: str, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2
    assert said in capsys.readouterr().err
