"""GraCE's DALLE2 workload: a stand-in of the same shape as TorchBench's DALLE2_pytorch (lucidrains' DALLE2-pytorch,
which the zoo does not install), as model code of our own in its configuration."""

from __future__ import annotations

import itertools
import math

import torch
import torch.nn.functional as F
from torch import nn

from ._grace import CLIP_CONTEXT, CLIP_VOCAB, ClipTextEncoder, _pre_norm_encoder
from ._transformers import Built

DALLE2_EMBEDDING = 512  # CLIP ViT-B/32's embedding, the prior's and the decoder's conditioning
DALLE2_SIZES = (128, 256)  # the decoder's two stages, as TorchBench's DALLE2_pytorch configures them


class Dalle2(nn.Module):
    """A stand-in of the same shape as TorchBench's DALLE2_pytorch (lucidrains' DALLE2-pytorch, which the zoo does
    not install), as model code of our own in its configuration: CLIP ViT-B/32's text encoder (OpenAI's keeps its
    causal mask on the host too, and picks the end-of-text token with a host row index), a diffusion prior (a
    6-layer causal transformer of width 512 over the text's tokens, its embedding, the time and the noised image
    embedding) and a two-stage decoder (a U-Net of width 128 at 128 pixels conditioned on the image embedding and
    the text, then one of width 16 at 256 pixels on the first's image), one sampling step each as TorchBench sets
    its timesteps -- hundreds of small kernels a call, most of its time launching them."""

    def __init__(self) -> None:
        super().__init__()
        self.text_encoder = ClipTextEncoder()
        self.prior = DiffusionPrior()
        self.decoders = nn.ModuleList(
            [_Unet(128, (1, 2, 4, 8), text=True), _Unet(16, (1, 2, 4, 8, 16), low_resolution=True)]
        )

    def forward(self, text: torch.Tensor) -> torch.Tensor:
        embedding, tokens = self.text_encoder.encode(text[:, :CLIP_CONTEXT])  # CLIP reads its context's length
        image_embedding = self.prior(torch.randn_like(embedding), embedding, tokens)
        image = None
        for size, unet in zip(DALLE2_SIZES, self.decoders, strict=True):
            noise = torch.randn(text.shape[0], 3, size, size, device=text.device, dtype=embedding.dtype)
            low = None if image is None else F.interpolate(image, size=size, mode="bilinear", align_corners=False)
            image = unet(noise, image_embedding, tokens, low).clamp(-1.0, 1.0)
        return image


