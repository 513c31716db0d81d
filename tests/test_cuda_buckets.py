"""GPU tests of batch buckets: calls of many batch sizes replay the graphs of a few, padded and sliced back, equal
to eager (bit for bit, or within the named batch-shape bound); a model whose rows interact is refused buckets with
one WARNING and stays exact; a batch over the largest bucket keeps its own signature."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

import launchless as ll
from launchless.core.verify import difference, identical

pytestmark = pytest.mark.cuda

GRAD_MODES = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}


class PerRow(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.Sequential(*(nn.Sequential(nn.Linear(64, 64), nn.GELU()) for _ in range(8)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class AcrossBatch(PerRow):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.layers(x)
        return torch.softmax(h @ h.T, dim=-1) @ h  # every row attends to every row of the batch


def _close(graphed, eager, verdicts) -> bool:
    if identical(graphed, eager):
        return True
    max_abs, _, bound = difference(eager, graphed, 64.0)
    return max_abs <= bound and any(v["status"] == "batch-shape" for v in verdicts.values())


@pytest.mark.parametrize("grad_mode", list(GRAD_MODES))
def test_many_batch_sizes_replay_the_graphs_of_a_few_buckets(grad_mode: str) -> None:
    model = PerRow().cuda().eval()
    m = ll.wrap(model, capture_after=1, batch_buckets=[1, 2, 4, 8])
    sizes = [3, 5, 8, 1, 7, 2, 6, 4, 3, 5]
    with GRAD_MODES[grad_mode]():
        for rows in sizes:
            x = torch.randn(rows, 64, device="cuda")
            out = m(x)
            assert out.shape == (rows, 64)
            assert _close(out, model(x), m.graph_info()["batch_buckets"]["proofs"]), rows
    info = m.graph_info()
    buckets = info["batch_buckets"]
    assert len(info["graphs"]) == 4 and buckets["refused"] is None, info
    assert buckets["padded_calls"] == sum(1 for r in sizes if r not in (1, 2, 4, 8)), buckets
    assert buckets["padding_rows"] == sum({3: 1, 5: 3, 7: 1, 6: 2}.get(r, 0) for r in sizes), buckets
    assert set(buckets["proofs"]) == {4, 8} and all(
        p["status"] in ("bit-identical", "batch-shape") for p in buckets["proofs"].values()
    ), buckets


def test_a_model_whose_rows_interact_is_refused_buckets_and_stays_exact(caplog) -> None:
    model = AcrossBatch().cuda().eval()
    m = ll.wrap(model, capture_after=1, batch_buckets=[4, 8])
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="launchless"):
        for rows in (3, 5, 3, 5, 8):
            x = torch.randn(rows, 64, device="cuda")
            assert identical(m(x), model(x)), rows
    buckets = m.graph_info()["batch_buckets"]
    assert buckets["refused"] and "rows interact" in buckets["refused"], buckets
    warnings = [r.getMessage() for r in caplog.records if "cannot pad batches" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith("launchless: AcrossBatch"), warnings
    assert buckets["padded_calls"] == 0


def test_a_batch_over_the_largest_bucket_keeps_its_own_signature_with_one_warning(caplog) -> None:
    model = PerRow().cuda().eval()
    m = ll.wrap(model, capture_after=1, batch_buckets=[1, 2, 4])
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="launchless"):
        for _ in range(3):
            x = torch.randn(6, 64, device="cuda")
            assert identical(m(x), model(x))
    buckets = m.graph_info()["batch_buckets"]
    assert buckets["calls_over_largest"] == 3 and len(m.graph_info()["graphs"]) == 1
    over = [r.getMessage() for r in caplog.records if "larger than its largest bucket" in r.getMessage()]
    assert len(over) == 1, over


def test_a_transformers_encoder_pads_token_ids_and_masks() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256, vocab_size=1000
    )
    torch.manual_seed(0)
    model = transformers.BertModel(config).cuda().eval()
    m = ll.wrap(model, capture_after=1, batch_buckets=[2, 4, 8])
    with torch.no_grad():
        for rows in (3, 5, 3, 7):
            ids = torch.randint(1000, (rows, 16), device="cuda")
            mask = torch.ones(rows, 16, dtype=torch.long, device="cuda")
            out = m(input_ids=ids, attention_mask=mask).last_hidden_state
            eager = model(input_ids=ids, attention_mask=mask).last_hidden_state
            assert out.shape == eager.shape
            max_abs, _, bound = difference(eager, out, 64.0)
            assert max_abs <= bound, (rows, max_abs, bound)
    buckets = m.graph_info()["batch_buckets"]
    assert buckets["refused"] is None and buckets["padded_calls"] == 4, buckets


def test_automatic_buckets_take_one_graph_per_doubling_of_the_batch() -> None:
    model = PerRow().cuda().eval()
    m = ll.wrap(model, capture_after=1, batch_buckets="auto")
    with torch.no_grad():
        for rows in (3, 5, 6, 7, 3, 8):
            x = torch.randn(rows, 64, device="cuda")
            assert _close(m(x), model(x), m.graph_info()["batch_buckets"]["proofs"]), rows
    info = m.graph_info()
    assert info["batch_buckets"]["sizes"] == [4, 8] and len(info["graphs"]) == 2, info["batch_buckets"]


def test_a_convolutional_network_in_tf32_is_padded_within_tf32s_rounding() -> None:
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.resnet18().cuda().eval()
    assert torch.backends.cudnn.allow_tf32  # PyTorch's default: convolutions round their inputs to TF32
    m = ll.wrap(model, capture_after=1, batch_buckets=[4, 8, 16])
    sizes = [3, 5, 13, 7, 3, 16, 11]
    with torch.no_grad():
        for rows in sizes:
            x = torch.randn(rows, 3, 64, 64, device="cuda")
            out, eager = m(x), model(x)
            scale = eager.abs().max().item()
            assert (out - eager).abs().max().item() <= 8 * 2.0**-10 * scale, rows  # TF32_ULPS units of TF32
    info = m.graph_info()
    buckets = info["batch_buckets"]
    assert buckets["refused"] is None and len(info["graphs"]) == 3, buckets  # one graph per bucket, none per size
    assert buckets["padded_calls"] == 6 and all(
        p["status"] in ("bit-identical", "batch-shape") for p in buckets["proofs"].values()
    ), buckets


class TrimsToLongest(PerRow):
    """Reads on the host how many leading columns any row uses and keeps that many: over a padded batch the read
    would also see the padding rows, which the call's own eager run does not."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.layers(x)
        used = int((x != 0).any(dim=0).sum())  # a value read on the host, over every row
        return h[:, :used]


def test_a_bucket_never_replays_graphs_around_a_value_read_over_its_padding_rows() -> None:
    model = TrimsToLongest().cuda().eval()
    m = ll.wrap(model, capture_after=1, batch_buckets=[4])
    with torch.no_grad():
        for rows, used in ((4, 48), (4, 48), (3, 48), (3, 48), (3, 16), (3, 48)):
            # four rows fit the bucket (graphs around the read may be captured for them); three rows are padded to
            # four, and the padding rows hold earlier rows' columns
            x = torch.randn(rows, 64, device="cuda")
            x[:, used:] = 0
            out = m(x)
            assert identical(out, model(x)) and out.shape == (rows, used), (rows, used)
    assert m.graph_info()["batch_buckets"]["padded_calls"] == 0, "no padded call replayed the bucket's graphs"
