"""What the differential harness knows of one model before it runs it: a candidate and how it is built.

A candidate is enumerated from a library's own model list, so building it can fail in three distinct ways, which
the report keeps apart: the library itself cannot build the architecture (its own constructor raises, or it needs a
package that is not installed) -- listed with the reason and not counted; the harness could not make it small or
feed it (a harness defect, counted); or it builds and runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

import torch

Inputs = tuple[tuple, dict]
# Fresh inputs for every call: a CPU generator (advanced by each call) and the device the tensors go to.
InputMaker = Callable[[torch.Generator, "torch.device | str"], Inputs]


class Library(str, Enum):
    """The populations: each enumerated from the library's own list at run time."""

    TRANSFORMERS_CAUSAL = "transformers-causal"
    TRANSFORMERS = "transformers"
    TORCHVISION = "torchvision"
    TIMM = "timm"
    DIFFUSERS = "diffusers"


class NotInLibraryError(Exception):
    """The library cannot build this architecture itself (its constructor raises, a package is missing)."""


@dataclass(frozen=True)
class Built:
    """A model in eval mode with random weights (fp32, CPU unless built on ``meta``) and its input maker."""

    model: torch.nn.Module
    make_inputs: InputMaker
    architecture: str = ""  # what was built, where the candidate names a group (a timm module: its smallest model)


@dataclass(frozen=True)
class Candidate:
    """One model of a population: ``build(device)`` builds it on ``device`` ("cpu" or "meta")."""

    library: Library
    name: str
    task: str
    build: Callable[[str], Built]
    huge: bool = False  # its real-size weights are large: CPU checks build it on ``meta``

    @property
    def key(self) -> str:
        """The name a shard or ``--models`` picks it by: unique across populations."""
        return f"{self.library.value}:{self.name}"
