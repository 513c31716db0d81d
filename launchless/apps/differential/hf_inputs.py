"""What a transformers architecture is fed: its inputs read off the forward's signature and its config.

Ids within the vocabulary, images of the configured size, audio of the length the encoder expects, decoder ids for
encoder-decoders, and what a few families take beside these: region features, image slots in the ids, images packed
as patches, clips. Where the config does not name a modality's layout, the layouts a processor could have produced
are tried on the freshly built model and the first that eager accepts is kept (``fit_layout``). Every call draws
new values from the caller's generator.
"""

from __future__ import annotations

import inspect
import logging
import math
import re
from dataclasses import dataclass, fields, replace
from typing import Any

import torch

from ...errors import one_line
from . import inputs
from .candidate import Inputs
from .shrink import HIDDEN

log = logging.getLogger(__name__)

BATCH = 2
SEQUENCE = 16
DECODER_SEQUENCE = 8
AUDIO_SAMPLES = 7680  # half a second at 16 kHz, a multiple of every codec hop (256, 320, 480, 512, 960, 1920)
AUDIO_FRAMES = 64
# log-mel frames per text position where a streaming recogniser adds its audio to the ids position by position
# (after the encoder's strides and its merge of neighbouring frames)
FRAMES_PER_TOKEN = (2, 4, 8)
VIDEO_FRAMES = 2  # frames of a clip where the config counts none
REGIONS = 36  # regions a bottom-up detector keeps per image, what region-feature models (LXMERT) are fed
PACKED_SIDE = 8  # patches a side of each image packed into one row (a multiple of two 2 x 2 merges)
STACKED_FRAMES = (2, 4)  # log-mel frames a speech processor stacks into one (wav2vec2-bert: 2; with deltas: 4)
KNOWN_INPUTS = (
    "input_ids",
    "attention_mask",
    "bbox",
    "pixel_values",
    "input_values",
    "input_features",
    "input_features_mask",
    "decoder_input_ids",
    "pixel_attention_mask",
    "spatial_shapes",
    "target_sizes",
    "visual_feats",
    "visual_pos",
    "image_attention_mask",
    "image_embeds_position_mask",
    "pixel_values_videos",
    "decoder_input_values",
)
# Made where the forward takes them, but not enough to feed a forward that requires them: the audio encoders that
# require a frame mask also want their frames stacked or cut to windows of their own; the video models that
# require a clip want grids or a tubelet layout of their own.
ONLY_WHERE_OPTIONAL = {"input_features_mask", "pixel_values_videos"}
LAYOUT_SCALE = 1000  # layout tokenizers normalise word boxes to [0, 1000]
MAIN_INPUTS = {"input_ids", "pixel_values", "input_values", "input_features"}
# Config attributes of models that match two images (keypoint detectors and matchers)
_MATCHING = re.compile(r".*(matching|keypoint).*")
# Config attributes that name the width of one log-mel frame (processors call it feature_size or num_mel_bins).
_MEL_NAMES = (
    "num_mel_bins",
    "feature_size",
    "n_mels",
    "num_mels",
    "mel_bins",
    "feat_in",
    "input_feat_per_channel",
    "feature_projection_input_dim",
)


