"""CPU tests of the cuFFT plan watch (``core.fft_plans``): a graph whose device held cuFFT plans is captured
again once a plan it may read can have been destroyed -- the cache cleared, made smaller, or full -- and a
graph captured without plans costs no check. The plan caches are a stand-in: only a GPU has them."""

from __future__ import annotations

import logging

import pytest
import torch

from launchless.core import fft_plans
from launchless.core import pool as pool_module
from launchless.core.cache import GraphCache
from launchless.core.fft_plans import CufftPlanWatch


class StandInCaches:
    """Per-device plan caches as PyTorch keeps them: a size, a max_size, and the clears counted."""

    def __init__(self, *, size: int = 2, max_size: int = 4096) -> None:
        self.sizes = {0: size}
        self.max_sizes = {0: max_size}
        self.cleared = {0: 0}
        self.counting = False

    def size(self, device: int) -> int:
        return self.sizes[device]

    def max_size(self, device: int) -> int:
        return self.max_sizes[device]

    def clears(self, device: int) -> int:
        return self.cleared[device]

    def start_counting(self) -> None:
        self.counting = True

    def clear(self, device: int = 0) -> None:
        self.sizes[device] = 0
        self.cleared[device] += 1


class HeldGraph:
    def __init__(self, plan_devices: tuple[int, ...]) -> None:
        self.plan_devices = plan_devices


@pytest.fixture(autouse=True)
def fake_pools(monkeypatch):
    monkeypatch.setattr(pool_module, "new_pool", lambda: ("pool", 0))


def watched_cache(caches: StandInCaches) -> GraphCache:
    cache = GraphCache(name="M.forward", capture_after=1, max_graphs=4)
    cache.plans = CufftPlanWatch(caches)
    return cache


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ("cleared, then as many new plans made", "was cleared"),
        ("made smaller", "was made smaller"),
        ("filled up", "is full"),
        ("cleared by a private call", "was cleared"),
    ],
)
def test_a_graph_that_may_read_plans_is_dropped_once_one_can_have_been_destroyed(caplog, change, reason) -> None:
    caches = StandInCaches(size=2)
    cache = watched_cache(caches)
    cache.keep("a", HeldGraph((0,)), {}, ())
    assert caches.counting, "clears are not counted"
    caches.sizes[0] = 3  # a plan made by eager code since: harmless
    assert cache.lookup("a", ()) is not None
    if change.startswith("cleared, then"):
        caches.clear()
        caches.sizes[0] = 5  # more plans than before: the size alone would not tell
    elif change == "made smaller":
        caches.max_sizes[0] = 4  # room left, but plans may have gone
    elif change == "filled up":
        caches.sizes[0] = caches.max_sizes[0]  # the next new plan evicts the least recently used
    else:
        caches.sizes[0] = 1  # torch._cufft_clear_plan_cache called past the counter, then one new plan
    with caplog.at_level(logging.INFO, logger="launchless"):
        assert cache.lookup("a", ()) is None
    assert cache.invalidations == 1 and not cache.graphs
    assert [r.getMessage() for r in caplog.records if reason in r.getMessage()], caplog.text
    assert cache.plans not in cache.guards and not cache.plans.watched  # nothing left to read a plan
    cache.keep("a", HeldGraph((0,)), {}, ())  # captured again, with the plans its warm-up made
    assert cache.lookup("a", ()) is not None or change == "filled up"  # a full cache cannot be watched


def test_a_graph_kept_after_every_other_was_evicted_is_watched_from_the_plans_as_they_are_now() -> None:
    caches = StandInCaches(size=2)
    cache = watched_cache(caches)
    cache.keep("a", HeldGraph((0,)), {}, ())
    cache.evict("a", "over the memory budget")  # no graph left, the watch still armed
    caches.clear()
    caches.sizes[0] = 2  # the next capture's warm-up made its plans again
    cache.keep("b", HeldGraph((0,)), {}, ())
    assert cache.lookup("b", ()) is not None and cache.invalidations == 0


def test_a_graph_captured_without_plans_on_its_device_is_not_watched() -> None:
    caches = StandInCaches(size=0)
    cache = watched_cache(caches)
    cache.keep("a", HeldGraph(()), {}, ())
    assert cache.plans not in cache.guards and not caches.counting
    caches.clear()
    assert cache.lookup("a", ()) is not None


def test_the_plans_of_a_graph_inside_an_entry_are_watched() -> None:
    class Entry:  # a training step's or a compiled graph's entry holds its captured graph as .graph
        graph = HeldGraph((0,))

    caches = StandInCaches(size=1)
    cache = watched_cache(caches)
    cache.keep("a", Entry(), {}, ())
    caches.clear()
    assert cache.lookup("a", ()) is None


def test_clears_are_counted_through_torchs_own_function(monkeypatch) -> None:
    calls: list[int] = []

    def original(device_index: int) -> None:
        calls.append(device_index)

    monkeypatch.setattr(torch, "_cufft_clear_plan_cache", original)
    monkeypatch.setattr(fft_plans, "_clears", fft_plans.Counter())
    fft_plans._count_clears()
    fft_plans._count_clears()  # once only: not wrapped twice
    torch._cufft_clear_plan_cache(1)
    assert calls == [1] and fft_plans.PlanCaches().clears(1) == 1
