"""What `launchless bench --suite serving` serves: its two parts, told apart by the workload's prefix
(``buckets:<name>``: a forward per call over a trace of batch sizes; ``decode:<family>-<size>@b<batch>``: greedy
``generate()`` of a causal LM), their workloads and modes, and the trace (docs/benchmarks.md, the serving suite, says
what each is). A ``buckets:package.module:function`` builder takes the keyword ``device`` and returns ``(model,
make_inputs)``, ``make_inputs(rows)`` drawing from torch's global generator (seeded before the trace is drawn, so
that every mode serves the same inputs). Nothing here imports torch until a model is built, so that the report and
the command line can name workloads and modes anywhere.
"""

from __future__ import annotations

import importlib.metadata
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .workloads import UnknownWorkload, part_by_prefix, prefixed_builder

if TYPE_CHECKING:
    import torch

BUCKETS = "buckets"
DECODE = "decode"
PART_TITLES = {BUCKETS: "Batch buckets", DECODE: "Decode"}

EAGER = "eager"
GRAPH_PER_SIZE = "graph-per-size"  # launchless.wrap, a graph per batch size
BUCKETS_FIXED = "buckets"  # launchless.wrap(batch_buckets=[1, 2, 4, 8, 16, 32])
BUCKETS_AUTO = "buckets-auto"  # launchless.wrap(batch_buckets="auto")
SPLIT_16 = "buckets-split-16"  # buckets up to 16 rows, a larger call served as calls of 16 (a server's capped bucket)
SPLIT_8 = "buckets-split-8"  # the same, up to 8 rows
REDUCE_OVERHEAD = "reduce-overhead"
STATIC_COMPILE = "static-compile"  # transformers' static KV cache with a compiled forward
LAUNCHLESS = "launchless"
BUCKET_MODES = (EAGER, GRAPH_PER_SIZE, BUCKETS_FIXED, BUCKETS_AUTO, SPLIT_16, SPLIT_8, REDUCE_OVERHEAD)
DECODE_MODES = (EAGER, STATIC_COMPILE, LAUNCHLESS)
COMPILED_KERNELS = "launchless-compiled-kernels"  # raced in the launchless worker: wrap(model, kernels="compiled")
MODES = tuple(dict.fromkeys((*BUCKET_MODES, *DECODE_MODES)))

# --- the trace ------------------------------------------------------------------------------------------------

LARGEST_BATCH = 32
TRACE_CALLS = 200  # the trace's length unless --iters says otherwise
TRACE_SEED = 0
TRACE_LAW = "P(size = k) proportional to 1/k, k = 1..32"


def batch_trace(calls: int, *, seed: int = TRACE_SEED) -> list[int]:
    """``calls`` batch sizes from 1 to 32, drawn with probability proportional to 1/size (Zipf's law cut at 32).

    This is what a server that batches requests as they arrive sees at moderate load: a quarter of the calls carry
    one request, a batch of 8 comes 3 % of the time and a full batch of 32 under 1 % (the bursts), so most sizes
    appear, the large ones rarely. Drawn with Python's own generator, seeded, so that every mode, every run and every
    version of torch serves the same trace."""
    sizes = range(1, LARGEST_BATCH + 1)
    return random.Random(seed).choices(sizes, weights=[1 / k for k in sizes], k=calls)


def serving_environment(device: str, calls: int) -> dict[str, Any]:
    """What a serving report states beside ``describe()``: the device, the model libraries' versions and the
    trace."""
    return {"device": device, "transformers": _version("transformers"), "timm": _version("timm")} | {
        "trace": describe_trace(calls)
    }


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def describe_trace(calls: int) -> dict[str, Any]:
    """The trace as the report states it: its length, law, seed and what it holds."""
    trace = batch_trace(calls)
    return {
        "calls": calls,
        "law": TRACE_LAW,
        "seed": TRACE_SEED,
        "distinct_sizes": len(set(trace)),
        "rows": sum(trace),
        "largest": max(trace, default=None),
    }


