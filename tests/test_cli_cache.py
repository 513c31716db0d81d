"""`launchless cache`: the compiled programs, package-loader records and graph decisions kept on disk, listed as a
user reads them, the loader records forgotten alone, everything removed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launchless.apps import cli
from launchless.apps.bench.formatting import byte_size
from launchless.core import package_check
from launchless.core.compiled_programs import cache_dir, constants_of, plan_of

CRASHED = "a process that loaded and ran the package ended with signal SIGSEGV (Fatal Python error: Segmentation fault)"


def _kept(folder: Path, name: str, plan: dict | None, size: int) -> Path:
    program = folder / name
    program.write_bytes(b"x" * size)
    if plan is not None:
        plan_of(program).write_text(json.dumps(plan))
    return program


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LAUNCHLESS_CACHE_DIR", str(tmp_path))
    folder = cache_dir()
    folder.mkdir(parents=True)
    inference = _kept(folder, "a1.pt2", {"training": False, "format": "package", "unpackaged": ""}, 3000)
    constants_of(inference).write_bytes(b"c" * 1000)
    why = f"{CRASHED}; a two-layer probe package crashed it too: packages are no longer built here"
    _kept(folder, "b2.pt2", {"training": False, "format": "artifact", "unpackaged": why}, 2000)
    _kept(folder, "c3.bin", {"training": True, "format": "artifact", "unpackaged": ""}, 5000)
    _kept(folder, "d4.pt2", None, 10)  # no plan
    plan_of(folder / "f6.pt2").write_text("{}")  # a plan whose program never came
    package_check.loader_record(folder).write_text(json.dumps({"why": CRASHED, "at": "2026-12-07T09:40:00+00:00"}))
    (tmp_path / "e5.json").write_text("{}")  # a graph decision of the compiler backend
    return folder


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert cli.main(["cache", *args]) == 0
    return " ".join(capsys.readouterr().out.split())  # the table's line breaks and padding aside


def test_the_cache_lists_every_program_with_what_it_is_and_the_loader_record(cache: Path, capsys) -> None:
    out = _run([], capsys)
    assert f"compiled programs in {cache}: 4" in out
    for name, purpose, kept_as in (
        ("a1.pt2", "inference", "AOTInductor package"),
        ("b2.pt2", "inference", "Inductor's format"),
        ("c3.bin", "training", "Inductor's format"),
    ):
        assert f"{name} │ {purpose} │ {kept_as}" in out, out
    assert "d4.pt2 │ ? │ no readable plan" in out
    assert "files of programs not kept (nothing reads them): 1" in out
    a1 = sum(p.stat().st_size for p in cache.glob("a1.*"))  # the program, its plan and the tensors it makes
    assert f"a1.pt2 │ inference │ AOTInductor package │ {byte_size(a1)} │" in out
    assert "not a package: a process that loaded and ran the package ended with signal SIGSEGV" in out
    record = package_check.loader_record(cache)
    assert f"package loader record {record.name}: PyTorch's package loader crashed on this machine" in out
    assert f"graph decisions in {cache.parent}: 1" in out


def test_forgetting_the_loader_removes_only_its_records(cache: Path, capsys) -> None:
    out = _run(["--forget-loader"], capsys)
    assert out == f"removed 1 package-loader record(s) from {cache}"
    assert not package_check.loader_records(cache)
    assert sorted(p.name for p in cache.iterdir()) == [
        "a1.constants.pt",
        "a1.plan.json",
        "a1.pt2",
        "b2.plan.json",
        "b2.pt2",
        "c3.bin",
        "c3.plan.json",
        "d4.pt2",
        "f6.plan.json",
    ]


def test_clearing_removes_programs_records_and_decisions(cache: Path, capsys) -> None:
    programs = sum(p.stat().st_size for p in cache.iterdir() if not p.name.startswith("package-loader-"))
    out = _run(["--clear"], capsys)
    assert out.startswith(f"removed 4 compiled program(s) ({byte_size(programs)})"), out
    assert f"and 1 package-loader record(s) from {cache}, and 1 graph decision(s) from {cache.parent}" in out
    assert list(cache.iterdir()) == [] and not (cache.parent / "e5.json").exists()
    assert _run([], capsys).startswith(f"compiled programs in {cache}: 0")


def test_clear_and_forget_loader_are_one_choice(cache: Path) -> None:
    with pytest.raises(SystemExit):
        cli.main(["cache", "--clear", "--forget-loader"])