@dataclass(frozen=True)
class Layout:
    """How the harness lays out a modality whose layout the config does not name; the first that eager accepts on
    the freshly built model is kept (``fit_layout``), as a processor would have produced one of them.

    ``channels_first``: a codec's waveform is (batch, channels, samples) -- what the codec processors return --
    where a speech encoder takes (batch, samples). ``time_major``: log-mel frames as (batch, frames, mels), the
    conformer processors' layout, where Whisper-like encoders take (batch, mels, frames). ``mels``: the frame width
    among the config's candidates, or a multiple of one where the processor stacks frames (``STACKED_FRAMES``).
    ``codebook_rows``: a decoder over several audio codebooks (MusicGen) takes one row of ids per codebook, (batch
    x codebooks, sequence). ``box_fractions``: word boxes as fractions of the page rather than the layout
    tokenizers' integers in [0, 1000] (the first tried where the model keeps no table of 2-D positions,
    ``max_2d_position_embeddings``). ``streams``: ids of parallel streams per position, (batch, sequence,
    streams), a text stream beside one per audio codebook or the codebooks alone (Kyutai speech-to-text).
    ``image_pairs``: two views of one scene per sample, (batch, 2,
    channels, height, width), what the processors of matchers produce (tried where the config has matching or
    keypoint settings). ``feature_channel``: log-mel frames with a channel axis, (batch, 1, frames, mels), what
    audio-text dual encoders' feature extractors return (CLAP). ``every_modality``: every main input the forward
    takes, where it fails on the ones the harness picks (text alone, where a dual encoder or a visual question
    answerer needs the image or the audio as well). ``frames``: log-mel frames in step with the ids, a whole
    number of frames per text position (streaming recognisers add their audio to the ids position by position).
    ``states``: audio inputs as states of the model's width, what a bare speech encoder-decoder without its
    speech or text pre-nets takes (SpeechT5). ``videos``: a clip beside the other inputs, where the model needs
    one. ``image_sets``: a set of images per sample, (batch, images, channels, height, width), and which text
    positions see which image, (batch, sequence, images) -- what models cross-attending to interleaved images
    take (IDEFICS). ``decoder_streams``: decoder ids of parallel codebooks per position, (batch, sequence,
    codebooks), what the processors of decoders over audio codebooks write (Dia). ``one_sample``: a batch of
    one, for a forward that fails on every larger batch (TVP views its column position embeddings with the batch
    size): the library's limit, which the model's own examples keep to.
    """

    channels_first: bool = False
    time_major: bool = False
    mels: int | None = None
    codebook_rows: bool = False
    box_fractions: bool = False
    image_pairs: bool = False
    feature_channel: bool = False
    streams: int | None = None
    every_modality: bool = False
    frames: int | None = None
    states: bool = False
    videos: bool = False
    image_sets: bool = False
    decoder_streams: int | None = None
    one_sample: bool = False


def config_attribute(config: Any, name: str) -> Any:
    """``config.name``, or None where the config refuses the read (a per-layer attribute read globally)."""
    try:
        return getattr(config, name, None)
    except Exception:
        return None


def select_defaults(model: torch.nn.Module, config: Any) -> None:
    """State a model's API asks its user to set before a forward, set to the config's first choice.

    X-MOD's adapters are picked by a language the user sets (``set_default_language``) from ``config.languages``.
    A model that writes its Q-Former's query outputs over image tokens (BLIP-2) has a default config that names no
    image token: its processor adds ``<image>`` to the tokenizer, after the text's ids, and the checkpoints name
    that id; the last id of the shrunk text vocabulary plays it (the harness draws text ids far below it)."""
    languages = getattr(config, "languages", None)
    if hasattr(model, "set_default_language") and languages:
        model.set_default_language(languages[0])
    vocab = _int(_sub(config, "text_config"), "vocab_size", default=0)
    if _query_tokens(config) and _image_token(config) is None and hasattr(config, "image_token_index") and vocab > 1:
        config.image_token_index = vocab - 1


def _query_tokens(config: Any) -> int | None:
    """How many query outputs a Q-Former model writes over image tokens (BLIP-2's ``num_query_tokens``)."""
    count = getattr(config, "num_query_tokens", None)
    return count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else None


