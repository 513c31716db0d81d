"""Builders for transformers models: a config built in code (random weights, no hub access) plus inputs.

Configs that would name a pretrained backbone get a small in-library one instead (a transformers
ResNet / ConvNeXt config), so nothing is fetched; input factories read sizes and vocabularies from
the config, so ids stay in range and audio lengths match what the model expects.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch

from ._common import Inputs

Built = tuple[torch.nn.Module, Callable[[], Inputs]]
# An input factory: (config, batch) -> keyword arguments of the forward.
MakeKwargs = Callable[[Any, int], dict[str, Any]]


def _hf(
    model_cls: str,
    config_cls: str,
    seq: int,
    batch: int,
    *,
    ids: tuple[str, ...] = ("input_ids",),
    fills: dict[str, int] | None = None,
    flags: dict[str, Any] | None = None,
    **config: Any,
) -> Built:
    """Transformers model from a default-ish config; ``flags`` keep outputs tensor-only (no caches)."""
    import transformers

    cls = getattr(transformers, model_cls)
    attn = "sdpa" if getattr(cls, "_supports_sdpa", False) else "eager"  # e.g. XLNet has no SDPA path
    cfg = getattr(transformers, config_cls)(attn_implementation=attn, **config)
    model = cls(cfg)

    def make() -> Inputs:
        kw: dict[str, Any] = {k: torch.randint(cfg.vocab_size, (batch, seq)) for k in ids}
        kw |= {k: torch.full((batch, seq), v) for k, v in (fills or {}).items()}
        return (), kw | (flags or {})

    return model, make


def _hf_pixels(model_cls: str, config_cls: str, size: int, batch: int, **config: Any) -> Built:
    """A transformers vision model from its default config (no pretrained backbone), on pixel_values."""
    import transformers

    cfg = getattr(transformers, config_cls)(**config)
    model = getattr(transformers, model_cls)(cfg)
    return model, lambda: ((), {"pixel_values": torch.rand(batch, 3, size, size)})


def _transformers(
    model_cls: str, config_cls: str, make_kwargs: MakeKwargs, batch: int, *, sdpa: bool = True, **config: Any
) -> Built:
    """``model_cls(config_cls(**config))`` called with ``make_kwargs(config, batch)`` and default flags.

    ``sdpa``: ask for SDPA attention where the class has it, else eager (as ``_hf``); False leaves the
    choice to transformers, for composite models whose backbone refuses an explicit implementation.
    """
    import transformers

    cls = getattr(transformers, model_cls)
    config = copy.deepcopy(config)  # configs may consume nested dicts (backbone_config)
    if sdpa:
        config["attn_implementation"] = "sdpa" if getattr(cls, "_supports_sdpa", False) else "eager"
    cfg = getattr(transformers, config_cls)(**config)
    model = cls(cfg)
    return model, lambda: ((), make_kwargs(cfg, batch))


# --- input factories: partial(factory, sizes...)(config, batch) -> kwargs -----------------------


def _tokens(
    seq: int, cfg: Any, batch: int, *, mask: bool = True, type_ids: bool = False, decoder: int = 0
) -> dict[str, Any]:
    """Random ids in the vocabulary, an all-ones attention mask, optional token types / decoder ids."""
    kw: dict[str, Any] = {"input_ids": torch.randint(cfg.vocab_size, (batch, seq))}
    if mask:
        kw["attention_mask"] = torch.ones(batch, seq, dtype=torch.long)
    if type_ids:
        kw["token_type_ids"] = torch.zeros(batch, seq, dtype=torch.long)
    if decoder:
        kw["decoder_input_ids"] = torch.randint(cfg.vocab_size, (batch, decoder))
    return kw


def _pixels(size: int | tuple[int, int], cfg: Any, batch: int) -> dict[str, Any]:
    """RGB images in [0, 1], square or (height, width)."""
    height, width = (size, size) if isinstance(size, int) else size
    return {"pixel_values": torch.rand(batch, 3, height, width)}


def _clip(frames: int, size: int, cfg: Any, batch: int) -> dict[str, Any]:
    """A video clip as (batch, frames, 3, size, size), the layout of transformers' video models."""
    return {"pixel_values": torch.rand(batch, frames, 3, size, size)}


def _image_text(size: int, seq: int, cfg: Any, batch: int) -> dict[str, Any]:
    """CLIP-style: an image and a caption."""
    return {
        "pixel_values": torch.rand(batch, 3, size, size),
        "input_ids": torch.randint(cfg.text_config.vocab_size, (batch, seq)),
        "attention_mask": torch.ones(batch, seq, dtype=torch.long),
    }


def _waveform(samples: int, cfg: Any, batch: int) -> dict[str, Any]:
    """Raw audio (wav2vec2 family): ``samples`` at 16 kHz, roughly unit-variance after normalisation."""
    return {"input_values": 0.1 * torch.randn(batch, samples)}


def _log_mel(cfg: Any, batch: int, *, decoder: int = 0) -> dict[str, Any]:
    """Whisper: log-mel features of exactly the length the encoder expects (2 frames per position)."""
    kw: dict[str, Any] = {"input_features": torch.randn(batch, cfg.num_mel_bins, 2 * cfg.max_source_positions)}
    if decoder:
        kw["decoder_input_ids"] = torch.randint(cfg.vocab_size, (batch, decoder))
    return kw


def _spectrogram(cfg: Any, batch: int) -> dict[str, Any]:
    """AST: a (time, mel) filterbank of the configured length."""
    return {"input_values": torch.randn(batch, cfg.max_length, cfg.num_mel_bins)}
