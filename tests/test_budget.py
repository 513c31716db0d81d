"""CPU tests of the memory budget across graph caches (``core.budget``): the least recently used graph goes first,
whichever model holds it; the graph just kept stays; shares per model; bad limits. Graphs here are plain objects
with the pool growth a capture would have measured."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

import launchless as ll
from launchless.core import pool as pool_module
from launchless.core.budget import BUDGET
from launchless.core.cache import GraphCache

MIB = 2**20


@pytest.fixture(autouse=True)
def fresh_budget(monkeypatch):
    monkeypatch.setattr(pool_module, "new_pool", lambda: ("pool",))
    yield
    ll.set_memory_budget(None)


def graph(mib: int) -> SimpleNamespace:
    return SimpleNamespace(pool_growth=mib * MIB)


def cache(name: str) -> GraphCache:
    return GraphCache(name=name, capture_after=1, max_graphs=8)


def test_the_least_recently_used_graph_goes_first_whichever_model_holds_it(caplog) -> None:
    a, b = cache("model a"), cache("model b")
    ll.set_memory_budget(10 * MIB)
    a.keep("a1", graph(4), None, [])
    b.keep("b1", graph(4), None, [])
    assert a.get("a1") is not None  # a1 used after b1: b1 is now the least recently used
    with caplog.at_level(logging.WARNING, logger="launchless"):
        a.keep("a2", graph(4), None, [])  # 12 MiB: one must go
    assert set(a.graphs) == {"a1", "a2"} and set(b.graphs) == set()
    assert b.evictions == 1 and BUDGET.evictions >= 1
    said = [r.getMessage() for r in caplog.records if "memory budget" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("launchless: model b: evicting"), said
    usage = ll.memory_budget()
    assert usage["limit_bytes"] == 10 * MIB and usage["by_model"]["model a"] == 8 * MIB
    assert usage["held_bytes"] >= 8 * MIB


def test_the_graph_just_kept_stays_even_alone_over_the_budget(caplog) -> None:
    a = cache("model a")
    ll.set_memory_budget(2 * MIB)
    with caplog.at_level(logging.WARNING, logger="launchless"):
        a.keep("big", graph(5), None, [])
    assert set(a.graphs) == {"big"}
    assert any("more than the whole memory budget" in r.getMessage() for r in caplog.records)


def test_lowering_the_budget_evicts_now_and_no_budget_evicts_nothing() -> None:
    a = cache("model a")
    a.keep("x", graph(3), None, [])
    a.keep("y", graph(3), None, [])
    assert set(a.graphs) == {"x", "y"}  # no budget set
    ll.set_memory_budget(4 * MIB)
    assert set(a.graphs) == {"y"}  # x was used longest ago


@pytest.mark.parametrize("bad", [-1, 1.5, "8G", True])
def test_a_budget_is_a_number_of_bytes_or_none(bad) -> None:
    with pytest.raises(ll.ConfigError, match="number of bytes"):
        ll.set_memory_budget(bad)