# --- workloads ------------------------------------------------------------------------------------------------

BucketBuilder = Callable[..., tuple["torch.nn.Module", Callable[[int], tuple[tuple, dict]]]]
DISTILBERT_TOKENS = 128  # the zoo's sequence length for its encoders


def part_of(workload: str) -> str:
    """``buckets`` or ``decode``, from the workload's prefix."""
    parts = {"buckets:": (BUCKETS, "batch-bucket"), "decode:": (DECODE, "decode")}
    return part_by_prefix(workload, suite="serving", parts=parts)


def modes_of(workload: str) -> tuple[str, ...]:
    return BUCKET_MODES if part_of(workload) == BUCKETS else DECODE_MODES


def mlp(*, device: torch.device) -> tuple[torch.nn.Module, Callable[[int], tuple[tuple, dict]]]:
    """Two linear layers with GELU between, 256 -> 1024 -> 256: little work per row, so launches dominate."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256)).to(device).eval()
    return model, lambda rows: ((torch.randn(rows, 256, device=device),), {})


def resnet18_at_64(*, device: torch.device) -> tuple[torch.nn.Module, Callable[[int], tuple[tuple, dict]]]:
    """timm's resnet18 (random weights) on 3x64x64 images: a small vision model served at many batch sizes."""
    import timm
    import torch

    torch.manual_seed(0)
    model = timm.create_model("resnet18").to(device).eval()
    return model, lambda rows: ((torch.randn(rows, 3, 64, 64, device=device),), {})


