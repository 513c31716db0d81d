"""A generic shrinker for transformers configs: any architecture made small without a config written for it.

The differential population is every architecture the library lists, so sizes cannot be hand-picked per model.
The shrinker walks a config's ``to_dict()`` (sub-configs such as ``text_config`` / ``vision_config`` included) and
rewrites attributes by what their names mean: widths, heads, key/value heads, head sizes, feed-forward sizes,
experts, vocabularies, sliding windows, rope settings and per-layer lists, keeping them consistent with each
other (heads divide the width; a per-layer list keeps one layer of every kind; token ids stay in the vocabulary).
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass, field
from typing import Any

HIDDEN = 128  # width of every shrunk transformer (the brief allows at most 256)
HEADS = 4
HEAD_DIM = HIDDEN // HEADS
# Document-layout encoders concatenate six 2-D position embeddings (x0, y0, x1, y1, height, width) into the width,
# each a sixth of it: their width must divide by six (and by the heads), which 128 does not.
LAYOUT_HIDDEN = 192
LAYOUT_PARTS = 6
FEED_FORWARD = 256
EXPERT_FEED_FORWARD = 64
VOCAB = 1024
EXPERTS = 4
EXPERTS_PER_TOKEN = 2
SLIDING_WINDOW = 64
ROPE_AXES = ("time", "height", "width")  # the axes multimodal rope sections split a head's frequencies among
TILE_PATCHES = 8  # patches a side of a tile cut out of a larger image (DepthPro)
STATE = 16  # state sizes / ranks of state-space and low-rank layers
FRAMES = 8  # frames of a clip: a multiple of every tubelet (two frames), few enough for a per-frame backbone

_WIDTH = re.compile(
    r"^(hidden_size|d_model|n_embd|n_embed|embed_dim|model_dim|dim|d_embed|word_embed_proj_dim|hidden_dim|"
    r"out_hidden_size|text_hidden_size|vision_hidden_size|projector_hidden_size|projection_dim|proj_dim|"
    r"encoder_hidden_size|decoder_hidden_size|embedding_dim|n_embd_text|attention_hidden_size|projection_size)$"
)
_HEADS = re.compile(
    r"^(num_attention_heads|n_head|n_heads|num_heads|encoder_attention_heads|decoder_attention_heads|"
    r"attention_heads|num_attention_heads_text|decoder_num_attention_heads)$"
)
_KV_HEADS = re.compile(
    r"^(num_key_value_heads|n_kv_heads|num_kv_heads|multi_query_group_num|kv_heads|n_head_kv|"
    r"num_key_value_attention_heads)$"
)
_INDEX_HEADS = re.compile(r"^(index_num_heads|index_n_heads)$")  # a sparse attention's indexer (DeepSeek V3.2's)
_HEAD_DIM = re.compile(r"^(head_dim|attention_head_dim|d_kv|d_head|kv_channels|head_size|attention_head_size)$")
_ROTARY_DIM = re.compile(r"^(rotary_dim|rotary_emb_base_dim|rope_dim)$")
_LAYERS = re.compile(
    r"^(num_hidden_layers|n_layer|n_layers|num_layers|encoder_layers|decoder_layers|num_encoder_layers|"
    r"num_decoder_layers|num_text_layers|num_vision_layers|decoder_num_hidden_layers|num_blocks)$"
)
_FEED_FORWARD = re.compile(
    r"^(intermediate_size|ffn_dim|encoder_ffn_dim|decoder_ffn_dim|n_inner|d_ff|ffn_hidden_size|mlp_dim|"
    r"intermediate_dim|dim_feedforward|decoder_intermediate_size|encoder_intermediate_size|ff_dim)$"
)
_EXPERT_FEED_FORWARD = re.compile(
    r"^(moe_intermediate_size|shared_expert_intermediate_size|expert_intermediate_size|moe_ffn_hidden_size|"
    r"moe_shared_expert_intermediate_size|expert_dim)$"
)
_EXPERTS = re.compile(
    r"^(num_experts|num_local_experts|n_routed_experts|moe_num_experts|num_routed_experts|n_experts|num_moe_experts)$"
)
_EXPERTS_PER_TOKEN = re.compile(r"^(num_experts_per_tok|moe_topk|top_k|num_experts_per_token|moe_k|experts_per_token)$")
_ONE = re.compile(
    r"^(n_group|num_expert_group|topk_group|n_shared_experts|num_shared_experts|first_k_dense_replace|moe_layer_start)$"
)
_VOCAB = re.compile(r"^(vocab_size|n_vocab|text_vocab_size)$")
_TOKEN_ID = re.compile(r".*(_token_id|_token_index|_token_ids|_id)$")
_STATE = re.compile(r"^(mamba_dt_rank|time_step_rank|mamba_d_state|state_size|d_state|kv_lora_rank|q_lora_rank)$")
_ROPE_DIMS = re.compile(r"^(qk_rope_head_dim|qk_nope_head_dim|v_head_dim)$")
_PERIOD = re.compile(r".*_period$")
_WINDOW = re.compile(r"^(sliding_window|window_size_local|local_window_size)$")
# sizes that may be a width another config ties to, and names that are never a width
_TIED = re.compile(r".*(hidden|_dim|_size|channels|projection|groups).*")
_NOT_TIED = re.compile(
    r".*(position|vocab|image|patch|window|kernel|max_|chunk|batch|length|(?<!up)sampl|rate|codebook_size|num_|"
    r"layers).*"
)
# indices of a hybrid decoder's attention layers, and the names its per-layer kinds give a recurrent layer
_ATTENTION_INDICES = re.compile(r"^(attn|attention)_layer_(indices|ids)$")
_RECURRENT = {"linear_attention", "mamba"}
_PART = re.compile(r"^(n|num)_\w+_layers$")  # layers of one part of the stack
_SIZES = re.compile(r".*(channels|size|_dim|hidden|width).*")  # a list of sizes per layer is not layer indices
_OUTPUT = re.compile(r".*(out_|output|projection).*")  # widths a staged encoder hands to another model
_FEATS = re.compile(r".*_feats$")
# where a range of ids starts in the vocabulary (a codebook's codes placed after the text ids)
_RANGE_OFFSET = re.compile(r".*_token_offset$")
_CODEBOOK = re.compile(r"^codebook_size$")
_STAGES = ("depths", "hidden_sizes", "stage_depths", "block_depths", "embed_dims")


@dataclass
class _TokenIds:
    """What the walk of one config shares: token ids past the shrunk vocabulary, each moved to its own id at the
    top of it (equal ids stay equal), how many layers of every kind the layer cut keeps, and whether rope settings
    without multimodal sections get sections of the shrunk head."""

    moved: dict[int, int] = field(default_factory=dict)
    per_kind: int = 1
    rope_sections: bool = False

    def remap(self, value: int) -> int:
        if value < VOCAB:
            return value
        if value not in self.moved:
            self.moved[value] = VOCAB - 1 - len(self.moved)
        return self.moved[value]


def layer_selection(types: list[Any], count: int) -> list[int]:
    """Indices of ``count`` layers that keep the first layer of every kind in ``types`` (in order)."""
    chosen: list[int] = []
    for i, kind in enumerate(types):
        if len(chosen) < count and kind not in [types[j] for j in chosen]:
            chosen.append(i)
    for i in range(len(types)):
        if len(chosen) >= count:
            break
        if i not in chosen:
            chosen.append(i)
    return sorted(chosen)


def _chosen_layers(lists: list[list[Any]], count: int, per_kind: int = 1) -> list[int]:
    """``count`` layers covering every kind of every per-layer list, topped up with the first others."""
    named = [v for v in lists if all(isinstance(x, str) for x in v)]  # kinds, not indices of other layers
    chosen = layer_cover(named, per_kind)[:count]
    chosen += [i for i in range(len(lists[0]) if lists else count) if i not in chosen][: count - len(chosen)]
    return sorted(chosen)


def _layer_count(config: dict[str, Any], per_kind: int = 1) -> tuple[int | None, int]:
    """(original layer count, shrunk count): enough layers to keep ``per_kind`` of every kind a per-layer list
    names."""
    old = next((v for k, v in config.items() if _LAYERS.match(str(k)) and isinstance(v, int) and v > 0), None)
    if old is None:
        return None, 0
    named = [v for v in _per_layer_lists(config, old) if all(isinstance(x, str) for x in v)]
    kinds = len(layer_cover(named, per_kind))
    pattern = max((len(v) for v in _layer_patterns(config, old)), default=0)
    return old, min(old, max(2, min(max(kinds, pattern), 4 * per_kind)))


def layer_cover(lists: list[list[Any]], per_kind: int = 1) -> list[int]:
    """The first layers that between them show every kind of every per-layer list ``per_kind`` times (attention
    kind and MLP kind are separate lists in hybrid MoE decoders: a cut keeping the kinds of one list only can drop
    all attention)."""
    chosen: list[int] = []
    seen: list[dict[str, int]] = [{} for _ in lists]
    for i in range(min((len(v) for v in lists), default=0)):
        if any(kinds.get(str(v[i]), 0) < per_kind for v, kinds in zip(lists, seen, strict=True)):
            chosen.append(i)
            for v, kinds in zip(lists, seen, strict=True):
                kinds[str(v[i])] = kinds.get(str(v[i]), 0) + 1
    return chosen


def _layer_patterns(config: dict[str, Any], layers: int | None) -> list[list[Any]]:
    """Block-kind patterns shorter than the stack, repeated over it (RecurrentGemma's recurrent, recurrent,
    attention): the cut keeps one full period so that every kind is built."""
    return [
        v
        for k, v in config.items()
        if isinstance(v, list)
        and layers
        and 1 < len(v) < layers
        and "type" in str(k)
        and all(isinstance(x, str) for x in v)
        and len(set(v)) > 1
    ]


def _per_layer_lists(config: dict[str, Any], layers: int | None) -> list[list[Any]]:
    """Lists with one entry per layer that repeat kinds (an index list, all values distinct, names no kinds)."""
    return [
        v
        for v in config.values()
        if isinstance(v, list) and layers and len(v) == layers and len(set(map(str, v))) < len(v)
    ]


def _heads(key: str, value: int, old_heads: int) -> int | None:
    """Heads divide the width, key/value heads divide the heads (one stays one: multi-query attention); a sparse
    attention's indexer heads stay within the query heads of one key head."""
    if _HEADS.match(key):
        return HEADS
    if _INDEX_HEADS.match(key):
        return min(value, HEADS // 2)
    if _KV_HEADS.match(key):
        return 1 if value == 1 else (HEADS if value >= old_heads else 2)
    if _HEAD_DIM.match(key) or _ROTARY_DIM.match(key):
        return min(value, HEAD_DIM)
    return None


def _state_space(config: dict[str, Any], out: dict[str, Any]) -> None:
    """State-space heads tile the inner width: heads x head size == expand x width."""
    expand = next((config[k] for k in ("mamba_expand", "expand") if isinstance(config.get(k), int)), None)
    heads_key = next((k for k in ("mamba_n_heads", "n_mamba_heads", "mamba_num_heads") if k in config), None)
    head_key = next((k for k in ("mamba_d_head", "mamba_head_dim", "mamba_headdim") if k in config), None)
    if expand is None:
        return
    if heads_key is None and "num_heads" in config and "head_dim" in config and "expand" in config:
        heads_key, head_key = "num_heads", "head_dim"
    width = out.get("hidden_size", HIDDEN)
    if heads_key and head_key and isinstance(width, int):
        out[heads_key] = HEADS
        out[head_key] = expand * width // HEADS
    if isinstance(config.get("mamba_d_ssm"), int) and isinstance(width, int):
        out["mamba_d_ssm"] = expand * width
    for key in ("mamba_n_groups", "n_groups", "mamba_ngroups"):
        if isinstance(config.get(key), int):
            out[key] = 1


def _image_tiles(config: dict[str, Any], out: dict[str, Any]) -> None:
    """A model that cuts its input, scaled down by ratios, into tiles as large as its sub-models' whole image
    (DepthPro: ``patch_size`` 384, each tile a 384-pixel ViT image) takes inputs four times a tile: the tile
    shrinks to ``TILE_PATCHES`` of the sub-models' own patches, and every sub-config whose image is a tile
    follows (full-size tiles make a 1536-pixel input and 8 GB of activations on the CPU)."""
    ratios, tile = config.get("scaled_images_ratios"), config.get("patch_size")
    if not isinstance(ratios, list) or not isinstance(tile, int):
        return
    subs = [k for k, v in out.items() if isinstance(v, dict) and v.get("image_size") == tile]
    patches = [out[k].get("patch_size") for k in subs]
    if not subs or not all(isinstance(p, int) and p > 0 for p in patches):
        return
    out["patch_size"] = TILE_PATCHES * max(patches)
    for key in subs:
        out[key]["image_size"] = out["patch_size"]


def _bottlenecks(config: dict[str, Any], out: dict[str, Any]) -> None:
    """A feed-forward narrower than its config's width, a whole fraction of it (an adaptor's bottleneck a quarter
    of the width), keeps that fraction of the shrunk width: cut to ``FEED_FORWARD`` alone it would be wider than
    the shrunk width, and configs that check the fraction (Fun-ASR's adaptor) refuse it."""
    old_width, new_width = _width_of(config), _width_of(out)
    if not old_width or not new_width or new_width == old_width:
        return
    for key, value in config.items():
        if _FEED_FORWARD.match(str(key)) and _count(value) and value < old_width and old_width % value == 0:
            out[key] = max(1, new_width // (old_width // value))


def _compound_scaling(config: dict[str, Any], out: dict[str, Any]) -> None:
    """A compound-scaled convnet (EfficientNet) computes every layer's width as a base width of its code or its
    stage lists times ``width_coefficient``, and states only the resulting widths: the coefficient is set so the
    last stage is ``HIDDEN`` wide (the width a joint embedding is projected to), the stated widths scale with it,
    and the depth multiplier goes to one."""
    coefficient, stages = config.get("width_coefficient"), config.get("out_channels")
    if not isinstance(coefficient, (int, float)) or not isinstance(stages, list) or not stages:
        return
    if not all(isinstance(x, int) and x > 0 for x in stages):
        return
    factor = HIDDEN / (stages[-1] * coefficient)
    out["width_coefficient"] = coefficient * factor
    for key, value in config.items():
        if _WIDTH.match(str(key)) and isinstance(value, int) and not isinstance(value, bool):
            out[key] = round(value * factor)
    if isinstance(config.get("depth_coefficient"), (int, float)):
        out["depth_coefficient"] = min(config["depth_coefficient"], 1.0)


def _layer_parts(config: dict[str, Any], out: dict[str, Any], old: int | None, new: int) -> None:
    """Counts of the parts of the stack (input, recurrent and output layers) that add up to the layer count keep
    adding up to the shrunk count: one share each, the rest to the largest part. A share is the original parts'
    common step where the shrunk count allows it (counts written out doubled, one per sub-layer, stay even)."""
    parts = {k: v for k, v in config.items() if _PART.match(str(k)) and not _LAYERS.match(str(k)) and _count(v)}
    if not old or not new or len(parts) < 2 or sum(parts.values()) != old:
        return
    common = math.gcd(math.gcd(*parts.values()), new)
    step = max((d for d in range(1, common + 1) if common % d == 0 and new // d >= len(parts)), default=None)
    if step is None:
        return
    largest = max(parts, key=parts.__getitem__)
    for key in parts:
        out[key] = step
    out[largest] += new - step * len(parts)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _keep_attention(config: dict[str, Any], out: dict[str, Any], layers: int) -> None:
    """A hybrid decoder whose default config has no attention layer (every layer recurrent, or its attention
    layers' indices unset) keeps its last layer as attention: the library's hybrid cache counts the sequence on
    an attention layer and fails without one, and the differential run covers both kinds."""
    if not layers or not any(_HEADS.match(str(k)) and isinstance(v, int) and v > 0 for k, v in config.items()):
        return
    for key, value in config.items():
        if _ATTENTION_INDICES.match(str(key)) and value is None:
            out[key] = [layers - 1]
        kinds = out.get(key)
        if "type" in str(key) and isinstance(kinds, list) and len(kinds) == layers and set(kinds) <= _RECURRENT:
            out[key] = [*kinds[:-1], "attention" if "mamba" in kinds else "full_attention"]


def _rotary_width(config: dict[str, Any]) -> int | None:
    """The width rope turns: the rope part of a latent-attention head, else the head size."""
    for key in ("qk_rope_head_dim", "head_dim"):
        if isinstance(config.get(key), int):
            return config[key]
    width = next((v for k, v in config.items() if _WIDTH.match(str(k)) and isinstance(v, int)), None)
    heads = next((v for k, v in config.items() if _HEADS.match(str(k)) and isinstance(v, int)), None)
    return width // heads if width and heads else None


def _rope(value: dict[str, Any], old: int | None, new: int | None) -> dict[str, Any]:
    """Per-frequency rope lists and multimodal rope sections rescaled from the old rotary width to the new."""
    value = dict(value)
    for key in ("short_factor", "long_factor"):
        if isinstance(value.get(key), list) and value[key] and new:
            factors, half = value[key], new // 2
            value[key] = [factors[i * len(factors) // half] for i in range(half)]
    if isinstance(value.get("mrope_section"), list):
        value["mrope_section"] = _sections(value["mrope_section"], old, new)
    return value


def _sections(section: list[int], old: int | None, new: int | None) -> list[int]:
    """Sections of the rotary frequencies (time, height, width) keeping their shares of the new width."""
    if not section or not old or not new or old == new:
        return section
    total = max(len(section), sum(section) * new // old)
    scaled = [max(1, s * total // sum(section)) for s in section]
    scaled[0] += total - sum(scaled)
    return scaled


def _select_layers(value: list[Any], old_layers: int | None, chosen: list[int]) -> list[Any] | None:
    """A per-layer list cut to the chosen layers; None: not a layer list. Where each layer names a layer (its
    own index, or an earlier layer's whose keys and values it reads), the names are renumbered: a layer whose
    named layer was cut names itself."""
    if old_layers is None or not chosen:
        return None
    if len(value) != old_layers:
        return None
    picked = [value[i] for i in chosen]
    if _names_layers(value):
        return [chosen.index(v) if v in chosen else j for j, v in enumerate(picked)]
    return picked


def _names_layers(value: list[Any]) -> bool:
    """A per-layer list of layer indices: mostly each layer's own (``kv_source_layers``), not kinds or sizes."""
    ints = all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    own = sum(v == i for i, v in enumerate(value))
    return ints and all(0 <= v < len(value) for v in value) and 2 * own >= len(value)


def shrink_config(
    config: dict[str, Any], ids: _TokenIds | None = None, *, per_kind: int = 1, rope_sections: bool = False
) -> dict[str, Any]:
    """``config`` (a config's ``to_dict()``) with every size small and every dependent size consistent.

    ``per_kind``: layers kept of every kind a per-layer list names -- two where the layers of a kind share weights
    with the first of them (a shared attention block tied across hybrid layers needs a second layer to tie).
    ``rope_sections``: rope settings that name no multimodal sections get (time, height, width) sections of the
    shrunk head -- for a model whose code falls back to sections of the full-size head (Ernie 4.5 VL)."""
    if ids is None:
        ids = _TokenIds(per_kind=per_kind, rope_sections=rope_sections)
        shrunk = _shrink(config, ids)
        _tie_widths(config, shrunk, _width_map(config, shrunk))
        _vocabulary_ranges(config, shrunk, ids)
        return shrunk
    return _shrink(config, ids)


def _vocabulary_ranges(old: dict[str, Any], new: dict[str, Any], ids: _TokenIds) -> None:
    """Ranges of the vocabulary that codebooks fill (``image_token_offset``: where the visual codes start, right
    after the text ids) keep their places in the shrunk vocabulary: each offset keeps its share of it, a codebook
    that filled its range up to the next offset fills it again, and one that ends short of the vocabulary's end
    keeps its share, below the special ids moved to the top. Shrunk alone, the offsets would point past the
    vocabulary and the codebooks would not fit in it."""
    offsets = sorted((v, k) for k, v in old.items() if _RANGE_OFFSET.match(str(k)) and _count(v) and v >= VOCAB)
    indexed = [(v, s) for v, s in _paired_ints(old, new, _VOCAB) if offsets and v > offsets[-1][0]]
    if not indexed:
        return
    vocab, shrunk_vocab = max(indexed)
    starts = [value * shrunk_vocab // vocab for value, _ in offsets]
    ends = [*starts[1:], shrunk_vocab - len(ids.moved)]
    lengths = [b - a for a, b in itertools.pairwise([*(value for value, _ in offsets), vocab])]
    codebooks = _codebooks(old, new)
    for (_, key), start, end, length in zip(offsets, starts, ends, lengths, strict=True):
        new[key] = start
        fitting = [i for i, c in enumerate(codebooks) if c[0] == length]
        fitting = fitting or [i for i, c in enumerate(codebooks) if c[0] < length]
        if not fitting:
            continue
        size, parent, name = codebooks.pop(max(fitting, key=lambda i: codebooks[i][0]))
        share = end - start if size == length else size * shrunk_vocab // vocab
        parent[name] = max(1, min(share, end - start))


def _paired_ints(old: Any, new: Any, names: re.Pattern[str]) -> list[tuple[int, int]]:
    """(original, shrunk) of every positive int of the tree whose name matches."""
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return []
    found = [(v, new[k]) for k, v in old.items() if names.match(str(k)) and _count(v) and _count(new.get(k))]
    for key, value in old.items():
        found += _paired_ints(value, new.get(key), names)
    return found


def _codebooks(old: Any, new: Any) -> list[tuple[int, dict[str, Any], str]]:
    """(original size, shrunk sub-config, key) of every codebook size of the tree."""
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return []
    found = [(v, new, k) for k, v in old.items() if _CODEBOOK.match(str(k)) and _count(v)]
    for key, value in old.items():
        found += _codebooks(value, new.get(key))
    return found


def _width_map(old: Any, new: Any, found: dict[int, int | None] | None = None) -> dict[int, int | None]:
    """Every width of the tree that was shrunk, original -> shrunk (None where one original width went two ways).
    A width left as it was (a staged encoder keeps its widths) does not vote: an output width it shares with the
    text decoder follows the decoder."""
    found = {} if found is None else found
    if isinstance(old, dict) and isinstance(new, dict):
        for key, value in old.items():
            shrunk = new.get(key)
            if _WIDTH.match(str(key)) and isinstance(value, int) and isinstance(shrunk, int) and shrunk != value:
                found[value] = new[key] if found.get(value, new[key]) == new[key] else None
            _width_map(value, new.get(key), found)
    return found


def _tie_widths(old: Any, new: Any, widths: dict[int, int | None]) -> None:
    """Sizes tied to a width, left as they were, follow it: one equal to a width of the tree (a head's
    ``audio_hidden_size``, a flow head's ``condition_dim``, a quantizer's ``codebook_dim``, a depthwise
    upsampler's ``upsample_groups``); positional features half a width (sine and cosine halves); one equal to its
    own config's head size (a box projection added to the heads); a sixth of a layout encoder's width (its 2-D
    position embeddings). A staged encoder keeps its own widths (its hidden size is its last stage's): only its
    output widths follow (an audio tower's ``out_hidden_size`` scattered onto the text embeddings)."""
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return
    staged = _staged(old)
    shares = _shares(old, new)
    # a size equal to an entry of a list the shrinker keeps (a decoder's input channels) stays with that list
    listed = {x for v in new.values() if isinstance(v, list) for x in v if isinstance(x, int)}
    for key, value in old.items():
        if isinstance(value, dict):
            _tie_widths(value, new.get(key), widths)
            continue
        if not isinstance(value, int) or isinstance(value, bool) or new.get(key) != value or value in listed:
            continue
        if staged and not _OUTPUT.match(str(key)):
            continue
        if _FEATS.match(str(key)) and widths.get(2 * value) not in (None, 2 * value):
            new[key] = widths[2 * value] // 2
        elif not _TIED.match(str(key)) or _NOT_TIED.match(str(key)):
            continue
        elif widths.get(value) not in (None, value):
            new[key] = widths[value]
        elif value % 2 == 0 and widths.get(value // 2) not in (None, value // 2):
            new[key] = 2 * widths[value // 2]  # two streams of one width side by side (a codec's two encoders)
        elif value in shares:
            new[key] = shares[value]


def _shares(old: dict[str, Any], new: dict[str, Any]) -> dict[int, int]:
    """Original -> shrunk sizes of one config's parts of its width: the head size; a layout encoder's sixths."""
    old_width, new_width = _width_of(old), _width_of(new)
    old_heads, new_heads = _heads_of(old), _heads_of(new)
    shares: dict[int, int] = {}
    if old_width and new_width and old_heads and old_heads > 1 and new_heads and old_width % old_heads == 0:
        shares[old_width // old_heads] = new_width // new_heads
    if old_width and new_width and "max_2d_position_embeddings" in old and old_width % LAYOUT_PARTS == 0:
        shares[old_width // LAYOUT_PARTS] = new_width // LAYOUT_PARTS
    return {k: v for k, v in shares.items() if k != v}


def _width_of(config: dict[str, Any]) -> int | None:
    return next((v for k, v in config.items() if _WIDTH.match(str(k)) and isinstance(v, int) and v > 0), None)


def _heads_of(config: dict[str, Any]) -> int | None:
    return next((v for k, v in config.items() if _HEADS.match(str(k)) and isinstance(v, int) and v > 0), None)


def _shrink(config: dict[str, Any], ids: _TokenIds) -> dict[str, Any]:
    out = dict(config)
    staged = _staged(config)  # hierarchical widths: keep their stage plan
    # a backbone whose outputs name stages, or hierarchical stages: its depth plan stays as configured
    keeps_depth = staged or bool(config.get("out_features") or config.get("out_indices"))
    old_layers, layers = (None, 0) if keeps_depth else _layer_count(config, ids.per_kind)
    chosen = _chosen_layers(_per_layer_lists(config, old_layers), layers, ids.per_kind)
    old_heads = next((v for k, v in config.items() if _HEADS.match(str(k)) and isinstance(v, int)), HEADS)
    for key, value in config.items():
        if not isinstance(key, str) or key in ("id2label", "label2id"):
            continue
        if isinstance(value, dict):
            if "rope" in key:
                continue
            if _layer_keyed(value, old_layers):  # settings keyed by layer index
                out[key] = {
                    _layer_key(k, chosen.index(int(k))): _shrink_override(config, v, ids) if isinstance(v, dict) else v
                    for k, v in value.items()
                    if int(k) in chosen
                }
            else:
                out[key] = shrink_config(value, ids)
            continue
        if isinstance(value, list):
            if key == "mrope_section":
                continue  # rescaled once the head sizes are known
            if key.endswith("_config") and all(isinstance(v, dict) for v in value):
                out[key] = [shrink_config(v, ids) for v in value]
            elif _TOKEN_ID.match(key) and all(isinstance(v, int) for v in value):
                out[key] = [ids.remap(v) for v in value]
            elif (selected := _select_layers(value, old_layers, chosen)) is not None:
                out[key] = selected
            elif "layer" in key and not staged and not _SIZES.match(key) and _index_list(value):
                out[key] = [chosen.index(v) for v in value if v in chosen] or [0]
            per_layer = key.removesuffix("_per_layer")
            if per_layer != key and not staged and all(isinstance(v, int) for v in out[key]):
                # heads or key/value heads per layer shrink like the config's own
                out[key] = [_heads(per_layer, v, old_heads) or v for v in out[key]]
            continue
        if not isinstance(value, int) or isinstance(value, bool):
            continue
        heads = None if staged else _heads(key, value, old_heads)
        width = LAYOUT_HIDDEN if "max_2d_position_embeddings" in config else HIDDEN
        out[key] = (
            heads if heads is not None else _shrink_int(key, value, staged=staged, layers=layers, ids=ids, width=width)
        )
    _state_space(config, out)
    _keep_attention(config, out, layers)
    _layer_parts(config, out, old_layers, layers)
    _compound_scaling(config, out)
    _image_tiles(config, out)
    if not staged:
        _bottlenecks(config, out)
    if "num_experts_per_tok" in out and out["num_experts_per_tok"] is None and _routes(config):
        out["num_experts_per_tok"] = EXPERTS_PER_TOKEN  # a default config routing to None experts per token
    if "qk_rope_head_dim" in out and "head_dim" in out:
        # multi-head latent attention: rope runs on the rope part; a head that was the rope and the other part
        # together stays their sum
        whole = isinstance(config.get("qk_nope_head_dim"), int) and isinstance(config["qk_rope_head_dim"], int)
        if whole and config["head_dim"] == config["qk_nope_head_dim"] + config["qk_rope_head_dim"]:
            out["head_dim"] = out["qk_nope_head_dim"] + out["qk_rope_head_dim"]
        else:
            out["head_dim"] = out["qk_rope_head_dim"]
    if isinstance(config.get("mrope_section"), list):
        out["mrope_section"] = _sections(config["mrope_section"], _rotary_width(config), _rotary_width(out))
    for key, value in config.items():  # rope settings read the final head sizes
        if isinstance(value, dict) and "rope" in str(key):
            out[key] = _rope(value, _rotary_width(config), _rotary_width(out))
            half = (_rotary_width(out) or 0) // 2
            if ids.rope_sections and "mrope_section" not in value and half >= len(ROPE_AXES):
                share = half // len(ROPE_AXES)  # equal shares, the rest on the last (two spatial ones stay equal)
                out[key]["mrope_section"] = [share] * (len(ROPE_AXES) - 1) + [half - share * (len(ROPE_AXES) - 1)]
    if "qk_head_dim" in config and "qk_rope_head_dim" in out and "qk_nope_head_dim" in out:
        out["qk_head_dim"] = out["qk_rope_head_dim"] + out["qk_nope_head_dim"]
    return out


def _layer_keyed(value: dict[Any, Any], layers: int | None) -> bool:
    """Settings keyed by layer index: every key a layer of the stack (not a patch count keying a projector's
    query count)."""
    return bool(value and layers and all(str(k).isdigit() and int(k) < layers for k in value))


def _shrink_override(config: dict[str, Any], override: dict[str, Any], ids: _TokenIds) -> dict[str, Any]:
    """A layer's settings that override its config's, shrunk together with what they override: sizes related
    across the two (a head size the config sets that is the sum of an overridden part and one the config sets)
    stay related. Keeps the overridden keys and those whose shrunk value differs from the config's."""
    base = {k: v for k, v in config.items() if not isinstance(v, (dict, list))}
    shrunk_base, merged = _shrink(base, ids), _shrink({**base, **override}, ids)
    return {k: v for k, v in merged.items() if k in override or v != shrunk_base.get(k)}


def _staged(config: dict[str, Any]) -> bool:
    """Widths follow stages: a list of per-stage depths or widths (``depths``, ``stage_in_channels``, ...)."""
    return any(
        isinstance(v, list)
        and (k in _STAGES or str(k).startswith("stage_"))
        and not all(isinstance(x, str) for x in v)  # stage names are not a stage plan
        for k, v in config.items()
    )


def _index_list(value: list[Any]) -> bool:
    """A list of distinct layer indices (full-attention layers), not a per-stage setting (layers per stage)."""
    ints = all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    return bool(value) and ints and len(set(value)) == len(value)


def _layer_key(old: Any, index: int) -> Any:
    """A layer-index key renumbered in the original's type and width ("02" stays two digits)."""
    return str(index).zfill(len(old)) if isinstance(old, str) else type(old)(index)


def _routes(config: dict[str, Any]) -> bool:
    """The config routes tokens among several experts."""
    return any(_EXPERTS.match(str(k)) and isinstance(v, int) and v > 1 for k, v in config.items())


def _shrink_int(key: str, value: int, *, staged: bool, layers: int, ids: _TokenIds, width: int = HIDDEN) -> int:
    """The shrunk value of one integer attribute, by what its name says it is."""
    rules: list[tuple[bool, int]] = [
        (_LAYERS.match(key) is not None, min(value, layers) if layers else value),
        (not staged and _WIDTH.match(key) is not None, min(value, width)),
        (_FEED_FORWARD.match(key) is not None, min(value, FEED_FORWARD)),
        (_EXPERT_FEED_FORWARD.match(key) is not None, min(value, EXPERT_FEED_FORWARD)),
        (_EXPERTS.match(key) is not None, min(value, EXPERTS)),
        (_EXPERTS_PER_TOKEN.match(key) is not None, min(value, EXPERTS_PER_TOKEN)),
        (_ONE.match(key) is not None, min(value, 1)),
        (key == "num_kv_shared_layers", 0),  # a shared cache needs layers of every kind after the cut
        (_VOCAB.match(key) is not None, min(value, VOCAB)),
        (_STATE.match(key) is not None, min(value, STATE)),
        (_ROPE_DIMS.match(key) is not None, min(value, HEAD_DIM // 2)),
        (_WINDOW.match(key) is not None, min(value, SLIDING_WINDOW)),
        (key == "num_frames", min(value, FRAMES)),
        (_PERIOD.match(key) is not None, min(value, 2)),
        (key.endswith("_offset") and "layer" in key, value % 2),
        (_TOKEN_ID.match(key) is not None and value >= 0, ids.remap(value)),
    ]
    return next((new for applies, new in rules if applies), value)
