"""The transformers populations: every causal LM the auto mapping lists, and base models of every modality.

Each architecture is built from its own config class with ``shrink_config``'s sizes; its inputs are read off the
forward's signature and the config (ids within the vocabulary, images of the configured size, audio of the
length the encoder expects, decoder ids for encoder-decoders). When the shrunk model does not build, the default
config is tried on ``meta``: if that fails too, the library itself cannot build the architecture here.
"""

from __future__ import annotations

import inspect
from functools import partial
from typing import Any

import torch

from . import inputs
from .candidate import Built, Candidate, Inputs, Library, NotInLibraryError
from .shrink import shrink_config

BATCH = 2
SEQUENCE = 16
DECODER_SEQUENCE = 8
AUDIO_SAMPLES = 8000
AUDIO_FRAMES = 64
KNOWN_INPUTS = ("input_ids", "attention_mask", "pixel_values", "input_values", "input_features", "decoder_input_ids")
MAIN_INPUTS = {"input_ids", "pixel_values", "input_values", "input_features"}


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}"


def _classes(model_type: str, model_class: str) -> tuple[type, type]:
    """(config class, model class) of an auto-mapping entry; an import failure means the library cannot build it."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    try:
        model_cls = getattr(transformers, model_class)
        config_cls = getattr(model_cls, "config_class", None) or getattr(transformers, CONFIG_MAPPING_NAMES[model_type])
        return config_cls, model_cls
    except Exception as exc:  # missing optional package, class not exported
        raise NotInLibraryError(f"not importable: {_one_line(exc)}") from exc


def _config(config_cls: type, model_cls: type) -> Any:
    """The default config of the class with every size shrunk."""
    shrunk = shrink_config(config_cls().to_dict())
    for key in ("transformers_version", "model_type", "architectures", "_name_or_path"):
        shrunk.pop(key, None)
    return config_cls(**shrunk)  # the library picks the attention (SDPA where the model and its parts have it)


def _default_builds(config_cls: type, model_cls: type) -> None:
    """Raise ``NotInLibraryError`` when the unshrunk default config does not build either (tried on ``meta``)."""
    try:
        with torch.device("meta"):
            model_cls(config_cls())
    except Exception as exc:
        raise NotInLibraryError(f"its default config does not build: {_one_line(exc)}") from exc


def build_architecture(model_type: str, model_class: str, device: str = "cpu") -> Built:
    """The shrunk ``model_class`` on ``device`` in eval mode, with the inputs its forward takes."""
    config_cls, model_cls = _classes(model_type, model_class)
    try:
        config = _config(config_cls, model_cls)
        with torch.device(device):
            model = model_cls(config)
    except ImportError as exc:  # the architecture needs a package that is not installed
        raise NotInLibraryError(f"needs a package that is not installed: {_one_line(exc)}") from exc
    except Exception:
        _default_builds(config_cls, model_cls)
        raise
    model.eval()
    return Built(model, partial(make_inputs, _wanted(model), config), model_class)


def _sub(config: Any, name: str) -> Any:
    return getattr(config, name, None) or config


def _int(config: Any, *names: str, default: int) -> int:
    for source in (config, _sub(config, "vision_config"), _sub(config, "audio_config"), _sub(config, "text_config")):
        for name in names:
            value = getattr(source, name, None)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            if isinstance(value, (list, tuple)) and value and isinstance(value[0], int):
                return value[0]
    return default


def _wanted(model: torch.nn.Module) -> tuple[str, ...]:
    """The inputs this forward takes that the harness knows how to make."""
    names = inspect.signature(model.forward).parameters
    return tuple(name for name in KNOWN_INPUTS if name in names)


def _text_only(config: Any, wanted: tuple[str, ...]) -> bool:
    """A model that places image features at image tokens runs text-only; a dual encoder needs both."""
    if "input_ids" not in wanted:
        return False
    places_images = any(getattr(config, k, None) is not None for k in ("image_token_id", "image_token_index"))
    dual = getattr(config, "vision_config", None) is not None and getattr(config, "text_config", None) is not None
    return places_images or not dual


def make_inputs(wanted: tuple[str, ...], config: Any, generator: torch.Generator, device: Any) -> Inputs:
    """Fresh inputs for a transformers forward, moved to ``device``."""
    kw: dict[str, Any] = {}
    vocab = _int(config, "vocab_size", default=1024)
    text_only = _text_only(config, wanted)
    if "input_ids" in wanted and (text_only or "pixel_values" in wanted or not _audio(wanted)):
        kw["input_ids"] = inputs.token_ids(generator, BATCH, SEQUENCE, vocab)
        if "attention_mask" in wanted:
            kw["attention_mask"] = torch.ones(BATCH, SEQUENCE, dtype=torch.long)
    if "pixel_values" in wanted and not text_only:
        size = _int(config, "image_size", "img_size", default=224)
        channels = _int(config, "num_channels", "in_channels", default=3)
        kw["pixel_values"] = inputs.normalized_images(generator, BATCH, channels, size, size)
    if "input_features" in wanted and "input_ids" not in kw:
        kw["input_features"] = _audio_features(config, generator)
    elif "input_values" in wanted and "input_ids" not in kw:
        kw["input_values"] = _audio_values(config, generator)
    if "decoder_input_ids" in wanted and getattr(config, "is_encoder_decoder", False):
        kw["decoder_input_ids"] = inputs.token_ids(generator, BATCH, DECODER_SEQUENCE, vocab)
    return (), {k: v.to(device) for k, v in kw.items()}


def _audio(wanted: tuple[str, ...]) -> bool:
    return "input_features" in wanted or "input_values" in wanted


def _audio_features(config: Any, generator: torch.Generator) -> torch.Tensor:
    """Log-mel frames: Whisper-like encoders want exactly two frames per source position."""
    mels = _int(config, "num_mel_bins", "feature_size", default=80)
    source = getattr(config, "max_source_positions", None)
    if (source and getattr(config, "model_type", "") in ("whisper",)) or (hasattr(config, "num_mel_bins") and source):
        return inputs.features(generator, BATCH, mels, 2 * source)
    per_channel = getattr(config, "input_feat_per_channel", None)
    if per_channel:
        return inputs.features(generator, BATCH, AUDIO_FRAMES, per_channel * getattr(config, "input_channels", 1))
    return inputs.features(generator, BATCH, AUDIO_FRAMES, mels)


def _audio_values(config: Any, generator: torch.Generator) -> torch.Tensor:
    """A waveform, or a spectrogram of the configured length for spectrogram transformers (AST)."""
    if hasattr(config, "max_length") and hasattr(config, "num_mel_bins"):
        return inputs.features(generator, BATCH, config.max_length, config.num_mel_bins)
    return inputs.waveform(generator, BATCH, AUDIO_SAMPLES)


def causal_candidates() -> list[Candidate]:
    """Every architecture of ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return [
        Candidate(Library.TRANSFORMERS_CAUSAL, name, "decoder", partial(build_architecture, name, cls))
        for name, cls in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items()
    ]


def feedable(model_class: str) -> bool:
    """The forward takes a main input the harness makes and requires nothing else (an unimportable class is
    kept: it is listed as not building in the library)."""
    import transformers

    try:
        parameters = inspect.signature(getattr(transformers, model_class).forward).parameters
    except Exception:
        return True
    required = {
        n for n, p in parameters.items() if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    }
    return bool(MAIN_INPUTS & set(parameters)) and required - {"self"} <= set(KNOWN_INPUTS)


def base_candidates() -> list[Candidate]:
    """The base models of ``MODEL_MAPPING_NAMES`` not already causal-LM candidates, whose forward the harness can
    feed (text, images, audio; not time series, keypoint matchers or models needing grids and sessions)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_MAPPING_NAMES

    found = []
    for name, classes in MODEL_MAPPING_NAMES.items():
        cls = classes[0] if isinstance(classes, (tuple, list)) else classes
        if name in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES or not feedable(cls):
            continue
        found.append(Candidate(Library.TRANSFORMERS, name, _modality(name), partial(build_architecture, name, cls)))
    return found


def _modality(model_class: str) -> str:
    return "base"