def distilbert_tiny(*, device: torch.device) -> tuple[torch.nn.Module, Callable[[int], tuple[tuple, dict]]]:
    """The zoo's two-layer DistilBERT encoder on 128 random tokens per row, with an all-ones attention mask."""
    import torch

    from .. import zoo

    model = zoo.build("hf:distilbert-tiny", device=device).model
    vocab = model.config.vocab_size

    def make_inputs(rows: int) -> tuple[tuple, dict]:
        ids = torch.randint(vocab, (rows, DISTILBERT_TOKENS), device=device)
        return (), {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

    return model, make_inputs


BUCKET_WORKLOADS: dict[str, BucketBuilder] = {
    "buckets:mlp": mlp,
    "buckets:resnet18@64": resnet18_at_64,
    "buckets:distilbert-tiny": distilbert_tiny,
}


def bucket_builder(workload: str) -> BucketBuilder:
    """``builder(device=) -> (model, make_inputs)`` for a ``buckets:`` workload."""
    return prefixed_builder(workload, prefix="buckets:", what="batch-bucket", known=BUCKET_WORKLOADS)


@dataclass(frozen=True)
class DecoderSize:
    """A causal LM's config (beyond the family's defaults), its prompt, the tokens it generates, its dtype."""

    config: dict[str, Any]
    prompt_tokens: int
    new_tokens: int
    dtype: str


@dataclass(frozen=True)
class DecoderFamily:
    model_class: str  # in transformers
    config_class: str
    sizes: dict[str, DecoderSize]


_TINY_GPT2 = {"n_layer": 2, "n_embd": 64, "n_head": 2, "vocab_size": 1000, "n_positions": 128}
_TINY_LLAMA = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1}
_TINY_LLAMA |= {"intermediate_size": 128, "vocab_size": 1000}
_LLAMA_850M = {"hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 16, "num_key_value_heads": 4}
_LLAMA_850M |= {"intermediate_size": 5632, "vocab_size": 32000, "tie_word_embeddings": False}
DECODER_FAMILIES = {
    "gpt2": DecoderFamily(
        "GPT2LMHeadModel",
        "GPT2Config",
        {
            "tiny": DecoderSize(_TINY_GPT2, prompt_tokens=8, new_tokens=4, dtype="float32"),
            "124m": DecoderSize({}, prompt_tokens=64, new_tokens=128, dtype="bfloat16"),  # GPT-2 small
        },
    ),
    "llama": DecoderFamily(
        "LlamaForCausalLM",
        "LlamaConfig",
        {
            "tiny": DecoderSize(_TINY_LLAMA, prompt_tokens=8, new_tokens=4, dtype="float32"),
            "850m": DecoderSize(_LLAMA_850M, prompt_tokens=64, new_tokens=128, dtype="bfloat16"),
        },
    ),
}


@dataclass(frozen=True)
class DecodeWorkload:
    name: str
    family: str
    size: str
    batch: int

    @property
    def decoder(self) -> DecoderSize:
        return DECODER_FAMILIES[self.family].sizes[self.size]


def decode_workload(workload: str) -> DecodeWorkload:
    """``decode:<family>-<size>@b<batch>`` read; UnknownWorkload names what is accepted."""
    body = workload.removeprefix("decode:")
    model, _, batch = body.partition("@b")
    family, _, size = model.partition("-")
    known = [f"decode:{f}-{s}@b<batch>" for f, fam in DECODER_FAMILIES.items() for s in fam.sizes]
    if family not in DECODER_FAMILIES or size not in DECODER_FAMILIES[family].sizes or not batch.isdigit():
        raise UnknownWorkload(f"unknown decode workload {workload!r}; choose from: {', '.join(known)}")
    if int(batch) < 1:
        raise UnknownWorkload(f"decode workload {workload!r}: the batch must be 1 or more")
    return DecodeWorkload(workload, family, size, int(batch))


def build_decoder(workload: DecodeWorkload, *, device: torch.device) -> tuple[torch.nn.Module, dict[str, Any]]:
    """The causal LM (seeded random weights, SDPA attention, no end-of-sequence token so that every generation runs
    its full length) and the keyword arguments of its prompt: ``input_ids`` and an all-ones ``attention_mask``."""
    import torch
    import transformers

    family, size = DECODER_FAMILIES[workload.family], workload.decoder
    config = getattr(transformers, family.config_class)(
        attn_implementation="sdpa", bos_token_id=None, eos_token_id=None, **size.config
    )
    torch.manual_seed(0)
    model = getattr(transformers, family.model_class)(config)
    model = model.to(device=device, dtype=getattr(torch, size.dtype)).eval()
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(config.vocab_size, (workload.batch, size.prompt_tokens), generator=generator).to(device)
    return model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def check_workload(workload: str) -> None:
    """Raises UnknownWorkload unless a worker could build ``workload``."""
    if part_of(workload) == BUCKETS:
        bucket_builder(workload)
    else:
        decode_workload(workload)


def default_workloads(device: str) -> list[str]:
    """On a GPU, resnet18 and DistilBERT over the trace, and GPT-2 small and the 850M Llama at batches 1 and 8; on a
    CPU the MLP and the tiny decoders at batch 1, which finish in seconds."""
    if device == "cuda":
        decoders = [f"decode:{model}@b{batch}" for model in ("gpt2-124m", "llama-850m") for batch in (1, 8)]
        return ["buckets:resnet18@64", "buckets:distilbert-tiny", *decoders]
    return ["buckets:mlp", "decode:gpt2-tiny@b1", "decode:llama-tiny@b1"]


def listing() -> list[str]:
    """The workloads and modes, for ``--list``."""
    decoders = [f"decode:{f}-{s}@b<batch>" for f, fam in DECODER_FAMILIES.items() for s in fam.sizes]
    return [
        f"buckets workloads: {', '.join(BUCKET_WORKLOADS)}, buckets:package.module:function",
        f"buckets modes: {', '.join(BUCKET_MODES)}",
        f"decode workloads: {', '.join(decoders)}",
        f"decode modes: {', '.join(DECODE_MODES)}",
    ]
