"""The host-ahead decode loop: ``generate()``'s greedy and sampling decoding without waiting for the device per token.

transformers' ``generate()`` waits for the device at every step: it reads whether every sequence has finished
(``unfinished_sequences.max() == 0``), and building the step's attention mask it reads whether the mask hides
anything. A decode graph replays a step's forward in one launch, but the host prepares the next step only once the
device has finished this one, so every token costs the host's work (about a millisecond of Python per step) on top
of the device's. This loop decodes the same tokens with the host running ahead of the device:

1. the prompt's forward (the prefill) and the first decode step take their inputs from transformers' own
   ``prepare_inputs_for_generation``, as ``generate()`` does. From then on the loop advances the inputs itself, in
   place on the device: the chosen token becomes ``input_ids``, the static cache's mask attends one more position,
   position counters move by one. That rule is checked once per call, on the second decode step, against the inputs
   transformers prepares for it (every tensor bit for bit, every other value equal); where they differ, every step
   of the call takes transformers' inputs instead (exact, with its waits) and one line says so;
2. every step's forward goes through the decode graphs (``launchless.decoding``): captured, verified and replayed
   as ``generate()``'s steps are;
3. the next token is chosen as ``generate()`` chooses it, on the device: the last position's logits in float32,
   transformers' own temperature, top-k and top-p warpers where sampling asks for them, ``argmax`` or
   ``multinomial`` on the same random-number generator in the same order, finished sequences padded;
4. the host reads whether every sequence has met an end-of-sequence token once every ``CHECK_EVERY`` steps. Steps
   run past the end are dropped from the result, and the random-number generator is put back where it stood after
   the last kept step, so that a sampling call leaves it as ``generate()`` would. A streamer gets the prompt, the
   first token as soon as it is chosen, and the others at those reads, one ``put`` per step as ``generate()``
   hands them over.

The tokens are those of ``generate()`` on the same static cache. The loop takes the calls it can decode exactly; the
others go through ``generate()`` itself (their decode steps replay graphs all the same): logits processors or stopping
criteria passed in, a generation setting other than the length, sampling (temperature, top-k, top-p) and the end and
padding tokens, a cache passed in, several sequences per prompt, prompts given as embeddings, a prompt that holds the
pad token without an attention mask (``generate()`` infers the mask from it), a model class that overrides
``generate()`` or a step of it the loop stands in for, and a transformers that prepares inputs otherwise.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch

CHECK_EVERY = 16  # decode steps between two reads of whether every sequence has ended

# generate() arguments the loop takes (besides generation settings); everything else is generate()'s alone
LOOP_ARGUMENTS = frozenset({"input_ids", "inputs", "attention_mask", "streamer", "generation_config"})
# generation settings the loop carries out
LOOP_SETTINGS = frozenset(
    {
        "max_new_tokens",
        "max_length",
        "do_sample",
        "temperature",
        "top_k",
        "top_p",
        "eos_token_id",
        "pad_token_id",
        "bos_token_id",
        "decoder_start_token_id",
        "use_cache",
        "cache_implementation",
        "cache_config",
        "compile_config",
        "disable_compile",
        "transformers_version",
    }
)
# settings of decoding methods that never reach this loop (beam search, assisted decoding): whatever their value
OTHER_METHODS = frozenset(
    {
        "early_stopping",
        "length_penalty",
        "low_memory",
        "num_assistant_tokens",
        "num_assistant_tokens_schedule",
        "assistant_confidence_threshold",
        "assistant_lookbehind",
        "target_lookbehind",
        "max_matching_ngram_size",
        "assistant_early_exit",
        "assistant_ensemble_weight",
        "is_assistant",
        "prompt_lookup_num_tokens",
        "speculation_type",
    }
)
FALSY_DEFAULTS = frozenset({"output_attentions", "output_hidden_states"})  # False is as good as unset
ADVANCED_COUNTERS = ("cache_position", "position_ids")  # integer inputs that move by one position per step


@dataclasses.dataclass(frozen=True)
class LoopRequest:
    """A ``generate()`` call as the loop decodes it: the prompt, its 2-D attention mask, how many new tokens, and how
    each is chosen."""

    prompt: torch.Tensor
    attention_mask: torch.Tensor
    new_tokens: int
    do_sample: bool
    warpers: tuple[Callable[[torch.Tensor, torch.Tensor], torch.Tensor], ...]
    eos: torch.Tensor | None  # the end-of-sequence ids, on the prompt's device
    pad: int | None  # what a finished sequence is padded with
    streamer: Any = None  # handed the prompt, then each step's tokens (see ``run_loop``), then end()


# generate()'s own steps the loop stands in for: a model class that overrides one decodes its own way
STOOD_IN_FOR = ("generate", "_sample", "_prefill", "_update_model_kwargs_for_generation")


def loop_request(
    model: torch.nn.Module, kwargs: Mapping[str, Any], *, settings: GenerationSettings | Exception
) -> LoopRequest | str:
    """The call as the loop decodes it, or why the loop does not take it (``generate()`` decodes it then).
    ``settings``: ``settings_of(model, kwargs)``, resolved once for the whole call."""
    overridden = _overridden(model)
    if overridden:
        return f"{type(model).__name__} overrides generate()'s {', '.join(overridden)}"
    others = sorted(k for k in kwargs if k not in LOOP_ARGUMENTS and not _is_setting(k))
    if others:
        return f"generate() was given {', '.join(others)}, which only generate() itself carries out"
    prompt = kwargs.get("input_ids", kwargs.get("inputs"))
    if not isinstance(prompt, torch.Tensor) or prompt.dim() != 2:
        return "the prompt is not a 2-D tensor of token ids"
    if (
        not hasattr(model, "_prepare_generation_config")
        or "next_sequence_length" not in inspect.signature(model.prepare_inputs_for_generation).parameters
    ):
        return "this transformers prepares a step's inputs in a way the loop does not follow"
    if isinstance(settings, Exception):  # generate() raises the same for the user
        return f"the generation settings are not accepted ({type(settings).__name__})"
    config, model_kwargs = settings
    unused = [k for k in model_kwargs if k not in LOOP_ARGUMENTS]
    if unused:
        return f"generate() was given {', '.join(sorted(unused))}, which only generate() itself carries out"
    changed = _changed_settings(model, config)
    if changed:
        return f"the generation settings ask for {', '.join(changed)}, which only generate() itself carries out"
    if (config.num_return_sequences or 1) != 1:
        return f"num_return_sequences={config.num_return_sequences} decodes several sequences per prompt"
    new_tokens = generated_length(model, config, kwargs, prompt=prompt.shape[1]) - prompt.shape[1]
    if new_tokens < 1:
        return "no new token is asked for"
    eos = config.eos_token_id
    eos_list = None if eos is None else [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]
    eos_ids = None if eos_list is None else torch.tensor(eos_list, device=prompt.device)
    pad = config.pad_token_id
    mask = kwargs.get("attention_mask")
    if mask is None:
        if _mask_from_padding(prompt, pad, eos_list):
            return "the prompt holds the pad token and no attention_mask was given; pass the prompt's attention_mask"
        mask = torch.ones_like(prompt)  # what generate() attends to without a mask it can infer
    if pad is None and eos_list is not None:
        pad = eos_list[0]  # as generate() pads finished sequences
    return LoopRequest(
        prompt, mask, new_tokens, bool(config.do_sample), _warpers(config), eos_ids, pad, kwargs.get("streamer")
    )


def _mask_from_padding(prompt: torch.Tensor, pad: int | None, eos: list[int] | None) -> bool:
    """Whether ``generate()``, given no attention mask, infers one from the pad token in the prompt (transformers'
    ``_prepare_attention_mask_for_generation``: a pad token that is no end token and occurs in the prompt); else it
    attends to every position. Reads the prompt on the host once."""
    if pad is None or (eos is not None and pad in eos):
        return False
    return bool((prompt == pad).any())


PROMPT_ARGUMENTS = ("generation_config", "input_ids", "inputs")  # what generate() takes apart from its settings
GenerationSettings = tuple[Any, dict[str, Any]]  # generate()'s resolved config, and the arguments left for the model


def resolved_settings(model: torch.nn.Module, kwargs: Mapping[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The generation settings ``generate()`` will use for this call, by transformers' own resolution (the call's
    arguments over its or the model's generation config over the global defaults), and the arguments left for the
    model. Raises what transformers raises for settings it does not take, and AttributeError for a transformers
    without that resolution."""
    settings = {k: v for k, v in kwargs.items() if k not in PROMPT_ARGUMENTS}
    return model._prepare_generation_config(kwargs.get("generation_config"), **settings)


