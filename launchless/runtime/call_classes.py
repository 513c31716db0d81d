"""What makes one ``generate()`` call decode like another, and where each such class of calls stands.

``DecodeGraphs`` proves its decoding once per class of calls (``CallClass``: the model's class, dtype, device and
attention, the batch, whether a prompt is left-padded, how tokens are chosen, the end and pad tokens): the
host-ahead loop against ``generate()``'s own loop (``LoopProof``), and, for a model whose class does not vouch for
transformers' static cache, that cache against ``model.generate()`` as called (``CacheProof``). Here: the class of a
call, what a proof records, and the readings both proofs share (where two decodings' tokens part).
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import enum
import os
import traceback
from collections.abc import Hashable, Mapping
from typing import Any

import torch

from .decode_loop import GenerationSettings, Prepared


def vouches_for_static_cache(model: torch.nn.Module) -> bool:
    """Whether the model's class tells transformers it runs on a static cache (``_can_compile_fullgraph``, older
    ``_supports_static_cache``). transformers takes a ``StaticCache`` from any causal LM, and most classes that do not
    say so decode on it as on their own cache; some overflow it, ignore it or mask it otherwise. Where a class does
    not vouch for it, each class of calls is proven against ``model.generate()`` as called
    (``cache_proofs``)."""
    vouches = getattr(model, "_can_compile_fullgraph", None)
    if vouches is None:
        vouches = getattr(model, "_supports_static_cache", False)
    return bool(vouches)


class CacheProof(enum.Enum):
    """Where a class of calls stands with a static cache its model's class does not vouch for
    (``cache_proofs``)."""

    PROVEN = "proven"  # its first call decoded on the static cache as generate() as called does: graphs decode it
    PARTED = "parted"  # they parted, or decoding on the static cache raised: generate() as called decodes it


class LoopProof(enum.Enum):
    """Where a class of calls stands with the host-ahead loop (``loop_proofs``)."""

    PROVEN = "proven"  # its first call decoded alike both ways: the host-ahead loop decodes it
    PARTED = "parted"  # the loop parted from generate()'s own loop: that own loop decodes it, on the graphs
    FELL_BACK = "fell back"  # decoding through graphs raised where generate() does not: generate() as called


@dataclasses.dataclass(frozen=True)
class CallClass:
    """What makes one ``generate()`` call decode like another: the model's class, dtype and attention, the batch,
    whether a prompt is left-padded, how tokens are chosen, the end and pad tokens."""

    model: str
    dtype: str
    device: str
    attention: str
    batch: int
    left_padded: bool | None  # None: not read yet (before generate() prepared the mask), or either
    choice: tuple[tuple[str, Any], ...]  # ("greedy",) or the sampling settings
    eos: tuple[int, ...]
    pad: int | None

    def describe(self) -> str:
        choice = ", ".join(f"{k} {v}" for k, v in self.choice) if self.choice[0][0] != "greedy" else "greedy"
        tokens = f"end tokens {list(self.eos)}" if self.eos else "no end token"
        padding = {True: ", left-padded", False: ", unpadded", None: ""}[self.left_padded]
        return f"{self.model}, {self.dtype}, batch {self.batch}{padding}, {choice}, {tokens}, pad {self.pad}"

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "choice": dict(self.choice)}


def call_class(
    model: torch.nn.Module, args: tuple, kwargs: Mapping[str, Any], settings: GenerationSettings | Exception
) -> CallClass:
    """The call's class, but for whether a prompt is left-padded: that is read from the mask ``generate()`` prepares
    (``with_padding``), which costs no read of the device where it dropped a mask that hides nothing."""
    config = resolved_config(model, kwargs, settings)
    parameter = next(model.parameters())
    eos = getattr(config, "eos_token_id", None)
    eos_ids = () if eos is None else tuple(int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos]))
    pad = getattr(config, "pad_token_id", None)
    pad = None if pad is None else int(pad)
    if getattr(config, "do_sample", False):
        choice = tuple((name, getattr(config, name, None)) for name in ("do_sample", "temperature", "top_k", "top_p"))
    else:
        choice = (("greedy", True),)
    return CallClass(
        model=type(model).__name__,
        dtype=str(parameter.dtype).removeprefix("torch."),
        device=parameter.device.type,
        attention=str(getattr(model.config, "_attn_implementation", None)),
        batch=(prompt_shape(args, kwargs) or (0, 0))[0],
        left_padded=None,
        choice=choice,
        eos=eos_ids,
        pad=pad,
    )


def with_padding(kind: CallClass, prepared: Prepared) -> CallClass:
    """``kind`` with whether a prompt is left-padded, from the mask ``generate()`` prepared: none where every
    position is attended (``generate()`` drops such a mask, having read it), else read once."""
    mask = prepared.model_kwargs.get("attention_mask")
    padded = isinstance(mask, torch.Tensor) and mask.dim() == 2 and not bool(mask.all())
    return dataclasses.replace(kind, left_padded=padded)


@dataclasses.dataclass(frozen=True)
class ClassRecord:
    proof: LoopProof | CacheProof
    reason: str  # why it parted or fell back; empty where proven


def class_rows(records: Mapping[CallClass, ClassRecord]) -> list[dict[str, Any]]:
    """Each class of calls and where it stands, for ``graph_info()["decode"]``."""
    return [
        {**kind.as_dict(), "proof": record.proof.value, "reason": record.reason} for kind, record in records.items()
    ]


def raised(exc: BaseException) -> str:
    """An exception and the source line that raised it, for a log line."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = ""
    if frames:
        frame = frames[-1]
        where = f" at {os.path.basename(frame.filename)}:{frame.lineno}" + (f" ({frame.line})" if frame.line else "")
    return f"{type(exc).__name__}: {exc}{where}"


