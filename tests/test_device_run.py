"""``benchmarks/device_run.sh`` splits the GPU suite into parts one device call holds: no file of GPU tests may be
left out of every part (it would never run), and none may run in two."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PARTS = ("tests-core", "tests-serving", "tests-multigpu", "tests-fresh-inputs", "tests-differential", "tests-compiled")


def _part_files(script: str, part: str) -> list[str]:
    """The files of ``part``'s entry in the script's ``test_groups``, which its step runs."""
    body = re.search(rf'^  \[{re.escape(part)}\]="(.*?)"', script, re.S | re.M)
    assert body, f"device_run.sh has no test group {part}"
    assert re.search(rf"^  [^\n]*\b{re.escape(part)}\b[^\n]*\)$", script, re.M), f"device_run.sh has no step {part}"
    return re.findall(r"tests/[\w/]+(?:\.py)?", body.group(1))


def _gpu_test_files() -> set[str]:
    found = set()
    for path in (ROOT / "tests").rglob("test_*.py"):
        if path == Path(__file__).resolve():
            continue
        if "pytest.mark.cuda" in path.read_text() or re.search(r"^@cuda\b", path.read_text(), re.M):
            rel = path.relative_to(ROOT).as_posix()
            found.add("tests/hazards" if rel.startswith("tests/hazards/") else rel)
    return found


def test_every_file_of_gpu_tests_runs_in_exactly_one_part() -> None:
    script = (ROOT / "benchmarks" / "device_run.sh").read_text()
    listed = [f for part in PARTS for f in _part_files(script, part)]
    assert sorted(set(listed)) == sorted(listed), f"a file runs in two parts: {sorted(listed)}"
    assert set(listed) == _gpu_test_files()