def settings_of(model: torch.nn.Module, kwargs: Mapping[str, Any]) -> GenerationSettings | Exception:
    """``resolved_settings``, or what it raised: one resolution (about 0.1-0.5 ms of host time) serves the refusals,
    the loop and the static cache's length of a call."""
    try:
        return resolved_settings(model, kwargs)
    except Exception as exc:
        return exc


def generated_length(model: torch.nn.Module, config: Any, kwargs: Mapping[str, Any], *, prompt: int) -> int:
    """The length (prompt included) at which ``generate()`` stops, from its resolved settings ``config``: the prompt
    and ``max_new_tokens`` where set; else ``max_length`` as set by the caller or a generation config, or -- where no
    one set it -- transformers' default taken as new tokens after the prompt, at most the model's positions."""
    if config.max_new_tokens is not None:
        return prompt + config.max_new_tokens
    given = kwargs.get("generation_config")
    unset = (
        kwargs.get("max_length") is None
        and (given is None or given.max_length is None)
        and getattr(model.generation_config, "max_length", None) is None
    )
    if not unset:
        return config.max_length
    positions = getattr(model.config, "max_position_embeddings", None)
    return min(prompt + config.max_length, positions) if positions else prompt + config.max_length


def _overridden(model: torch.nn.Module) -> list[str]:
    """The steps of ``generate()`` that the model's class decodes its own way."""
    from transformers.generation.utils import GenerationMixin

    return [
        name
        for name in STOOD_IN_FOR
        if hasattr(GenerationMixin, name) and getattr(type(model), name, None) is not getattr(GenerationMixin, name)
    ]


