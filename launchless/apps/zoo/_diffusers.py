"""The zoo's diffusers workloads and their builders: small configs built in code (random weights, nothing fetched).

Sizes are read back from ``model.config``, so inputs match whatever the config sets: latents of
``in_channels`` x ``sample_size``, one timestep per sample, text states of the cross-attention width.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from ._common import Inputs, _Spec

Built = tuple[torch.nn.Module, Callable[[], Inputs]]
# An input factory: (model config, batch) -> keyword arguments of the forward.
MakeKwargs = Callable[[Any, int], dict[str, Any]]

TEXT_TOKENS = 16  # length of the (random) text-encoder states the conditioned models attend to


def _diffusers(model_cls: str, make_kwargs: MakeKwargs, batch: int, **config: Any) -> Built:
    import diffusers

    model = getattr(diffusers, model_cls)(**copy.deepcopy(config))
    return model, lambda: ((), make_kwargs(model.config, batch))


def _latents(cfg: Any, batch: int) -> torch.Tensor:
    return torch.randn(batch, cfg.in_channels, cfg.sample_size, cfg.sample_size)


def _steps(batch: int) -> torch.Tensor:
    return torch.randint(1000, (batch,))


def _unet(cfg: Any, batch: int) -> dict[str, Any]:
    """UNet2DModel (unconditional) or UNet2DConditionModel (text states when it has cross-attention)."""
    kw: dict[str, Any] = {"sample": _latents(cfg, batch), "timestep": _steps(batch)}
    if getattr(cfg, "cross_attention_dim", None):
        kw["encoder_hidden_states"] = torch.randn(batch, TEXT_TOKENS, cfg.cross_attention_dim)
    return kw


def _image(cfg: Any, batch: int) -> dict[str, Any]:
    """AutoencoderKL's full forward: encode, take the posterior's mode, decode."""
    return {"sample": torch.rand(batch, cfg.in_channels, cfg.sample_size, cfg.sample_size) * 2 - 1}


def _dit(cfg: Any, batch: int) -> dict[str, Any]:
    """DiT: class-conditioned latents."""
    return {
        "hidden_states": _latents(cfg, batch),
        "timestep": _steps(batch),
        "class_labels": torch.randint(cfg.num_embeds_ada_norm, (batch,)),
    }


def _pixart(cfg: Any, batch: int) -> dict[str, Any]:
    """PixArt-alpha: latents attending to caption states."""
    return {
        "hidden_states": _latents(cfg, batch),
        "encoder_hidden_states": torch.randn(batch, TEXT_TOKENS, cfg.caption_channels),
        "timestep": _steps(batch),
    }


def _sd3(cfg: Any, batch: int) -> dict[str, Any]:
    """SD3 MMDiT: latents, text states and pooled text projections."""
    return {
        "hidden_states": _latents(cfg, batch),
        "encoder_hidden_states": torch.randn(batch, TEXT_TOKENS, cfg.joint_attention_dim),
        "pooled_projections": torch.randn(batch, cfg.pooled_projection_dim),
        "timestep": _steps(batch),
    }


FLUX_SIDE = 16  # packed latent grid: FLUX_SIDE x FLUX_SIDE tokens


def _flux(cfg: Any, batch: int) -> dict[str, Any]:
    """Flux: packed latent tokens with their (0, row, column) rotary ids, text states, t in [0, 1]."""
    rows, cols = torch.meshgrid(torch.arange(FLUX_SIDE), torch.arange(FLUX_SIDE), indexing="ij")
    img_ids = torch.stack([torch.zeros_like(rows), rows, cols], dim=-1).reshape(-1, 3).float()
    return {
        "hidden_states": torch.randn(batch, FLUX_SIDE * FLUX_SIDE, cfg.in_channels),
        "encoder_hidden_states": torch.randn(batch, TEXT_TOKENS, cfg.joint_attention_dim),
        "pooled_projections": torch.randn(batch, cfg.pooled_projection_dim),
        "timestep": torch.rand(batch),
        "img_ids": img_ids,
        "txt_ids": torch.zeros(TEXT_TOKENS, 3),
    }


def _df(model_cls: str, make_kwargs: Any, **config: Any) -> _Spec:
    return _Spec("diffusers", "diffusers", partial(_diffusers, model_cls, make_kwargs, **config), "diffusion")


# The zoo's diffusers workloads: small configs of each model family, conditioned as the pipelines call them.
DIFFUSION: dict[str, _Spec] = {
    "diffusers:unet2d-cond-tiny": _df(  # SD-style: cross-attention to text states
        "UNet2DConditionModel",
        _unet,
        sample_size=32,
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(32, 64),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=64,
        attention_head_dim=8,
        norm_num_groups=16,
    ),
    "diffusers:unet2d-tiny": _df(  # DDPM-style, unconditional
        "UNet2DModel",
        _unet,
        sample_size=32,
        in_channels=3,
        out_channels=3,
        layers_per_block=1,
        block_out_channels=(32, 64),
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        norm_num_groups=16,
    ),
    "diffusers:vae-tiny": _df(
        "AutoencoderKL",
        _image,
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        block_out_channels=(32, 64),
        latent_channels=4,
        norm_num_groups=16,
        sample_size=64,
    ),
    "diffusers:dit-tiny": _df(
        "DiTTransformer2DModel",
        _dit,
        num_attention_heads=4,
        attention_head_dim=32,
        in_channels=4,
        out_channels=8,
        num_layers=2,
        sample_size=32,
        patch_size=2,
        num_embeds_ada_norm=1000,
    ),
    "diffusers:pixart-tiny": _df(
        "PixArtTransformer2DModel",
        _pixart,
        num_attention_heads=4,
        attention_head_dim=32,
        in_channels=4,
        out_channels=8,
        num_layers=2,
        sample_size=32,
        patch_size=2,
        cross_attention_dim=128,
        caption_channels=64,
        use_additional_conditions=False,
    ),
    "diffusers:sd3-tiny": _df(
        "SD3Transformer2DModel",
        _sd3,
        sample_size=32,
        patch_size=2,
        in_channels=4,
        out_channels=4,
        num_layers=2,
        attention_head_dim=32,
        num_attention_heads=4,
        joint_attention_dim=64,
        caption_projection_dim=128,
        pooled_projection_dim=64,
        pos_embed_max_size=32,
    ),
    "diffusers:flux-tiny": _df(
        "FluxTransformer2DModel",
        _flux,
        patch_size=1,
        in_channels=16,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=32,
        num_attention_heads=4,
        joint_attention_dim=64,
        pooled_projection_dim=64,
        guidance_embeds=False,
        axes_dims_rope=(8, 12, 12),
    ),
}
