"""Model zoo: real architectures with random weights and matching example inputs.

Benchmarks, ``launchless demo`` and GPU tests need realistic graphs (convs, attention, detection
post-processing) without network access, so nothing here downloads weights, configs or
tokenizers. timm / transformers / torchvision are imported lazily inside the builders, so
``import launchless.apps.zoo`` needs only torch; install them with ``pip install 'launchless[zoo]'``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from torch.utils._pytree import tree_map

__all__ = ["Workload", "available", "build", "names"]

Inputs = tuple[tuple, dict]
# A builder takes the batch size and returns (fp32 CPU model in eval mode, factory of fp32 CPU inputs).
Builder = Callable[[int], tuple[torch.nn.Module, Callable[[], Inputs]]]


@dataclass(frozen=True, eq=False)
class Workload:
    """A built model plus example inputs, ready for ``model(*args, **kwargs)``."""

    name: str
    model: torch.nn.Module = field(repr=False)
    args: tuple
    kwargs: dict
    family: str
    _make: Callable[[], Inputs] = field(repr=False)

    def inputs(self) -> Inputs:
        """Fresh inputs of the same shapes/dtypes/device with new random values (replay checks need them)."""
        return self._make()


@dataclass(frozen=True)
class _Spec:
    family: str
    package: str  # import name whose absence makes the workload unavailable
    builder: Builder


class _UnknownWorkloadError(KeyError, ValueError):
    """Catchable as KeyError (a registry lookup) or ValueError (a bad argument)."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


# --- builders ------------------------------------------------------------------------------------


def _timm(arch: str, batch: int, size: int = 224) -> tuple[torch.nn.Module, Callable[[], Inputs]]:
    import timm

    model = timm.create_model(arch, pretrained=False)
    return model, lambda: ((torch.randn(batch, 3, size, size),), {})


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
) -> tuple[torch.nn.Module, Callable[[], Inputs]]:
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


def _tv_detector(arch: str, batch: int, size: int = 320) -> tuple[torch.nn.Module, Callable[[], Inputs]]:
    from torchvision.models import detection

    model = getattr(detection, arch)(weights=None, weights_backbone=None)
    return model, lambda: (([torch.rand(3, size, size) for _ in range(batch)],), {})


def _raft(batch: int, size: int = 128) -> tuple[torch.nn.Module, Callable[[], Inputs]]:
    from torchvision.models.optical_flow import raft_small

    model = raft_small(weights=None)
    return model, lambda: ((torch.rand(batch, 3, size, size), torch.rand(batch, 3, size, size)), {})


def _hf_pixels(
    model_cls: str, config_cls: str, size: int, batch: int, **config: Any
) -> tuple[torch.nn.Module, Callable[[], Inputs]]:
    """A transformers vision model from its default config (no pretrained backbone), on pixel_values."""
    import transformers

    cfg = getattr(transformers, config_cls)(**config)
    model = getattr(transformers, model_cls)(cfg)
    return model, lambda: ((), {"pixel_values": torch.rand(batch, 3, size, size)})


# --- registry: one entry per workload ------------------------------------------------------------

_REGISTRY: dict[str, _Spec] = {
    **{
        f"timm:{arch}": _Spec("timm", "timm", partial(_timm, arch))
        for arch in (
            "resnet18",
            "mobilenetv3_small_100",
            "efficientnet_b0",
            "convnext_atto",
            "vit_tiny_patch16_224",
            "resnet50",
        )
    },
    "hf:bert-base": _Spec(
        "transformers",
        "transformers",
        partial(_hf, "BertModel", "BertConfig", 128, fills={"attention_mask": 1, "token_type_ids": 0}),
    ),
    "hf:gpt2": _Spec(
        "transformers",
        "transformers",
        partial(_hf, "GPT2LMHeadModel", "GPT2Config", 64, flags={"use_cache": False}),
    ),
    "hf:t5-small": _Spec(
        "transformers",
        "transformers",
        partial(
            _hf,
            "T5ForConditionalGeneration",
            "T5Config",
            64,
            ids=("input_ids", "decoder_input_ids"),
            flags={"use_cache": False},
            d_model=512,
            d_ff=2048,
            num_layers=6,
            num_heads=8,
            vocab_size=32128,
        ),
    ),
    "hf:xlnet-base": _Spec(
        "transformers",
        "transformers",
        # XLNet returns `mems` in eval by default; turn it off in the config and the call.
        partial(_hf, "XLNetModel", "XLNetConfig", 64, flags={"use_mems": False}, use_mems_eval=False),
    ),
    "tv:fasterrcnn_mobilenet_v3_large_fpn": _Spec(
        "torchvision", "torchvision", partial(_tv_detector, "fasterrcnn_mobilenet_v3_large_fpn")
    ),
    # Models a host->device copy keeps out of plain capture (DESIGN.md): the compiler path's CGCT cases.
    **{
        f"tv:{arch}": _Spec("torchvision", "torchvision", partial(_tv_detector, arch))
        for arch in (
            "fasterrcnn_resnet50_fpn",
            "retinanet_resnet50_fpn",
            "fcos_resnet50_fpn",
            "maskrcnn_resnet50_fpn",
            "ssdlite320_mobilenet_v3_large",
        )
    },
    "tv:raft_small": _Spec("torchvision", "torchvision", _raft),
    "hf:mistral-tiny": _Spec(
        "transformers",
        "transformers",
        partial(
            _hf,
            "MistralForCausalLM",
            "MistralConfig",
            64,
            flags={"use_cache": False},
            hidden_size=256,
            intermediate_size=512,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
        ),
    ),
    "hf:rt-detr": _Spec(
        "transformers", "transformers", partial(_hf_pixels, "RTDetrForObjectDetection", "RTDetrConfig", 320)
    ),
    "hf:mask2former": _Spec(  # its loss module imports scipy at construction
        "transformers",
        "scipy",
        partial(_hf_pixels, "Mask2FormerForUniversalSegmentation", "Mask2FormerConfig", 256),
    ),
}


# --- public API ----------------------------------------------------------------------------------


def names() -> list[str]:
    """All registered workload names, in registration order."""
    return list(_REGISTRY)


def _spec(name: str) -> _Spec:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise _UnknownWorkloadError(f"unknown workload {name!r}; valid names: {', '.join(_REGISTRY)}") from None


def available(name: str) -> bool:
    """True when the package ``name`` needs imports cleanly (unknown names raise)."""
    package = _spec(name).package
    try:
        importlib.import_module(package)
    except Exception:  # a broken install (e.g. torchvision ops mismatch) is as unusable as a missing one
        return False
    return True


def build(
    name: str,
    *,
    batch: int = 1,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> Workload:
    """Build workload ``name`` with random weights: reproducible per ``seed``, on any ``device``.

    Weights and inputs are created on the CPU in fp32 and then moved, so the same seed gives the
    same values on every device; ``dtype`` applies to parameters and float inputs only.
    """
    spec = _spec(name)
    try:
        importlib.import_module(spec.package)  # before seeding, so a first import can't shift the RNG
    except ImportError as e:
        raise ImportError(f"workload {name!r} needs {spec.package!r}: pip install 'launchless[zoo]' ({e})") from e
    torch.manual_seed(seed)
    model, make_cpu = spec.builder(batch)
    model = model.to(device=device, dtype=dtype).eval()

    def convert(x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        return x.to(device=device, dtype=dtype) if x.is_floating_point() else x.to(device=device)

    def make() -> Inputs:
        return tree_map(convert, make_cpu())

    args, kwargs = make()
    return Workload(name=name, model=model, args=args, kwargs=kwargs, family=spec.family, _make=make)
