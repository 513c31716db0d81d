"""CPU tests of the graph core's state machine (``core.cache.GraphCache``): counting, refusal, limits, churn,
validity checks before replay, log-once and the pool's lifetime. Graphs here are plain objects: the cache never
looks inside what a policy holds."""

from __future__ import annotations

import logging

import pytest

from launchless.core import pool as pool_module
from launchless.core.cache import GraphCache, Refusal
from launchless.core.capture import CaptureFailed
from launchless.core.status import Admission, SignatureState, Stage


class Flag:
    """A validity check the test flips by hand."""

    def __init__(self) -> None:
        self.why: str | None = None
        self.armed = 0

    def arm(self, leaves) -> None:
        self.armed += 1

    def stale(self, leaves) -> str | None:
        return self.why


@pytest.fixture(autouse=True)
def fake_pools(monkeypatch):
    made = []

    def new_pool():
        made.append(("pool", len(made)))
        return made[-1]

    monkeypatch.setattr(pool_module, "new_pool", new_pool)
    return made


def cache(**kw) -> GraphCache:
    return GraphCache(
        name="M.forward", capture_after=kw.pop("capture_after", 2), max_graphs=kw.pop("max_graphs", 2), **kw
    )


def test_a_signature_waits_then_is_captured_then_replays() -> None:
    c = cache()
    assert c.admit("a") is Admission.WAIT and c.state("a") is SignatureState.SEEN
    assert c.admit("a") is Admission.CAPTURE
    with c.capturing("a"):
        assert c.state("a") is SignatureState.CAPTURED
    c.keep("a", "graph-a", {"status": "bit-identical"}, ())
    assert c.state("a") is SignatureState.VERIFIED
    assert c.lookup("a", ()) == "graph-a"
    assert c.state("a", replays=1) is SignatureState.REPLAYING
    (row,) = c.rows(lambda key, graph: {"signature": key, "replays": 1})
    assert row == {"signature": "a", "replays": 1, "state": "replaying"}


def test_a_refused_signature_stays_refused_and_is_logged_once(caplog) -> None:
    c = cache(capture_after=1)
    assert c.admit("a") is Admission.CAPTURE
    with caplog.at_level(logging.INFO, logger="launchless"):
        for _ in range(3):
            c.refuse("a", Refusal(Stage.CAPTURE, "host sync", "M.forward cannot be captured: host sync"))
    assert c.admit("a") is Admission.REFUSED and c.state("a") is SignatureState.REFUSED
    assert [r.getMessage() for r in caplog.records] == ["M.forward cannot be captured: host sync"]
    (row,) = c.fallbacks(str)
    assert row["stage"] == "capture" and row["reason"] == "host sync"


def test_out_of_memory_is_tried_again_after_a_wait_that_doubles() -> None:
    from launchless.core.cache import RETRY_FIRST, RETRY_MOST

    c = cache(capture_after=1)
    oom = Refusal(Stage.CAPTURE, "out of GPU memory", transient=True)

    def calls_until_capture() -> int:
        calls = 1
        while c.admit("a") is not Admission.CAPTURE:
            assert c.state("a") is SignatureState.REFUSED
            calls += 1
        return calls

    assert c.admit("a") is Admission.CAPTURE
    waits = []
    for _ in range(9):
        c.refuse("a", oom, log_line=False)
        assert c.retry_in("a") == (waits[-1] * 2 if waits else RETRY_FIRST) or c.retry_in("a") == RETRY_MOST
        waits.append(calls_until_capture())
    assert waits == [8, 16, 32, 64, 128, 256, 512, 1024, 1024], waits
    c.keep("a", "graph-a", {}, ())  # captured at last: the next out-of-memory refusal waits the shortest time
    c.drop_all(forget_refusals=False)
    assert c.admit("a") is Admission.CAPTURE
    c.refuse("a", oom, log_line=False)
    assert c.retry_in("a") == RETRY_FIRST
    c.refuse("a", Refusal(Stage.CAPTURE, "host sync"), log_line=False)  # a lasting cause replaces it: no retry
    assert c.retry_in("a") is None and all(c.admit("a") is Admission.REFUSED for _ in range(2000))


def test_eviction_is_least_recently_used_with_one_warning(caplog) -> None:
    c = cache(capture_after=1, max_graphs=2)
    with caplog.at_level(logging.INFO, logger="launchless"):
        for key in ("a", "b"):
            c.keep(key, key, None, ())
        assert c.lookup("a", ()) == "a"  # b is now the least recently used
        c.keep("c", "c", None, ())
        c.keep("d", "d", None, ())
    assert list(c.graphs) == ["c", "d"] and c.evictions == 2
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "max_graphs=2" in warnings[0].getMessage()


