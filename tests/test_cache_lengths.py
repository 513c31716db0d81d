"""A static cache's lengths read on the host by a decode step, answered without reading the device while the step is
captured (``runtime.cache_lengths``), on a transformers ``StaticCache`` on the CPU: the reads a capture would fail on
are counted at the dispatcher, where ``.item()`` and ``bool(t)`` read a tensor's value."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

transformers = pytest.importorskip("transformers")

from launchless.core.junctions import HOST_READS  # noqa: E402
from launchless.runtime.cache_lengths import CacheLengths  # noqa: E402

MAX_CACHE_LEN = 16
GRAD_MODES = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}


class _Reads(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in HOST_READS:
            self.reads.append(str(func))
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def host_reads() -> Iterator[list[str]]:
    """The reads of a tensor's value on the host made inside the block (what fails a CUDA graph's capture)."""
    mode = _Reads()
    with mode:
        yield mode.reads


def static_cache(written: int) -> transformers.StaticCache:
    """A one-layer static cache holding ``written`` positions."""
    config = transformers.LlamaConfig(
        hidden_size=16, num_attention_heads=2, num_key_value_heads=2, num_hidden_layers=1, vocab_size=32
    )
    cache = transformers.StaticCache(config=config, max_cache_len=MAX_CACHE_LEN)
    keys = torch.zeros(1, 2, written, 8)
    cache.update(keys, keys, 0)
    return cache


def advance(cache: transformers.StaticCache, tokens: int = 1) -> None:
    keys = torch.ones(1, 2, tokens, 8)
    cache.update(keys, keys, 0)


def positions(cache: transformers.StaticCache, new: int) -> torch.Tensor:
    """TrOCR's, MVP's and RoFormer's learned positions: ``arange(length, length + new)``, built in Python."""
    length = cache.get_seq_length()
    return torch.arange(length, length + new, dtype=torch.long, device="cpu").expand(2, -1)


@pytest.mark.parametrize("grad", GRAD_MODES)
def test_positions_built_from_the_length_are_computed_without_reading_it(grad: str) -> None:
    with GRAD_MODES[grad]():
        cache = static_cache(written=3)
        lengths = CacheLengths(cache)
        assert lengths
        for _ in range(3):  # at every length the cache holds, the very integers eager builds
            want = positions(cache, 2)
            with host_reads() as reads, lengths:
                got = positions(cache, 2)
            assert reads == []
            assert got.dtype == want.dtype and torch.equal(got, want)
            advance(cache)
        with host_reads() as reads:
            positions(cache, 2)
        assert reads, "without the mode, building the positions reads the length on the host"
    assert lengths.answered == 3


@pytest.mark.parametrize("grad", GRAD_MODES)
def test_a_comparison_every_length_answers_alike_is_answered_without_reading(grad: str) -> None:
    """XGLM's ``if 2 + n + length > table_size``: false for every length a cache of 16 can hold, with a table of 20;
    with a table of 10 it depends on the length, and is read as written."""
    with GRAD_MODES[grad]():
        cache = static_cache(written=3)
        lengths = CacheLengths(cache)
        with host_reads() as reads, lengths:
            grows = bool(2 + 2 + cache.get_seq_length() > MAX_CACHE_LEN + 4)
            max(cache.get_seq_length() - 100, 0)  # Python's max compares: 0 > length - 100, never
            past = bool(cache.get_seq_length() + 1)  # ``if length + 1:``, never zero
        assert reads == [] and grows is False and past is True
        with host_reads() as reads, lengths:
            grows = bool(2 + 2 + cache.get_seq_length() > 10)
            past = bool(cache.get_seq_length())  # zero for an empty cache: read as written
        assert len(reads) == 2 and grows is False and past is True


@pytest.mark.parametrize("grad", GRAD_MODES)
def test_an_arange_whose_ends_were_taken_around_a_write_runs_as_written(grad: str) -> None:
    """``end`` taken from the length, the length written, then ``arange(length, end)``: the ends are no longer one
    length apart, and the call reads the device as eager does."""
    with GRAD_MODES[grad]():
        cache = static_cache(written=3)
        lengths = CacheLengths(cache)
        with host_reads() as reads, lengths:
            length = cache.get_seq_length()
            end = length + 2
            advance(cache)
            got = torch.arange(length, end)
        assert reads and got.tolist() == [4]


def test_float_positions_and_other_devices_run_as_written() -> None:
    """Floats round ``start + i`` otherwise than ``i + start``; another device than the length's would need a copy."""
    cache = static_cache(written=3)
    lengths = CacheLengths(cache)
    with torch.no_grad(), host_reads() as reads, lengths:
        length = cache.get_seq_length()
        torch.arange(length, length + 2, dtype=torch.float32)
        torch.arange(length, length + 2, device="meta")
    assert len(reads) >= 2


def test_a_cache_without_static_layers_has_no_lengths_to_follow() -> None:
    cache = transformers.DynamicCache()
    assert not CacheLengths(cache)
