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
   source line) through ``generate()`` as called from its next call: eager steps on a static cache cost more.

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
import contextlib
import copy
import dataclasses
import functools
import inspect
import logging
import os
import threading
import traceback
from collections.abc import Iterator, Mapping
from typing import Any, cast

import torch

from ..core.compiled_programs import ROUTING, SpareCompiler
from ..errors import CaptureError
from ..options import KernelsMode
from .cache_layers import checked_writes, uneven_lengths, unfollowed_layers
from .call_classes import (
    AsCalled,
    CacheProof,
    CallClass,
    ClassRecord,
    LoopProof,
    call_class,
    left_padded,
    parting,
    prompt_shape,
    resolved_config,
    sequences,
    vouches_for_static_cache,
    with_padding,
)
from .decode_loop import (
    GenerationSettings,
    Prepared,
    decoding_method,
    device_generator,
    generated_length,
    loop_refusal,
    own_loop,
    run_loop,
    settings_of,
    unfollowed,
)
from .decode_steps import DecodeSteps
from .static_cache import (
    CACHE_KEYWORDS,
    cache_keyword,
    given_cache,
    static_cache_class,
)
from .static_caches import StaticCaches

log = logging.getLogger("launchless")


def static_cache_refusal(model: torch.nn.Module, kwargs: Mapping[str, Any], *, config: Any = None) -> str | None:
    """Why this ``generate()`` call cannot decode through graphs; None when it can. ``config``: the call's resolved
    generation settings (``_resolved_config``), resolved here when not given."""
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


