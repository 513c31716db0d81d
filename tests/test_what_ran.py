"""One reading of a wrapped model's ``graph_info()``: the conformance row, the differential row's status and the
bench's summary say the same about every shape of it (a whole graph, graphs around eager operations, a split by
submodule kept or dropped, a refusal, an eager call)."""

from __future__ import annotations

import pytest

from launchless.apps.bench.graphs import describe_runtime, runtime_summary
from launchless.apps.conformance.check import classify_info, empty_row
from launchless.apps.differential.rows import Entry
from launchless.apps.differential.runner import status_of
from launchless.apps.what_ran import Ran, SplitBy, what_ran

PASSED = {"status": "bit-identical", "passed": True}
SPLIT = {
    "pieces": [{"module": "backbone", "graphs": 1, "pool_bytes": 2**20}, {"module": "head", "graphs": 0}],
    "eager": [{"module": "(root)", "reason": "host copy", "source": "det.py:9"}, {"module": "rpn", "reason": "sync"}],
    "signatures": [{"status": "verified", "verification": PASSED, "captured_share": 0.8, "detail": ""}],
}
DROPPED = SPLIT | {"signatures": [{"status": "dropped", "detail": "not faster than eager", "captured_share": 0.8}]}
REGION = {"graphs": 5, "eager_ops": [{"op": "aten::nonzero"}] * 3, "source": "boxes.py:145", "speedup": 2.0}


def _info(**overrides: object) -> dict:
    return {"graphs": [], "split": None, "fallbacks": [], "eager_calls": {}, "pool_bytes": 3 * 2**20} | overrides


CASES = {
    "whole graph": (_info(graphs=[{"replays": 2, "verification": PASSED}]), Ran.GRAPH, None, None),
    "around operations": (
        _info(graphs=[{"replays": 2, "verification": PASSED, "region_split": REGION}]),
        Ran.SPLIT,
        SplitBy.OPERATION,
        "runs aten::nonzero eager between graphs",
    ),
    "by submodule": (_info(split=SPLIT), Ran.SPLIT, SplitBy.SUBMODULE, "host copy"),
    "split dropped": (_info(split=DROPPED), Ran.EAGER, None, "host copy; split dropped: not faster than eager"),
    "refused": (_info(fallbacks=[{"reason": "host sync", "source": "m.py:3"}]), Ran.EAGER, None, "host sync"),
    "an eager call": (_info(eager_calls={"a mutated input": 2}), Ran.EAGER, None, "a mutated input"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_reader_tells_the_same_of_one_graph_info(case: str) -> None:
    info, ran, split_by, reason = CASES[case]
    verdict = what_ran(info)
    assert (verdict.ran, verdict.split_by, verdict.reason) == (ran, split_by, reason)
    row = empty_row("m", "task")
    classify_info(row, info)
    assert (row["status"], row["reason"], row["verified"]) == (str(ran), reason, ran is not Ran.EAGER)
    assert row["split_by"] == (None if split_by is None else str(split_by))
    status, said, _ = status_of(info, Entry.WRAP_AUTO)
    assert (status.value, said) == (str(ran), reason)
    summary = runtime_summary(info)
    said = describe_runtime(summary)
    assert summary["runtime"] == str(ran)
    if ran is Ran.EAGER:
        assert said == f"eager: {reason}"
    elif split_by is SplitBy.SUBMODULE:
        assert said.startswith(f"split ({reason}): 1 pieces replay (80 % of eager GPU time: backbone)")
    elif split_by is SplitBy.OPERATION:
        assert said.startswith("split around aten::nonzero: 5 graphs replay")
    else:
        assert said == "whole graph"
