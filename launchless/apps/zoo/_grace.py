"""Builders for GraCE's workloads: the CUDA-graph-sensitive models its evaluation names, in the configurations
PyTorch's benchmark runners give them (TorchBench's models and its Hugging Face suite: default configs, random
weights, the runners' batch sizes), as model code of our own where the original package is not one of the zoo's.

What makes each one a graph workload is kept as the original has it: XLNet builds its relative positional encoding
on the host and copies it to the GPU at every call (transformers 4.x did; 5.x builds it on the GPU, so the host
path is restored here: one host tensor in front of a graph of hundreds of kernels), and the Deep Recommender
autoencoder takes a 200 MB batch of ratings per call (what a graph's replay copies into its input buffer).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ._common import Inputs
from ._transformers import Built

NETFLIX_ITEMS = 197951  # the Netflix prize's movies: the Deep Recommender's input and output width
RECOMMENDER_LAYERS = (512, 512, 1024)  # TorchBench's nvidia_deeprecommender: encoder widths, mirrored by the decoder
XLNET_TOKENS = 512  # the Hugging Face suite's sequence length for XLNet


class DeepRecommender(nn.Module):
    """NVIDIA's Deep Recommender autoencoder (Kuchaiev and Ginsburg, 2017) as TorchBench runs it: fully connected
    encoder and decoder with SELU after every layer (the decoder's last too), dropout on the code, the decoder's
    own weights (not tied to the encoder's)."""

    def __init__(self, items: int = NETFLIX_ITEMS, layers: tuple[int, ...] = RECOMMENDER_LAYERS) -> None:
        super().__init__()
        widths = (items, *layers)
        self.encoder = nn.ParameterList(_xavier(w_out, w_in) for w_in, w_out in itertools.pairwise(widths))
        self.encoder_bias = nn.ParameterList(nn.Parameter(torch.zeros(w)) for w in widths[1:])
        back = widths[::-1]
        self.decoder = nn.ParameterList(_xavier(w_out, w_in) for w_in, w_out in itertools.pairwise(back))
        self.decoder_bias = nn.ParameterList(nn.Parameter(torch.zeros(w)) for w in back[1:])
        self.code_dropout = nn.Dropout(0.8)

    def forward(self, ratings: torch.Tensor) -> torch.Tensor:
        x = ratings
        for weight, bias in zip(self.encoder, self.encoder_bias, strict=True):
            x = F.selu(F.linear(x, weight, bias))
        x = self.code_dropout(x)
        for weight, bias in zip(self.decoder, self.decoder_bias, strict=True):
            x = F.selu(F.linear(x, weight, bias))
        return x


def _xavier(rows: int, columns: int) -> nn.Parameter:
    bound = math.sqrt(6.0 / (rows + columns))
    return nn.Parameter(torch.empty(rows, columns).uniform_(-bound, bound))


def deep_recommender(batch: int, *, items: int = NETFLIX_ITEMS) -> Built:
    """The autoencoder on ``batch`` users' ratings of every item (TorchBench: random normal ratings)."""
    model = DeepRecommender(items)
    return model, lambda: ((torch.randn(batch, items),), {})


def xlnet_host_positions(batch: int, *, tokens: int = XLNET_TOKENS, **config: Any) -> Built:
    """XLNetLMHeadModel from its default config (24 layers, width 1024), without memories (tensor outputs only),
    its positional encoding built on the host at every call; ``batch`` sequences of ``tokens`` random ids."""
    import transformers

    from ._grace_xlnet import HostPositionsXLNetModel

    cfg = transformers.XLNetConfig(attn_implementation="eager", use_mems_eval=False, **config)
    model = transformers.XLNetLMHeadModel(cfg)
    model.transformer.__class__ = HostPositionsXLNetModel  # the same module, its encoding built as 4.x built it

    def make() -> Inputs:
        return (), {"input_ids": torch.randint(cfg.vocab_size, (batch, tokens)), "use_mems": False}

    return model, make
