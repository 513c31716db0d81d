"""Decoding rows of a causal LM: ``wrap(model).generate`` against ``model.generate`` on the same call.

Three requests, each on fresh prompts: greedy batch 1 and greedy batch 4 left-padded in bfloat16, and sampling
under a seed in float32; under ``inference_mode`` (greedy batch 1 also under ``no_grad``). The tokens must match
exactly one of two references: eager ``generate()`` on a static cache of the same length with compilation off (the
cache class decode graphs use), or ``model.generate()`` as called, with the model's own cache (where launchless hands
the call to it: a cache no graph can follow, or one the model's class does not vouch for that parted from it). The
static-cache reference is made only for a call launchless would decode through a static cache
(``static_cache_refusal`` names none); where the model's class does not vouch for one, its writes are checked first,
and a model that would write past its end (MPT) raises there. One that raises is dropped,
its error kept in the row's reason;
the row is ``eager-fails`` only where ``model.generate()`` as called raises. The speed is against
``model.generate()`` as called: what the user would run instead.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import time
from collections.abc import Callable
from typing import Any

import torch

from .candidate import Built, Candidate
from .inputs import token_ids
from .rows import Entry, GradMode, Result, Status, new_row
from .runner import Measure, grad_mode, one_line, release

GENERATE_CALLS = 3
PROMPT = 12
NEW_TOKENS = 16
LEFT_PADS = (0, 3, 5, 1)  # pads per row of the batch-4 request
SAMPLING = {"do_sample": True, "top_k": 50, "temperature": 0.9}
WAITING = "captured once seen"  # the steps run eager before a decode shape is captured: not why none replays
REQUESTS: tuple[tuple[Entry, GradMode], ...] = (
    (Entry.GENERATE_GREEDY_B1, GradMode.INFERENCE_MODE),
    (Entry.GENERATE_GREEDY_B1, GradMode.NO_GRAD),
    (Entry.GENERATE_GREEDY_B4, GradMode.INFERENCE_MODE),
    (Entry.GENERATE_SAMPLE, GradMode.INFERENCE_MODE),
)


def _prompt(entry: Entry, vocab: int, generator: torch.Generator, codebooks: int = 1) -> dict[str, Any]:
    """Fresh prompts, left-padded with id 0 for batch 4; a decoder over several audio codebooks takes one row of ids
    per codebook, (batch x codebooks, length), under one mask row per sequence."""
    batch = 4 if entry is Entry.GENERATE_GREEDY_B4 else 1
    ids = token_ids(generator, batch * codebooks, PROMPT, vocab).view(batch, codebooks, PROMPT)
    mask = torch.ones(batch, PROMPT, dtype=ids.dtype)
    if entry is Entry.GENERATE_GREEDY_B4:
        for row, pads in enumerate(LEFT_PADS):
            ids[row, :, :pads], mask[row, :pads] = 0, 0
    ids = ids.reshape(batch * codebooks, PROMPT)
    return {"input_ids": ids.cuda(), "attention_mask": mask.cuda(), "max_new_tokens": NEW_TOKENS, "pad_token_id": 0}


def _codebooks(model: torch.nn.Module, built: Built) -> int:
    """Rows of ids per sequence: the config's ``num_codebooks`` where the forward took one row of ids per audio
    codebook (the layout the harness fitted on the built model, MusicGen's decoders), else 1."""
    layout = (getattr(built.make_inputs, "keywords", None) or {}).get("layout")
    codebooks = getattr(model.config, "num_codebooks", None)
    return codebooks if getattr(layout, "codebook_rows", False) and isinstance(codebooks, int) else 1


def _codebook_ids(model: torch.nn.Module, vocab: int) -> dict[str, int]:
    """The pad (and start) id of a decoder over several codebooks: its generate() offsets each codebook by a step
    more than the last (a delay pattern) filled with the start id, then drops every pad id from what it returns,
    so the two must be one id the heads never emit. The embeddings hold it as a row past the heads' ``vocab``
    outputs (MusicGen's ``vocab_size + 1`` rows; the checkpoints' pad and start id is ``vocab_size``) -- the shrunk
    config's own pad id, moved inside the vocabulary, is one the heads emit. The start id is passed where the
    model's generation config names none (checkpoints carry it in theirs)."""
    embeddings = model.get_input_embeddings()
    rows = max((m.num_embeddings for m in embeddings.modules() if isinstance(m, torch.nn.Embedding)), default=0)
    if rows <= vocab:
        return {}
    ids = {"pad_token_id": rows - 1}
    if getattr(model.generation_config, "decoder_start_token_id", None) is None:
        ids["decoder_start_token_id"] = rows - 1
    return ids


def _reference(model: torch.nn.Module, request: dict[str, Any]) -> torch.Tensor:
    """Eager generate() on the static cache decode graphs would use, compilation off; for a model whose class does not
    vouch for a static cache, every write to it checked on the host first (as launchless's own proof does: a write
    past its end is a device-side assert on the GPU, which would end the worker)."""
    from ...runtime.cache_layers import checked_writes
    from ...runtime.call_classes import vouches_for_static_cache
    from ...runtime.static_cache import cache_keyword, cache_length, new_static_cache

    batch, length = request["attention_mask"].shape[0], cache_length(request["input_ids"].shape[1] + NEW_TOKENS)
    cache = new_static_cache(model, batch=batch, length=length)
    checked = contextlib.nullcontext() if vouches_for_static_cache(model) else checked_writes(cache)
    with checked:
        return model.generate(**request, **{cache_keyword(model): cache}, disable_compile=True)


def _as_called(model: torch.nn.Module, request: dict[str, Any]) -> torch.Tensor:
    """``model.generate()`` as the user calls it: the model's own cache."""
    return model.generate(**request)


def _static_refusal(model: torch.nn.Module, request: dict[str, Any]) -> str | None:
    """Why launchless would not decode this call through a static cache; None when it would. Where reading the call
    raises, launchless hands it to ``generate()`` as called, as for a refusal."""
    from ...runtime.decode_graphs import static_cache_refusal

    try:
        return static_cache_refusal(model, request)
    except Exception as exc:
        return f"reading the call raised {one_line(exc)}"


def _references(model: torch.nn.Module, request: dict[str, Any], seed: int) -> tuple[list[torch.Tensor], str | None]:
    """The tokens the accelerated call may match, under ``seed`` each, and the error of the static-cache reference
    where it raised (it is then left out). What ``model.generate()`` as called raises is raised."""
    wants, dropped = [], None
    if _static_refusal(model, request) is None:
        try:
            wants.append(_seeded(_reference, seed, model, request))
        except Exception as exc:
            dropped = one_line(exc)
    wants.append(_seeded(_as_called, seed, model, request))
    return wants, dropped


def _seeded(run: Any, seed: int, model: torch.nn.Module, request: dict[str, Any]) -> torch.Tensor:
    torch.manual_seed(seed)
    return run(model, request)


def _vocabulary(model: torch.nn.Module) -> int:
    """Rows of the output embedding (the ids the model can emit), else the shrunk vocabulary."""
    head = model.get_output_embeddings()
    weight = getattr(head, "weight", None)
    return int(weight.shape[0]) if isinstance(weight, torch.Tensor) else int(model.config.get_text_config().vocab_size)


def _decode_status(info: dict[str, Any]) -> tuple[Status, str | None]:
    decode = info.get("decode") or {}
    if decode.get("steps_replayed"):
        return (Status.SPLIT if decode.get("steps_eager") else Status.GRAPH), None
    reasons = list((decode.get("generations_eager") or {}) | (decode.get("steps_eager") or {}))
    reasons.sort(key=lambda why: str(why).startswith(WAITING))  # the cause first, the steps that waited after it
    return Status.EAGER, "; ".join(map(str, reasons)) or "no decode step replayed"


def generate_row(
    candidate: Candidate,
    built: Built,
    entry: Entry,
    mode: GradMode,
    seed: int,
    *,
    measure: Measure | None = None,
) -> dict[str, Any]:
    """GENERATE_CALLS generations on fresh prompts, compared token for token, then the last request timed each way
    by ``measure`` (none without: beside other workers a timing is not one), from the same generator state."""
    from ... import wrap

    row = new_row(candidate.name, candidate.library.value, candidate.task, entry, mode, architecture=built.architecture)
    generator = torch.Generator().manual_seed(seed)
    started = time.perf_counter()
    same = 0
    dropped: dict[str, None] = {}  # the static-cache reference's errors, once each
    fast: Any = None
    try:
        model, requests = _requests(built, entry)
        fast = wrap(model)
        with grad_mode(mode):
            for call in range(GENERATE_CALLS):
                request = requests(generator)
                try:
                    wants, error = _references(model, request, seed + call)
                except Exception as exc:
                    row.update(result=Result.EAGER_FAILS.value, reason=f"eager generate(): {one_line(exc)}")
                    return row
                if error is not None:
                    dropped[error] = None
                got = _seeded(lambda _, r: fast.generate(**r), seed + call, model, request)
                row["calls"] += 1
                same += int(any(got.shape == want.shape and torch.equal(got, want) for want in wants))
            status, reason = _decode_status(fast.graph_info())
            row.update(status=status.value, reason=reason, identical_calls=same)
            row["result"] = (Result.IDENTICAL if same == row["calls"] else Result.DIFFERS).value
            if row["result"] == Result.DIFFERS.value:
                row["reason"] = f"tokens differ from the references on {row['calls'] - same} of {row['calls']} calls"
            notes = [row["reason"], *(f"static-cache reference dropped: {error}" for error in dropped)]
            row["reason"] = "; ".join(note for note in notes if note) or None
            if measure is not None:
                eager = functools.partial(_seeded, _as_called, seed, model, request)
                accelerated = functools.partial(_seeded, lambda _, r: fast.generate(**r), seed, model, request)
                row.update(timed_alone=True, **measure(eager, accelerated))
    except Exception as exc:
        from .runner import _where

        row.update(result=Result.CRASH.value, reason=one_line(exc), source=_where(exc))
    finally:
        row["wall_s"] = round(time.perf_counter() - started, 2)
        release(fast)
    return row


def _requests(built: Built, entry: Entry) -> tuple[torch.nn.Module, Any]:
    """The model in ``entry``'s dtype (a copy in bfloat16 for the greedy requests) and a function from a generator
    to a fresh request of ``entry`` for it."""
    dtype = torch.float32 if entry is Entry.GENERATE_SAMPLE else torch.bfloat16
    model = copy.deepcopy(built.model).to(dtype) if dtype is not torch.float32 else built.model
    vocab, codebooks = _vocabulary(model), _codebooks(model, built)
    special = _codebook_ids(model, vocab) if codebooks > 1 else {}
    extra = SAMPLING if entry is Entry.GENERATE_SAMPLE else {"do_sample": False}

    def request(generator: torch.Generator) -> dict[str, Any]:
        return {**_prompt(entry, vocab, generator, codebooks), **special, **extra}

    return model, request


def references_alone(built: Built, entry: Entry, mode: GradMode, seed: int) -> None:
    """The references of ``entry``'s row alone, on the same prompts and draws (no ``wrap``): whether eager
    ``generate()`` itself ends the process (``shard``'s check of a model that killed its worker)."""
    model, requests = _requests(built, entry)
    generator = torch.Generator().manual_seed(seed)
    with grad_mode(mode):
        for call in range(GENERATE_CALLS):
            _references(model, requests(generator), seed + call)
    torch.cuda.synchronize()


def best_of_two(eager: Callable[[], Any], accelerated: Callable[[], Any]) -> dict[str, Any]:
    """Wall time of one generation each way (the host waits for the tokens), best of two interleaved rounds: a
    correctness run's worker alone on the GPU times its decoding rows so."""
    times: dict[str, list[float]] = {"eager": [], "accelerated": []}
    for _ in range(2):
        for name, run in (("eager", eager), ("accelerated", accelerated)):
            torch.cuda.synchronize()
            began = time.perf_counter()
            run()
            torch.cuda.synchronize()
            times[name].append((time.perf_counter() - began) * 1e3)
    eager_ms, accelerated_ms = min(times["eager"]), min(times["accelerated"])
    return {
        "eager_ms": round(eager_ms, 3),
        "accelerated_ms": round(accelerated_ms, 3),
        "speedup": round(eager_ms / accelerated_ms, 3),
    }
