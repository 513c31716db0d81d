"""CPU tests of FX-graph diagnosis: aten graphs traced with fake CUDA tensors (no GPU needed)."""

from __future__ import annotations

import torch
from fake_cuda import trace_on_fake_cuda

from launchless.compiler.diagnose import CPU_NODE, INPUT_MUTATION, diagnose, source_line
from launchless.diagnose.blockers import COPY, DATA_DEPENDENT, HOST_SYNC


def test_clean_graph_has_no_blockers() -> None:
    gm = trace_on_fake_cuda(lambda x, w: torch.relu(x @ w).sum(dim=1), (4, 8), (8, 8))
    assert diagnose(gm) == []


def test_each_blocker_kind_is_found_in_graph_order() -> None:
    def fn(x, y):
        offsets = torch.arange(x.shape[0])  # built on the host
        z = x * 2 + offsets.to(x.device)  # copied to the device on every call
        y.add_(1)  # writes into an input
        scale = z.sum().item()  # host sync
        return z * scale, torch.nonzero(x)  # data-dependent shape

    found = diagnose(trace_on_fake_cuda(fn, (4,), (4,)))
    assert [b.kind for b in found] == [COPY, INPUT_MUTATION, HOST_SYNC, DATA_DEPENDENT]
    copy = found[0]
    assert copy.rewritable and "_to_copy" in copy.target  # arange feeds it: CGCT can build it on the device
    assert "rewritable" in copy.describe()


def test_a_copy_of_input_data_is_not_rewritable_and_cpu_compute_is_flagged() -> None:
    def fn(x):
        host = x.cpu()  # device -> host: data, not a constant
        doubled = host * 2  # computed on the CPU inside a GPU graph
        return x + doubled.sum().to(x.device)

    found = diagnose(trace_on_fake_cuda(fn, (4,)))
    kinds = [b.kind for b in found]
    assert kinds[0] == COPY and not found[0].rewritable
    assert CPU_NODE in kinds


def test_source_line_comes_from_the_recorded_stacktrace_on_fake_cuda() -> None:
    gm = trace_on_fake_cuda(lambda x: x.sum().item(), (3,))
    node = next(n for n in gm.graph.nodes if "_local_scalar_dense" in str(n.target))
    node.meta["stack_trace"] = (
        '  File "/home/me/model.py", line 41, in forward\n    y = self.head(x)\n'
        '  File "/home/me/model.py", line 57, in head\n    if x.sum().item() > 0:\n'
    )
    assert source_line(node) == "/home/me/model.py:57 in head: `if x.sum().item() > 0:`"
    assert diagnose(gm)[0].source == source_line(node)


def test_histc_with_a_range_is_no_blocker_and_without_one_is_a_host_sync() -> None:
    """The experts of transformers' mixtures count tokens with ``histc(..., min=0, max=num_experts - 1)``: a fixed
    shape computed on the device, nothing a capture refuses (a graph with it is no CGCT hazard); without a range
    histc reads the input's extremes on the host."""
    ranged = trace_on_fake_cuda(lambda x: torch.histc(x, bins=4, min=0, max=3) * 2, (16,))
    assert diagnose(ranged) == []
    found = diagnose(trace_on_fake_cuda(lambda x: torch.histc(x, bins=4) * 2, (16,)))
    assert [(b.kind, "histc" in b.target) for b in found] == [(HOST_SYNC, True)]
