"""Builders for GraCE's workloads: the CUDA-graph-sensitive models its evaluation names, in the configurations
PyTorch's benchmark runners give them (TorchBench's models and its Hugging Face suite: default configs, random
weights, the runners' batch sizes), as model code of our own where the original package is not one of the zoo's.

What makes each one a graph workload is kept as the original has it: XLNet builds its relative positional encoding
on the host and copies it to the GPU at every call (transformers 4.x did; 5.x builds it on the GPU, so the host
path is restored here: one host tensor in front of a graph of hundreds of kernels), CLIP keeps its text encoder's
causal mask and a row index on the host (as torchmultimodal, which TorchBench's torch_multimodal_clip runs, does),
and the Deep Recommender autoencoder takes a 200 MB batch of ratings per call (what a graph's replay copies into
its input buffer).
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


OCEAN_GRID = (204, 204, 26)  # TorchBench's pyhpc models at their default size (2**20 points): x, y, depth levels


class OceanEquationOfState(nn.Module):
    """A stand-in of the same shape as the seawater equation of state TorchBench's pyhpc_equation_of_state
    evaluates: one float64 polynomial in the square root of salinity, temperature and pressure, term by term --
    about 300 elementwise operations over the ocean grid in eager, one fused kernel once compiled. The
    coefficients are fixed pseudo-random numbers (the timings and the graphs do not depend on them)."""

    SALINITY_POWERS, TEMPERATURE_POWERS, PRESSURE_POWERS = 4, 6, 3

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0xE05)
        shape = (self.SALINITY_POWERS, self.TEMPERATURE_POWERS, self.PRESSURE_POWERS)
        self.coefficients = torch.randn(shape, generator=generator, dtype=torch.float64).tolist()  # Python floats

    def forward(self, salinity: torch.Tensor, temperature: torch.Tensor, pressure: torch.Tensor) -> torch.Tensor:
        x = torch.sqrt(salinity * 0.0248826675584615 + 0.5)
        y = temperature * 0.025
        z = pressure * 1e-4
        xs, ys, zs = (
            _powers(x, self.SALINITY_POWERS),
            _powers(y, self.TEMPERATURE_POWERS),
            _powers(z, self.PRESSURE_POWERS),
        )
        density = torch.zeros_like(x)
        for i, by_temperature in enumerate(self.coefficients):
            for j, by_pressure in enumerate(by_temperature):
                for k, coefficient in enumerate(by_pressure):
                    density = density + coefficient * xs[i] * ys[j] * zs[k]
        return density


def _powers(x: torch.Tensor, count: int) -> list[torch.Tensor]:
    """``[1, x, x**2, ...]``, ``count`` of them, each from the last (as a hand-written polynomial computes them)."""
    powers = [torch.ones_like(x), x]
    while len(powers) < count:
        powers.append(powers[-1] * x)
    return powers[:count]


def ocean_equation_of_state(batch: int) -> Built:
    """The stand-in on the pyhpc grid: salinity and temperature per point, pressure per depth level (``batch`` grids
    stacked along x; pyhpc computes in float64: the bench workload builds it so)."""
    nx, ny, nz = OCEAN_GRID

    def make() -> Inputs:
        salinity = 30.0 + 10.0 * torch.rand(batch * nx, ny, nz)
        temperature = 25.0 * torch.rand(batch * nx, ny, nz)
        pressure = torch.linspace(0.0, 5000.0, nz).reshape(1, 1, nz)
        return (salinity, temperature, pressure), {}

    return OceanEquationOfState(), make


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


class OceanTurbulence(nn.Module):
    """A stand-in of the same shape as the turbulent kinetic energy step TorchBench's pyhpc_turbulent_kinetic_energy
    integrates (from the Veros ocean model), as model code of our own: on a float64 ocean grid, an implicit vertical
    diffusion solved level by level (the Thomas algorithm, a Python loop over the depth levels writing slices in
    place), then flux-limited (superbee) advection along the three axes, its limiter's bounds made as small tensors
    on the device at every call as the original makes them -- hundreds of small kernels and host-made constants."""

    def __init__(self, dt: float = 1.0) -> None:
        super().__init__()
        self.dt = dt

    def forward(
        self,
        velocity: torch.Tensor,  # [3, nx, ny, nz]: u, v, w
        energy: torch.Tensor,  # [nx, ny, nz]
        diffusivity: torch.Tensor,  # [nx, ny, nz]
        forcing: torch.Tensor,  # [nx, ny, nz]
        water: torch.Tensor,  # [nx, ny, nz]: 1 in water, 0 on land
        thickness: torch.Tensor,  # [nz]: each level's thickness
    ) -> torch.Tensor:
        above = -self.dt * diffusivity / (thickness * thickness)
        below = torch.roll(above, 1, dims=2)
        diagonal = 1.0 - above - below
        solved = _thomas(below * water, diagonal, above * water, (energy + self.dt * forcing) * water)
        tendency = torch.zeros_like(solved)
        for axis in range(3):
            flux = _superbee_flux(velocity[axis], solved, water, axis, self.dt)
            tendency = tendency - (flux - torch.roll(flux, 1, dims=axis))
        return (solved + self.dt * tendency) * water


def _thomas(lower: torch.Tensor, diagonal: torch.Tensor, upper: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """The tridiagonal systems along the last axis, solved by elimination and back substitution, level by level."""
    diagonal, right = diagonal.clone(), right.clone()
    levels = diagonal.shape[-1]
    for k in range(1, levels):
        factor = lower[..., k] / diagonal[..., k - 1]
        diagonal[..., k] -= factor * upper[..., k - 1]
        right[..., k] -= factor * right[..., k - 1]
    out = torch.empty_like(right)
    out[..., -1] = right[..., -1] / diagonal[..., -1]
    for k in range(levels - 2, -1, -1):
        out[..., k] = (right[..., k] - upper[..., k] * out[..., k + 1]) / diagonal[..., k]
    return out


def _superbee_flux(
    velocity: torch.Tensor, field: torch.Tensor, water: torch.Tensor, axis: int, dt: float
) -> torch.Tensor:
    """The superbee-limited upwind flux of ``field`` through each cell's face along ``axis``."""
    ahead, behind = torch.roll(field, -1, dims=axis), torch.roll(field, 1, dims=axis)
    jump_ahead, jump, jump_behind = (
        (ahead - field) * water,
        (field - behind) * water,
        (behind - torch.roll(behind, 1, dims=axis)) * water,
    )
    upwind = torch.where(velocity > 0.0, jump_behind, jump_ahead)
    ratio = upwind / torch.where(torch.abs(jump) < 1e-20, 1e-20, jump)
    zero, one, two = (torch.tensor([value], dtype=field.dtype, device=field.device) for value in (0.0, 1.0, 2.0))
    limited = torch.maximum(zero, torch.maximum(torch.minimum(one, 2 * ratio), torch.minimum(two, ratio)))
    courant = torch.abs(velocity * dt)
    return velocity * (field + behind) * 0.5 - torch.abs(velocity) * ((1.0 - limited) + courant * limited) * jump * 0.5


