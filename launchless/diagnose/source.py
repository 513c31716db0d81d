"""Where in whose code an operation was asked for: the leaf every diagnosis builds on.

PyTorch's capture errors name neither the operation nor the line. ``locate`` finds the innermost frame
that is not PyTorch's, launchless's, the standard library's or the test runner's own -- the line that
asked for the forbidden thing -- and, when that is library code, the outermost frame of the caller's
own code that reached it.
"""

from __future__ import annotations

import os
import sysconfig
import traceback
from dataclasses import dataclass
from types import TracebackType

import torch

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_OWN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # the launchless package
_STDLIB = sysconfig.get_paths()["stdlib"] + os.sep


@dataclass(frozen=True)
class Location:
    """Where an operation was asked for: the line itself and, for library code, the caller's line."""

    file: str
    line: int
    function: str
    code: str
    owner: str
    caller: str | None = None

    def __str__(self) -> str:
        owner = "your code" if self.owner == "user" else f"{self.owner} code"
        text = f"{self.file}:{self.line} in {self.function} ({owner}): `{self.code}`"
        return text + (f", reached from your code at {self.caller}" if self.caller else "")


def _owner(filename: str) -> str:
    """'user' for the caller's own files, else the top-level package that ships the file."""
    for marker in ("site-packages" + os.sep, "dist-packages" + os.sep):
        if marker in filename:
            return filename.split(marker, 1)[1].split(os.sep, 1)[0].removesuffix(".py")
    return "user"


def _in_packages(filename: str) -> bool:
    return ("site-packages" + os.sep) in filename or ("dist-packages" + os.sep) in filename


def is_foreign(filename: str) -> bool:
    """PyTorch's, launchless's, the standard library's or the test runner's own frames."""
    if filename.startswith((_TORCH_DIR, _OWN_DIR)) or filename.startswith("<"):
        return True
    if "/_pytest/" in filename or "/pluggy/" in filename:
        return True
    # conda and python:3.x images keep site-packages inside the stdlib folder: those are libraries
    return filename.startswith(_STDLIB) and not _in_packages(filename)


def locate(frames: list[traceback.FrameSummary]) -> Location | None:
    """Innermost frame outside torch/launchless/stdlib; plus the outermost user frame if it is library code."""
    inside = [f for f in frames if not is_foreign(f.filename)]
    if not inside:
        return None
    frame = inside[-1]
    owner = _owner(frame.filename)
    caller = None
    if owner != "user":
        users = [f for f in inside if _owner(f.filename) == "user"]
        if users:
            caller = f"{users[-1].filename}:{users[-1].lineno}"
    return Location(frame.filename, frame.lineno or 0, frame.name, (frame.line or "").strip(), owner, caller)


def locate_exception(exc: BaseException) -> Location | None:
    tb: TracebackType | None = exc.__traceback__
    return locate(traceback.extract_tb(tb)) if tb else None
