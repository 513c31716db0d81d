"""The interpreter's switch interval while launchless runs Python beside the calls (``core.switch_interval``): short
inside, restored after the last thread leaves, another setter's value kept; the compile job's pickling and its read
of a program run inside it."""

from __future__ import annotations

import json
import sys
import threading

import pytest
import torch
from torch import nn

from launchless.core import compiled_programs, switch_interval
from launchless.core.compiled_programs import JobState, compile_in_background
from launchless.core.switch_interval import SHORT_SWITCH_S, calls_first

DEFAULT_S = 0.005


@pytest.fixture(autouse=True)
def _python_default_interval():
    before = sys.getswitchinterval()
    sys.setswitchinterval(DEFAULT_S)
    yield
    sys.setswitchinterval(before)


def test_the_interval_is_short_inside_and_restored_after() -> None:
    with calls_first():
        assert sys.getswitchinterval() == pytest.approx(SHORT_SWITCH_S)
    assert sys.getswitchinterval() == pytest.approx(DEFAULT_S)


def test_the_interval_is_restored_when_the_last_of_two_threads_leaves() -> None:
    first_in, second_out, seen = threading.Event(), threading.Event(), []

    def second() -> None:
        first_in.wait()
        with calls_first():
            pass
        seen.append(sys.getswitchinterval())  # the first is still inside
        second_out.set()

    thread = threading.Thread(target=second)
    thread.start()
    with calls_first():
        first_in.set()
        second_out.wait(10)
        assert seen == [pytest.approx(SHORT_SWITCH_S)]
    thread.join()
    assert sys.getswitchinterval() == pytest.approx(DEFAULT_S)


def test_an_interval_someone_else_set_meanwhile_stands() -> None:
    with calls_first():
        sys.setswitchinterval(0.001)
    assert sys.getswitchinterval() == pytest.approx(0.001)


def test_a_shorter_interval_than_ours_is_left_as_it_is() -> None:
    sys.setswitchinterval(SHORT_SWITCH_S / 2)
    with calls_first():
        assert sys.getswitchinterval() == pytest.approx(SHORT_SWITCH_S / 2)
    assert sys.getswitchinterval() == pytest.approx(SHORT_SWITCH_S / 2)


def test_an_exception_inside_still_restores_it() -> None:
    with pytest.raises(ValueError), calls_first():
        raise ValueError("the read failed")
    assert sys.getswitchinterval() == pytest.approx(DEFAULT_S)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def test_a_program_is_read_and_a_structure_pickled_with_the_interval_short(tmp_path, monkeypatch) -> None:
    seen: dict[str, float] = {}
    monkeypatch.setattr(
        compiled_programs, "_load_artifact", lambda path: seen.setdefault("read", sys.getswitchinterval())
    )
    model, x = Net().eval(), torch.randn(2, 4)
    signature = "(float32[2x4]@cpu)"
    path = compiled_programs.program_path(tmp_path, compiled_programs.program_key(model, signature), training=False)
    path.write_bytes(b"a program")
    compiled_programs.plan_of(path).write_text(json.dumps({"format": compiled_programs.ProgramFormat.ARTIFACT}))
    job = compile_in_background(model, (x,), signature=signature, directory=tmp_path)
    assert job.wait(60) is JobState.READY
    assert seen["read"] == pytest.approx(SHORT_SWITCH_S)

    def structure_of(*args, **kwargs):
        seen["pickle"] = sys.getswitchinterval()
        raise RuntimeError("no compile wanted here")

    monkeypatch.setattr(compiled_programs, "structure_of", structure_of)
    job = compile_in_background(model, (x,), signature=signature + " other", directory=tmp_path)
    assert job.wait(60) is JobState.FAILED and "no compile wanted here" in job.reason
    assert seen["pickle"] == pytest.approx(SHORT_SWITCH_S)
    assert sys.getswitchinterval() == pytest.approx(DEFAULT_S)
    assert switch_interval._inside == 0
