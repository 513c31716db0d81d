"""CPU tests of output flattening (``core.output_tree``): transformers' caches and dataclasses are seen into,
copied with fresh tensors and rebuilt as working objects; other objects stay opaque."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch
from torch.utils import _pytree as pytree

from launchless.core.output_copies import make_cloner
from launchless.core.output_tree import is_cache, see_into
from launchless.core.verify import identical


@dataclasses.dataclass(frozen=True)
class Scores:
    logits: torch.Tensor
    temperature: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "top", self.logits.argmax(-1))


@dataclasses.dataclass
class Nested:
    scores: Scores
    extra: list


class Plain:
    def __init__(self, t: torch.Tensor) -> None:
        self.t = t


def _tensors(tree) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]


def test_dataclasses_are_seen_into_copied_and_rebuilt() -> None:
    out = Nested(Scores(torch.randn(2, 5), 0.5), [torch.ones(3), 7])
    assert {"Nested", "Scores"} <= set(see_into(out)) and see_into(out) == []  # registered once
    assert len(_tensors(out)) == 3  # logits, top (added after __init__), the list's tensor: nothing hidden
    copy = make_cloner(out)()
    assert type(copy) is Nested and type(copy.scores) is Scores and copy.scores.temperature == 0.5
    assert identical(copy, out)
    assert all(a is not b for a, b in zip(_tensors(copy), _tensors(out), strict=True)), "tensors must be copies"
    out.scores.logits.add_(1)  # the graph's buffers change at the next replay: the copy must not
    assert not identical(copy, out)


def test_a_plain_object_stays_opaque() -> None:
    plain = Plain(torch.ones(2))
    assert see_into({"x": plain}) == []
    assert pytree.tree_leaves({"x": plain}) == [plain]
    assert not is_cache(Plain)


transformers = pytest.importorskip("transformers")


def _quiet_transformers() -> None:
    logging.getLogger("transformers").setLevel(logging.ERROR)
    transformers.utils.logging.set_verbosity_error()


def test_a_decoders_dynamic_cache_is_copied_and_still_works() -> None:
    _quiet_transformers()
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=64, bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    ids = torch.randint(0, 64, (1, 6))
    with torch.no_grad():
        out = model(ids)  # use_cache by default: a DynamicCache in the output
    cache = out.past_key_values
    assert is_cache(type(cache))
    see_into(out)
    leaves = _tensors(out)
    assert len(leaves) == 1 + 2 * cfg.n_layer, "logits and each layer's keys and values"
    copy = make_cloner(out)()
    assert type(copy.past_key_values) is type(cache) and identical(copy, out)
    assert all(a is not b for a, b in zip(_tensors(copy), leaves, strict=True))
    nxt = torch.randint(0, 64, (1, 1))
    with torch.no_grad():
        from_copy = model(nxt, past_key_values=copy.past_key_values).logits
        from_original = model(nxt, past_key_values=cache).logits
    assert torch.equal(from_copy, from_original), "the rebuilt cache must continue decoding like the original"


def test_an_encoder_decoder_cache_is_seen_into() -> None:
    _quiet_transformers()
    torch.manual_seed(0)
    cfg = transformers.T5Config(
        vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
        decoder_start_token_id=0,
    )  # fmt: skip
    model = transformers.T5ForConditionalGeneration(cfg).eval()
    ids = torch.randint(0, 64, (1, 5))
    with torch.no_grad():
        out = model(input_ids=ids, decoder_input_ids=ids[:, :3])
    see_into(out)
    assert not [leaf for leaf in pytree.tree_leaves(out) if is_cache(type(leaf))], "a cache left opaque"
    copy = make_cloner(out)()
    assert type(copy.past_key_values) is type(out.past_key_values) and identical(copy, out)


def test_a_cache_passed_in_is_not_part_of_a_signature() -> None:
    """The forward appends to a cache passed in; a replay would append to the graph's copy, not the caller's."""
    from launchless.core.signature import UnhashableInput, flatten_inputs, signature_of

    _quiet_transformers()
    cfg = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=4, vocab_size=64, bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        cache = model(torch.randint(0, 64, (1, 4))).past_key_values
    flat = flatten_inputs((torch.randint(0, 64, (1, 1)),), {"past_key_values": cache})
    assert cache in flat.leaves, "the cache must stay one leaf, not be taken apart into copies"
    with pytest.raises(UnhashableInput, match=r"DynamicCache.*updates it in place"):
        signature_of(flat)