def test_an_evicted_signature_coming_back_stops_eviction(caplog) -> None:
    c = cache(capture_after=1, max_graphs=1)
    c.keep("a", "a", None, ())
    c.keep("b", "b", None, ())  # evicts a
    with caplog.at_level(logging.INFO, logger="launchless"):
        assert c.admit("a") is Admission.OVER_CAPACITY
        assert c.admit("a") is Admission.OVER_CAPACITY
    assert list(c.graphs) == ["b"] and c.summary()["calls_over_max_graphs"] == 2
    assert sum("needs more than max_graphs=1" in r.getMessage() for r in caplog.records) == 1


def test_a_stale_check_drops_every_graph_once_per_reason(caplog) -> None:
    flag = Flag()
    dropped = []
    c = cache(capture_after=1, guards=[flag], on_invalidate=dropped.append)
    c.keep("a", "a", None, ())
    c.keep("b", "b", None, ())
    assert flag.armed == 1  # armed by the first graph kept, not by every one
    flag.why = "the optimizer's state was replaced"
    with caplog.at_level(logging.INFO, logger="launchless"):
        assert c.lookup("a", ()) is None
    assert not c.graphs and c.invalidations == 1 and dropped == ["the optimizer's state was replaced"]
    assert [r.getMessage() for r in caplog.records] == [
        "launchless: M.forward: the optimizer's state was replaced; dropped 2 graph(s), captured again as needed"
    ]
    flag.why = None
    assert c.admit("a") is Admission.CAPTURE  # counting starts again after capture_after=1


def test_lookup_of_an_unknown_signature_runs_no_check() -> None:
    flag = Flag()
    c = cache(guards=[flag])
    c.keep("a", "a", None, ())
    flag.why = "moved"
    assert c.lookup("other", ()) is None and c.graphs  # checks run before a replay, not on every miss
    assert c.lookup("a", ()) is None and not c.graphs


def test_a_failed_capture_retires_the_pool_and_an_empty_cache_releases_it(fake_pools) -> None:
    c = cache()
    with pytest.raises(CaptureFailed), c.capturing("a") as first:
        raise CaptureFailed(Stage.CAPTURE, None, "operation not permitted when stream is capturing")
    with c.capturing("a") as second:
        pass
    assert first != second  # PyTorch's rule: a pool a capture failed in is not captured into again
    c.discard()  # a verification failed and nothing is held: the pool goes too
    with c.capturing("a") as third:
        pass
    assert third not in (first, second) and len(fake_pools) == 3
    c.keep("a", "a", None, ())
    c.discard()  # a graph is held: its pool stays
    with c.capturing("b") as fourth:
        pass
    assert fourth == third


def test_a_warm_up_failure_keeps_the_pool(fake_pools) -> None:
    c = cache()
    with pytest.raises(CaptureFailed), c.capturing("a") as first:
        raise CaptureFailed(Stage.WARM_UP, ValueError("bad input"), "the forward failed during warm-up")
    with c.capturing("a") as second:
        pass
    assert first == second


def test_a_shared_pool_stays_while_any_cache_holds_a_graph_in_it(fake_pools) -> None:
    shared = pool_module.GraphPool(shared=True)
    a, b = cache(pool=shared), cache(pool=shared)
    with a.capturing("x") as first:
        a.keep("x", "graph-a", None, ())
    with b.capturing("y") as second:
        b.keep("y", "graph-b", None, ())
    assert first == second  # the second model's graphs go into the same pool
    a.drop_all()  # the first model lets go of its graphs: the second still holds one in the pool
    with a.capturing("x") as third:
        pass
    assert third == first
    b.drop_all()
    a.discard()  # nothing is held in the pool by either: it goes
    with b.capturing("y") as fourth:
        pass
    assert fourth != first and len(fake_pools) == 2


def test_a_caches_own_pool_replays_under_the_caches_lock_and_a_shared_one_under_its_own() -> None:
    own = cache()
    assert own.pool.lock is own.lock and not own.pool.shared
    shared = pool_module.GraphPool(shared=True)
    a, b = cache(pool=shared), cache(pool=shared)
    assert a.pool.lock is b.pool.lock is shared.lock and a.lock is not b.lock


def test_release_forgets_refusals_and_counts() -> None:
    c = cache(capture_after=2)
    c.admit("a")
    c.refuse("b", Refusal(Stage.VERIFICATION, "verification"), log_line=False)
    c.drop_all()
    assert c.state("a") is None and c.state("b") is None and c.invalidations == 0
    assert c.admit("a") is Admission.WAIT


def test_states_print_as_their_values() -> None:
    assert f"{SignatureState.REPLAYING}" == "replaying" and str(Stage.NO_DEVICE) == "no CUDA device"
    assert Stage.CAPTURE == "capture"  # a str enum: compares with the plain value
