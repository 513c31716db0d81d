"""Tensor-parallel transformer workloads: real architectures sharded with PyTorch's own ``parallelize_module``.

A forward split over a 1-D DeviceMesh launches the same small kernels per rank plus one all-reduce per block,
which is what graph capture has to survive (collectives inside the graph, DTensor wrapping around the linears).
Each block is planned column-wise then row-wise (q/k/v and gate/up/fc1 split by output features, o/down/fc2 by
input features), so the activations between the two stay local and only the row-wise output is reduced.
Embeddings, norms and LM heads stay replicated: every rank holds them whole, which keeps the plan simple and the
output a plain tensor on every rank.

Every rank builds the full model from the same seed on the CPU and only then shards it, so the sharded forward
can be checked against ``build_tp(name, mesh=None, ...)`` with the very same weights and inputs. transformers is
imported lazily (``pip install 'launchless[zoo]'``); nothing is downloaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel, parallelize_module

__all__ = ["TP_WORKLOADS", "build_tp", "tp_plan"]

# Attention modules that reshape with explicit head counts or widths (rather than ``-1``) would silently mix
# tokens and heads after a column-wise split, so these attributes are divided by the mesh size wherever the
# installed transformers version defines them on the attention module.
_PER_RANK_ATTRIBUTES = ("num_heads", "num_attention_heads", "num_key_value_heads", "all_head_size", "embed_dim")


@dataclass(frozen=True)
class _TPSpec:
    """One workload: a transformers class with a small config, where its blocks are and how they split."""

    model_cls: str
    config_cls: str
    config: dict[str, Any]
    layers: str  # the ModuleList of transformer blocks
    attention: str  # the module inside a block that owns q/k/v and reshapes into heads
    colwise: tuple[str, ...]  # linears inside a block split by output features
    rowwise: tuple[str, ...]  # linears inside a block split by input features (their output is all-reduced)
    head_counts: tuple[str, ...]  # config fields that must divide by the mesh size
    token_types: bool = False
    extra_attributes: tuple[str, ...] = ()  # version-specific widths on the attention module


_SPECS: dict[str, _TPSpec] = {
    "tp:bert": _TPSpec(
        model_cls="BertModel",
        config_cls="BertConfig",
        config={
            "hidden_size": 384,
            "num_hidden_layers": 6,
            "num_attention_heads": 8,
            "intermediate_size": 1536,
            "vocab_size": 8192,
            "max_position_embeddings": 512,
        },
        layers="encoder.layer",
        attention="attention.self",
        colwise=("attention.self.query", "attention.self.key", "attention.self.value", "intermediate.dense"),
        rowwise=("attention.output.dense", "output.dense"),
        head_counts=("num_attention_heads",),
        token_types=True,
    ),
    "tp:llama": _TPSpec(
        model_cls="LlamaForCausalLM",
        config_cls="LlamaConfig",
        config={
            "hidden_size": 512,
            "num_hidden_layers": 4,
            "num_attention_heads": 8,
            "num_key_value_heads": 4,
            "intermediate_size": 1408,
            "vocab_size": 8192,
            "max_position_embeddings": 512,
        },
        layers="model.layers",
        attention="self_attn",
        colwise=("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"),
        rowwise=("self_attn.o_proj", "mlp.down_proj"),
        head_counts=("num_attention_heads", "num_key_value_heads"),
        extra_attributes=("hidden_size",),  # older LlamaAttention reshapes its output to self.hidden_size
    ),
    "tp:opt": _TPSpec(
        model_cls="OPTForCausalLM",
        config_cls="OPTConfig",
        config={
            "hidden_size": 384,
            "word_embed_proj_dim": 384,
            "num_hidden_layers": 6,
            "num_attention_heads": 8,
            "ffn_dim": 1536,
            "vocab_size": 8192,
            "max_position_embeddings": 512,
        },
        layers="model.decoder.layers",
        attention="self_attn",
        colwise=("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "fc1"),
        rowwise=("self_attn.out_proj", "fc2"),
        head_counts=("num_attention_heads",),
    ),
}

TP_WORKLOADS: tuple[str, ...] = tuple(_SPECS)


def _spec(name: str) -> _TPSpec:
    try:
        return _SPECS[name]
    except KeyError:
        raise ValueError(f"unknown tensor-parallel workload {name!r}; valid names: {', '.join(_SPECS)}") from None


def _block_count(spec: _TPSpec, model: torch.nn.Module) -> int:
    blocks = model.get_submodule(spec.layers)
    if not isinstance(blocks, torch.nn.ModuleList):
        raise TypeError(f"{spec.layers} of {type(model).__name__} is not a ModuleList of blocks")
    return len(blocks)


def tp_plan(name: str, model: torch.nn.Module) -> dict[str, ParallelStyle]:
    """The plan ``build_tp`` applies to ``model``: fully qualified module name -> ColwiseParallel/RowwiseParallel.

    Names are spelled out per block (no wildcards) so callers can look each sharded linear up directly.
    """
    spec = _spec(name)
    plan: dict[str, ParallelStyle] = {}
    for index in range(_block_count(spec, model)):
        block = f"{spec.layers}.{index}"
        plan |= {f"{block}.{linear}": ColwiseParallel() for linear in spec.colwise}
        plan |= {f"{block}.{linear}": RowwiseParallel() for linear in spec.rowwise}
    return plan


def _localize_attention(spec: _TPSpec, model: torch.nn.Module, *, world_size: int) -> None:
    """Divide the head counts / widths the attention modules keep by ``world_size`` (see _PER_RANK_ATTRIBUTES)."""
    for index in range(_block_count(spec, model)):
        attention = model.get_submodule(f"{spec.layers}.{index}.{spec.attention}")
        for attribute in _PER_RANK_ATTRIBUTES + spec.extra_attributes:
            value = getattr(attention, attribute, None)
            if isinstance(value, int):
                setattr(attention, attribute, value // world_size)


def build_tp(
    name: str,
    *,
    mesh: DeviceMesh | None,
    device: str | torch.device,
    batch: int = 1,
    seq: int = 32,
    seed: int = 0,
) -> tuple[torch.nn.Module, tuple, dict]:
    """The model in eval mode on ``device`` and example inputs (args, kwargs) for ``model(*args, **kwargs)``.

    Every rank builds the identical full model from ``seed`` (``torch.manual_seed`` before construction, on the
    CPU so the weights do not depend on the device), then, when ``mesh`` is given, shards it with
    ``parallelize_module`` and the workload's plan (``tp_plan``). ``mesh=None`` gives the unsharded reference
    with the very same weights. Inputs are identical on every rank (built from ``seed`` too) and ask for no KV
    cache, so the output holds plain tensors only.
    """
    import transformers

    spec = _spec(name)
    world_size = 1 if mesh is None else mesh.size()
    if mesh is not None and mesh.ndim != 1:
        raise ValueError(f"{name} shards over a 1-D DeviceMesh, got {mesh.ndim} dimensions")
    for count in spec.head_counts:
        if spec.config[count] % world_size:
            raise ValueError(f"{name}: {count}={spec.config[count]} does not divide over {world_size} ranks")
    if seq > spec.config["max_position_embeddings"]:
        raise ValueError(f"{name}: seq={seq} exceeds max_position_embeddings={spec.config['max_position_embeddings']}")

    model_cls = getattr(transformers, spec.model_cls)
    attention = "sdpa" if getattr(model_cls, "_supports_sdpa", False) else "eager"
    config = getattr(transformers, spec.config_cls)(attn_implementation=attention, **spec.config)
    torch.manual_seed(seed)
    model = model_cls(config).eval().to(device)
    if mesh is not None:
        parallelize_module(model, mesh, tp_plan(name, model))
        _localize_attention(spec, model, world_size=world_size)

    generator = torch.Generator().manual_seed(seed)
    kwargs: dict[str, Any] = {
        "input_ids": torch.randint(config.vocab_size, (batch, seq), generator=generator).to(device),
        "attention_mask": torch.ones(batch, seq, dtype=torch.long, device=device),
        "use_cache": False,
    }
    if spec.token_types:
        kwargs["token_type_ids"] = torch.zeros(batch, seq, dtype=torch.long, device=device)
    return model, (), kwargs
