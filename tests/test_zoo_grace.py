"""GraCE's workloads keep what makes each one a graph workload: the operation that stops a plain capture (found by the
dry run, without a GPU), and an isoneutral mixing step that writes into the tensors it is given."""

from __future__ import annotations

import pytest
import torch

import launchless
from launchless.apps import zoo

pytestmark = pytest.mark.zoo


@pytest.mark.parametrize(
    ("name", "kind", "operation"),
    [
        ("grace:clip", "CPU<->GPU copy", "aten._to_copy"),  # the text encoder's causal mask, kept on the host
        ("grace:dalle2", "CPU<->GPU copy", "aten._to_copy"),  # OpenAI CLIP's text encoder keeps its mask there too
        ("grace:speech-transformer", "host sync", "aten._local_scalar_dense"),  # each input's length read on the host
        ("grace:ocean-turbulence", "CPU<->GPU copy", "torch.tensor(host data, device=...)"),  # the limiter's bounds
        ("grace:ocean-isoneutral-mixing", "CPU<->GPU copy", "torch.tensor(host data, device=...)"),
        ("grace:ocean-equation-of-state", None, None),  # one graph: nothing stops its capture
    ],
)
def test_each_grace_workload_is_blocked_where_the_original_is(name: str, kind: str | None, operation: str | None):
    w = zoo.build(name)
    blocker = launchless.dry_run(w.model, w.args, w.kwargs)
    assert (blocker and blocker.kind, blocker and blocker.operation) == (kind, operation)


@torch.no_grad()
def test_isoneutral_mixing_writes_its_results_into_the_tensors_it_is_given() -> None:
    """As pyhpc's original fills its K_11, K_22, K_33 and Ai_* arguments: a graph that copied them into buffers of
    its own would leave the caller's tensors stale."""
    w = zoo.build("grace:ocean-isoneutral-mixing", dtype=torch.float64)
    *_, k, slopes = w.args
    before_k, before_slopes = k.clone(), slopes.clone()
    out_k, out_slopes = w.model(*w.args, **w.kwargs)
    assert out_k is k and out_slopes is slopes
    assert not torch.equal(k, before_k) and not torch.equal(slopes, before_slopes)
    assert bool(torch.isfinite(k).all()) and bool(torch.isfinite(slopes).all())
    assert k.dtype == torch.float64 and sum(t.numel() * t.element_size() for t in w.args) > 250e6  # about 260 MB
