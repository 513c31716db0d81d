"""Every fenced code block of README.md runs as written.

Each block carries an HTML comment among the comment lines right above its fence, naming where it runs:

    <!-- readme-test: cpu -->    Python, run with exec in a fresh namespace, everywhere (CI has no GPU)
    <!-- readme-test: cuda -->   Python, run the same way where a GPU is present (marked ``cuda``)
    <!-- readme-test: shell -->  a shell command, run with bash from the repository root
    <!-- readme-test: ci -->     the test command, which CI itself runs: checked to be what .ci/run extracts

A block without an annotation fails, so a new example cannot go untested.
"""

from __future__ import annotations

import linecache
import os
import re
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
KINDS = {"cpu": ("python",), "cuda": ("python",), "shell": ("bash", "sh"), "ci": ("bash", "sh")}
ANNOTATION = re.compile(r"<!--\s*readme-test:\s*(\S+)\s*-->")
OPEN_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)")
SHELL_TIMEOUT_S = 600


@dataclass(frozen=True)
class Block:
    line: int  # 1-based line of the opening fence
    language: str
    kind: str | None  # None: not annotated
    code: str

    @property
    def name(self) -> str:
        return f"README.md:{self.line}"


def parse_blocks(text: str) -> list[Block]:
    """Fenced blocks in order, each with the readme-test annotation found in the comments above its fence."""
    lines = text.splitlines()
    blocks, i = [], 0
    while i < len(lines):
        opened = OPEN_FENCE.match(lines[i])
        if not opened:
            i += 1
            continue
        fence, language = opened.group(1), opened.group(2).lower()
        end = i + 1
        while end < len(lines) and not re.match(rf"^ {{0,3}}{fence[0]}{{{len(fence)},}}\s*$", lines[end]):
            end += 1
        kind, above = None, i - 1
        while above >= 0 and lines[above].strip().startswith("<!--"):
            found = ANNOTATION.search(lines[above])
            if found:
                kind = found.group(1)
            above -= 1
        blocks.append(Block(i + 1, language, kind, "\n".join(lines[i + 1 : end]) + "\n"))
        i = end + 1
    return blocks


BLOCKS = parse_blocks(README.read_text(encoding="utf-8"))


def _param(block: Block):
    marks = [pytest.mark.cuda] if block.kind == "cuda" else []
    return pytest.param(block, id=f"{block.name}-{block.kind or 'unannotated'}", marks=marks)


def test_the_readme_has_its_blocks():
    assert any(b.kind in ("cpu", "cuda") for b in BLOCKS), "no Python example found in README.md"
    assert [b.kind for b in BLOCKS].count("ci") == 1, "README.md needs exactly one `readme-test: ci` block"


def test_every_block_is_annotated():
    bad = [
        f"{b.name} ({b.language or 'no language'}): {b.kind or 'no readme-test annotation'}"
        for b in BLOCKS
        if b.kind not in KINDS or b.language not in KINDS[b.kind]
    ]
    assert not bad, (
        "every fenced block of README.md needs `<!-- readme-test: KIND -->` on the line before its fence, KIND "
        f"one of {', '.join(KINDS)} (cpu and cuda for python blocks, shell and ci for bash blocks): " + "; ".join(bad)
    )


@pytest.mark.parametrize("block", [_param(b) for b in BLOCKS if b.kind in ("cpu", "cuda")])
def test_python_block(block: Block):
    filename = f"<{block.name}>"
    linecache.cache[filename] = (len(block.code), None, block.code.splitlines(True), filename)  # source in errors
    namespace = {"__name__": "readme_block", "__file__": filename}
    try:
        exec(compile(block.code, filename, "exec"), namespace)
    finally:
        linecache.cache.pop(filename, None)
        if block.kind == "cuda":
            import torch

            torch._dynamo.reset()  # a block's compiled graphs must not outlive it
            torch.cuda.synchronize()
            torch.cuda.empty_cache()


def _console_scripts(bin_dir: Path) -> None:
    """The checkout's own commands (pyproject's [project.scripts]), as `pip install -e .` would make them, so that
    a shell block runs this working tree's entry points with this interpreter, not a stale installed copy."""
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")  # (tomllib needs Python 3.11)
    section = re.search(r"^\[project\.scripts\]\n(.*?)(?=^\[|\Z)", pyproject, re.M | re.S)
    assert section, "pyproject.toml has no [project.scripts]"
    for name, target in re.findall(r'^([\w.-]+)\s*=\s*"([^"]+)"', section.group(1), re.M):
        module, func = target.split(":")
        path = bin_dir / name
        path.write_text(
            f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(ROOT)!r})\n"
            f"from {module} import {func}\nsys.exit({func}())\n"
        )
        path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.mark.parametrize("block", [_param(b) for b in BLOCKS if b.kind == "shell"])
def test_shell_block(block: Block, tmp_path: Path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _console_scripts(bin_dir)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=SHELL_TIMEOUT_S,
    )
    assert done.returncode == 0, f"{block.name} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"


def test_the_ci_block_is_what_ci_runs():
    """CI runs the line .ci/run extracts from README.md; it must be the block annotated `ci`."""
    (block,) = [b for b in BLOCKS if b.kind == "ci"]
    extract = next(line for line in (ROOT / ".ci/run").read_text().splitlines() if line.startswith("cmd=$("))
    done = subprocess.run(
        ["bash", "-c", f'{extract}\nprintf "%s" "$cmd"'], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout, ".ci/run extracts no test command from README.md"
    assert done.stdout.strip() == block.code.strip()
