"""The whole population, enumerated from the libraries at run time, and the picks a shard or a name list makes.

Nothing here is a list chosen by hand: each library's own registry decides what is in it, so a library release
that adds, renames or breaks an architecture changes the population and shows up in the checks.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from .candidate import Candidate, Library

_ENUMERATORS: dict[Library, tuple[str, str]] = {
    Library.TRANSFORMERS_CAUSAL: ("hf", "causal_candidates"),
    Library.TRANSFORMERS: ("hf", "base_candidates"),
    Library.TORCHVISION: ("vision", "torchvision_candidates"),
    Library.TIMM: ("vision", "timm_candidates"),
    Library.DIFFUSERS: ("vision", "diffusers_candidates"),
}


def candidates(library: Library) -> list[Candidate]:
    """Every candidate of ``library`` in the library's own order."""
    module, function = _ENUMERATORS[library]
    enumerate_: Callable[[], list[Candidate]] = getattr(importlib.import_module(f".{module}", __package__), function)
    return enumerate_()


def shard(items: list[Candidate], index: int, count: int) -> list[Candidate]:
    """Shard ``index`` (1-based) of ``count``: every count-th candidate, so that each shard mixes sizes."""
    if not 1 <= index <= count:
        raise ValueError(f"shard {index}/{count}: the index runs from 1 to the count")
    return items[index - 1 :: count]


def parse_shard(text: str) -> tuple[int, int]:
    """``"3/8"`` -> (3, 8)."""
    index, _, count = text.partition("/")
    try:
        return int(index), int(count)
    except ValueError:
        raise ValueError(f"--shard {text!r}: expected INDEX/COUNT such as 3/8") from None


def pick(items: list[Candidate], names: list[str] | None) -> list[Candidate]:
    """The candidates named (by name or ``library:name``), in the order given; an unknown name raises."""
    if not names:
        return items
    by_name = {c.name: c for c in items} | {c.key: c for c in items}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise KeyError(f"not in the population: {', '.join(unknown)}")
    return [by_name[n] for n in names]