@functools.cache
def _settings() -> frozenset[str]:
    """The names ``GenerationConfig`` knows: the generation settings."""
    from transformers import GenerationConfig

    return frozenset(vars(GenerationConfig()))


def _is_setting(name: str) -> bool:
    return name in LOOP_SETTINGS or name in _settings()


def _changed_settings(model: torch.nn.Module, config: Any) -> list[str]:
    """The settings of ``config`` that differ from transformers' plain defaults and that the loop does not carry out."""
    from transformers import GenerationConfig

    plain = GenerationConfig()
    defaults = getattr(model.generation_config, "_get_default_generation_params", None)
    if defaults is not None:
        plain.update(**defaults(), defaults_only=True)
    base = plain.to_dict()
    changed = []
    for key, value in config.to_dict().items():
        if key.startswith("_") or key in LOOP_SETTINGS or key in OTHER_METHODS:
            continue
        if key in FALSY_DEFAULTS and not value:
            continue
        if value != base.get(key):
            changed.append(f"{key}={value!r}")
    return changed


def _warpers(config: Any) -> tuple[Callable[[torch.Tensor, torch.Tensor], torch.Tensor], ...]:
    """transformers' own warpers for a sampling call, in the order ``generate()`` applies them."""
    if not config.do_sample:
        return ()
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    warpers: list[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = []
    if config.temperature is not None and config.temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(config.temperature))
    if config.top_k is not None and config.top_k != 0:
        warpers.append(TopKLogitsWarper(top_k=config.top_k, min_tokens_to_keep=1))
    if config.top_p is not None and config.top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p=config.top_p, min_tokens_to_keep=1))
    return tuple(warpers)


@dataclasses.dataclass(frozen=True)
class LoopResult:
    """The sequences ``generate()`` returns (the prompt, then the new tokens), and where the loop's own inputs for a
    step differed from transformers' (empty: the loop advanced the inputs itself; else every step took
    transformers')."""

    sequences: torch.Tensor
    mismatch: str = ""

    @property
    def advanced(self) -> bool:
        return not self.mismatch


def run_loop(model: torch.nn.Module, request: LoopRequest, *, cache: Any, keyword: str) -> LoopResult:
    """Decodes ``request`` on ``cache`` (empty, static), calling ``model`` once per step -- with its forward routed
    through the decode graphs by the caller; see the module docstring."""
    prompt, batch = request.prompt, request.prompt.shape[0]
    kwargs: dict[str, Any] = {keyword: cache, "attention_mask": request.attention_mask, "use_cache": True}
    sequence = prompt
    tokens = torch.empty(batch, request.new_tokens, dtype=torch.long, device=prompt.device)
    ended = torch.zeros(request.new_tokens, dtype=torch.bool, device=prompt.device)
    unfinished = torch.ones(batch, dtype=torch.long, device=prompt.device)
    generator = _generator(prompt.device) if request.do_sample and request.eos is not None else None
    states: list[torch.Tensor] = []
    takes_first = "is_first_iteration" in inspect.signature(model.prepare_inputs_for_generation).parameters
    prepare = functools.partial(_prepare, model, takes_first=takes_first)
    inputs = prepare(prompt, next_sequence_length=prompt.shape[1], is_first_iteration=True, **kwargs)
    advanced, mismatch = True, ""
    kept, handed, streamer = request.new_tokens, 0, request.streamer
    if streamer is not None:
        streamer.put(prompt.cpu())  # as generate() hands it over first
    for step in range(request.new_tokens):
        if step == 1 or (step > 1 and not advanced):
            inputs = prepare(sequence, next_sequence_length=1, **kwargs)
            if step == 1:
                inputs = _owned(inputs)
        elif step == 2:
            actual = prepare(sequence, next_sequence_length=1, **kwargs)
            _advance(inputs, tokens[:, step - 1], column=prompt.shape[1] + 1)
            mismatch = _difference(inputs, actual)
            advanced = not mismatch
            inputs = inputs if advanced else actual
        elif step > 2:
            _advance(inputs, tokens[:, step - 1], column=prompt.shape[1] + step - 1)
        if generator is not None:
            states.append(generator.get_state())
        output = model(**inputs, return_dict=True)
        chosen = _choose(output.logits, request, prompt)
        if request.eos is not None:
            chosen = chosen * unfinished + request.pad * (1 - unfinished)
            unfinished = unfinished & ~torch.isin(chosen, request.eos)
            ended[step] = unfinished.max() == 0
        tokens[:, step] = chosen
        del output
        if step < 2 or not advanced:  # transformers prepares these steps from the whole sequence and its mask
            sequence = torch.cat([sequence, chosen[:, None]], dim=-1)
            kwargs["attention_mask"] = torch.cat(
                [kwargs["attention_mask"], kwargs["attention_mask"].new_ones(batch, 1)], -1
            )
        boundary = step == 0 or (step + 1) % CHECK_EVERY == 0 or step + 1 == request.new_tokens
        if boundary and (request.eos is not None or streamer is not None):  # the host waits here, and only here
            done = request.eos is not None and bool(ended[: step + 1].any())
            if done:
                kept = int(ended.nonzero()[0]) + 1
            if streamer is not None:
                handed = _hand_over(streamer, tokens, start=handed, stop=min(step + 1, kept))
            if done:
                break
    if generator is not None and kept < len(states):
        generator.set_state(states[kept])  # where it stood after the last kept step's draw
    if streamer is not None:
        streamer.end()
    return LoopResult(torch.cat([prompt, tokens[:, :kept]], dim=-1), mismatch)