def parting(expected: torch.Tensor, got: torch.Tensor, *, start: int) -> str:
    """Where the host-ahead loop's sequences part from ``generate()``'s own (``start``: the prompt's length);
    empty where they are the same. Read on the host: once per class."""
    if got.shape != expected.shape:
        return f"it decoded {got.shape[-1] - start} new tokens, generate() {expected.shape[-1] - start}"
    differ = (got != expected).cpu()
    # a sequence over several audio codebooks is a row of ids per codebook (batch x codebooks x length): it differs
    # at a token where any of its rows does
    differ = differ.reshape(differ.shape[0], -1, differ.shape[-1]).any(dim=1)
    rows = [int(r) for r in differ.any(dim=1).nonzero().flatten()]
    if not rows:
        return ""
    steps = [int(differ[r].nonzero()[0, 0]) - start + 1 for r in rows]
    where = ", ".join(f"row {r} at new token {s}" for r, s in zip(rows, steps, strict=True))
    return f"{where} (of {expected.shape[-1] - start})"


def sequences(output: Any) -> torch.Tensor:
    """The token ids of a ``generate()`` output: the tensor itself, or its ``sequences``."""
    return output if isinstance(output, torch.Tensor) else output["sequences"]


def left_padded(kwargs: Mapping[str, Any]) -> bool | None:
    """Whether a prompt of the call is left-padded, from the mask passed in; None without one (``generate()`` infers
    it from the pad token)."""
    mask = kwargs.get("attention_mask")
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
        return None
    return not bool(mask.all())


def resolved_config(model: torch.nn.Module, kwargs: Mapping[str, Any], settings: GenerationSettings | Exception) -> Any:
    """The generation settings ``generate()`` will use for this call: transformers' own resolution (the call's
    arguments over its or the model's generation config over the global defaults; ``settings``, from
    ``settings_of``) where it has one that accepts them, else the call's arguments over the config, as older
    versions merge them (generate() raises for settings it refuses; the length taken from them is only the cache's)."""
    if not isinstance(settings, Exception):
        return settings[0]
    merged = copy.deepcopy(kwargs.get("generation_config") or model.generation_config)
    merged.update(**{k: v for k, v in kwargs.items() if hasattr(merged, k)})
    return merged