def _raised(exc: BaseException) -> str:
    """An exception and the source line that raised it, for a log line."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = ""
    if frames:
        frame = frames[-1]
        where = f" at {os.path.basename(frame.filename)}:{frame.lineno}" + (f" ({frame.line})" if frame.line else "")
    return f"{type(exc).__name__}: {exc}{where}"


class DecodeGraphs:
    """The decode graphs of one wrapped model (see the module docstring)."""

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        name: str,
        explicit: bool,
        capture_after: int,
        max_graphs: int,
        warmup: int,
        verify: str,
        tolerance_ulps: float,
        kernels: KernelsMode = "eager",
        spare: SpareCompiler | None = None,
    ) -> None:
        self.name, self.explicit = name, explicit
        self.steps = DecodeSteps(  # the decode steps' graphs, routed to while generate() runs
            model,
            name=name,
            explicit=explicit,
            capture_after=capture_after,
            max_graphs=max_graphs,
            warmup=warmup,
            verify=verify,
            tolerance_ulps=tolerance_ulps,
            kernels=kernels,
            spare=spare,
        )
        # the static caches generations decode on, one per decode graph at most
        self._caches = StaticCaches(limit=lambda: self.steps.graphs.max_graphs, on_drop=self.steps.forget)
        self._lock = threading.RLock()  # one generate() at a time: the model's forward is routed while it runs
        self.generate_calls = 0
        self.eager_generations: collections.Counter[str] = collections.Counter()
        self.loop_generations = self.loop_exact_inputs = 0  # generations the host-ahead loop decoded
        self.through_generate: collections.Counter[str] = collections.Counter()  # why others went through generate()
        self.proofs = 0  # first calls of a class, decoded both ways
        self._classes: dict[CallClass, ClassRecord] = {}  # where each class of calls stands with the loop
        # where each class of calls stands with a static cache the model's class does not vouch for
        self._cache_classes: dict[CallClass, ClassRecord] = {}
        self._forwards = [0]  # forwards of the routed model in this decoding: the first is the prompt's
        self._unusable = ""  # why reading a call raised: every call goes through generate() as called
        self._as_called = AsCalled()  # calls known to go through generate() as called, recognised without reading

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
            settings = settings_of(model, kwargs)
            why = self._refusal(model, args, kwargs, settings=settings)
            kind = call_class(model, args, kwargs, settings) if why is None else None
            generator = device_generator(next(model.parameters()).device)
        except Exception as exc:
            if self.explicit:
                raise
            result = model.generate(*called[0], **called[1])  # what raises here is the model's own error
            self._unusable = f"reading a generate() call raised {_raised(exc)}"
            self.eager_generations[self._unusable] += 1
            log.warning(
                f"launchless: {self.name}.generate() decodes through transformers' generate() as called, without "
                f"graphs: {self._unusable}. From now on"
            )
            return result
        if kind is None:
            result = self._eager_generation(model, cast(str, why), args, kwargs)
            self._as_called.remember(model, kwargs, cast(str, why), padded=padded)
            return result
        if unvouched:  # its cache proofs are per padding, read from the mask passed in
            kind = dataclasses.replace(kind, left_padded=padded)
        record = self._classes.get(kind)
        if record is not None and record.proof is LoopProof.FELL_BACK:
            return self._as_called_again(model, record, args, kwargs, padded=padded)
        if unvouched:
            record = self._cache_classes.get(kind)
            if record is None:
                return self._prove_cache(model, args, kwargs, settings=settings, kind=kind)
            if record.proof is CacheProof.PARTED:
                return self._as_called_again(model, record, args, kwargs, padded=padded)
        before = generator.get_state()
        streamer = _WatchedStreamer(kwargs["streamer"]) if kwargs.get("streamer") is not None else None
        try:
            return self._graphed_generation(model, args, kwargs, settings=settings, kind=kind, streamer=streamer)
        except Exception as exc:
            if self.explicit or (streamer is not None and streamer.received):
                raise  # a token already reached the caller, or graphs were asked for: the error is theirs to see
            generator.set_state(before)
            result = model.generate(*args, **kwargs)  # what raises here is the model's own error, raised as is
            self._fell_back(kind, exc)
            return result

    def _as_called_again(
        self, model: torch.nn.Module, record: ClassRecord, args: tuple, kwargs: dict[str, Any], *, padded: bool | None
    ) -> Any:
        """A call of a class that goes through ``generate()`` as called (it fell back, or parted from its own
        generate() on the static cache): said once, when the class was decided; calls like it are recognised
        without reading them from now on."""
        self.eager_generations[record.reason] += 1
        self._as_called.remember(model, kwargs, record.reason, padded=padded)
        return model.generate(*args, **kwargs)

    def _prove_cache(
        self,
        model: torch.nn.Module,
        args: tuple,
        kwargs: dict[str, Any],
        *,
        settings: GenerationSettings | Exception,
        kind: CallClass,
    ) -> Any:
        """The first call of a class whose model's class does not vouch for the static cache
        (``vouches_for_static_cache``) decodes twice from the same random-number generator state: eager on the
        static cache later calls would replay graphs on, every write to it checked on the host first (a write past
        its end is a device-side assert on the GPU, fatal to the process), then by ``model.generate()`` as called
        (the model's own cache, the caller's streamer), whose output the caller gets. Tokens and generator state
        alike, and one length in every attention layer: later calls of the class decode through graphs (whose steps
        are verified against eager on the same cache). Else one WARNING says where they parted, or what the static
        cache raised, and the class goes through ``generate()`` as called from then on."""
        generator = device_generator(next(model.parameters()).device)
        before = generator.get_state()
        quiet = {k: v for k, v in kwargs.items() if k != "streamer"}  # the caller's streamer gets eager's tokens
        static, parted = None, ""
        try:
            with self._lock:
                cache = self._own_cache(model, args, quiet, settings=settings)
                with checked_writes(cache):
                    static = model.generate(*args, **self._static_call(model, quiet, cache))
                parted = uneven_lengths(cache)
        except Exception as exc:
            parted = f"decoding on the static cache raised {_raised(exc)}"
        static_state = generator.get_state()
        generator.set_state(before)
        expected = model.generate(*args, **kwargs)  # what raises here is the model's own error, raised as is
        if not parted:
            length = (prompt_shape(args, kwargs) or (0, 0))[1]
            start = length if kwargs.get("inputs_embeds") is None else 0  # an embedded prompt is not in the output
            parted = parting(sequences(expected), sequences(static), start=start)
            if not parted and not torch.equal(generator.get_state(), static_state):
                parted = "the tokens agree, the random-number generator is left elsewhere"
        self.proofs += 1
        if not parted:
            self._cache_classes[kind] = ClassRecord(CacheProof.PROVEN, "")
            return expected
        reason = (
            f"{kind.model} does not tell transformers it runs on a static cache, and decoding on one parted from "
            f"generate() as called for {kind.describe()}: {parted}"
        )
        self._cache_classes[kind] = ClassRecord(CacheProof.PARTED, reason)
        self.eager_generations[reason] += 1
        if self.explicit:
            raise CaptureError(
                f"launchless: {self.name}.generate() cannot decode through graphs: {reason}. Use cuda_graph='auto' to "
                "decode through generate() as called instead",
                reason=reason,
            )
        log.warning(
            f"launchless: {self.name}.generate() decodes through transformers' generate() as called, without graphs: "
            f"{reason}. Calls like it do so from now on"
        )
        self._as_called.remember(model, kwargs, reason, padded=kind.left_padded)
        return expected

    def _static_call(self, model: torch.nn.Module, kwargs: Mapping[str, Any], cache: Any) -> dict[str, Any]:
        """The call's arguments with ``cache`` passed as its cache, and transformers kept from compiling for it."""
        call = {k: v for k, v in kwargs.items() if k not in CACHE_KEYWORDS} | {cache_keyword(model): cache}
        if hasattr(model.generation_config, "disable_compile"):
            call["disable_compile"] = True  # transformers would compile a static-cache forward
        # the cache is passed: transformers refuses a cache_implementation with it, and fills one a caller's own
        # generation_config leaves unset from the model's, so it is cleared wherever it was set
        configs = (kwargs.get("generation_config"), model.generation_config)
        asked = [kwargs.get("cache_implementation")] + [getattr(c, "cache_implementation", None) for c in configs]
        if any(a is not None for a in asked):
            call["cache_implementation"] = None
        return call

    def _graphed_generation(
        self,
        model: torch.nn.Module,
        args: tuple,
        kwargs: dict[str, Any],
        *,
        settings: GenerationSettings | Exception,
        kind: CallClass,
        streamer: _WatchedStreamer | None,
    ) -> Any:
        """The call decoded through the decode graphs: in the host-ahead loop (``decode_loop``) inside
        ``generate()`` where the loop takes it, else in ``generate()``'s own loop."""
        keyword = cache_keyword(model)
        with self._lock:
            self.generate_calls += 1
            cache = given_cache(kwargs)
            own = cache is None
            loop = self._loop_request(model, args, kwargs, given=not own, settings=settings)
            if own:
                cache = self._own_cache(model, args, kwargs, settings=settings)
            call_kwargs = self._static_call(model, kwargs, cache)
            if streamer is not None:
                call_kwargs["streamer"] = streamer
            if loop:
                decode = functools.partial(self._decode, model, kind, cache, streamer)
                call_kwargs["custom_generate"] = decoding_method(decode)
            if self.steps.kernels is not None:  # between two generations: compiled decode steps swapped in
                self.steps.kernels.swap_ready()
            replayed, refused = self.steps.replayed, self.steps.refused
            with self._routed(model, cache, keyword):
                result = model.generate(*args, **call_kwargs)
            if own and self.steps.replayed == replayed and self.steps.refused > refused:
                self._nothing_replays(kind)
            return self._handed_out(result, cache) if own else result

    def _nothing_replays(self, kind: CallClass) -> None:
        """A generation whose decode steps all ran eager, their graph refused for good: eager steps on the static cache
        (attention over its whole masked length) cost more than ``generate()`` as called, so the class goes through
        that from then on, said once."""
        reason = (
            f"no decode step replays as a graph ({self.steps.refusal}); eager steps on a static cache cost more than "
            "generate() as called"
        )
        self._classes[kind] = ClassRecord(LoopProof.FELL_BACK, reason)
        self.steps.graphs.log_once(
            f"nothing-replays:{kind}",
            logging.INFO,
            f"launchless: {self.name}.generate() decodes through transformers' generate() as called, without graphs, "
            f"for {kind.describe()}: {reason}. Calls like it do so from now on",
        )

    def _decode(
        self, model: torch.nn.Module, kind: CallClass, cache: Any, streamer: Any, prepared: Prepared
    ) -> torch.Tensor:
        """The decoding method ``generate()`` runs once it has prepared the call: the host-ahead loop for a class of
        calls proven to decode in it as ``generate()``'s own loop does, that own loop for a class that parted, and
        both -- the proof -- at the first call of a class."""
        why = unfollowed(prepared)
        if why:
            self._note_through_generate(why)
            return own_loop(model, prepared, streamer=streamer)
        kind = with_padding(kind, prepared)
        record = self._classes.get(kind)
        if record is None:
            return self._prove(model, kind, cache, streamer, prepared)
        if record.proof is LoopProof.PARTED:
            self.through_generate[record.reason] += 1
            return own_loop(model, prepared, streamer=streamer)
        return self._loop(model, prepared, streamer).sequences

    def _prove(
        self, model: torch.nn.Module, kind: CallClass, cache: Any, streamer: Any, prepared: Prepared
    ) -> torch.Tensor:
        """The first call of a class decodes both ways on the same graphs: ``generate()``'s own loop (the caller's
        result, its streamer, where it leaves the random-number generator), then the host-ahead loop from the same
        generator state on the emptied cache. Tokens and generator state alike: the class is proven and later calls
        run the loop; else one WARNING says where they parted and the class keeps to ``generate()``'s own loop."""
        generator = device_generator(prepared.input_ids.device)
        before = generator.get_state()
        expected = own_loop(model, prepared, streamer=streamer)
        after = generator.get_state()
        cache.reset()  # in place: the graphs read the same tensors
        generator.set_state(before)
        self._prefill_next()
        try:
            result = self._loop(model, prepared, None, proof=True)
            parted = parting(expected, result.sequences, start=prepared.input_ids.shape[1])
            if not parted and not torch.equal(generator.get_state(), after):
                parted = "the tokens agree, the random-number generator is left elsewhere"
        except Exception as exc:  # the loop's own failure: generate()'s own loop decodes this class
            parted = f"the loop raised {_raised(exc)}"
        finally:
            generator.set_state(after)
        self.proofs += 1
        if not parted:
            self._classes[kind] = ClassRecord(LoopProof.PROVEN, "")
            return expected
        reason = f"the host-ahead loop parted from generate()'s own loop for {kind.describe()}: {parted}"
        self._classes[kind] = ClassRecord(LoopProof.PARTED, reason)
        self.through_generate[reason] += 1
        log.warning(
            f"launchless: {self.name}.generate(): {reason}; calls like it decode through generate()'s own loop, "
            "which waits for the GPU at every token (its steps still replay graphs)"
        )
        return expected

    def _fell_back(self, kind: CallClass, exc: Exception) -> None:
        """A class whose decoding through graphs raised where ``generate()`` itself does not: it goes through
        ``generate()`` as called from now on, with one WARNING naming the exception and where it was raised."""
        reason = f"decoding through graphs raised {_raised(exc)}"
        self._classes[kind] = ClassRecord(LoopProof.FELL_BACK, reason)
        self.eager_generations[reason] += 1
        log.warning(
            f"launchless: {self.name}.generate() decodes through transformers' generate() as called, without "
            f"graphs, for {kind.describe()}: {reason}. Calls like it do so from now on"
        )

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

    @contextlib.contextmanager
    def _routed(self, model: torch.nn.Module, cache: Any, keyword: str) -> Iterator[None]:
        """The model's forward sent through ``_step`` while the block runs: calling the model (its ``__call__`` and
        hooks stay the way in) runs a decode step through the graphs. An instance's own forward is put back after."""
        own = model.__dict__.get("forward")
        forward = own or type(model).forward.__get__(model)
        calls = self._forwards = [0]  # the first forward is the prefill (``_prefill_next`` starts over)

        @functools.wraps(forward)  # generate() reads the forward's parameters
        def step(*step_args: Any, **step_kwargs: Any) -> Any:
            calls[0] += 1
            return self.steps.step(forward, cache, keyword, calls[0] == 1, step_args, step_kwargs)

        setattr(step, ROUTING, True)  # a compile of the decode step sends the model without it
        model.forward = step
        try:
            yield
        finally:
            if own is None:
                del model.__dict__["forward"]
            else:
                model.forward = own

    def _prefill_next(self) -> None:
        """The next forward of the routed model is a prompt's (a second decoding of the same call): it runs eager."""
        self._forwards[0] = 0

    def _loop_request(
        self,
        model: torch.nn.Module,
        args: tuple,
        kwargs: Mapping[str, Any],
        *,
        given: bool,
        settings: GenerationSettings | Exception,
    ) -> bool:
        """Whether the host-ahead loop (``decode_loop``) may decode the call; where not, one line per
        reason says why ``generate()``'s own loop decodes it."""
        if args:
            why = "generate() was given positional arguments"
        elif given:
            why = "a cache was passed in: generate() decodes on it as given"
        else:
            why = loop_refusal(model, kwargs, settings=settings)
            if not why:
                return True
        self._note_through_generate(why)
        return False

    def _note_through_generate(self, why: str) -> None:
        self.through_generate[why] += 1
        self.steps.graphs.log_once(
            f"loop:{why}",
            logging.INFO,
            f"launchless: {self.name}.generate() decodes through transformers' own loop, which waits for the GPU at "
            f"every token (its steps still replay graphs): {why}. Shown once.",
        )

    def _loop(self, model: torch.nn.Module, prepared: Prepared, streamer: Any, *, proof: bool = False) -> Any:
        """The host-ahead loop's decoding of the prepared call, the model's forward routed (``_routed``)."""
        result = run_loop(model, prepared, streamer=streamer)
        if not proof:
            self.loop_generations += 1
        if not result.advanced:
            self.loop_exact_inputs += 1
            self.steps.graphs.log_once(
                "loop:inputs",
                logging.INFO,
                f"launchless: {self.name}.generate(): the decode loop's own inputs for a step differ from "
                f"transformers' ({result.mismatch}); every step takes transformers' inputs, waiting for the GPU",
            )
        return result

    def _refusal(
        self,
        model: torch.nn.Module,
        args: tuple,
        kwargs: Mapping[str, Any],
        *,
        settings: GenerationSettings | Exception,
    ) -> str | None:
        if model.training:
            return "the model is in training mode; call .eval() to decode through graphs"
        if prompt_shape(args, kwargs) is None:
            return "generate() was called without input_ids or inputs_embeds"
        why = static_cache_refusal(model, kwargs, config=resolved_config(model, kwargs, settings))
        if why is not None:
            return why
        given = given_cache(kwargs)
        needed = self._needed(model, args, kwargs, settings=settings)[1]
        if given is not None:
            return unfollowed_layers(model, given, needed=needed) or None
        return self._caches.layers_refusal(model, needed) or None

    def _needed(
        self,
        model: torch.nn.Module,
        args: tuple,
        kwargs: Mapping[str, Any],
        *,
        settings: GenerationSettings | Exception,
    ) -> tuple[int, int]:
        """(sequences, tokens each) a call's generation needs: the batch times the sequences returned per prompt, and
        the prompt with its new tokens."""
        batch, prompt = prompt_shape(args, kwargs)
        config = resolved_config(model, kwargs, settings)
        batch *= getattr(config, "num_return_sequences", 1) or 1
        if getattr(config, "max_length", None) is None and getattr(config, "max_new_tokens", None) is None:
            config = copy.copy(config)  # the call's settings, shared with the loop, stay as resolved
            config.max_length = DEFAULT_MAX_LENGTH  # a transformers that fills its defaults in later
        return batch, generated_length(model, config, kwargs, prompt=prompt)

    def _eager_generation(self, model: torch.nn.Module, why: str, args: tuple, kwargs: dict[str, Any]) -> Any:
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
        return model.generate(*args, **kwargs)

    def _own_cache(
        self,
        model: torch.nn.Module,
        args: tuple,
        kwargs: Mapping[str, Any],
        *,
        settings: GenerationSettings | Exception,
    ) -> Any:
        """This call's static cache (``static_caches``), emptied."""
        sequences, needed = self._needed(model, args, kwargs, settings=settings)
        return self._caches.cache(model, sequences=sequences, needed=needed)

    # ---- reporting -------------------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        """For ``graph_info()["decode"]``: what generate() ran, the graphs and caches held, what decoded eager."""

        return {
            "generate_calls": self.generate_calls,
            "prefills": self.steps.prefills,
            "steps_replayed": self.steps.replayed,
            "steps_eager": dict(self.steps.eager_steps),
            "generations_eager": dict(self.eager_generations),
            "loop_generations": self.loop_generations,
            "loop_exact_inputs": self.loop_exact_inputs,
            "through_generate": dict(self.through_generate),
            "proofs": self.proofs,
            "classes": [
                {**kind.as_dict(), "proof": record.proof.value, "reason": record.reason}
                for kind, record in self._classes.items()
            ],
            "cache_classes": [
                {**kind.as_dict(), "proof": record.proof.value, "reason": record.reason}
                for kind, record in self._cache_classes.items()
            ],
            "static_caches": self._caches.rows(),
            "graphs": self.steps.rows(),
            "fallbacks": self.steps.graphs.fallbacks(lambda key: key.describe()),
            # kernels="compiled": per decode graph, Inductor's program compiling, swapped in, or why eager's stay
            "compiled_kernels": None if self.steps.kernels is None else self.steps.kernels.info(),
        }


DEFAULT_MAX_LENGTH = 20  # transformers' own default length of a generation (prompt included)


def by_keyword(model: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    """A generate() call's positional arguments under the names of generate()'s own parameters (``generate(ids)``
    is ``generate(inputs=ids)``), so that it decodes as the same call made by keyword does. Left as given where they
    do not bind by name alone (more of them than named parameters, or a name also given by keyword): generate()
    then takes them, and says what is wrong with them, itself."""
    if not args:
        return args, kwargs
    try:
        parameters = inspect.signature(model.generate).parameters
        bound = inspect.Signature([p for p in parameters.values() if p.kind is p.POSITIONAL_OR_KEYWORD]).bind_partial(
            *args
        )
    except (TypeError, ValueError):
        return args, kwargs
    if bound.arguments.keys() & kwargs.keys():
        return args, kwargs
    return (), {**bound.arguments, **kwargs}