def _prepare(model: torch.nn.Module, sequence: torch.Tensor, *, takes_first: bool, **kwargs: Any) -> dict[str, Any]:
    """transformers' inputs for a step, as ``generate()`` asks for them (``is_first_iteration`` only where the
    installed version takes it, ``takes_first``: anything else it does not name would reach the forward)."""
    if not takes_first:
        kwargs.pop("is_first_iteration", None)
    return dict(model.prepare_inputs_for_generation(sequence, **kwargs))


def _hand_over(streamer: Any, tokens: torch.Tensor, *, start: int, stop: int) -> int:
    """Hands the streamer the tokens of steps ``start`` to ``stop`` (one ``put`` per step, as ``generate()`` calls
    it); returns the next step to hand over. The first token goes at once; the rest every ``CHECK_EVERY`` steps."""
    if stop > start:
        host = tokens[:, start:stop].cpu()
        for column in range(stop - start):
            streamer.put(host[:, column])
    return max(start, stop)


def _generator(device: torch.device) -> torch.Generator:
    """The default random-number generator ``torch.multinomial`` draws from on ``device``."""
    if device.type == "cuda":
        return torch.cuda.default_generators[device.index if device.index is not None else torch.cuda.current_device()]
    return torch.default_generator


def _choose(logits: torch.Tensor, request: LoopRequest, prompt: torch.Tensor) -> torch.Tensor:
    """The next token per sequence, as ``generate()`` chooses it (its warpers read the scores only)."""
    scores = logits[:, -1].to(copy=True, dtype=torch.float32)
    for warp in request.warpers:
        scores = warp(prompt, scores)
    if request.do_sample:
        probabilities = torch.nn.functional.softmax(scores, dim=-1)
        return torch.multinomial(probabilities, num_samples=1).squeeze(1)
    return torch.argmax(scores, dim=-1)


def _owned(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """The step's inputs with every tensor the loop advances in place copied: the caller's own tensors stay as
    they were."""
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def _advance(inputs: dict[str, Any], chosen: torch.Tensor, *, column: int) -> None:
    """The next step's inputs, in place: the chosen tokens, the static mask attending ``column`` as it attends the
    column before (the token before), position counters one further."""
    inputs["input_ids"].copy_(chosen[:, None])
    for name in ADVANCED_COUNTERS:
        if isinstance(inputs.get(name), torch.Tensor):
            inputs[name].add_(1)
    mask = inputs.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() == 4 and column < mask.shape[-1]:
        mask.select(-1, column).copy_(mask.select(-1, column - 1))


def _difference(predicted: Mapping[str, Any], actual: Mapping[str, Any]) -> str:
    """Where the loop's own inputs for a step differ from transformers'; empty where they are the same."""
    if set(predicted) != set(actual):
        return f"transformers passes {sorted(actual)}, the loop {sorted(predicted)}"
    for name, value in actual.items():
        mine = predicted[name]
        if isinstance(value, torch.Tensor):
            same = (
                isinstance(mine, torch.Tensor)
                and mine.shape == value.shape
                and mine.dtype == value.dtype
                and bool(torch.equal(mine, value))
            )
        else:
            same = mine is value or _equal(mine, value)
        if not same:
            return f"its {name!r} differs"
    return ""


def _equal(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # values that do not compare (a tensor inside a structure): not the same
        return False