def prompt_shape(args: tuple, kwargs: Mapping[str, Any]) -> tuple[int, int] | None:
    """(batch, prompt length) of a generate() call; None without input_ids or inputs_embeds."""
    ids = args[0] if args else kwargs.get("input_ids", kwargs.get("inputs"))
    if isinstance(ids, torch.Tensor) and ids.dim() == 2:
        return ids.shape[0], ids.shape[1]
    embeds = kwargs.get("inputs_embeds")
    if isinstance(embeds, torch.Tensor) and embeds.dim() == 3:
        return embeds.shape[0], embeds.shape[1]
    return None


_SCALARS = (bool, int, float, str, type(None))
KNOWN_CALLS = 64  # call keys remembered (least recently used forgotten)


class AsCalled:
    """Calls already known to go through ``generate()`` as called, recognised without reading them again.

    Reading a call (transformers' resolution of its settings deep-copies the generation config, the refusals, its
    class) costs a few hundred microseconds of host time; a class that goes through ``generate()`` as called would
    pay it at every call, on top of the generate() it matches. A call whose arguments are tensors (by shape, dtype and
    device) and plain values, made on a model in the same state (mode, dtype, device, configs), decodes as the
    same call did: the answer of its first reading is remembered (with whether a prompt is left-padded, read from the
    mask, where the class depends on it). Anything else -- a generation config or a processor passed in, a model
    changed since -- is read in full."""

    def __init__(self) -> None:
        self._known: collections.OrderedDict[Hashable, tuple[tuple, str]] = collections.OrderedDict()

    def reason(self, model: torch.nn.Module, kwargs: Mapping[str, Any], *, padded: bool | None) -> str | None:
        """Why a call like this one went through ``generate()`` as called; None where none was remembered.
        ``padded``: whether a prompt is left-padded, where the call's class depends on it (else None)."""
        try:
            key = _call_key(kwargs, padded=padded)
            known = None if key is None else self._known.get(key)
            if known is None or known[0] != _model_state(model):
                return None
        except Exception:  # an argument or a config that does not compare plainly: the call is read in full
            return None
        self._known.move_to_end(key)
        return known[1]

    def remember(self, model: torch.nn.Module, kwargs: Mapping[str, Any], reason: str, *, padded: bool | None) -> None:
        try:
            key = _call_key(kwargs, padded=padded)
            if key is None:
                return
            self._known[key] = (_model_state(model), reason)
        except Exception:  # not remembered: the next call like it is read in full
            return
        self._known.move_to_end(key)
        while len(self._known) > KNOWN_CALLS:
            self._known.popitem(last=False)


def _call_key(kwargs: Mapping[str, Any], *, padded: bool | None) -> tuple | None:
    """The call's arguments as a key: tensors by shape, dtype and device, plain values (and tuples or lists of them)
    as they are, and whether a prompt is left-padded; None where an argument is anything else."""
    items: list[tuple] = []
    for name in sorted(kwargs):
        value = kwargs[name]
        if isinstance(value, torch.Tensor):
            items.append((name, tuple(value.shape), value.dtype, value.device))
        elif isinstance(value, _SCALARS):
            items.append((name, type(value), value))
        elif isinstance(value, (tuple, list)) and all(isinstance(x, _SCALARS) for x in value):
            items.append((name, type(value), tuple(value)))
        else:
            return None
    items.append(("left padded", padded))
    return tuple(items)


def _model_state(model: torch.nn.Module) -> tuple:
    """What a call's class and refusals read of the model: its mode (training or not), dtype, device, attention and
    configs (compared by their attributes: a config changed in place is another state)."""
    parameter = next(model.parameters())
    generation = getattr(model, "generation_config", None)
    return (
        type(model),
        model.training,
        parameter.dtype,
        parameter.device,
        dict(vars(model.config)),
        None if generation is None else dict(vars(generation)),
    )
