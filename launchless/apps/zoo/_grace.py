"""Builders for GraCE's workloads: the CUDA-graph-sensitive models its evaluation names, in the configurations
PyTorch's benchmark runners give them (TorchBench's models and its Hugging Face suite: default configs, random
weights, the runners' batch sizes), as model code of our own where the original package is not one of the zoo's.

What makes each one a graph workload is kept as the original has it: XLNet builds its relative positional encoding
on the host and copies it to the GPU at every call (transformers 4.x did; 5.x builds it on the GPU, so the host
path is restored here: one host tensor in front of a graph of hundreds of kernels), CLIP keeps its text encoder's
causal mask and a row index on the host (as torchmultimodal, which TorchBench's torch_multimodal_clip runs, does),
and the Deep Recommender autoencoder takes a 200 MB batch of ratings per call (what a graph's replay copies into
its input buffer). pyhpc's ocean models are in ``_grace_ocean``, the DALLE2 stand-in in ``_grace_dalle2``.
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


CLIP_IMAGE = 224  # CLIP ViT-B/32 as TorchBench's torch_multimodal_clip builds it (torchmultimodal's clip_vit_b32)
CLIP_CONTEXT = 77
CLIP_VOCAB = 49408


class QuickGELU(nn.Module):
    """CLIP's GELU approximation: ``x * sigmoid(1.702 x)``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


def _pre_norm_encoder(width: int, heads: int, layers: int, activation: nn.Module) -> nn.TransformerEncoder:
    layer = nn.TransformerEncoderLayer(
        width, heads, 4 * width, dropout=0.0, activation=activation, batch_first=True, norm_first=True
    )
    return nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)


