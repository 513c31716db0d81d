"""Decode graphs: ``wrap(model).generate(...)`` replays a captured decode step.

A transformers causal LM generates one token per step: a forward of one token per sequence that reads the KV cache
and writes the new token's keys and values into it. With transformers' default dynamic cache the cache grows every
step (new tensors of new shapes): nothing to capture. With its static cache (``StaticCache``: keys and values
allocated for a fixed length up front, the length written so far kept on the device) every step runs the same shapes
on the same memory, so one graph replays them all. ``wrap(model).generate(...)``:

1. hands ``generate()`` a static cache of its own per (batch, cache length, inference mode, the model's dtype and
   device): the length is what the call needs (prompt and new tokens) rounded up to a power of two, at least
   ``MIN_CACHE_LENGTH``, so that requests of similar lengths share one cache and one graph. The cache is emptied in
   place before each call: its tensors keep the addresses the graph reads. A ``StaticCache`` passed in by the caller
   is used as given;
2. runs the prompt's forward (the prefill) eager;
3. sends every decode step through a graph (``decode_steps``): captured once the step repeats (``capture_after``),
   verified against eager from the same cache state, then replayed on the cache's own tensors;
4. decodes greedy and sampling calls in a loop of its own that keeps the host ahead of the GPU
   (``decode_loop``: ``generate()`` itself waits for the GPU at every token), run inside ``generate()``
   as its decoding method, on the inputs ``generate()`` prepared; the calls that loop cannot decode exactly (logits
   processors or stopping criteria passed in, other generation settings, a cache passed in) go through
   ``generate()``'s own loop, which keeps its logits processors, choice or sampling (the same random numbers as
   eager: the graph draws none), stopping criteria and streamers;
5. proves the loop once per class of calls (``CallClass``: model class, dtype, batch, left padding, greedy or
   sampling settings, end and pad tokens): the class's first call decodes both ways on the same graphs, and the
   caller gets ``generate()``'s own loop's tokens. Tokens and random-number generator alike: later calls of the
   class run the loop; else one WARNING says where they parted, and the class keeps to ``generate()``'s own loop;
6. where the model's class does not tell transformers it runs on a static cache (``vouches_for_static_cache``: most
   such classes do decode on one as on their own cache, some overflow it, ignore it or mask it otherwise), proves the
   static cache too, once per class of calls: the class's first call decodes eager on the static cache (each write
   to it checked on the host first) and by ``model.generate()`` as called, and the caller gets the latter. Tokens
   and generator state alike: later calls of the class decode through graphs; else one WARNING says where they
   parted, and the class goes through ``generate()`` as called from then on;
7. sends a class of calls none of whose decode steps can be a graph (each refused, named by its operation and
   source line, or by why it does not run on the static cache: a forward that takes no cache argument and carries
   its own state, RWKV's ``state``, XLNet's ``mems``) through ``generate()`` as called from its next call, with one
   line: eager steps on a static cache cost more.

Decoding goes through ``model.generate()`` as called (the model's own cache, nothing of ours per step), with one
WARNING naming why, for a static cache whose layers a graph cannot replay (``cache_layers``: a dynamic attention
cache in a hybrid layer, a sliding window that fills within the generation), an encoder-decoder, beam search and
assisted decoding (they reorder or crop the cache between steps), ``use_cache=False``, a cache passed in that is not
static, and another cache implementation asked for. So does a class of calls whose decoding through graphs raised
where ``model.generate()`` does not (before any token reached the caller): one WARNING names the exception and its
source line. The tokens are those of eager ``generate()`` on the same static cache. Against the default dynamic
cache they can part after some steps: attention over the static cache's full, masked length rounds differently, as
it does in transformers' own static-cache recipe.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import functools
import logging
import threading
from collections.abc import Mapping
from typing import Any, cast

import torch

from ..errors import CaptureError
from .cache_layers import unfollowed_layers
from .cache_proofs import CacheProofs
from .call_classes import (
    AsCalled,
    CacheProof,
    CallClass,
    ClassRecord,
    LoopProof,
    call_class,
    class_rows,
    left_padded,
    prompt_shape,
    raised,
    resolved_config,
    vouches_for_static_cache,
)
from .decode_loop import decoding_method, device_generator, settings_of
from .decode_steps import DecodeSteps
from .generate_call import GenerateCall, by_keyword
from .loop_proofs import LoopProofs
from .static_cache import OffCache, cache_keyword, given_cache, static_cache_class
from .static_caches import StaticCaches
from .step_routing import StepRouting

log = logging.getLogger("launchless")


def static_cache_refusal(model: torch.nn.Module, kwargs: Mapping[str, Any], *, config: Any = None) -> str | None:
    """Why this ``generate()`` call cannot decode through graphs; None when it can. ``config``: the call's resolved
    generation settings (``call_classes.resolved_config``), resolved here when not given."""
    static_cache = static_cache_class()
    if static_cache is None:
        return "the installed transformers has no static KV cache (StaticCache came in transformers 4.38)"
    if getattr(model.config, "is_encoder_decoder", False):
        return "an encoder-decoder keeps two caches; decode graphs are for decoder-only causal LMs"
    # the settings generate() will use: a generation_config passed in leaves unset what transformers fills in from
    # the model's and its defaults (transformers 5 leaves use_cache, num_beams, ... None until then)
    config = config if config is not None else resolved_config(model, kwargs, settings_of(model, kwargs))
    if kwargs.get("use_cache", getattr(config, "use_cache", True)) is False:
        return "use_cache=False runs the whole sequence again at every step, without a cache"
    beams = kwargs.get("num_beams", getattr(config, "num_beams", 1)) or 1
    if beams > 1:
        return f"beam search (num_beams={beams}) reorders the cache between steps"
    if kwargs.get("assistant_model") is not None or kwargs.get(
        "prompt_lookup_num_tokens", getattr(config, "prompt_lookup_num_tokens", None)
    ):
        return "assisted decoding crops the cache between steps"
    implementation = kwargs.get("cache_implementation", getattr(config, "cache_implementation", None))
    if implementation not in (None, "static"):
        return f"cache_implementation={implementation!r} was asked for; decode graphs need the static cache"
    given = given_cache(kwargs)
    if given is not None and not isinstance(given, static_cache):
        return (
            f"a cache of type {type(given).__name__} was passed in; pass none (launchless brings a static one) or a "
            "transformers StaticCache"
        )
    return None


class _WatchedStreamer:
    """A caller's streamer, and whether anything reached it: a call that handed a token on cannot start over."""

    def __init__(self, streamer: Any) -> None:
        self.streamer, self.received = streamer, False

    def put(self, value: torch.Tensor) -> None:
        self.received = True
        self.streamer.put(value)

    def end(self) -> None:
        self.streamer.end()