def ocean_turbulence(batch: int) -> Built:
    """The stand-in on pyhpc's default grid (``batch`` grids stacked along x; float64 as pyhpc computes, set by the
    bench workload)."""
    nx, ny, nz = OCEAN_GRID

    def make() -> Inputs:
        shape = (batch * nx, ny, nz)
        velocity = 0.1 * torch.randn(3, *shape)
        water = (torch.rand(shape) < 0.8).float()
        thickness = 1.0 + torch.rand(nz)
        return (velocity, torch.rand(shape), 0.1 * torch.rand(shape), torch.randn(shape), water, thickness), {}

    return OceanTurbulence(), make


class OceanIsoneutralMixing(nn.Module):
    """A stand-in of the same shape as the isoneutral mixing coefficients TorchBench's pyhpc_isoneutral_mixing
    computes (Griffies' isoneutral diffusion, from the Veros ocean model), as model code of our own: the slopes of
    the density surfaces at the east, north and top faces of every cell, tapered where they are steep, each from
    the two neighbouring cells of each of two levels (Python loops over those four), summed into the three
    diffusivities. What makes it a graph workload is kept: it writes its results **into the tensors it is given**
    (the diffusivities ``k`` and the slopes ``slopes``, as the original fills its K_11, K_22, K_33 and Ai_* inputs),
    its small constants are made on the device at every call, and a call takes about 260 MB of float64 inputs."""

    EPSILON = 1e-20
    STEEP = 50.0  # the diffusivity a steep slope still gets
    SLOPE_LIMIT, SLOPE_WIDTH = 1e-3, 1e-3  # where the taper falls off, and how fast

    def forward(
        self,
        masks: torch.Tensor,  # [4, nx, ny, nz]: cells, east faces, north faces, top faces (1 in water)
        widths_x: torch.Tensor,  # [2, nx]: cell and face widths
        widths_y: torch.Tensor,  # [2, ny]
        widths_z: torch.Tensor,  # [2, nz]
        cosines: torch.Tensor,  # [2, ny]: the cosine of the latitude at cells and faces
        salt: torch.Tensor,  # [nx, ny, nz, 3]: time levels
        temperature: torch.Tensor,  # [nx, ny, nz, 3]
        depth: torch.Tensor,  # [nz]
        k_iso: torch.Tensor,  # [nx, ny, nz]: the isoneutral diffusivity
        k: torch.Tensor,  # [3, nx, ny, nz]: written: the east, north and top diffusivities
        slopes: torch.Tensor,  # [4, nx, ny, nz, 2, 2]: written: the tapered slopes by neighbour and level
    ) -> tuple[torch.Tensor, torch.Tensor]:
        zero, steep = (torch.tensor([v], dtype=k.dtype, device=k.device) for v in (0.0, self.STEEP))
        mask_cells, mask_top = masks[0], masks[3]
        t, s = temperature[..., 0], salt[..., 0]
        density_by_t = mask_cells * -(1e-5 * (t - 9.85) + 1.67e-4 * (1 - 1.1e-8 * 9.81 * depth.abs() * 1024.0)) * 1024
        density_by_s = mask_cells * 0.78e-3 * 1024.0 * torch.ones_like(t)
        steps = (  # the distance between the centres of two neighbouring cells, along x, y and z
            widths_x[1][:-1, None, None] * cosines[0][None, :, None],
            widths_y[1][None, :-1, None],
            widths_z[1][None, None, :-1],
        )
        gradients = [  # of (temperature, salt) across the east, north and top faces
            tuple(_face_gradient(field, axis, masks[axis + 1], steps[axis]) for field in (t, s)) for axis in range(3)
        ]

        def slope(here: tuple, across: tuple, levels: slice, vertical: torch.Tensor) -> torch.Tensor:
            along = density_by_t[(*here, levels)] * across[0] + density_by_s[(*here, levels)] * across[1]
            return -along / (torch.minimum(vertical, zero) - self.EPSILON)

        levels = k.shape[3]
        for axis in range(2):  # the east (x) and north (y) faces
            inner, ahead = _cells(axis, slice(1, -2)), _cells(axis, slice(2, -1))
            spread = torch.zeros_like(k_iso)
            spread[(*inner, slice(1, None))] = 0.25 * (
                k_iso[(*inner, slice(1, None))] + k_iso[(*inner, slice(None, -1))]
                + k_iso[(*ahead, slice(1, None))] + k_iso[(*ahead, slice(None, -1))]
            )  # fmt: skip
            spread[(*inner, 0)] = 0.5 * (k_iso[(*inner, 0)] + k_iso[(*ahead, 0)])
            total = torch.zeros_like(k_iso)[inner]
            for level in range(2):
                first, last = 1 - level, levels - 1 + level
                for side in range(2):
                    here = _cells(axis, slice(1 + side, -2 + side))
                    across = tuple(g[(*inner, slice(first, None))] for g in gradients[axis])
                    vertical = sum(
                        d[(*here, slice(first, None))] * g[(*here, slice(None, last))]
                        for d, g in zip((density_by_t, density_by_s), gradients[2], strict=True)
                    )
                    tilt = slope(here, across, slice(first, None), vertical)
                    taper = self._taper(tilt)
                    water = masks[axis + 1][(*inner, slice(first, None))]
                    total[..., first:] += (
                        widths_z[1][:last] * water * torch.maximum(steep, spread[(*inner, slice(first, None))] * taper)
                    )
                    slopes[axis][(*inner, slice(first, None), side, level)] = taper * tilt * water
            k[axis][inner] = total / (4.0 * widths_z[0])

        cells, top = (slice(2, -2), slice(2, -2)), slice(None, -1)
        totals = [torch.zeros_like(k_iso)[(*cells, top)] for _ in range(2)]
        face_weights = (widths_x[1], cosines[1] * widths_y[1])
        for level in range(2):
            levels_here = slice(level, levels - 1 + level)
            vertical = sum(
                d[(*cells, levels_here)] * g[(*cells, top)]
                for d, g in zip((density_by_t, density_by_s), gradients[2], strict=True)
            )
            for axis in range(2):  # the slopes at the top face, eastward then northward
                for side in range(2):
                    shifted = _cells(axis, slice(1 + side, -3 + side), other=slice(2, -2))
                    across = tuple(g[(*shifted, levels_here)] for g in gradients[axis])
                    tilt = slope(cells, across, levels_here, vertical)
                    taper = self._taper(tilt)
                    weight = _on_axis(face_weights[axis][1 + side : -3 + side], axis)
                    tapered = taper * tilt  # first: a steep slope's square would overflow float32, its taper is 0
                    totals[axis] += weight * k_iso[(*cells, top)] * tapered * tilt * mask_top[(*cells, top)]
                    slopes[2 + axis][(*cells, top, side, level)] = tapered * mask_top[(*cells, top)]
        k[2][(*cells, top)] = totals[0] / (4 * _on_axis(widths_x[0][2:-2], 0)) + totals[1] / (
            4 * _on_axis(widths_y[0][2:-2] * cosines[0][2:-2], 1)
        )
        k[2][(*cells, -1)] = 0.0
        return k, slopes

    def _taper(self, slope: torch.Tensor) -> torch.Tensor:
        """1 for a gentle slope, falling to 0 past ``SLOPE_LIMIT``."""
        return 0.5 * (1.0 + torch.tanh((self.SLOPE_LIMIT - torch.abs(slope)) / self.SLOPE_WIDTH))


