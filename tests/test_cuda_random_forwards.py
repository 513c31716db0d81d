"""GPU tests of forwards that draw random numbers at inference (a vocoder's noise, a duration predictor's draws, a
VAE's sample), called as users call: a fresh input each call, the generator seeded by the caller.

Eager draws from the CUDA generator's state; a replay draws the same numbers from the same state. Compared runs must
therefore start from one state: verifying two probes eager and as replays, each from wherever the previous run left
the generator, made a deterministic forward look like one that differs from itself ("eager-noise"), and it ran
eager. The capture call ran the forward several times (warm-ups, probes, timing) before its own result, which then
drew other numbers than eager would have. Now every compared run starts from the state on entry, and the call's
result draws from where the call began: the same draws as eager, and the generator left where eager leaves it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import launchless as ll
from launchless.core.verify import identical

pytestmark = pytest.mark.cuda

GRAD_MODES = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}
CALLS = 8


class NoisyBlock(nn.Module):
    """Adds noise before and draws a mask after its layers, as a vocoder's upsampler or a sampling step does (six
    layers: launch-bound, a graph "auto" keeps)."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.net = nn.Sequential(*(nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(6)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.net(x + 0.5 * torch.randn_like(x))
        return h * (torch.rand_like(h) > 0.1)


class RandomLength(nn.Module):
    """How many rows come out depends on random draws, read on the host (a duration predictor's total): the forward
    cannot be captured whole, and its piece draws random numbers. What follows the length is the root's own code
    (a piece after it would see a new row count at most calls, and the captures of those would be what a split's
    timing measures)."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.encoder = NoisyBlock(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        rows = int((h[:, 0] > 0).sum()) + 1  # host sync: a random length
        return torch.tanh(h[:rows]) * (torch.rand_like(h[:rows]) > 0.5)


def _calls(model: nn.Module, fast: nn.Module, grad_mode: str) -> None:
    """CALLS fresh inputs, each run eager and wrapped from the same seed: same outputs, generator left alike."""
    inputs = torch.Generator(device="cuda").manual_seed(3)
    with GRAD_MODES[grad_mode]():
        for call in range(CALLS):
            x = torch.randn(32, 64, device="cuda", generator=inputs)
            torch.manual_seed(100 + call)
            want = model(x)
            eager_state = torch.cuda.get_rng_state()
            torch.manual_seed(100 + call)
            got = fast(x)
            assert identical(got, want), f"call {call}: other draws than eager's"
            assert torch.equal(torch.cuda.get_rng_state(), eager_state), f"call {call}: generator left elsewhere"


@pytest.mark.parametrize("grad_mode", list(GRAD_MODES))
def test_a_forward_that_draws_noise_replays_one_graph_with_eagers_draws(grad_mode: str) -> None:
    torch.manual_seed(0)
    model = NoisyBlock().cuda().eval()
    fast = ll.wrap(model)
    _calls(model, fast, grad_mode)
    (row,) = fast.graph_info()["graphs"]
    assert row["verification"]["status"] == "bit-identical" and row["replays"] >= CALLS - 3, row


@pytest.mark.parametrize("grad_mode", list(GRAD_MODES))
def test_a_random_length_forward_runs_split_with_eagers_draws(grad_mode: str, judged_faster) -> None:
    torch.manual_seed(0)
    model = RandomLength().cuda().eval()
    fast = ll.wrap(model)
    _calls(model, fast, grad_mode)
    split = fast.graph_info()["split"]
    assert split is not None and split["signatures"], fast.graph_info()
    (sig,) = split["signatures"]
    assert sig["verification"]["status"] == "bit-identical", sig  # not "eager-noise": the draws were the same
    encoder = next(row for row in split["pieces"] if row["module"] == "encoder")
    assert encoder["replays"] >= 1, split


@pytest.mark.parametrize("grad_mode", list(GRAD_MODES))
def test_a_compiled_forward_that_draws_noise_replays_with_its_programs_draws(grad_mode: str) -> None:
    """The compiler backend: its graphs against the same backend's programs with no graph captured, call by call
    from the same seed; the capture call returns its draws from where it began."""
    from launchless.compiler import backend as ll_backend

    torch._dynamo.reset()
    ll_backend._registry.clear()
    torch.manual_seed(0)
    model = NoisyBlock().cuda().eval()
    fast = torch.compile(model, backend=ll_backend.make_backend(selective=False))
    reference = torch.compile(model, backend=ll_backend.make_backend(capture_after=2**62))
    _calls(reference, fast, grad_mode)
    verified = [row for g in ll_backend._registry for row in g.graph_info()["graphs"]]
    assert verified and all(row["verification"]["status"] == "bit-identical" for row in verified), verified
    assert max(row["replays"] for row in verified) >= CALLS - 3, verified