class DecodeGraphs:
    """The decode graphs of one wrapped model (see the module docstring): what decodes each ``generate()`` call.

    ``steps``: the decode steps' graphs, routed to while ``generate()`` runs (their name and mode are the wrapper's).
    """

    def __init__(self, *, steps: DecodeSteps) -> None:
        self.name, self.explicit = steps.name, steps.explicit
        self.steps = steps
        self._routing = StepRouting(steps)  # the model's forward sent to the steps while a generation decodes
        # the static caches generations decode on, one per decode graph at most
        self._caches = StaticCaches(limit=lambda: steps.graphs.max_graphs, on_drop=steps.forget)
        self._lock = threading.RLock()  # one generate() at a time: the model's forward is routed while it runs
        self.generate_calls = 0
        self.eager_generations: collections.Counter[str] = collections.Counter()
        self._unusable = ""  # why reading a call raised: every call goes through generate() as called
        self._as_called = AsCalled()  # calls known to go through generate() as called, recognised without reading
        # where each class of calls stands with the host-ahead loop
        self._loop = LoopProofs(name=self.name, routing=self._routing, log_once=steps.graphs.log_once)
        # where each class of calls stands with a static cache the model's class does not vouch for
        self._cache_proofs = CacheProofs(
            name=self.name,
            explicit=self.explicit,
            caches=self._caches,
            lock=self._lock,
            eager_generations=self.eager_generations,
            as_called=self._as_called,
        )

    # ---- generate() ------------------------------------------------------------------------------
    def generate(self, model: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> Any:
        if self._unusable:
            self.eager_generations[self._unusable] += 1  # said once, when it raised
            return model.generate(*args, **kwargs)
        try:  # reading the call: an error here is launchless's (generate() raises the caller's own below)
            called = (args, kwargs)
            args, kwargs = by_keyword(model, args, kwargs)
            # a model whose class does not vouch for the static cache proves it per padding, read from the mask once
            unvouched = not vouches_for_static_cache(model) and given_cache(kwargs) is None
            padded = left_padded(kwargs) if unvouched else None
            known = None if self.explicit else self._as_called.reason(model, kwargs, padded=padded)
            if known is not None:  # said once, when its class was decided
                self.eager_generations[known] += 1
                return model.generate(*args, **kwargs)
            call = GenerateCall(model, args, kwargs, settings_of(model, kwargs))
            why = self._refusal(call)
            kind = call_class(model, args, kwargs, call.settings) if why is None else None
            generator = device_generator(next(model.parameters()).device)
        except Exception as exc:
            if self.explicit:
                raise
            result = model.generate(*called[0], **called[1])  # what raises here is the model's own error
            self._unusable = f"reading a generate() call raised {raised(exc)}"
            self.eager_generations[self._unusable] += 1
            log.warning(
                f"launchless: {self.name}.generate() decodes through transformers' generate() as called, without "
                f"graphs: {self._unusable}. From now on"
            )
            return result
        if kind is None:
            result = self._eager_generation(call, cast(str, why))
            self._as_called.remember(model, kwargs, cast(str, why), padded=padded)
            return result
        if unvouched:  # its cache proofs are per padding, read from the mask passed in
            kind = dataclasses.replace(kind, left_padded=padded)
        record = self._loop.classes.get(kind)
        if record is not None and record.proof is LoopProof.FELL_BACK:
            return self._as_called_again(call, record, padded=padded)
        if unvouched:
            record = self._cache_proofs.classes.get(kind)
            if record is None:
                return self._cache_proofs.prove(call, kind)
            if record.proof is CacheProof.PARTED:
                return self._as_called_again(call, record, padded=padded)
        before = generator.get_state()
        streamer = _WatchedStreamer(kwargs["streamer"]) if kwargs.get("streamer") is not None else None
        try:
            return self._graphed_generation(call, kind=kind, streamer=streamer)
        except Exception as exc:
            if self.explicit or (streamer is not None and streamer.received):
                raise  # a token already reached the caller, or graphs were asked for: the error is theirs to see
            generator.set_state(before)
            result = model.generate(*args, **kwargs)  # what raises here is the model's own error, raised as is
            self._fell_back(kind, exc)
            return result

    def _refusal(self, call: GenerateCall) -> str | None:
        """Why the call cannot decode through graphs (``static_cache_refusal``, or a cache layer a graph cannot
        follow); None when it can."""
        model = call.model
        if model.training:
            return "the model is in training mode; call .eval() to decode through graphs"
        if prompt_shape(call.args, call.kwargs) is None:
            return "generate() was called without input_ids or inputs_embeds"
        why = static_cache_refusal(model, call.kwargs, config=call.config())
        if why is not None:
            return why
        given = given_cache(call.kwargs)
        needed = call.needed()[1]
        if given is not None:
            return unfollowed_layers(model, given, needed=needed) or None
        return self._caches.layers_refusal(model, needed) or None

    def _graphed_generation(self, call: GenerateCall, *, kind: CallClass, streamer: _WatchedStreamer | None) -> Any:
        """The call decoded through the decode graphs: in the host-ahead loop (``decode_loop``) inside
        ``generate()`` where the loop takes it, else in ``generate()``'s own loop."""
        model = call.model
        keyword = cache_keyword(model)
        with self._lock:
            self.generate_calls += 1
            cache = given_cache(call.kwargs)
            own = cache is None
            loop = self._loop.takes(call, given=not own)
            if own:
                cache = call.own_cache(self._caches)
            call_kwargs = call.on_cache(cache)
            if streamer is not None:
                call_kwargs["streamer"] = streamer
            if loop:
                decode = functools.partial(self._loop.decode, model, kind, cache, streamer)
                call_kwargs["custom_generate"] = decoding_method(decode)
            if self.steps.kernels is not None:  # between two generations: compiled decode steps swapped in
                self.steps.kernels.swap_ready()
            replayed, refused = self.steps.replayed, self.steps.refused
            with self._routing.routed(model, cache, keyword):
                result = model.generate(*call.args, **call_kwargs)
            if own and self.steps.replayed == replayed and self.steps.refused > refused:
                self._nothing_replays(kind)
            return self._handed_out(result, cache) if own else result

    def _handed_out(self, result: Any, cache: Any) -> Any:
        """generate()'s output with a copy of this call's static cache where it carries the cache itself
        (``return_dict_in_generate=True``): the next call empties and refills that cache in place, which would change
        the caller's ``past_key_values`` under them. Left out (None), with one WARNING, where it cannot be copied."""
        if not isinstance(result, Mapping):
            return result  # the sequences alone
        for name, value in list(result.items()):
            if value is cache:
                try:
                    result[name] = copy.deepcopy(cache)
                except Exception as exc:  # whatever a cache class raises, the caller gets None
                    result[name] = None
                    self.steps.graphs.log_once(
                        "handout",
                        logging.WARNING,
                        f"launchless: {self.name}.generate(): the output's {name} is left out (None): the static cache "
                        f"is launchless's own, reused by the next call, and could not be copied "
                        f"({type(exc).__name__}: {exc}); pass a transformers StaticCache of your own to keep one",
                    )
        return result

    # ---- through generate() as called --------------------------------------------------------------
    def _eager_generation(self, call: GenerateCall, why: str) -> Any:
        if self.explicit:
            raise CaptureError(
                f"launchless: {self.name}.generate() cannot decode through graphs: {why}. Use cuda_graph='auto' to "
                "decode eager instead",
                reason=why,
            )
        self.eager_generations[why] += 1
        self.steps.graphs.log_once(
            f"generate:{why}",
            logging.WARNING,
            f"launchless: {self.name}.generate() decodes eager: {why}. Shown once.",
        )
        return call.model.generate(*call.args, **call.kwargs)

    def _as_called_again(self, call: GenerateCall, record: ClassRecord, *, padded: bool | None) -> Any:
        """A call of a class that goes through ``generate()`` as called (it fell back, or parted from its own
        generate() on the static cache): said once, when the class was decided; calls like it are recognised
        without reading them from now on."""
        self.eager_generations[record.reason] += 1
        self._as_called.remember(call.model, call.kwargs, record.reason, padded=padded)
        return call.model.generate(*call.args, **call.kwargs)

    def _fell_back(self, kind: CallClass, exc: Exception) -> None:
        """A class whose decoding through graphs raised where ``generate()`` itself does not: it goes through
        ``generate()`` as called from now on, with one WARNING naming the exception and where it was raised."""
        reason = f"decoding through graphs raised {raised(exc)}"
        self._loop.classes[kind] = ClassRecord(LoopProof.FELL_BACK, reason)
        self.eager_generations[reason] += 1
        log.warning(
            f"launchless: {self.name}.generate() decodes through transformers' generate() as called, without "
            f"graphs, for {kind.describe()}: {reason}. Calls like it do so from now on"
        )

    def _nothing_replays(self, kind: CallClass) -> None:
        """A generation whose decode steps all ran eager, their graph refused for good (or the steps not run on the
        static cache at all, ``static_cache.off_cache``): eager steps on a static cache (attention over its whole
        masked length) cost more than ``generate()`` as called, so the class goes through that from then on, said
        once, at INFO: nothing the caller can change. Steps that never ran on the static cache are said so: the
        cache was of no use to them, and generate() as called decodes them with the model's own state."""
        refusal = self.steps.refusal
        if any(refusal.startswith(off.value) for off in OffCache):
            reason = f"no decode step runs on the static cache ({refusal}); generate() as called decodes without it"
        else:
            reason = (
                f"no decode step replays as a graph ({refusal}); eager steps on a static cache cost more than "
                "generate() as called"
            )
        self._loop.classes[kind] = ClassRecord(LoopProof.FELL_BACK, reason)
        self.steps.graphs.log_once(
            f"nothing-replays:{kind}",
            logging.INFO,
            f"launchless: {self.name}.generate() decodes through transformers' generate() as called, without graphs, "
            f"for {kind.describe()}: {reason}. Calls like it do so from now on",
        )

    # ---- reporting -------------------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        """For ``graph_info()["decode"]``: what generate() ran, the graphs and caches held, what decoded eager."""
        return {
            "generate_calls": self.generate_calls,
            "prefills": self.steps.prefills,
            "steps_replayed": self.steps.replayed,
            "steps_eager": dict(self.steps.eager_steps),
            "generations_eager": dict(self.eager_generations),
            "loop_generations": self._loop.loop_generations,
            "loop_exact_inputs": self._loop.loop_exact_inputs,
            "through_generate": dict(self._loop.through_generate),
            "proofs": self._loop.proofs + self._cache_proofs.proofs,
            "classes": class_rows(self._loop.classes),
            "cache_classes": class_rows(self._cache_proofs.classes),
            "static_caches": self._caches.rows(),
            "graphs": self.steps.rows(),
            "fallbacks": self.steps.graphs.fallbacks(lambda key: key.describe()),
            # kernels="compiled": per decode graph, Inductor's program compiling, swapped in, or why eager's stay
            "compiled_kernels": None if self.steps.kernels is None else self.steps.kernels.info(),
        }
