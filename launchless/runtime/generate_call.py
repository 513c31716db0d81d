"""One ``generate()`` call as decode graphs read it: the model, its arguments by keyword, the settings it resolves to.

A call is read once (transformers' resolution of its settings deep-copies the generation config): what it needs of a
static cache (its sequences and their length, prompt and new tokens), and the arguments that hand it a cache of
launchless's own, are asked of that one reading by every way the call may decode.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
from typing import Any

import torch

from .call_classes import prompt_shape, resolved_config
from .decode_loop import GenerationSettings, generated_length
from .static_cache import CACHE_KEYWORDS, cache_keyword
from .static_caches import StaticCaches

DEFAULT_MAX_LENGTH = 20  # transformers' own default length of a generation (prompt included)


@dataclasses.dataclass(frozen=True)
class GenerateCall:
    """A ``generate()`` call read: the model, its arguments (``by_keyword``), and its resolved generation settings
    (``decode_loop.settings_of``: the settings, or what transformers raised resolving them)."""

    model: torch.nn.Module
    args: tuple
    kwargs: dict[str, Any]
    settings: GenerationSettings | Exception

    def config(self) -> Any:
        """The generation settings ``generate()`` will use for this call (``call_classes.resolved_config``)."""
        return resolved_config(self.model, self.kwargs, self.settings)

    def needed(self) -> tuple[int, int]:
        """(sequences, tokens each) the call's generation needs: the batch times the sequences returned per prompt,
        and the prompt with its new tokens."""
        batch, prompt = prompt_shape(self.args, self.kwargs)
        config = self.config()
        batch *= getattr(config, "num_return_sequences", 1) or 1
        if getattr(config, "max_length", None) is None and getattr(config, "max_new_tokens", None) is None:
            config = copy.copy(config)  # the call's settings, shared with the loop, stay as resolved
            config.max_length = DEFAULT_MAX_LENGTH  # a transformers that fills its defaults in later
        return batch, generated_length(self.model, config, self.kwargs, prompt=prompt)

    def own_cache(self, caches: StaticCaches) -> Any:
        """This call's static cache from ``caches``, emptied."""
        sequences, needed = self.needed()
        return caches.cache(self.model, sequences=sequences, needed=needed)

    def on_cache(self, cache: Any) -> dict[str, Any]:
        """The call's arguments with ``cache`` passed as its cache, and transformers kept from compiling for it."""
        model, kwargs = self.model, self.kwargs
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

    def new_tokens_start(self) -> int:
        """Where the call's new tokens begin in its output: after the prompt's ids (an embedded prompt is not in it)."""
        length = (prompt_shape(self.args, self.kwargs) or (0, 0))[1]
        return length if self.kwargs.get("inputs_embeds") is None else 0

    def quiet(self) -> GenerateCall:
        """The call without its streamer: a decoding whose tokens the caller does not get."""
        return dataclasses.replace(self, kwargs={k: v for k, v in self.kwargs.items() if k != "streamer"})


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
