"""A model that writes transformers' static cache otherwise than once a token, for the decoding tests (CPU and GPU)."""

from __future__ import annotations

import torch


def writes_twice_where_static(model: torch.nn.Module) -> None:
    """The model's first attention layer writes each token's keys twice where its cache is static (a model that
    writes a static cache otherwise than once a token); its own dynamic cache is left alone."""
    import transformers

    config = model.config
    heads, size = config.num_key_value_heads, config.hidden_size // config.num_attention_heads

    def writes_twice(module, args, kwargs):
        cache = next((v for v in kwargs.values() if isinstance(v, transformers.StaticCache)), None)
        if cache is not None:
            hidden = kwargs.get("hidden_states", args[0] if args else None)
            extra = hidden.new_zeros(hidden.shape[0], heads, hidden.shape[1], size)
            cache.update(extra, extra, 0)

    model.model.layers[0].self_attn.register_forward_pre_hook(writes_twice, with_kwargs=True)