def _time_embedding(batch: int, width: int, like: torch.Tensor) -> torch.Tensor:
    """The sinusoidal embedding of the one sampling step (time 0), ``batch`` rows of ``width``."""
    frequencies = torch.exp(-math.log(10000.0) * torch.arange(width // 2, device=like.device) / (width // 2))
    angles = torch.zeros(batch, 1, device=like.device) * frequencies
    return torch.cat([angles.sin(), angles.cos()], dim=-1).to(like.dtype)


class DiffusionPrior(nn.Module):
    """Predicts CLIP's image embedding from the text's, one denoising step: a causal transformer over the text's
    token encodings, its embedding, the time, the noised image embedding and a learned query, read at the query."""

    def __init__(self, width: int = DALLE2_EMBEDDING, layers: int = 6, heads: int = 8) -> None:
        super().__init__()
        self.time = nn.Sequential(nn.Linear(width, width), nn.SiLU(), nn.Linear(width, width))
        self.query = nn.Parameter(torch.randn(width) * 0.02)
        self.encoder = _pre_norm_encoder(width, heads, layers, nn.GELU())
        self.norm_out = nn.LayerNorm(width)
        self.out = nn.Linear(width, width, bias=False)

    def forward(self, noised: torch.Tensor, text: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        batch = noised.shape[0]
        time = self.time(_time_embedding(batch, noised.shape[-1], noised))
        sequence = torch.cat(
            [tokens, text[:, None], time[:, None], noised[:, None], self.query.expand(batch, 1, -1)], dim=1
        )
        causal = torch.full((sequence.shape[1],) * 2, float("-inf"), device=noised.device).triu(1)
        return self.out(self.norm_out(self.encoder(sequence, mask=causal, is_causal=True)[:, -1]))


class _ResidualBlock(nn.Module):
    """Two 3x3 convolutions with group norms, the conditioning added as a scale and shift between them."""

    def __init__(self, channels_in: int, channels_out: int, conditioning: int) -> None:
        super().__init__()
        self.norm1, self.conv1 = nn.GroupNorm(8, channels_in), nn.Conv2d(channels_in, channels_out, 3, padding=1)
        self.scale_shift = nn.Linear(conditioning, 2 * channels_out)
        self.norm2, self.conv2 = nn.GroupNorm(8, channels_out), nn.Conv2d(channels_out, channels_out, 3, padding=1)
        self.skip = nn.Conv2d(channels_in, channels_out, 1) if channels_in != channels_out else nn.Identity()

    def forward(self, x: torch.Tensor, condition: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        scale, shift = self.scale_shift(F.silu(condition))[:, :, None, None].chunk(2, dim=1)
        h = self.conv2(F.silu(self.norm2(h) * (1 + scale) + shift))
        return h + self.skip(x)


class _Unet(nn.Module):
    """A U-Net of ``width`` channels times ``multiples`` per stage (two residual blocks each), conditioned on the
    time and the image embedding; ``text``: the text's tokens attended to at the bottleneck; ``low_resolution``:
    the previous stage's image, upsampled, read beside the noise."""

    def __init__(self, width: int, multiples: tuple[int, ...], *, text: bool = False, low_resolution: bool = False):
        super().__init__()
        conditioning = 4 * width
        self.width = width
        self.time = nn.Sequential(nn.Linear(width, conditioning), nn.SiLU(), nn.Linear(conditioning, conditioning))
        self.image_embedding = nn.Linear(DALLE2_EMBEDDING, conditioning)
        self.inputs = nn.Conv2d(6 if low_resolution else 3, width, 7, padding=3)
        channels = [width * m for m in multiples]
        self.down = nn.ModuleList()
        for i, (c_in, c_out) in enumerate(itertools.pairwise([width, *channels])):
            last = i == len(channels) - 1
            self.down.append(nn.ModuleList([
                _ResidualBlock(c_in, c_out, conditioning), _ResidualBlock(c_out, c_out, conditioning),
                nn.Identity() if last else nn.Conv2d(c_out, c_out, 4, stride=2, padding=1),
            ]))  # fmt: skip
        middle = channels[-1]
        self.middle = nn.ModuleList([_ResidualBlock(middle, middle, conditioning) for _ in range(2)])
        self.attention = (
            nn.MultiheadAttention(middle, 8, kdim=DALLE2_EMBEDDING, vdim=DALLE2_EMBEDDING, batch_first=True)
            if text
            else None
        )
        self.up = nn.ModuleList()
        for i, (c_out, c_in) in enumerate(reversed(list(itertools.pairwise([width, *channels])))):
            self.up.append(nn.ModuleList([
                _ResidualBlock(2 * c_in, c_in, conditioning), _ResidualBlock(2 * c_in, c_out, conditioning),
                nn.Identity() if i == len(channels) - 1 else nn.Upsample(scale_factor=2, mode="nearest"),
            ]))  # fmt: skip
        self.outputs = nn.Conv2d(width, 3, 1)

    def forward(
        self, noise: torch.Tensor, image_embedding: torch.Tensor, tokens: torch.Tensor, low: torch.Tensor | None
    ) -> torch.Tensor:
        condition = self.time(_time_embedding(noise.shape[0], self.width, noise))
        condition = condition + self.image_embedding(image_embedding)
        x = self.inputs(noise if low is None else torch.cat([noise, low], dim=1))
        skips = []
        for first, second, down in self.down:
            x = first(x, condition)
            skips.append(x)
            x = second(x, condition)
            skips.append(x)
            x = down(x)
        x = self.middle[0](x, condition)
        if self.attention is not None:
            flat = x.flatten(2).transpose(1, 2)
            flat = flat + self.attention(flat, tokens, tokens, need_weights=False)[0]
            x = flat.transpose(1, 2).reshape(x.shape)
        x = self.middle[1](x, condition)
        for first, second, up in self.up:
            x = first(torch.cat([x, skips.pop()], dim=1), condition)
            x = second(torch.cat([x, skips.pop()], dim=1), condition)
            x = up(x)
        return self.outputs(x)


def dalle2(batch: int) -> Built:
    """The stand-in on ``batch`` texts of 256 token ids, as TorchBench feeds DALLE2_pytorch."""
    return Dalle2(), lambda: ((torch.randint(CLIP_VOCAB, (batch, 256)),), {})
