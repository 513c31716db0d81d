"""Junction splits at run time: a forward that cannot be captured whole runs as captured submodules.

A torchvision detector normalises its images with a host copy, an R-CNN's proposal step sorts and filters
boxes on data-dependent shapes, a transformers model may return a cache object or sync on a mask: one such
line refuses the graph of the whole forward, and the backbone -- most of the GPU time -- runs eager with it.
The split keeps the part that blocks eager and graphs the rest, by submodule:

- The root's children become *pieces*: each is its own graph cache over that submodule (captured at its first
  call, verified against eager like a whole graph, one graph per input signature). A piece whose forward
  cannot be captured (or fails verification) is *expanded*: its own code runs eager and its children become
  pieces, down the module tree. Modules that hold no parameters or buffers (activations, pooling, the
  transform that blocks) are not worth a graph and run inside their parent's eager code; containers without a
  forward (``ModuleList``, ``ModuleDict``) are looked through.
- A piece is routed to while the split forward runs by shadowing the submodule's ``forward`` on the instance
  (the module stays where it is: ``isinstance``, ``len``, indexing and attribute reads in the parent's code see
  the user's module; its hooks run around the replay). The shadow is removed when the call returns or raises.
- The search runs on the call that found the whole forward refused: forward, expand what refused, forward
  again, until nothing more is refused. Then the joined forward is proven against eager on two probes, like a
  graph (``core.verify``), and timed against eager in interleaved rounds, waited-for and back to back: a split
  that is not equal to eager, or not faster than it both ways, is dropped and that signature runs eager. Every
  decision is one log line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Hashable, Iterator
from typing import Any, Protocol, cast

import torch
from torch import nn

from ..core.cache import GraphCache, Refusal
from ..core.signature import FlatInputs
from ..core.snapshot import RngState
from ..core.status import SplitStatus, Stage, VerifyStatus
from ..core.verify import VerifyReport, verify
from ..timing import judge_speed

SPLITTABLE = frozenset({Stage.CAPTURE, Stage.OUTPUTS, Stage.VERIFICATION})
"""Refusals of a whole forward a split can work around: the blocker is in some part of it, not in its device. A
forward that writes into the caller's input is not split: it runs eager, as the caller's tensor must change."""
EXPANDABLE = SPLITTABLE | {Stage.INPUT_MUTATION}
"""Refusals of a piece that its children may not share (a piece writing into its input writes into an
intermediate of its parent's eager code, which the expanded piece's own code then does eagerly)."""
MAX_ROUNDS = 24  # forward passes one search may take (each expands at least one piece)
_ABSENT = object()


class Piece(Protocol):
    """One submodule's graph cache, as the runtime builds it (a ``GraphedModule`` that calls the submodule's
    own forward, so the shadow that routes to it is not called again)."""

    _cache: GraphCache[Any]  # the runtime sets its capture_after

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

    def graph_info(self) -> dict: ...

    def release_graphs(self) -> None: ...


@dataclasses.dataclass(frozen=True)
class EagerPart:
    """A module whose own code runs eager, and why: its forward was refused as a whole."""

    module: str  # dotted path from the root ("" for the root)
    kind: str  # its class name
    reason: str
    source: str | None = None

    def row(self) -> dict[str, Any]:
        return {"module": self.module or "(root)", "type": self.kind, "reason": self.reason, "source": self.source}


@dataclasses.dataclass
class SplitOutcome:
    """What was decided for one input signature of the root."""

    status: SplitStatus
    detail: str = ""
    verification: dict | None = None
    eager_ms: float | None = None  # waited-for, per call
    split_ms: float | None = None
    eager_back_to_back_ms: float | None = None
    split_back_to_back_ms: float | None = None
    shares: dict[str, float] = dataclasses.field(default_factory=dict)  # piece path -> share of eager GPU time

    @property
    def speedup(self) -> float | None:
        return self.eager_ms / self.split_ms if self.eager_ms and self.split_ms else None


def worth_a_graph(module: nn.Module) -> bool:
    """Holds parameters or buffers (something of the model's own is computed) and has a forward to call."""
    if type(module).forward is nn.Module.forward:
        return False
    return any(True for _ in module.parameters()) or any(True for _ in module.buffers())


def is_container(module: nn.Module) -> bool:
    """A module that is never called, only iterated or indexed (``ModuleList``, ``ModuleDict``)."""
    return type(module).forward is nn.Module.forward


class SplitForward:
    """The pieces of one model, how to run the model through them, and the decision per input signature."""

    def __init__(
        self,
        model: nn.Module,
        *,
        name: str,
        why: EagerPart,
        make_piece: Callable[[nn.Module], Piece],
    ) -> None:
        self.model = model
        self.name = name
        self._make_piece = make_piece
        self.pieces: dict[str, Piece] = {}
        self._modules: dict[str, nn.Module] = {}  # piece path -> the submodule it stands for
        self._own: dict[str, Any] = {}  # piece path -> the instance's own forward when the piece was made, if any
        self.eager: dict[str, EagerPart] = {"": why}
        self.outcomes: dict[Hashable, SplitOutcome] = {}
        self._add_children("", model)

    # ---- the module tree -------------------------------------------------------------------------------------
    def _add_children(self, path: str, module: nn.Module) -> None:
        for name, child in module.named_children():
            child_path = f"{path}.{name}" if path else name
            if is_container(child):
                self._add_children(child_path, child)
            elif worth_a_graph(child):
                self._modules[child_path] = child
                self._own[child_path] = child.__dict__.get("forward", _ABSENT)
                self.pieces[child_path] = self._make_piece(child)

    def refine(self) -> bool:
        """Expand every piece refused as a whole (no graph held, a lasting refusal a split can work around);
        True when the plan changed."""
        changed = False
        for path, piece in list(self.pieces.items()):
            refusal = lasting_refusal(piece)
            if refusal is None:
                continue
            module = self._modules.pop(path)
            self._own.pop(path)
            del self.pieces[path]
            piece.release_graphs()
            self.eager[path] = EagerPart(path, type(module).__name__, refusal["reason"], refusal.get("source"))
            if Stage(refusal["stage"]) in EXPANDABLE:
                self._add_children(path, module)
            changed = True
        return changed

    # ---- running -----------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def routed(self, routes: dict[str, Callable[..., Any]] | None = None) -> Iterator[None]:
        """While inside: calling a piece's submodule runs ``routes[path]`` (by default the piece). The route is an
        instance attribute ``forward`` (``nn.Module.__call__`` looks there first); whatever the instance held
        before -- nothing, or a ``forward`` of the user's own -- is put back on the way out, also on an error."""
        routes = self.pieces if routes is None else routes
        previous: list[tuple[nn.Module, Any]] = []
        try:
            for path, target in routes.items():
                module = self._modules[path]
                held = module.__dict__.get("forward", _ABSENT)
                if held is not self._own[path]:  # the user gave it another forward since: that one runs, eager
                    continue
                previous.append((module, held))
                module.__dict__["forward"] = target
            yield
        finally:
            for module, held in reversed(previous):  # last in, first out: a module shared by two paths included
                if held is _ABSENT:
                    module.__dict__.pop("forward", None)
                else:
                    module.__dict__["forward"] = held

    def run(self, args: tuple, kwargs: dict) -> Any:
        """One forward of the model with its pieces replaying."""
        with self.routed():
            return self.model(*args, **kwargs)

    def search(self, flat: FlatInputs) -> None:
        """Run the forward, expanding what refuses, until the plan holds. It runs on copies of the call's
        tensors: the caller's own are used once, by the call itself."""
        args, kwargs = flat.rebuild(copies(flat.leaves))
        for _ in range(MAX_ROUNDS):
            self.run(args, kwargs)
            if not self.refine():
                break

    # ---- the decision per signature ------------------------------------------------------------------------------
    def decide(
        self,
        key: Hashable,
        flat: FlatInputs,
        *,
        verify_mode: str,
        tolerance_ulps: float,
        measure: bool = True,
    ) -> SplitOutcome:
        """Prove the joined forward against eager and time it; the outcome is kept for ``key``."""
        if not self.pieces:
            outcome = SplitOutcome(SplitStatus.DROPPED, "no submodule could be captured")
        else:
            report = self._verify(flat, verify_mode, tolerance_ulps)
            if not report.passed:
                outcome = SplitOutcome(
                    SplitStatus.DROPPED,
                    f"the joined forward differs from eager ({report.status}: {report.detail})",
                    verification=report.as_dict(),
                )
            else:
                outcome = SplitOutcome(SplitStatus.VERIFIED, verification=report.as_dict())
                if measure:
                    self._measure(flat, outcome)
        self.outcomes[key] = outcome
        return outcome

    def _verify(self, flat: FlatInputs, mode: str, tolerance_ulps: float) -> VerifyReport:
        if mode == "off":
            return VerifyReport(VerifyStatus.SKIPPED, True)
        return verify(_Joined(self, flat), self.model, flat, mode=mode, tolerance_ulps=tolerance_ulps)

    def _measure(self, flat: FlatInputs, outcome: SplitOutcome) -> None:
        """Waited-for time of eager and of the joined forward, interleaved; each piece's share of eager GPU time
        (on copies of the call's tensors)."""
        args, kwargs = flat.rebuild(copies(flat.leaves))
        verdict = judge_speed(lambda: self.model(*args, **kwargs), lambda: self.run(args, kwargs))
        outcome.eager_ms, outcome.split_ms = verdict.eager_ms, verdict.candidate_ms
        outcome.eager_back_to_back_ms = verdict.eager_back_to_back_ms
        outcome.split_back_to_back_ms = verdict.candidate_back_to_back_ms
        outcome.shares = self._shares(args, kwargs)
        if not verdict.faster:
            outcome.status = SplitStatus.DROPPED
            outcome.detail = verdict.detail

    def _shares(self, args: tuple, kwargs: dict) -> dict[str, float]:
        """One eager forward with CUDA events around each piece's submodule: its share of the forward's time."""
        events: dict[str, list[tuple[torch.cuda.Event, torch.cuda.Event]]] = {path: [] for path in self.pieces}

        def timed(path: str, module: nn.Module) -> Callable[..., Any]:
            forward = type(module).forward

            def run(*a: Any, **k: Any) -> Any:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                out = forward(module, *a, **k)
                end.record()
                events[path].append((start, end))
                return out

            return run

        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with self.routed({path: timed(path, self._modules[path]) for path in self.pieces}):
            start.record()
            self.model(*args, **kwargs)
            end.record()
        torch.cuda.synchronize()
        total = start.elapsed_time(end)
        if total <= 0:
            return {}
        return {path: round(sum(s.elapsed_time(e) for s, e in pairs) / total, 4) for path, pairs in events.items()}

    # ---- reporting and release -------------------------------------------------------------------------------------
    def release(self) -> None:
        for piece in self.pieces.values():
            piece.release_graphs()

    def info(self, describe: Callable[[Any], str]) -> dict[str, Any]:
        """The pieces (graphs, replays, verification), what runs eager and why, and the decision per signature."""
        pieces = []
        for path, piece in self.pieces.items():
            piece_info = piece.graph_info()
            graphs = piece_info["graphs"]
            pieces.append(
                {
                    "module": path,
                    "type": type(self._modules[path]).__name__,
                    "graphs": len(graphs),
                    "replays": sum(g["replays"] for g in graphs),
                    "pool_bytes": piece_info.get("pool_bytes", 0),
                    "verification": sorted({str(g["verification"]["status"]) for g in graphs if g["verification"]}),
                }
            )
        signatures = []
        for key, outcome in self.outcomes.items():
            signatures.append(
                {
                    "signature": describe(key),
                    "status": str(outcome.status),
                    "detail": outcome.detail,
                    "speedup": None if outcome.speedup is None else round(outcome.speedup, 3),
                    "eager_ms": outcome.eager_ms,
                    "split_ms": outcome.split_ms,
                    "eager_back_to_back_ms": outcome.eager_back_to_back_ms,
                    "split_back_to_back_ms": outcome.split_back_to_back_ms,
                    "captured_share": round(sum(outcome.shares.values()), 4) if outcome.shares else None,
                    "shares": dict(outcome.shares),
                    "verification": outcome.verification,
                }
            )
        return {"pieces": pieces, "eager": [part.row() for part in self.eager.values()], "signatures": signatures}

    def describe(self) -> str:
        """The split in one phrase: which pieces replay and what runs eager."""
        pieces = ", ".join(self.pieces) or "none"
        eager = ", ".join(part.module or "(root)" for part in self.eager.values())
        return f"pieces that replay: {pieces}; eager: {eager}"


class ModelSplit:
    """One wrapped model's split by submodule, for every input signature refused whole: made at the first of them,
    searched and decided at each one's first call (one log line), run where verified and faster, released when no
    signature uses it, dropped when the model changes (and searched again when needed)."""

    def __init__(
        self,
        model: nn.Module,
        *,
        name: str,
        make_piece: Callable[[nn.Module], Piece],
        log_once: Callable[[str, int, str], None],
    ) -> None:
        self.model, self.name = model, name
        self._make_piece, self._log_once = make_piece, log_once
        self.forward: SplitForward | None = None  # made at the first signature refused whole

    def has(self, key: Hashable) -> bool:
        """Whether ``key``'s split was decided (verified or dropped)."""
        return self.forward is not None and key in self.forward.outcomes

    def verified(self, key: Hashable) -> bool:
        """Whether ``key`` runs split: decided, verified against eager and faster."""
        outcome = None if self.forward is None else self.forward.outcomes.get(key)
        return outcome is not None and outcome.status is SplitStatus.VERIFIED

    def runs_any(self) -> bool:
        """Whether any signature runs split (its calls must take the full path, which routes them)."""
        return self.forward is not None and any(
            outcome.status is SplitStatus.VERIFIED for outcome in self.forward.outcomes.values()
        )

    def outcome(
        self,
        key: Hashable,
        flat: FlatInputs,
        refusal: Refusal | None,
        *,
        verify_mode: str,
        tolerance_ulps: float,
        capture_after: int,
        describe: Callable[[Any], str],
        strict: bool = False,
    ) -> SplitOutcome:
        """``key``'s decision; at its first call the search and the decision (they run the forward: the generators
        go back to where the call began, so its own result draws what eager would). ``strict``: a dropped split
        makes the call raise (``cuda_graph=True``), not run eager."""
        split = self.forward
        if split is None:
            split = self.forward = self._new(refusal)
        outcome = split.outcomes.get(key)
        if outcome is not None:
            return outcome
        self._pieces_capture_after(1)  # a search captures what it meets at once
        rng = RngState()
        split.search(flat)
        outcome = split.decide(key, flat, verify_mode=verify_mode, tolerance_ulps=tolerance_ulps)
        rng.rewind()
        self._log(describe(key), outcome, strict=strict)
        # then a piece's new shapes (a detector head's box count per image) must repeat to be captured
        self._pieces_capture_after(max(2, capture_after))
        if not any(o.status is SplitStatus.VERIFIED for o in split.outcomes.values()):
            split.release()  # no signature uses the pieces: their memory goes
        return outcome

    def run(self, args: tuple, kwargs: dict) -> Any:
        """The forward through the pieces (a signature whose outcome is verified)."""
        return cast(SplitForward, self.forward).run(args, kwargs)

    def note(
        self, key: Hashable, flat: FlatInputs, refusal: Refusal, *, verify_mode: str, tolerance_ulps: float
    ) -> str:
        """What a call would run instead of the one graph capture_graph() asked for: a split searched and verified
        on this call, then released (not timed: the note names what is allowed)."""
        split = self._new(refusal)
        try:
            split.search(flat)
            outcome = split.decide(key, flat, verify_mode=verify_mode, tolerance_ulps=tolerance_ulps, measure=False)
        except Exception as exc:  # the note is a courtesy: the refusal is the error
            return f" (a split by submodule could not be tried: {type(exc).__name__}: {exc})"
        finally:
            split.release()
        if outcome.status is not SplitStatus.VERIFIED:
            return f" A split by submodule was tried and is not usable: {outcome.detail}."
        return f" A call runs it split by submodule, verified against eager ({split.describe()}), if faster than eager."

    def drop(self) -> None:
        """The model changed (parameters moved, a submodule swapped): the split is searched again when needed."""
        if self.forward is not None:
            self.forward.release()
            self.forward = None

    def info(self, describe: Callable[[Any], str]) -> dict[str, Any] | None:
        return None if self.forward is None else self.forward.info(describe)

    def _new(self, refusal: Refusal | None) -> SplitForward:
        why = EagerPart(
            "",
            type(self.model).__name__,
            refusal.reason if refusal else "refused as a whole",
            refusal.source if refusal else None,
        )
        return SplitForward(self.model, name=self.name, why=why, make_piece=self._make_piece)

    def _pieces_capture_after(self, calls: int) -> None:
        for piece in cast(SplitForward, self.forward).pieces.values():
            piece._cache.capture_after = calls

    def _log(self, signature: str, outcome: SplitOutcome, *, strict: bool) -> None:
        split = cast(SplitForward, self.forward)
        root = split.eager[""]
        where = f" at {root.source}" if root.source else ""
        if outcome.status is SplitStatus.VERIFIED:
            share = sum(outcome.shares.values())
            speed = f"; {outcome.speedup:.2f}x over eager" if outcome.speedup else ""
            message = (
                f"launchless: {self.name} cannot be captured whole ({root.reason}{where}); it runs split by "
                f"submodule, verified against eager: {len(split.pieces)} piece(s) replay"
                + (f" ({share:.0%} of eager GPU time)" if outcome.shares else "")
                + f"{speed}. {split.describe()}. graph_info()['split'] has the details"
            )
        else:
            message = (
                f"launchless: {self.name} {signature} cannot be captured whole ({root.reason}{where}) and "
                f"its split by submodule is dropped: {outcome.detail}. "
                + ("cuda_graph=True raises the refusal" if strict else "Running eager for this input signature")
            )
        self._log_once(f"split:{outcome.status}", logging.INFO, message)


class _Joined:
    """The joined forward on the verification protocol's probes (it replays like a graph would)."""

    def __init__(self, split: SplitForward, flat: FlatInputs) -> None:
        self._split, self._flat = split, flat

    def replay_cloned(self, leaves: list) -> Any:
        args, kwargs = self._flat.rebuild(leaves)
        return self._split.run(args, kwargs)


def copies(leaves: list) -> list:
    """The call's leaves with every tensor copied (same layout): runs that are not the call itself use these."""
    return [torch.empty_like(x).copy_(x) if isinstance(x, torch.Tensor) else x for x in leaves]


def lasting_refusal(piece: Piece) -> dict | None:
    """The refusal that makes a piece worth expanding: no graph held and a refusal that is not passing."""
    info = piece.graph_info()
    if info["graphs"]:
        return None
    for row in info["fallbacks"]:
        if not row.get("transient"):
            return row
    return None
