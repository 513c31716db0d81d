"""What a wrapped forward's call runs where no graph replays: eager, a split by submodule, or the refusal's error.

A signature whose whole graph was refused still has to answer its calls. Under "auto" it runs split by submodule
where that was proven and faster, else eager, with one log line per reason; under ``cuda_graph=True`` it raises the
refusal's error (a graph was asked for), unless its split runs. A call the caller could graph by calling otherwise
(grad mode, training mode, an input with no signature) runs eager with one WARNING per reason, counted for
``graph_info()["eager_calls"]``.
"""

from __future__ import annotations

import logging
from typing import Any, cast

from ..core.cache import GraphCache, Refusal
from ..core.junctions import JunctionChanged, JunctionValueChanged
from ..core.signature import FlatInputs, Signature
from ..core.status import SplitStatus, Stage
from .capture_flow import CaptureFlow, add_note
from .split import SPLITTABLE, ModelSplit


class Fallbacks:
    """The ways a wrapped forward's call runs without its graph, and how a refusal is taken when it comes.

    ``strict``: ``cuda_graph=True`` (a refused signature raises). ``level``: the most a refusal's log line says (a
    piece of a split leaves its refusals to the split's report).
    """

    def __init__(
        self,
        *,
        cache: GraphCache[Any],
        flow: CaptureFlow,
        split: ModelSplit,
        name: str,
        strict: bool,
        verify: str,
        tolerance_ulps: float,
        capture_after: int,
    ) -> None:
        self.cache, self.flow, self.split, self.name, self.strict = cache, flow, split, name, strict
        self.verify, self.tolerance_ulps, self.capture_after = verify, tolerance_ulps, capture_after
        self.level = logging.INFO
        self.eager_reasons: dict[str, int] = {}

    def eager(self, args: tuple, kwargs: dict) -> Any:
        """The model's forward without a graph (a piece of a split: its submodule's own forward)."""
        return self.flow.target()(*args, **kwargs)

    def eager_because(self, reason: str, args: tuple, kwargs: dict) -> Any:
        """A call the caller could graph by changing how it calls (grad mode, training mode, an input): eager,
        with one WARNING per reason."""
        self.eager_reasons[reason] = self.eager_reasons.get(reason, 0) + 1
        self.cache.log_once(f"eager:{reason}", logging.WARNING, f"launchless: {self.name} runs eager: {reason}")
        return self.eager(args, kwargs)

    def refused(self, sig: Signature, flat: FlatInputs, args: tuple, kwargs: dict, *, split: bool = True) -> Any:
        """A call of a signature refused before: its split where one was verified (``split``: a batch bucket's
        signature has none), else the refusal's error under ``cuda_graph=True``, else eager. A split decided and
        dropped is not looked up again: on a launch-bound forward of a few milliseconds that runs eager, every
        microsecond of the wrapper's own work shows against eager."""
        if split and self.split.verified(sig):
            return self.run_split(sig, flat)
        error = self.error(sig)
        if error is not None:
            raise error
        return self.eager(args, kwargs)

    def refuse(
        self, sig: Signature, flat: FlatInputs, refusal: Refusal, *, explicit: bool, level: int = logging.INFO
    ) -> Any:
        """A capture refused: recorded, then this call runs split, raises or runs eager with one log line.
        ``explicit``: ``capture_graph()`` asked for this one graph: the error, with what a call would run instead."""
        self.cache.refuse(sig, refusal, log_line=False)
        # a forward with collectives is not split: a rank could split where another does not
        splittable = (
            refusal.stage in SPLITTABLE and not refusal.transient and self.flow.splits and not self.flow.collective
        )
        if explicit:
            if splittable:
                add_note(refusal.error, self._split_note(sig, flat, refusal))
            raise _explicit_error(refusal)
        if splittable:
            return self.run_split(sig, flat, refusal)
        if self.strict:
            raise _explicit_error(refusal)
        retry = self.cache.retry_in(sig)
        self.cache.log_once(
            f"refuse:{refusal.stage}:{refusal.reason}:{refusal.source}",
            min(level, self.level) if level <= logging.INFO else level,
            f"{refusal.message}. Running eager for this input signature"
            + (f"; trying again in {retry} calls." if retry is not None else "."),
        )
        args, kwargs = flat.rebuild(flat.leaves)
        return self.eager(args, kwargs)

    def junction_changed(self, sig: Signature, flat: FlatInputs, exc: JunctionChanged) -> Any:
        """A chain's junction returned another shape than at its capture (its shape depends on the values after all),
        or a host read another value (the Python code after it may go another way). Nothing was handed out; the chain
        goes, and this signature runs as a refused one does from now on (split by submodule where allowed, else
        eager), this call included. One log line. (A batch bucket's padded call never replays a chain.)"""
        self.cache.forget(sig)
        refusal = Refusal(
            Stage.CAPTURE,
            "an operation run eager between graphs returned another "
            + ("value" if isinstance(exc, JunctionValueChanged) else "shape")
            + " than at its capture",
            f"launchless: {self.name} {sig.describe()}: {exc}. Its graphs are dropped and this input signature "
            "runs without them",
        )
        self.cache.refuse(sig, refusal)
        if self.flow.splits and not self.flow.collective:
            return self.run_split(sig, flat, refusal)
        args, kwargs = flat.rebuild(flat.leaves)
        return self.eager(args, kwargs)

    def run_split(self, sig: Signature, flat: FlatInputs, refusal: Refusal | None = None) -> Any:
        """A signature refused whole: its forward runs through the captured submodules, searched and decided at
        its first call (``split.ModelSplit``). Where the split was dropped: eager under "auto"; under
        ``cuda_graph=True`` the refusal is raised, naming why the split was dropped too."""
        args, kwargs = flat.rebuild(flat.leaves)
        with self.cache.lock:  # the split routes the model's submodules while it runs: one call at a time
            decided = self.split.has(sig)
            outcome = self.split.outcome(
                sig,
                flat,
                refusal,
                verify_mode=self.verify,
                tolerance_ulps=self.tolerance_ulps,
                capture_after=self.capture_after,
                describe=Signature.describe,
                strict=self.strict,
            )
            if outcome.status is SplitStatus.VERIFIED:
                return self.split.run(args, kwargs)
        error = self.error(sig)
        if error is not None:
            if not decided:
                add_note(error, f" A split by submodule was tried and dropped: {outcome.detail}.")
            raise error
        return self.eager(args, kwargs)

    def error(self, sig: Signature) -> Exception | None:
        """What a refused signature raises under ``cuda_graph=True``: its refusal's error, unless its split by
        submodule runs (verified and faster) or the refusal came after its graph was kept (an operation run eager
        between graphs returned another shape at replay: such a signature runs as "auto" runs it)."""
        if not self.strict or self.split.verified(sig):
            return None
        refusal = self.cache.refusal(sig)
        return None if refusal is None else refusal.error

    def _split_note(self, sig: Signature, flat: FlatInputs, refusal: Refusal) -> str:
        """What a call would run instead of the one graph capture_graph() asked for: graphs around operations,
        else a split by submodule."""
        return self.flow.chain_note(flat) or self.split.note(
            sig, flat, refusal, verify_mode=self.verify, tolerance_ulps=self.tolerance_ulps
        )


def _explicit_error(refusal: Refusal | None) -> Exception:
    """The error a refused signature raises where a graph was asked for explicitly: every refusal recorded for a
    signature carries one (the casts tell the type checker so; nothing is checked at run time)."""
    return cast(Exception, cast(Refusal, refusal).error)
