"""Every relative link of the README and the docs leads to a file that exists: a result deleted because a later run
superseded it must not leave a page pointing at nothing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _relative_links(page: Path) -> list[str]:
    return [
        target.split("#", 1)[0]
        for target in LINK.findall(page.read_text())
        if not re.match(r"[a-z]+:", target) and not target.startswith("#")
    ]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_leads_to_a_file(page: Path) -> None:
    missing = [t for t in _relative_links(page) if t and not (page.parent / t).exists()]
    assert not missing, f"{page.relative_to(ROOT)} links to files that do not exist: {missing}"
