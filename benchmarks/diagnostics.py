"""What the diagnostic scripts share: a part of a measurement run in a fresh process -- nothing imported before it,
its own caches -- its result read back from the last line it printed (JSON); the report printed and kept with the
profile beside it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def run_fresh(arguments: list[str], *, env: dict[str, str], timeout: float | None = None) -> dict[str, Any]:
    """This interpreter run on ``arguments`` in a process of its own, ``env`` added to the environment: the last line
    it printed, as JSON; ``{"error": ...}`` (its last line of errors) where it failed or did not end in time."""
    try:
        done = subprocess.run(
            [sys.executable, *arguments],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"did not end within {timeout} s"}
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        return {"error": lines[-1] if lines else f"exit status {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def keep_report(report: dict[str, Any], *, out: str, stem: str, profile: str, profile_name: str = "profile") -> None:
    """``report`` printed, and where ``out`` names a folder, kept there as ``<stem>.json`` with the profile beside it
    (``<stem>-<profile_name>.txt``)."""
    text = json.dumps(report, indent=1)
    print(text)
    if out:
        folder = Path(out)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{stem}.json").write_text(text + "\n")
        (folder / f"{stem}-{profile_name}.txt").write_text(profile)
