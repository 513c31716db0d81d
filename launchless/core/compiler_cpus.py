"""Where the compiler runs: the CPUs a compiler process and its compile workers get, whole physical cores left to
the calls beside them.

Inductor's compile workers keep every CPU they are given busy for seconds to minutes. The calls' thread shares the
machine with them: its host work between launches slows when a worker runs on its core -- on the same hyperthread,
or on the other half of the same physical core, which shares its execution units. So the compiler's CPU affinity
leaves ``CALLS_CORES`` whole physical cores (both hyperthreads of each) out, and its worker count follows.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path

CALLS_CORES = 2  # physical cores the compiler leaves to the calls' process (its host work between replays)


@functools.lru_cache(maxsize=1)
def compiler_cpus() -> frozenset[int] | None:
    """The CPUs the compiler and its workers run on: this process's, but for ``CALLS_CORES`` whole physical cores
    left to the calls -- both hyperthreads of each, since a compile worker on the other half of the calls' core
    slows their host work as much as one on the same half. None (no restriction) where that would leave the
    compiler no core, or where this system sets no affinity."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    allowed = set(os.sched_getaffinity(0))
    cores = physical_cores(allowed, siblings=_thread_siblings)
    if len(cores) <= CALLS_CORES:
        return None
    return frozenset().union(*cores[: len(cores) - CALLS_CORES])


def physical_cores(cpus: set[int], *, siblings: Callable[[int], set[int]]) -> list[frozenset[int]]:
    """``cpus`` grouped by physical core (each group the hyperthreads ``siblings`` names, among ``cpus``), in the
    order of their lowest CPU."""
    cores: list[frozenset[int]] = []
    seen: set[int] = set()
    for cpu in sorted(cpus):
        if cpu not in seen:
            core = frozenset((siblings(cpu) & cpus) | {cpu})
            seen |= core
            cores.append(core)
    return cores


def _thread_siblings(cpu: int) -> set[int]:
    """The logical CPUs sharing ``cpu``'s physical core, as Linux lists them ("0,8" or "0-1"); itself alone where the
    topology cannot be read."""
    try:
        text = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").read_text().strip()
        return cpu_list(text)
    except (OSError, ValueError):
        return {cpu}


def cpu_list(text: str) -> set[int]:
    """A Linux CPU list ("0,8", "0-3,8-11") as a set."""
    cpus: set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus
