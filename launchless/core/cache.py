"""GraphCache: the per-signature state machine every entry point runs its graphs through.

A signature is *seen* (counted towards ``capture_after``), then *captured* and *verified* -- or *refused*, and
from then on runs without a graph -- and a verified graph is *replaying* once it has served a call. The
cache holds at most ``max_graphs`` graphs, least recently used evicted; once an evicted signature comes back
(more shapes in use than ``max_graphs``: ``churn``) it stops evicting and keeps what it holds. Before every
replay it runs the validity checks (``Guard``) its policy gave it, and when one says the graphs no longer
read what they captured -- parameters relocated, optimizer state replaced, cuFFT plans destroyed
(``fft_plans``, armed by the cache itself) -- every graph is dropped with one log line and captured again as
needed. It owns the memory pool's lifetime (``pool``), the log-once rule and
the rows ``graph_info()`` shows.

What it does not decide: the key (the policy computes the ``Signature``), what to capture and how to verify
it. ``wrap``, ``graphed_step`` and the compiler backend are thin policies over it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import torch

from .budget import BUDGET, tick
from .capture import CAPTURE_LOCK, CaptureFailed
from .churn import ShapeChurn
from .fft_plans import CufftPlanWatch
from .pool import GraphPool
from .status import Admission, SignatureState, Stage

log = logging.getLogger("launchless")


def _captured(held: Any) -> Iterator[Any]:
    """A held graph, then the captured graph inside it (a training step's or a compiled graph's entry)."""
    yield held
    yield getattr(held, "graph", None)


def graph_bytes(held: Any) -> int:
    """A held graph's memory as the budget counts it: what its capture added to PyTorch's reserved memory, and its
    static input buffers."""
    for graph in _captured(held):
        if hasattr(graph, "held_bytes"):
            return int(graph.held_bytes)
        if hasattr(graph, "pool_growth"):
            return int(graph.pool_growth or 0)
    return 0


def plan_devices(held: Any) -> tuple[int, ...]:
    """The devices whose cuFFT plans a held graph may read (``fft_plans``)."""
    for graph in _captured(held):
        devices = getattr(graph, "plan_devices", None)
        if devices is not None:
            return tuple(devices)
    return ()


G = TypeVar("G")  # what a policy holds per signature: a captured forward, a training step, a compiled graph's entry
REMEMBER = 4096  # signatures counted towards capture_after, and refused ones: oldest forgotten first
RETRY_FIRST, RETRY_MOST = 8, 1024  # calls before a transient refusal is tried again: 8, 16, 32, ... 1024


class Guard(Protocol):
    """A validity check run before every replay: do the graphs still read what they captured?"""

    def arm(self, leaves: Sequence[Any]) -> None:
        """A graph was kept: remember what the graphs read now (``leaves``: the capturing call's inputs)."""

    def stale(self, leaves: Sequence[Any]) -> str | None:
        """None while the graphs are valid for this call; else why every graph must be captured again."""


@dataclass(frozen=True)
class Refusal:
    """Why a signature runs without a graph; ``error`` is raised where the caller asked for a graph explicitly."""

    stage: Stage
    reason: str  # one line
    message: str = ""  # the whole explanation (defaults to ``reason``)
    operation: str | None = None
    source: str | None = None
    error: Exception | None = None
    # a passing cause (out of GPU memory): tried again after a number of calls that doubles each time
    transient: bool = False

    def row(self, signature: str) -> dict[str, Any]:
        return {
            "signature": signature,
            "stage": str(self.stage),
            "reason": self.reason,
            "message": self.message or self.reason,
            "operation": self.operation,
            "source": self.source,
            "transient": self.transient,
        }


class GraphCache(Generic[G]):
    """Graphs per input signature, with the counting, limits, refusals, validity checks, logging and pool they
    share. Thread-safe for captures (``capturing`` holds the cache's lock and the process-wide capture lock)."""

    def __init__(
        self,
        *,
        name: str,
        capture_after: int,
        max_graphs: int,
        max_graphs_hint: str = "max_graphs",
        guards: Sequence[Guard] = (),
        on_invalidate: Callable[[str], None] | None = None,
        pool: GraphPool | None = None,
    ) -> None:
        self.name = name
        self.capture_after = capture_after
        self.max_graphs = max_graphs
        self.max_graphs_hint = max_graphs_hint  # how the user raises max_graphs at this entry point
        self.guards = list(guards)
        self.on_invalidate = on_invalidate  # what the policy resets when a validity check drops the graphs
        self.graphs: OrderedDict[Hashable, G] = OrderedDict()
        self.reports: dict[Hashable, Any] = {}
        self.lock = threading.RLock()
        self.pool = pool or GraphPool(lock=self.lock)  # a pool shared across models (``pool``), or its own
        if self.pool.shared:
            self.pool.join(self)
        self.churn = ShapeChurn()
        self.plans = CufftPlanWatch()  # a guard too, once a graph may read cuFFT plans
        self.evictions = 0
        self.invalidations = 0
        self._seen: OrderedDict[Hashable, int] = OrderedDict()
        self._refused: OrderedDict[Hashable, Refusal] = OrderedDict()
        self._retry: dict[Hashable, list[int]] = {}  # transient refusals: [calls left, calls to wait next time]
        self._capturing: Hashable | None = None
        self._logged: set[str] = set()
        self.used: dict[Hashable, int] = {}  # key -> when its graph was last replayed or kept (``budget.tick``)
        BUDGET.register(self)

    # ---- the call --------------------------------------------------------------------------------
    def lookup(self, key: Hashable, leaves: Sequence[Any]) -> G | None:
        """The graph to replay for ``key``, after every validity check; None when there is none (any more)."""
        if key not in self.graphs or not self.validate(leaves):
            return None
        return self.get(key)

    def validate(self, leaves: Sequence[Any]) -> bool:
        """Run every validity check; when one fails, every graph is dropped (one log line) and False returned."""
        for guard in self.guards:
            why = guard.stale(leaves)
            if why is not None:
                self.drop_all(why)
                return False
        return True

    def get(self, key: Hashable) -> G | None:
        """The graph held for ``key`` (made the most recently used), without validity checks: for a policy that
        ran ``validate`` already on this call."""
        graph = self.graphs.get(key)
        if graph is not None:
            self.graphs.move_to_end(key)
            self.used[key] = tick()
        return graph

    def admit(self, key: Hashable) -> Admission:
        """For a signature without a graph: refused before, still waiting, over capacity, or to capture now."""
        if key in self._refused and not self._retry_due(key):
            return Admission.REFUSED
        count = self._seen.pop(key, 0) + 1
        self._seen[key] = count
        if len(self._seen) > REMEMBER:  # shapes seen once and never again (a dynamic length) are forgotten
            self._seen.popitem(last=False)
        if count < self.capture_after:
            return Admission.WAIT
        if not self.churn.admits(key, len(self.graphs), self.max_graphs):
            self.log_once("churn", logging.INFO, self.churn.message(self.name, self.max_graphs, self.max_graphs_hint))
            return Admission.OVER_CAPACITY
        return Admission.CAPTURE

    def waits_to_retry(self) -> bool:
        """Whether a transient refusal (out of memory) is counting calls until its signature is tried again."""
        return bool(self._retry)

    def _retry_due(self, key: Hashable) -> bool:
        """A transient refusal counts this call; once its wait is over the signature is captured again."""
        retry = self._retry.get(key)
        if retry is None:
            return False
        retry[0] -= 1
        if retry[0] > 0:
            return False
        del self._refused[key]
        self._seen[key] = self.capture_after  # waited long enough: the next admission captures
        return True

    def refusal(self, key: Hashable) -> Refusal | None:
        return self._refused.get(key)

    def retry_in(self, key: Hashable) -> int | None:
        """Calls before a transient refusal of ``key`` is tried again (None: not a transient refusal)."""
        retry = self._retry.get(key)
        return retry[0] if retry is not None and key in self._refused else None

    def forget_refusal(self, key: Hashable) -> None:
        """An explicit capture request tries a refused signature again."""
        self._refused.pop(key, None)

    # ---- capture ---------------------------------------------------------------------------------
    @contextlib.contextmanager
    def capturing(self, key: Hashable) -> Iterator[Any]:
        """Hold the locks for one capture of ``key`` and yield the pool to capture into. A capture that failed
        midway retires the pool (``CaptureFailed`` with stage ``capture`` propagates)."""
        with self.lock, CAPTURE_LOCK, self.pool.lock:  # a shared pool: no other model replays meanwhile
            self._capturing = key
            if self.pool.shared and torch.cuda.is_initialized():
                self.pool.order(torch.cuda.current_device())  # after the last replay into the pool, on the GPU
            try:
                yield self.pool.handle()
            except CaptureFailed as fail:
                if fail.stage == Stage.CAPTURE:
                    self.pool.retire()
                raise
            finally:
                self._capturing = None

    def keep(self, key: Hashable, graph: G, report: Any, leaves: Sequence[Any]) -> None:
        """A verified graph: held (evicting the least recently used beyond ``max_graphs``), guards armed."""
        with self.lock:
            if self.graphs:  # graphs held already: still valid for what this one read?
                self.validate(leaves)
            if not self.graphs:
                for guard in self.guards:
                    guard.arm(leaves)
            self._seen.pop(key, None)
            self._refused.pop(key, None)  # cuda_graph=True tries a passing refusal again at every call
            self._retry.pop(key, None)  # captured: a later out-of-memory refusal waits the shortest time again
            self.graphs[key] = graph
            self.reports[key] = report
            self.used[key] = tick()
            self._watch_plans(graph)
            while len(self.graphs) > self.max_graphs:
                old, _ = self.graphs.popitem(last=False)
                self.reports.pop(old, None)
                self.used.pop(old, None)
                self.evictions += 1
                self.churn.evicted(old)
                self.log_once(
                    "evict",
                    logging.WARNING,
                    f"launchless: {self.name} has more than max_graphs={self.max_graphs} input signatures; evicting "
                    f"the least recently used graph (raise {self.max_graphs_hint}, or pad inputs to fewer shapes). "
                    "Shown once.",
                )
        BUDGET.enforce(kept=(self, key))  # outside this cache's lock: it may evict from other caches

    def _watch_plans(self, graph: G) -> None:
        """A graph that may read cuFFT plans: the plan caches of its devices are checked before every replay."""
        devices = plan_devices(graph)
        if not devices:
            return
        for device in devices:
            self.plans.watch(device)
        if self.plans not in self.guards:  # a new list: a call validating in another thread keeps its own
            self.guards = [*self.guards, self.plans]

    def held(self) -> list[tuple[Hashable, int, int]]:
        """For the memory budget: per graph held, its key, bytes (its pool growth at capture) and last use."""
        with self.lock:
            return [(key, graph_bytes(graph), self.used.get(key, 0)) for key, graph in self.graphs.items()]

    def evict(self, key: Hashable, why: str) -> None:
        """The memory budget evicts this graph (one WARNING per cache); it is captured again when needed."""
        with self.lock:
            if self.graphs.pop(key, None) is None:
                return
            self.reports.pop(key, None)
            self.used.pop(key, None)
            self.evictions += 1
            self.pool.release_if_empty(len(self.graphs))
            self.log_once(
                "budget",
                logging.WARNING,
                f"launchless: {self.name}: evicting the least recently used graph across models: {why} "
                "(launchless.set_memory_budget). Shown once.",
            )

    def forget(self, key: Hashable) -> None:
        """The policy dropped what this graph reads (a decode graph's cache): it goes without a log line."""
        with self.lock:
            if self.graphs.pop(key, None) is not None:
                self.reports.pop(key, None)
                self.used.pop(key, None)
                self.pool.release_if_empty(len(self.graphs))

    def discard(self) -> None:
        """A captured graph was not kept (verification failed): its pool goes if no graph is left in it."""
        self.pool.release_if_empty(len(self.graphs))

    def refuse(self, key: Hashable, refusal: Refusal, *, level: int = logging.INFO, log_line: bool = True) -> None:
        """``key`` runs without a graph from now on -- a transient refusal until its wait is over (see
        ``retry_in``); one log line per reason and source line."""
        self._refused[key] = refusal
        self._seen.pop(key, None)
        if refusal.transient:
            wait = self._retry.get(key, [0, RETRY_FIRST])[1]
            self._retry[key] = [wait, min(2 * wait, RETRY_MOST)]
        else:
            self._retry.pop(key, None)
        if len(self._refused) > REMEMBER:
            old, _ = self._refused.popitem(last=False)
            self._retry.pop(old, None)
        if log_line:
            self.log_once(f"refuse:{refusal.stage}:{refusal.reason}:{refusal.source}", level, refusal.message)

    # ---- invalidation and release ------------------------------------------------------------------
    def drop_all(self, why: str | None = None, *, forget_refusals: bool = True) -> int:
        """Every graph goes (their pool with them); they are captured again as needed. ``why`` (a validity check
        failed) is logged once per reason and counted as an invalidation. Refused signatures are tried again
        unless ``forget_refusals`` is False. Returns how many graphs were held."""
        with self.lock:
            dropped = len(self.graphs)
            self.graphs.clear()
            self.reports.clear()
            self.used.clear()
            self._seen.clear()
            if forget_refusals:
                self._refused.clear()
                self._retry.clear()
            self.churn.reset()
            if self.plans in self.guards:  # no graph left to read a plan
                self.guards = [guard for guard in self.guards if guard is not self.plans]
                self.plans.reset()
            self.pool.release()
            if why is not None:
                self.invalidations += 1
                if self.on_invalidate is not None:
                    self.on_invalidate(why)
                if dropped:
                    self.log_once(
                        f"invalid:{why}",
                        logging.INFO,
                        f"launchless: {self.name}: {why}; dropped {dropped} graph(s), captured again as needed",
                    )
            return dropped

    # ---- logging and reporting ---------------------------------------------------------------------
    def log_once(self, key: str, level: int, message: str) -> None:
        """One line per distinct cause for the life of the cache: never a line per call."""
        if key not in self._logged:
            self._logged.add(key)
            log.log(level, message)

    def state(self, key: Hashable, *, replays: int = 0) -> SignatureState | None:
        """Where ``key`` stands (None: never seen, or forgotten)."""
        if key == self._capturing:
            return SignatureState.CAPTURED
        if key in self.graphs:
            return SignatureState.REPLAYING if replays else SignatureState.VERIFIED
        if key in self._refused:
            return SignatureState.REFUSED
        return SignatureState.SEEN if key in self._seen else None

    def rows(self, describe: Callable[[Any, G], dict[str, Any]]) -> list[dict[str, Any]]:
        """One ``graph_info()`` row per held graph: the signature, its state, and what the policy adds."""
        rows = []
        for key, graph in self.graphs.items():
            row = describe(key, graph)
            row["state"] = str(self.state(key, replays=row.get("replays", 0)))
            rows.append(row)
        return rows

    def fallbacks(self, describe_key: Callable[[Any], str]) -> list[dict[str, Any]]:
        return [refusal.row(describe_key(key)) for key, refusal in self._refused.items()]

    def summary(self) -> dict[str, Any]:
        """The counters every entry point's ``graph_info()`` shares."""
        return {
            "max_graphs": self.max_graphs,
            "capture_after": self.capture_after,
            "evictions": self.evictions,
            "invalidations": self.invalidations,
            # more shapes in use than max_graphs: eviction stopped, and this many calls ran without a graph
            "calls_over_max_graphs": self.churn.calls_without_graph if self.churn.stop_evicting else None,
        }
