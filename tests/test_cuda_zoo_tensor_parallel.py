"""GPU test for launchless.apps.zoo.tensor_parallel: over NCCL on 2 GPUs the sharded forward equals the unsharded one.

The benchmarks run these workloads on GPUs, where the row-wise outputs are reduced by NCCL rather than gloo; the
tolerance is a little looser than on the CPU because cuBLAS picks its reduction order per matrix shape.
"""

from __future__ import annotations

import pytest
import torch
from ranks import run_ranks

pytest.importorskip("transformers")

from test_zoo_tensor_parallel import check_rank_results, sharded_against_reference

from launchless.apps.zoo.tensor_parallel import TP_WORKLOADS

pytestmark = pytest.mark.cuda

WORLD_SIZE = 2
SEQ = 32


@pytest.mark.skipif(torch.cuda.device_count() < WORLD_SIZE, reason=f"needs {WORLD_SIZE} CUDA GPUs")
def test_sharded_forward_matches_reference_over_nccl() -> None:
    results = run_ranks(
        sharded_against_reference, "cuda", SEQ, 1e-4, 1e-3, world_size=WORLD_SIZE, backend="nccl", timeout_s=300
    )
    for name in TP_WORKLOADS:
        check_rank_results(results, name, world_size=WORLD_SIZE)