def _cells(axis: int, along: slice, other: slice = slice(2, -2)) -> tuple[slice, slice]:
    """The horizontal cells ``along`` the face's ``axis`` (0: x, 1: y), ``other`` across it."""
    return (along, other) if axis == 0 else (other, along)


def _on_axis(values: torch.Tensor, axis: int) -> torch.Tensor:
    """A 1-D tensor along ``axis`` of an (x, y, z) grid, broadcast over the other two."""
    return values.reshape([-1 if i == axis else 1 for i in range(3)])


def _face_gradient(field: torch.Tensor, axis: int, water: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """How ``field`` changes across each cell's face along ``axis``, per ``step`` (zero at the last cell and on
    land)."""
    out = torch.zeros_like(field)
    here, ahead = [slice(None)] * 3, [slice(None)] * 3
    here[axis], ahead[axis] = slice(None, -1), slice(1, None)
    out[tuple(here)] = water[tuple(here)] * (field[tuple(ahead)] - field[tuple(here)]) / step
    return out


def ocean_isoneutral_mixing(batch: int) -> Built:
    """The stand-in on pyhpc's default grid (``batch`` grids stacked along x; float64, set by the bench workload),
    inputs drawn as pyhpc draws them: masks 80 % water, normal widths and fields, three time levels."""
    nx, ny, nz = OCEAN_GRID

    def make() -> Inputs:
        x = batch * nx
        masks = (torch.rand(4, x, ny, nz) < 0.8).float()
        widths = (torch.randn(2, x), torch.randn(2, ny), torch.randn(2, nz))
        fields = (torch.randn(x, ny, nz, 3), torch.randn(x, ny, nz, 3))
        written = (torch.randn(3, x, ny, nz), torch.zeros(4, x, ny, nz, 2, 2))
        return (masks, *widths, torch.randn(2, ny), *fields, torch.randn(nz), torch.randn(x, ny, nz), *written), {}

    return OceanIsoneutralMixing(), make


SPEECH_FEATURES = 320  # 80 filterbank channels, four frames stacked (low frame rate)
SPEECH_VOCAB = 1014
SPEECH_PADDING = -1  # a target's padding, dropped before decoding


class SpeechTransformer(nn.Module):
    """The Speech-Transformer (Dong et al., 2018) as TorchBench's speech_transformer configures it, as model code of
    our own: 6 encoder and 6 decoder layers of width 512 (8 heads, 2048 inner, dropout 0.1), sinusoidal positions,
    the output projection sharing the target embedding. What makes it a graph workload is kept: the encoder's
    padding mask is written row by row at each input's length (a device scalar read on the host), and the targets
    lose their padding row by row and gain start and end tokens (shapes that depend on the values)."""

    def __init__(self, width: int = 512, layers: int = 6, heads: int = 8, inner: int = 2048, max_len: int = 5000):
        super().__init__()
        self.input = nn.Linear(SPEECH_FEATURES, width)
        self.input_norm = nn.LayerNorm(width)
        self.register_buffer("positions", _sinusoids(max_len, width), persistent=False)
        self.encoder = nn.ModuleList(
            nn.TransformerEncoderLayer(width, heads, inner, dropout=0.1, batch_first=True) for _ in range(layers)
        )
        self.embedding = nn.Embedding(SPEECH_VOCAB, width)
        self.decoder = nn.ModuleList(
            nn.TransformerDecoderLayer(width, heads, inner, dropout=0.1, batch_first=True) for _ in range(layers)
        )
        self.projection = nn.Linear(width, SPEECH_VOCAB, bias=False)
        self.projection.weight = self.embedding.weight
        self.dropout = nn.Dropout(0.1)
        self.scale = width**-0.5
        self.start, self.end = SPEECH_VOCAB - 2, SPEECH_VOCAB - 1

    def forward(
        self, features: torch.Tensor, lengths: torch.Tensor, targets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        frames = torch.ones(features.shape[:2], dtype=features.dtype, device=features.device)
        for row in range(features.shape[0]):
            frames[row, lengths[row] :] = 0  # the original's loop: each length read on the host
        padding = frames == 0
        x = self.dropout(self.input_norm(self.input(features)) + self.positions[: features.shape[1]])
        for layer in self.encoder:
            x = layer(x, src_key_padding_mask=padding) * frames[..., None]
        rows = [row[row != SPEECH_PADDING] for row in targets]
        start, end = rows[0].new([self.start]), rows[0].new([self.end])
        given = nn.utils.rnn.pad_sequence([torch.cat([start, row]) for row in rows], True, self.end)
        expected = nn.utils.rnn.pad_sequence([torch.cat([row, end]) for row in rows], True, SPEECH_PADDING)
        steps = given.shape[1]
        causal = torch.ones(steps, steps, dtype=torch.bool, device=given.device).triu(1)
        y = self.dropout(self.embedding(given) + self.positions[:steps])
        for layer in self.decoder:
            y = layer(y, x, tgt_mask=causal, tgt_key_padding_mask=given == self.end, memory_key_padding_mask=padding)
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
