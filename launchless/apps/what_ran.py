"""What a wrapped model ran, read from its ``graph_info()``: its whole forward as one graph, split (graphs around
operations run eager between them, or its submodules as graphs around the code that blocks the whole), or eager --
and why not one graph, with the source line. The one reading of that structure that the bench, the conformance
matrix, the differential harness and ``launchless doctor`` share, so that they cannot come to tell it otherwise."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ..core.status import Label


class Ran(Label):
    """How a wrapped forward ran."""

    GRAPH = "graph"  # the whole forward replays
    SPLIT = "split"  # graphs with eager code between them, verified end to end
    EAGER = "eager"  # no graph: ``WhatRan.reason`` says why


class SplitBy(Label):
    OPERATION = "operation"  # graphs around operations run eager between them (a region split)
    SUBMODULE = "submodule"  # the submodules as graphs around the code that blocks the whole


@dataclasses.dataclass(frozen=True)
class WhatRan:
    """One wrapped forward's verdict, from its ``graph_info()`` (see ``what_ran``)."""

    ran: Ran
    split_by: SplitBy | None = None
    graphs: int = 0  # the graphs held (a whole graph) or replaying around the operations (split by operation)
    pieces: tuple[str, ...] = ()  # the submodules that replay (split by submodule)
    eager_parts: tuple[str, ...] = ()  # the operations, or submodules, run eager
    reason: str | None = None  # why not one graph (the split's root cause, else the first fallback's)
    source: str | None = None  # where that cause is
    fallback_reasons: tuple[str, ...] = ()  # every recorded reason for running eager
    verification: Mapping[str, Any] | None = None  # the kept graph's or split's verification report
    captured_share: float | None = None  # a split by submodule: the share of eager's GPU time that replays
    speedup: float | None = None  # a split by operation: over eager, measured when it was captured
    graph_bytes: int = 0  # the memory pools of the graphs (of the split's pieces where it split)

    @property
    def verified(self) -> bool:
        """A split by submodule was verified end to end to be kept; a graph, where its report passed."""
        if self.split_by is SplitBy.SUBMODULE:
            return self.ran is Ran.SPLIT
        return bool((self.verification or {}).get("passed"))


def what_ran(info: Mapping[str, Any]) -> WhatRan:
    """The verdict of a wrapped forward's ``graph_info()``: a graph that replays (split around operations where it
    carries a region split), else a verified split by submodule, else eager with the split's root cause (and why
    the split was dropped), the first fallback's reason or the first eager call's."""
    replaying = [g for g in info["graphs"] if g["replays"]]
    if replaying:
        first = replaying[0]
        region = first.get("region_split")
        common = dict(verification=first.get("verification"), graph_bytes=info.get("pool_bytes", 0))
        if not region:
            return WhatRan(Ran.GRAPH, graphs=len(info["graphs"]), **common)
        ops = tuple(dict.fromkeys(op["op"] for op in region["eager_ops"]))
        return WhatRan(
            Ran.SPLIT,
            SplitBy.OPERATION,
            graphs=region["graphs"],
            eager_parts=ops,
            reason=f"runs {', '.join(ops)} eager between graphs",
            source=region.get("source"),
            speedup=region.get("speedup"),
            **common,
        )
    split = info.get("split")
    fallbacks = tuple(f["reason"] for f in info["fallbacks"])
    if split:
        root = split["eager"][0]
        found = dict(
            eager_parts=tuple(part["module"] for part in split["eager"]),
            reason=root["reason"],
            source=root.get("source"),
            fallback_reasons=fallbacks,
            graph_bytes=sum(p.get("pool_bytes", 0) for p in split["pieces"]),
        )
        verified = [s for s in split["signatures"] if s["status"] == "verified"]
        if verified:
            return WhatRan(
                Ran.SPLIT,
                SplitBy.SUBMODULE,
                pieces=tuple(p["module"] for p in split["pieces"] if p["graphs"]),
                verification=verified[0].get("verification"),
                captured_share=verified[0]["captured_share"],
                **found,
            )
        if split["signatures"]:  # searched, proven and dropped (not equal to eager, or not faster)
            found["reason"] = f"{root['reason']}; split dropped: {split['signatures'][0]['detail']}"
            return WhatRan(Ran.EAGER, **found)
        if not info["fallbacks"] and not info.get("eager_calls"):  # searched, nothing decided: the split's cause
            return WhatRan(Ran.EAGER, **found)
        eager = _eager(info, fallbacks)  # the fallback's line, or the split's where an eager call is the reason
        source = eager.source if info["fallbacks"] else found["source"]
        return dataclasses.replace(
            eager, eager_parts=found["eager_parts"], source=source, graph_bytes=found["graph_bytes"]
        )
    return _eager(info, fallbacks)


def _eager(info: Mapping[str, Any], fallbacks: tuple[str, ...]) -> WhatRan:
    """Eager for the first fallback's reason, else for the first eager call's."""
    pools = info.get("pool_bytes", 0)
    if info["fallbacks"]:
        first = info["fallbacks"][0]
        return WhatRan(
            Ran.EAGER, reason=first["reason"], source=first.get("source"), fallback_reasons=fallbacks, graph_bytes=pools
        )
    eager_calls = list(info.get("eager_calls") or {})
    return WhatRan(Ran.EAGER, reason=eager_calls[0] if eager_calls else None, graph_bytes=pools)