class ClipImageEncoder(nn.Module):
    """CLIP's vision transformer: 32-pixel patches, a class token, a pre-norm encoder, the class token projected."""

    def __init__(self, width: int = 768, layers: int = 12, heads: int = 12, patch: int = 32, out: int = 512) -> None:
        super().__init__()
        scale = width**-0.5
        self.patches = nn.Conv2d(3, width, patch, stride=patch, bias=False)
        self.class_token = nn.Parameter(scale * torch.randn(width))
        self.positions = nn.Parameter(scale * torch.randn((CLIP_IMAGE // patch) ** 2 + 1, width))
        self.norm_in = nn.LayerNorm(width)
        self.encoder = _pre_norm_encoder(width, heads, layers, QuickGELU())
        self.norm_out = nn.LayerNorm(width)
        self.projection = nn.Parameter(scale * torch.randn(width, out))

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = self.patches(image).flatten(2).transpose(1, 2)
        x = torch.cat([self.class_token.expand(x.shape[0], 1, -1), x], dim=1) + self.positions
        x = self.encoder(self.norm_in(x))
        return self.norm_out(x[:, 0]) @ self.projection


class ClipTextEncoder(nn.Module):
    """CLIP's text transformer as torchmultimodal writes it: its causal mask a plain attribute, so it stays on the
    host when the model moves and is copied to the GPU at every call, and the end-of-text token of each row picked
    with a host-side row index -- the two host tensors GraCE's compiler moves to the GPU."""

    def __init__(self, width: int = 512, layers: int = 12, heads: int = 8, out: int = 512) -> None:
        super().__init__()
        self.tokens = nn.Embedding(CLIP_VOCAB, width)
        self.positions = nn.Parameter(torch.empty(CLIP_CONTEXT, width).normal_(std=0.01))
        self.encoder = _pre_norm_encoder(width, heads, layers, nn.SiLU())
        self.norm_out = nn.LayerNorm(width)
        self.projection = nn.Linear(width, out, bias=False)
        self.mask = torch.full((CLIP_CONTEXT, CLIP_CONTEXT), float("-inf")).triu(1)  # not a buffer: on the host

    def forward(self, text: torch.Tensor) -> torch.Tensor:
        return self.encode(text)[0]

    def encode(self, text: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The text's embedding (its end-of-text token, projected) and every token's encoding."""
        x = self.tokens(text) + self.positions
        x = self.norm_out(self.encoder(x, mask=self.mask.to(x.device), is_causal=True))
        rows = torch.arange(x.shape[0])  # on the host
        return self.projection(x[rows, text.argmax(dim=-1)]), x


class Clip(nn.Module):
    """CLIP ViT-B/32: image and text embeddings, each normalized to unit length."""

    def __init__(self) -> None:
        super().__init__()
        self.image_encoder = ClipImageEncoder()
        self.text_encoder = ClipTextEncoder()

    def forward(self, image: torch.Tensor, text: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return F.normalize(self.image_encoder(image), dim=-1), F.normalize(self.text_encoder(text), dim=-1)


def clip(batch: int) -> Built:
    """CLIP ViT-B/32 on ``batch`` images of 224 pixels and ``batch`` texts of 77 token ids."""
    model = Clip()

    def make() -> Inputs:
        return (torch.rand(batch, 3, CLIP_IMAGE, CLIP_IMAGE), torch.randint(CLIP_VOCAB, (batch, CLIP_CONTEXT))), {}

    return model, make


class SpeakerEncoder(nn.Module):
    """The speaker encoder TorchBench's tts_angular trains (a Coqui TTS model): three LSTMs of 768 units, each
    followed by a projection to 256 without bias, the last frame's embedding normalized to unit length. PyTorch's
    benchmark runner turns CUDA graphs off for it (its speed-up under them swung from 0.05 to 1.05): a graph that
    may not pay, where a selective capture must say no."""

    def __init__(self, mels: int = 40, hidden: int = 768, projected: int = 256, layers: int = 3) -> None:
        super().__init__()
        widths = [mels, *([projected] * (layers - 1))]
        self.lstms = nn.ModuleList(nn.LSTM(width, hidden, batch_first=True) for width in widths)
        self.projections = nn.ModuleList(nn.Linear(hidden, projected, bias=False) for _ in widths)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        x = frames
        for lstm, projection in zip(self.lstms, self.projections, strict=True):
            lstm.flatten_parameters()  # as the original calls it, at every forward
            x = projection(lstm(x)[0])
        return F.normalize(x[:, -1], p=2, dim=1)


def speaker_encoder(batch: int, *, frames: int = 50, mels: int = 40) -> Built:
    """The encoder on ``batch`` utterances of ``frames`` frames of ``mels`` mel bands (TorchBench: 64 x 50 x 40)."""
    return SpeakerEncoder(mels), lambda: ((torch.rand(batch, frames, mels),), {})


SPEECH_FEATURES = 320  # 80 filterbank channels, four frames stacked (low frame rate)
SPEECH_VOCAB = 1014
SPEECH_PADDING = -1  # a target's padding, dropped before decoding


class SpeechTransformer(nn.Module):
    """The Speech-Transformer (Dong et al., 2018) as TorchBench's speech_transformer configures it, as model code of
    our own: 6 encoder and 6 decoder layers of width 512 (8 heads, 2048 inner, dropout 0.1), sinusoidal positions,
    the output projection sharing the target embedding. What makes it a graph workload is kept: the padding masks are
    written row by row at each input's length (a device scalar read on the host), by the encoder and again by the
    decoder for its attention over the encoder's output, and the targets lose their padding row by row and gain
    start and end tokens (shapes that depend on the values). Those steps are functions and methods of their own, as
    in the original, so that a compiler that cannot trace them breaks its graph there and compiles the layers
    between (a step written inline in a loop of the forward would make it give up on the whole forward)."""

    def __init__(self, width: int = 512, layers: int = 6, heads: int = 8, inner: int = 2048, max_len: int = 5000):
        super().__init__()
        positions = _sinusoids(max_len, width)
        self.encoder = SpeechEncoder(width, layers, heads, inner, positions)
        self.decoder = SpeechDecoder(width, layers, heads, inner, positions.clone())  # a table each, as the original

    def forward(
        self, features: torch.Tensor, lengths: torch.Tensor, targets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        memory = self.encoder(features, lengths)
        return self.decoder(targets, memory, lengths)


def _frames_kept(features: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """1 at each utterance's frames, 0 at its padding (batch x frames): the original's loop, each length read on
    the host."""
    kept = torch.ones(features.shape[:2], dtype=features.dtype, device=features.device)
    for row in range(features.shape[0]):
        kept[row, lengths[row] :] = 0
    return kept


def _padding_mask(features: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """True at each utterance's padding frames (batch x frames), from the loop above (the original calls it again
    for every mask it needs)."""
    return _frames_kept(features, lengths) == 0


class SpeechEncoder(nn.Module):
    """Stacked filterbank frames to the encoder's states, padding frames zeroed after every layer."""

    def __init__(self, width: int, layers: int, heads: int, inner: int, positions: torch.Tensor) -> None:
        super().__init__()
        self.input = nn.Linear(SPEECH_FEATURES, width)
        self.input_norm = nn.LayerNorm(width)
        self.register_buffer("positions", positions, persistent=False)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(width, heads, inner, dropout=0.1, batch_first=True) for _ in range(layers)
        )
        self.dropout = nn.Dropout(0.1)

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        kept = _frames_kept(features, lengths)[..., None]
        padding = _padding_mask(features, lengths)
        x = self.dropout(self.input_norm(self.input(features)) + self.positions[: features.shape[1]])
        for layer in self.layers:
            x = layer(x, src_key_padding_mask=padding) * kept
        return x


class SpeechDecoder(nn.Module):
    """Target tokens (teacher forcing) and the encoder's states to the next tokens' logits."""

    def __init__(self, width: int, layers: int, heads: int, inner: int, positions: torch.Tensor) -> None:
        super().__init__()
        self.embedding = nn.Embedding(SPEECH_VOCAB, width)
        self.register_buffer("positions", positions, persistent=False)
        self.layers = nn.ModuleList(
            nn.TransformerDecoderLayer(width, heads, inner, dropout=0.1, batch_first=True) for _ in range(layers)
        )
        self.projection = nn.Linear(width, SPEECH_VOCAB, bias=False)
        self.projection.weight = self.embedding.weight
        self.dropout = nn.Dropout(0.1)
        self.scale = width**-0.5
        self.start, self.end = SPEECH_VOCAB - 2, SPEECH_VOCAB - 1

    def unpadded(self, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each target without its padding, behind a start token (the decoder's input) and before an end token (what
        it should predict), padded again to the longest: row by row, at lengths read from the values."""
        rows = [row[row != SPEECH_PADDING] for row in targets]
        start, end = rows[0].new([self.start]), rows[0].new([self.end])
        given = nn.utils.rnn.pad_sequence([torch.cat([start, row]) for row in rows], True, self.end)
        expected = nn.utils.rnn.pad_sequence([torch.cat([row, end]) for row in rows], True, SPEECH_PADDING)
        return given, expected

    def forward(
        self, targets: torch.Tensor, memory: torch.Tensor, lengths: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        given, expected = self.unpadded(targets)
        memory_padding = _padding_mask(memory, lengths)
        steps = given.shape[1]
        causal = torch.ones(steps, steps, dtype=torch.bool, device=given.device).triu(1)
        y = self.dropout(self.embedding(given) + self.positions[:steps])
        for layer in self.layers:
            y = layer(
                y,
                memory,
                tgt_mask=causal,
                tgt_key_padding_mask=given == self.end,
                memory_key_padding_mask=memory_padding,
            )
        return self.projection(y) * self.scale, expected


def _sinusoids(length: int, width: int) -> torch.Tensor:
    position = torch.arange(length, dtype=torch.float32)[:, None]
    frequency = torch.exp(torch.arange(0, width, 2, dtype=torch.float32) * (-math.log(10000.0) / width))
    table = torch.zeros(length, width)
    table[:, 0::2], table[:, 1::2] = torch.sin(position * frequency), torch.cos(position * frequency)
    return table


def speech_transformer(batch: int, *, frames: int = 204, tokens: int = 21) -> Built:
    """The model on a minibatch as TorchBench's first one is shaped (10 utterances of up to 204 stacked frames, up to
    21 target tokens; ``batch`` utterances here): random features, lengths and targets, the first the longest."""

    def make() -> Inputs:
        lengths = torch.randint(frames // 2, frames + 1, (batch,))
        lengths[0] = frames
        features = torch.randn(batch, frames, SPEECH_FEATURES) * (
            torch.arange(frames)[None, :, None] < lengths[:, None, None]
        )
        sizes = torch.randint(tokens // 2, tokens + 1, (batch,))
        sizes[0] = tokens
        targets = torch.randint(SPEECH_VOCAB - 2, (batch, tokens))
        targets[torch.arange(tokens)[None, :] >= sizes[:, None]] = SPEECH_PADDING
        return (features, lengths, targets), {}

    return SpeechTransformer(), make
