"""A captured training step proven against eager steps: from the same saved state on the same batch, the replay's
outputs and the state it leaves (parameters, gradients, optimizer state, anything else the step writes) must equal
an eager step's -- bit for bit, or within the spread of eager steps run again where the step's own kernels are
nondeterministic (atomics in a backward). ``lockstep``: a distributed step, whose ranks all make the same eager steps
whatever their own replay showed (their collectives must meet)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..core.status import VerifyStatus
from ..core.verify import difference, identical, worst_pair
from .snapshot import Snapshot

NOISE_FACTOR = 4.0  # a replay may differ from eager by this multiple of the largest eager-vs-eager difference
NOISE_RUNS = 8  # eager reruns at most to measure that difference (two at least)
LOCKSTEP_RUNS = 3  # eager reruns every rank of a distributed step makes, whatever its replay showed


def verified_step(
    eager: Callable[[], Any],
    replay: Callable[[], Any],
    before: Snapshot,
    *,
    mode: str,
    lockstep: bool,
    labels: Callable[[int], str] | None = None,
) -> tuple[dict, Any]:
    """Graph step and eager step from the same state on the same batch must agree. ``labels(i)`` names the ``i``-th
    tensor of ``before.live()``: a failure says where the replay differs most."""
    eager_out = eager()
    eager_state = before.current()
    before.restore()
    graph_out = replay()
    report = {"status": VerifyStatus.BIT_IDENTICAL, "passed": True, "max_abs_diff": 0.0}
    live = before.live()  # compared in place: no third copy of the model and optimizer state
    same = identical(eager_out, graph_out) and identical(eager_state, live)
    if same and not lockstep:
        return report, graph_out
    diff, where = 0.0, ""
    if not same:
        at, (state_diff, _, _) = worst_pair(eager_state, live, 0.0)
        out_diff = difference(eager_out, graph_out, 0.0)[0]
        diff = max(state_diff, out_diff)
        if out_diff >= state_diff:
            where = " in the step's output"
        elif at is not None and labels is not None:
            where = f" in {labels(at)}"
    if diff == 0.0 and mode != "strict" and not lockstep:  # equal values; only the sign of a zero differs
        report["status"] = VerifyStatus.IDENTICAL_VALUES
        return report, graph_out
    del live
    noise, runs = 0.0, 0
    # nondeterministic kernels (atomics in backward) differ by a random amount each run, spread over an order
    # of magnitude (resnet18 on an H200: 1.5e-08 to 1.8e-07); two runs can land low while the replay landed
    # high, so up to NOISE_RUNS are taken until the replay is within the bound (a stale graph is far outside)
    while (runs < LOCKSTEP_RUNS) if lockstep else (runs < 2 or (runs < NOISE_RUNS and diff > NOISE_FACTOR * noise)):
        runs += 1
        before.restore()
        again_out = eager()
        noise = max(noise, difference(eager_state, before.live(), 0.0)[0], difference(eager_out, again_out, 0.0)[0])
        if noise == 0.0 and runs >= 2 and not lockstep:  # deterministic: more runs will not differ either
            break
    before.restore()  # the step kept is a replay: compared in place above, so no copy of its state is held
    graph_out = replay()
    report.update(max_abs_diff=diff, eager_noise=noise)
    if same:
        return report, graph_out
    if diff == 0.0 and mode != "strict":
        report["status"] = VerifyStatus.IDENTICAL_VALUES
        return report, graph_out
    if noise > 0 and diff <= NOISE_FACTOR * noise and mode != "strict":
        report.update(
            status=VerifyStatus.EAGER_NOISE, detail=f"eager runs differ by up to {noise:.3g} ({runs + 1} runs)"
        )
    else:
        strict = "; verify='strict' demands bit identity" if mode == "strict" else ""
        report.update(
            passed=False,
            status=VerifyStatus.FAILED,
            detail=f"replay differs from eager by {diff:.3g}{where}, eager from eager by {noise:.3g}{strict}",
        )
    return report, graph_out
