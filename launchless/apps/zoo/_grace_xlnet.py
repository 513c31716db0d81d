"""transformers' XLNet with its relative positional encoding built on the host, as transformers 4.x built it: GraCE's
XLNet workload, where one host tensor copied to the GPU at every call stands in front of a graph of hundreds of
kernels. A module of its own because it imports transformers (the zoo imports its model libraries lazily), and so
that a compiler process can rebuild the model from its class's name."""

from __future__ import annotations

from typing import Any

import torch
from transformers import XLNetModel


class HostPositionsXLNetModel(XLNetModel):
    """XLNetModel whose positional encoding is computed on the CPU and then copied to the model's device."""

    def relative_positional_encoding(
        self, qlen: int, klen: int, bsz: int | None = None, device: Any = None
    ) -> torch.Tensor:
        on_host = super().relative_positional_encoding(qlen, klen, bsz=bsz, device=torch.device("cpu"))
        return on_host.to(device)