def _image_token(config: Any) -> int | None:
    for name in ("image_token_id", "image_token_index"):
        value = config_attribute(config, name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _layouts(config: Any, wanted: tuple[str, ...]) -> list[Layout]:
    """The layouts worth trying, the conventional ones first, then each with every main input the forward takes;
    then the layouts a few model families need: audio in step with the ids, sets of images per sample, a clip
    beside the other inputs."""
    names = set(_names(wanted))
    modality = _modality_layouts(config, wanted)
    layouts = list(modality)
    if "input_ids" in names and len(MAIN_INPUTS & names) > 1:
        every = [replace(layout, every_modality=True) for layout in modality]
        layouts += every
        if "input_features" in names:
            layouts += [
                replace(layout, frames=SEQUENCE * k)
                for k in FRAMES_PER_TOKEN
                for layout in every
                if not layout.feature_channel
            ]
        layouts += [replace(layout, one_sample=True) for layout in every]
    if {"image_attention_mask", "pixel_values"} <= names:
        layouts.append(Layout(every_modality=True, image_sets=True))
    if "pixel_values_videos" in names:
        layouts += [replace(layout, every_modality=True, videos=True) for layout in modality]
    return layouts


def _modality_layouts(config: Any, wanted: tuple[str, ...]) -> list[Layout]:
    """The layouts of the inputs the config leaves open, the conventional one first."""
    wanted = _names(wanted)
    if "bbox" in wanted:
        table = isinstance(getattr(config, "max_2d_position_embeddings", None), int)
        return [Layout(box_fractions=fractions) for fractions in ((False, True) if table else (True, False))]
    if "input_features" in wanted:
        mels = list(dict.fromkeys(_named_ints(config.to_dict(), _MEL_NAMES))) or [80, 128]
        plain = [Layout(time_major=t, mels=m) for t in (False, True) for m in mels]
        # frames stacked by the processor (pairs, or delta-expanded pairs): a multiple of the mel count wide
        stacked = [Layout(time_major=True, mels=k * m) for k in STACKED_FRAMES for m in mels]
        layouts = plain + stacked + [Layout(time_major=True, mels=m, feature_channel=True) for m in mels]
        if "input_values" in wanted:  # a codec's waveform beside its semantic encoder's frames, in either layout
            frames = _codec_frames(config)
            return [replace(layout, channels_first=c, frames=frames) for layout in layouts for c in (False, True)]
        return layouts
    if "input_values" in wanted:
        return [Layout(), Layout(channels_first=True), Layout(states=True)]
    codebooks = getattr(config, "num_codebooks", None)
    if isinstance(codebooks, int):
        return [Layout(), Layout(codebook_rows=True), Layout(streams=codebooks + 1), Layout(streams=codebooks)]
    if "decoder_input_ids" in wanted and (codebooks := _decoder_codebooks(config)):
        return [Layout(), Layout(decoder_streams=codebooks)]
    if "pixel_values" in wanted and any(_MATCHING.match(str(k)) for k in config.to_dict()):
        return [Layout(), Layout(image_pairs=True)]
    return [Layout()]


def _named_ints(tree: Any, names: tuple[str, ...]) -> list[int]:
    """Every positive int under one of ``names`` in a config dict, sub-configs included (outer ones first)."""
    if not isinstance(tree, dict):
        return []
    found = [v for k, v in tree.items() if k in names and isinstance(v, int) and not isinstance(v, bool) and v > 0]
    for value in tree.values():
        found += _named_ints(value, names)
    return found


def fit_layout(model: torch.nn.Module, config: Any, wanted: tuple[str, ...]) -> Layout:
    """The first layout one eager forward accepts (on ``meta`` nothing runs: the conventional one). Where none is,
    the first, with one WARNING naming each layout's failure: the row's reason is the first one's, which may be a
    shape the layout got wrong where another layout met the model's own failure."""
    layouts = _layouts(config, wanted)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    if len(layouts) == 1 or device.type == "meta":
        return layouts[0]
    failures = []
    for layout in layouts:
        args, kwargs = make_inputs(wanted, config, torch.Generator().manual_seed(0), device, layout=layout)
        try:
            with torch.inference_mode():
                model(*args, **kwargs)
        except Exception as exc:
            failures.append(f"{_described(layout)}: {one_line(exc)}")
            continue
        return layout
    log.warning("%s: no input layout runs its eager forward: %s", type(model).__name__, "; ".join(failures))
    return layouts[0]


def _described(layout: Layout) -> str:
    """The settings of ``layout`` that differ from the conventional one."""
    changed = {f.name: getattr(layout, f.name) for f in fields(layout) if getattr(layout, f.name) != f.default}
    return ", ".join(f"{name}={value}" for name, value in changed.items()) or "conventional"


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


def _least_vocab(tree: Any) -> int | None:
    """The smallest vocabulary of any sub-config (an encoder of bytes or phonemes beside a decoder of codes): ids
    below it are ids of every part."""
    found = _named_ints(tree, ("vocab_size",))
    return min(found) if found else None


def wanted_inputs(model: torch.nn.Module) -> tuple[str, ...]:
    """The inputs this forward takes that the harness knows how to make (required ones marked ``!``)."""
    parameters = inspect.signature(model.forward).parameters
    return tuple(
        name + ("!" if parameters[name].default is inspect.Parameter.empty else "")
        for name in KNOWN_INPUTS
        if name in parameters
    )


def _names(wanted: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(name.rstrip("!") for name in wanted)


def _text_only(config: Any, wanted: tuple[str, ...]) -> bool:
    """A model that places image features at image tokens runs text-only; a dual encoder needs both."""
    if "input_ids" not in wanted:
        return False
    places_images = any(getattr(config, k, None) is not None for k in ("image_token_id", "image_token_index"))
    dual = getattr(config, "vision_config", None) is not None and getattr(config, "text_config", None) is not None
    return places_images or not dual


def make_inputs(
    wanted: tuple[str, ...], config: Any, generator: torch.Generator, device: Any, *, layout: Layout = Layout()
) -> Inputs:
    """Fresh inputs for a transformers forward, moved to ``device``; an input the forward requires is always made."""
    kw: dict[str, Any] = {}
    required = {name.rstrip("!") for name in wanted if name.endswith("!")}
    wanted = _names(wanted)
    vocab = _int(config, "vocab_size", default=0) or _least_vocab(config.to_dict()) or 1024
    every = layout.every_modality
    text_only = _text_only(config, wanted) and not required & {"pixel_values", "input_values", "input_features"}
    text_only = text_only and not every
    if "input_ids" in wanted and (
        text_only or "pixel_values" in wanted or not _audio(wanted) or "input_ids" in required or every
    ):
        kw["input_ids"] = _token_ids(config, generator, vocab, layout)
        if "attention_mask" in wanted:
            kw["attention_mask"] = torch.ones(kw["input_ids"].shape[:2], dtype=torch.long)
        if "bbox" in wanted:
            kw["bbox"] = _boxes(config, generator, kw["input_ids"].shape, layout)
    if "pixel_values" in wanted and (not text_only or "pixel_values" in required):
        if "spatial_shapes" in wanted:  # images cut into a grid of patches, the grid stated beside them
            kw["pixel_values"], kw["spatial_shapes"] = _patched_pixels(config, generator)
            kw["pixel_attention_mask"] = torch.ones(kw["pixel_values"].shape[:2], dtype=torch.long)
        elif "target_sizes" in wanted and "pixel_values" in required:
            # a vision tower of packed images (every image's patches in one row, each image's grid beside); the
            # whole model also wants the processor's token types beside the image tokens, and runs on its text
            kw["pixel_values"], kw["target_sizes"] = _packed_patches(config, generator)
        elif layout.image_sets:
            kw["pixel_values"] = _pixels(config, generator, layout)[:, None]  # a set of one image per sample
            if "input_ids" in kw:  # every text position sees the image
                kw["image_attention_mask"] = torch.ones((*kw["input_ids"].shape[:2], 1), dtype=torch.long)
        else:
            kw["pixel_values"] = _pixels(config, generator, layout)
    if {"input_ids", "pixel_values"} <= set(kw):
        _image_places(config, wanted, kw)
    if "visual_feats" in wanted:
        kw["visual_feats"], kw["visual_pos"] = _regions(config, generator)
    if layout.videos and "pixel_values_videos" in wanted:
        kw["pixel_values_videos"] = _videos(config, generator)
    if "input_features" in wanted and ("input_ids" not in kw or "input_features" in required or every):
        kw["input_features"] = _audio_features(config, generator, layout)
        if "input_features_mask" in wanted:  # every frame is audio: ones over the time axis
            time = -1 if kw["input_features"].dim() == 3 and not layout.time_major else -2
            shape = (BATCH, kw["input_features"].shape[time])
            kw["input_features_mask"] = torch.ones(shape, dtype=torch.long)
    if "input_values" in wanted and (
        not {"input_ids", "input_features"} & set(kw) or "input_values" in required or every
    ):
        kw["input_values"] = _audio_values(config, generator, layout)
    if getattr(config, "is_encoder_decoder", False):
        if "decoder_input_ids" in wanted:
            streams = layout.decoder_streams or 1
            ids = inputs.token_ids(generator, BATCH, DECODER_SEQUENCE * streams, vocab)
            kw["decoder_input_ids"] = ids.view(BATCH, DECODER_SEQUENCE, streams) if layout.decoder_streams else ids
        if "decoder_input_values" in wanted:  # the decoder's input frames: states where the encoder takes states
            width = _int(config, "hidden_size", default=0) if layout.states else 0
            width = width or _int(config, "num_mel_bins", default=80)
            kw["decoder_input_values"] = inputs.features(generator, BATCH, DECODER_SEQUENCE, width)
    if layout.one_sample:
        kw = {k: v[:1] for k, v in kw.items()}
    return (), {k: v.to(device) for k, v in kw.items()}


def _codec_frames(config: Any) -> int | None:
    """Frames of a codec's own rate in the harness's waveform (its samples over the product of the codec's
    downsampling ratios): a codec that encodes the waveform and its log-mel frames side by side (XCodec2) joins the
    two frame by frame, so its processor cuts the frames to the codec's rate."""
    ratios = getattr(config, "downsampling_ratios", None)
    if not isinstance(ratios, (list, tuple)) or not ratios or not all(isinstance(r, int) and r > 0 for r in ratios):
        return None
    return max(1, AUDIO_SAMPLES // math.prod(ratios))


def _decoder_codebooks(config: Any) -> int | None:
    """Codebooks a decoder of audio codes reads in parallel (Dia's ``decoder_config.num_channels``): its ids come
    as its processor writes them, one column per codebook, (batch, sequence, codebooks)."""
    decoder = getattr(config, "decoder_config", None)
    if decoder is None or not isinstance(getattr(decoder, "vocab_size", None), int):
        return None
    for name in ("num_codebooks", "num_channels"):
        value = getattr(decoder, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 1:
            return value
    return None


def _image_places(config: Any, wanted: tuple[str, ...], kw: dict[str, Any]) -> None:
    """The places in the ids where the model writes the image's features, as its processor marks them: a
    Q-Former model (BLIP-2) writes its query outputs over as many image tokens at the start; Kosmos-2 writes its
    latent queries where ``image_embeds_position_mask`` says, the slots its processor puts between ``<s><image>``
    and ``</image>``."""
    ids = kw["input_ids"]
    queries, token = _query_tokens(config), _image_token(config)
    slots = getattr(config, "latent_query_num", None)
    if "bbox" in kw or ids.dim() != 2:  # word boxes are one per id: a layout model places no image in its ids
        return
    if queries and token is not None:
        kw["input_ids"] = torch.cat([torch.full((ids.shape[0], queries), token, dtype=ids.dtype), ids], dim=1)
    elif "image_embeds_position_mask" in wanted and isinstance(slots, int) and slots > 0:
        placeholders = ids[:, 2:3].expand(-1, slots)  # any id: the image's features replace them
        kw["input_ids"] = torch.cat([ids[:, :2], placeholders, ids[:, 2:]], dim=1)
        places = torch.zeros_like(kw["input_ids"])
        places[:, 2 : 2 + slots] = 1
        kw["image_embeds_position_mask"] = places
    else:
        return
    if "attention_mask" in kw:
        kw["attention_mask"] = torch.ones(kw["input_ids"].shape[:2], dtype=torch.long)


def _token_ids(config: Any, generator: torch.Generator, vocab: int, layout: Layout) -> torch.Tensor:
    """(batch, sequence) ids; a decoder over several audio codebooks (MusicGen) takes one row per codebook, a
    model of parallel streams (``Layout.streams``) one column per stream."""
    if layout.streams:
        return inputs.token_ids(generator, BATCH, SEQUENCE * layout.streams, vocab).view(BATCH, SEQUENCE, -1)
    codebooks = getattr(config, "num_codebooks", None)
    rows = BATCH * codebooks if layout.codebook_rows and isinstance(codebooks, int) else BATCH
    return inputs.token_ids(generator, rows, SEQUENCE, vocab)


def _boxes(config: Any, generator: torch.Generator, shape: torch.Size, layout: Layout) -> torch.Tensor:
    """One word box per token, (x0, y0, x1, y1) with x0 <= x1 and y0 <= y1: integers in [0, 1000], the layout
    tokenizers' scale, or fractions of the page (``Layout.box_fractions``)."""
    boxes = inputs.boxes(generator, *shape)
    if layout.box_fractions:
        return boxes
    scale = min(LAYOUT_SCALE, getattr(config, "max_2d_position_embeddings", LAYOUT_SCALE + 1) - 1)
    return (boxes * scale).round().long()


def _image_size(config: Any) -> tuple[int, int]:
    """(height, width) the vision tower -- or its backbone -- is configured for: an int, or a (height, width) pair
    (text recognisers); a model that cuts patches out of the image scaled down by ratios (DepthPro) takes one
    whose smallest scaling is still a patch."""
    ratios, patch = getattr(config, "scaled_images_ratios", None), getattr(config, "patch_size", None)
    if isinstance(ratios, (list, tuple)) and ratios and isinstance(patch, int) and min(ratios) > 0:
        side = math.ceil(patch / min(ratios))
        return side, side
    if windowed := _windowed_side(getattr(config, "backbone_config", None)):
        return windowed, windowed
    vision = getattr(config, "vision_config", None)
    for source in (config, vision, getattr(vision, "backbone_config", None)):
        for name in ("image_size", "img_size", "max_img_size"):
            value = getattr(source, name, None)
            if isinstance(value, int) and not isinstance(value, bool):
                return value, value
            if isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, int) for v in value):
                return value[0], value[1]
    return 224, 224


def _windowed_side(backbone: Any) -> int | None:
    """The side of the image a windowed ViT backbone (RF-DETR's, LW-DETR's) is configured for, cut down to whole
    windows of whole patches: it splits its patch grid into ``num_windows`` windows a side (``num_windows_side``
    where ``num_windows`` counts them all), and a detector's pretraining size (518) need not split."""
    size, patch = getattr(backbone, "image_size", None), getattr(backbone, "patch_size", None)
    windows = getattr(backbone, "num_windows_side", None) or getattr(backbone, "num_windows", None)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (size, patch, windows)):
        return None
    step = patch * windows
    return max(step, size // step * step)


def _pixels(config: Any, generator: torch.Generator, layout: Layout = Layout()) -> torch.Tensor:
    """Images of the configured size; a video model (its config counts frames) gets (batch, frames, C, H, W), a
    matcher two views of one scene (``Layout.image_pairs``)."""
    height, width = _image_size(config)
    channels = _int(config, "num_channels", "in_channels", default=3)
    if layout.image_pairs:
        return inputs.view_pairs(generator, BATCH, channels, height, width)
    frames = _int(config, "num_frames", default=0)
    if frames > 1:
        clip = inputs.video_clip(generator, BATCH, frames, height)[..., :width]
        return clip.transpose(1, 2).contiguous()
    return inputs.normalized_images(generator, BATCH, channels, height, width)


def _patched_pixels(config: Any, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """An image as its grid of patches, what native-resolution vision towers (NaFlex) take: (batch, patches,
    patch x patch x channels), row by row, each patch's pixels channel-last, and the grid (rows, columns) per
    image; a square grid of the configured number of patches."""
    patch = _int(config, "patch_size", default=16)
    channels = _int(config, "num_channels", default=3)
    side = max(1, math.isqrt(_int(config, "num_patches", default=256)))
    images = inputs.normalized_images(generator, BATCH, channels, side * patch, side * patch)
    grid = images.reshape(BATCH, channels, side, patch, side, patch).permute(0, 2, 4, 3, 5, 1)
    return grid.reshape(BATCH, side * side, patch * patch * channels), torch.tensor([[side, side]] * BATCH)


def _packed_patches(config: Any, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Images packed the way NaViT-style processors pack them (MiniCPM-V): every image's patches, in grid order,
    side by side in one row, (1, channels, patch, patches x patch), and each image's grid (rows, columns) beside;
    square grids of ``PACKED_SIDE`` patches a side, whole windows of the two 2 x 2 merges that follow."""
    patch = _int(config, "patch_size", default=14)
    channels = _int(config, "num_channels", default=3)
    side = PACKED_SIDE
    images = inputs.normalized_images(generator, BATCH, channels, side * patch, side * patch)
    grid = images.reshape(BATCH, channels, side, patch, side, patch).permute(1, 3, 0, 2, 4, 5)
    packed = grid.reshape(1, channels, patch, BATCH * side * side * patch)
    return packed, torch.tensor([[side, side]] * BATCH, dtype=torch.int32)


def _regions(config: Any, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """What region-feature models (LXMERT) take from a bottom-up object detector: ``REGIONS`` pooled features per
    image, non-negative as the pooled activations after a ReLU are, and each region's box, (x0, y0, x1, y1) as
    fractions of the image."""
    width = _int(config, "visual_feat_dim", default=2048)
    features = inputs.features(generator, BATCH, REGIONS, width).relu()
    boxes = inputs.boxes(generator, BATCH, REGIONS)
    position = _int(config, "visual_pos_dim", default=4)
    if position != boxes.shape[-1]:  # a box encoding of another width: the corners, then their extents
        extents = boxes[..., 2:] - boxes[..., :2]
        boxes = torch.cat([boxes, extents, extents.prod(-1, keepdim=True)], dim=-1)[..., :position]
    return features, boxes


def _videos(config: Any, generator: torch.Generator) -> torch.Tensor:
    """A clip, (batch, frames, channels, height, width), of the video tower's image size and frame count
    (``VIDEO_FRAMES`` where its config counts none)."""
    video = getattr(config, "video_config", None) or config
    height, width = _tower_size(video)
    frames = _int(video, "num_frames", default=VIDEO_FRAMES)
    clip = inputs.video_clip(generator, BATCH, frames, max(height, width))[..., :height, :width]
    return clip.transpose(1, 2).contiguous()


def _tower_size(config: Any) -> tuple[int, int]:
    """The image size of a vision tower: its config's, or, for a timm model named by its architecture (a
    ``timm_wrapper`` config states no size), the input size of the architecture's pretrained configuration."""
    tower = getattr(config, "vision_config", None) or config
    architecture = getattr(tower, "architecture", None)
    if isinstance(architecture, str) and getattr(tower, "image_size", None) is None:
        try:
            import timm

            size = timm.models.get_pretrained_cfg(architecture).input_size
            return int(size[-2]), int(size[-1])
        except Exception:  # no pretrained configuration for that name: the configured size below
            pass
    return _image_size(config)


def _audio(wanted: tuple[str, ...]) -> bool:
    return "input_features" in wanted or "input_values" in wanted


def _audio_features(config: Any, generator: torch.Generator, layout: Layout = Layout()) -> torch.Tensor:
    """Log-mel frames: Whisper-like encoders want exactly two frames per source position."""
    mels = layout.mels or _int(config, "num_mel_bins", "feature_size", default=80)
    source = getattr(config, "max_source_positions", None)
    if layout.frames:
        frames = layout.frames
    elif (source and getattr(config, "model_type", "") in ("whisper",)) or (hasattr(config, "num_mel_bins") and source):
        frames = 2 * source
    else:
        frames = AUDIO_FRAMES
    per_channel = getattr(config, "input_feat_per_channel", None)
    if per_channel and not layout.mels:
        return inputs.features(generator, BATCH, AUDIO_FRAMES, per_channel * getattr(config, "input_channels", 1))
    if layout.feature_channel:
        return inputs.features(generator, BATCH, 1, frames, mels)
    if layout.time_major:
        return inputs.features(generator, BATCH, frames, mels)
    return inputs.features(generator, BATCH, mels, frames)


def _audio_values(config: Any, generator: torch.Generator, layout: Layout = Layout()) -> torch.Tensor:
    """A waveform -- (batch, channels, samples) for a codec -- or a spectrogram of the configured length for
    spectrogram transformers (AST), or states of the model's width (``Layout.states``)."""
    if layout.states:
        return inputs.features(generator, BATCH, SEQUENCE, _int(config, "hidden_size", "d_model", default=HIDDEN))
    if hasattr(config, "max_length") and hasattr(config, "num_mel_bins"):
        return inputs.features(generator, BATCH, config.max_length, config.num_mel_bins)
    wave = inputs.waveform(generator, BATCH, AUDIO_SAMPLES)
    if layout.channels_first:
        channels = _int(config, "audio_channels", "channels", default=1)
        return wave[:, None].expand(BATCH, channels, AUDIO_SAMPLES).contiguous()
    return wave
