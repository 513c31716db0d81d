"""The host-ahead decode loop: ``generate()``'s greedy and sampling decoding without waiting for the device per token.

transformers' ``generate()`` waits for the device at every step: it reads whether every sequence has finished
(``unfinished_sequences.max() == 0``), and building the step's attention mask it reads whether the mask hides
anything. A decode graph replays a step's forward in one launch, but the host prepares the next step only once the
device has finished this one, so every token costs the host's work (about a millisecond of Python per step) on top
of the device's. This loop decodes the same tokens with the host running ahead of the device.

It runs inside ``generate()``, as the decoding method ``generate()`` calls once it has prepared the call (its
``custom_generate`` argument takes a callable): transformers resolves the settings, infers the attention mask, builds
the position ids, the end and pad tokens, the length and the logits warpers, puts the prompt to a streamer, exactly
as for its own loop. The loop then:

1. runs the prompt's forward (the prefill) through transformers' own ``_prefill``, and takes the first decode step's
   inputs from ``prepare_inputs_for_generation`` on the keyword arguments ``_update_model_kwargs_for_generation``
   advanced, as ``generate()``'s own loop does. From then on it advances the inputs itself, in place on the device:
   the chosen token becomes ``input_ids``, the static cache's mask attends one more position, position counters
   move by one. That rule is checked once per call, on the second decode step, against the inputs transformers
   prepares for it (every tensor bit for bit, every other value equal); where they differ, every step of the call
   takes transformers' inputs instead (exact, with its waits) and one line says so;
2. sends every step's forward through the decode graphs (``decode_graphs``): captured, verified and replayed
   as ``generate()``'s steps are;
3. chooses the next token as ``generate()`` chooses it, on the device: the last position's logits in float32,
   ``generate()``'s own prepared warpers (temperature, top-k, top-p), ``argmax`` or ``multinomial`` on the same
   random-number generator in the same order, finished sequences padded;
4. reads on the host whether every sequence has met an end token once every ``CHECK_EVERY`` steps. Steps run past
   the end are dropped from the result, and the random-number generator is put back where it stood after the last
   kept step, so that a sampling call leaves it as ``generate()`` would. A streamer gets the first token as soon as
   it is chosen, and the others at those reads, one ``put`` per step as ``generate()`` hands them over.

``own_loop`` runs ``generate()``'s own loop (``_sample``) on the same prepared call: ``loop_proofs`` proves
the host-ahead loop against it on the first call of each kind of call, and sends a kind that parts through it.

The loop takes the calls it can decode exactly; the others go through ``generate()``'s own loop (their decode steps
replay graphs all the same): logits processors or stopping criteria passed in, a generation setting other than the
length, sampling (temperature, top-k, top-p) and the end and padding tokens, a cache passed in, several sequences per
prompt, prompts given as embeddings, a model class that overrides ``generate()`` or a step of it the loop stands in
for, and a transformers that prepares inputs otherwise or takes no decoding method as ``custom_generate``.
"""

from __future__ import annotations

import contextlib
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


# generate()'s own steps the loop stands in for: a model class that overrides one decodes its own way
STOOD_IN_FOR = ("generate", "_sample", "_prefill", "_update_model_kwargs_for_generation")


def loop_refusal(model: torch.nn.Module, kwargs: Mapping[str, Any], *, settings: GenerationSettings | Exception) -> str:
    """Why the loop does not take this ``generate()`` call (``generate()``'s own loop decodes it then); empty where
    it does. Read before ``generate()`` runs, from the call's arguments and ``settings``
    (``settings_of(model, kwargs)``, resolved once for the whole call)."""
    overridden = _overridden(model)
    if overridden:
        return f"{type(model).__name__} overrides generate()'s {', '.join(overridden)}"
    others = sorted(k for k in kwargs if k not in LOOP_ARGUMENTS and not _is_setting(k))
    if others:
        return f"generate() was given {', '.join(others)}, which only generate() itself carries out"
    prompt = kwargs.get("input_ids", kwargs.get("inputs"))
    if not isinstance(prompt, torch.Tensor) or prompt.dim() != 2:
        return "the prompt is not a 2-D tensor of token ids"
    if not _takes_a_decoding_method(type(model)):
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
    if generated_length(model, config, kwargs, prompt=prompt.shape[1]) <= prompt.shape[1]:
        return "no new token is asked for"
    return ""


@functools.cache
def _takes_a_decoding_method(model_class: type) -> bool:
    """Whether the installed transformers runs a decoding method passed to ``generate()`` as ``custom_generate``
    after preparing the call, and prefills and prepares a step's inputs the way the loop follows."""
    return (
        hasattr(model_class, "_prefill")
        and hasattr(model_class, "_sample")
        and "custom_generate" in inspect.signature(model_class.generate).parameters
        and "next_sequence_length" in inspect.signature(model_class.prepare_inputs_for_generation).parameters
    )


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A ``generate()`` call as transformers hands it to its decoding method once prepared: the prompt (expanded),
    its logits processors and stopping criteria, the resolved generation config, and the model's keyword arguments
    (attention mask, position ids, cache, ``logits_to_keep``, ``use_cache``)."""

    input_ids: torch.Tensor
    logits_processor: Any
    stopping_criteria: Any
    generation_config: Any
    model_kwargs: Mapping[str, Any]

    @property
    def new_tokens(self) -> int:
        return int(self.generation_config.max_length) - self.input_ids.shape[1]


# what generate() hands its own decoding methods besides the model's arguments (transformers 5 keeps them from a
# callable one; the caller of ``decoding_method`` holds the streamer)
DECODING_ARGUMENTS = ("streamer", "synced_gpus", "assistant_model", "tokenizer", "assistant_tokenizer")


def decoding_method(decode: Callable[[Prepared], torch.Tensor]) -> Callable[..., torch.Tensor]:
    """A decoding method for ``generate(custom_generate=...)``: ``decode`` gets the prepared call. Its parameters are
    ``_sample``'s (``generate()`` reads them: any other name it would take out of the call's arguments)."""

    def method(
        model: torch.nn.Module,
        input_ids: torch.Tensor,
        logits_processor: Any = None,
        stopping_criteria: Any = None,
        generation_config: Any = None,
        **model_kwargs: Any,
    ) -> torch.Tensor:
        for own in DECODING_ARGUMENTS:  # a transformers that hands them on: the caller keeps its own, not the model
            model_kwargs.pop(own, None)
        return decode(Prepared(input_ids, logits_processor, stopping_criteria, generation_config, model_kwargs))

    return method


def unfollowed(prepared: Prepared) -> str:
    """Why the loop cannot decode the call ``generate()`` prepared exactly; empty where it can: logits processors
    that read more than the scores, stopping criteria other than the length and the end tokens."""
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper
    from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria

    warpers = (TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)
    others = [type(p).__name__ for p in prepared.logits_processor or () if type(p) not in warpers]
    if others:
        return f"generate() prepared logits processors the loop does not carry out ({', '.join(others)})"
    criteria = (MaxLengthCriteria, EosTokenCriteria)
    others = [type(c).__name__ for c in prepared.stopping_criteria or () if type(c) not in criteria]
    if others:
        return f"generate() prepared stopping criteria the loop does not carry out ({', '.join(others)})"
    if prepared.new_tokens < 1:
        return "no new token is asked for"
    return ""


def own_loop(model: torch.nn.Module, prepared: Prepared, *, streamer: Any = None) -> torch.Tensor:
    """``generate()``'s own loop (``_sample``) on the prepared call, as ``generate()`` would have run it."""
    return type(model)._sample(
        model,
        prepared.input_ids,
        logits_processor=prepared.logits_processor,
        stopping_criteria=prepared.stopping_criteria,
        generation_config=prepared.generation_config,
        streamer=streamer,
        **prepared.model_kwargs,
    )


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


def run_loop(model: torch.nn.Module, prepared: Prepared, *, streamer: Any = None) -> LoopResult:
    """Decodes the prepared call on its cache (empty, static), calling ``model`` once per step -- with its forward
    routed through the decode graphs by the caller; see the module docstring."""
    prompt, config = prepared.input_ids, prepared.generation_config
    batch, start, new_tokens = prompt.shape[0], prompt.shape[1], prepared.new_tokens
    model_kwargs = dict(prepared.model_kwargs)  # advanced here: the prepared call stays as generate() made it
    eos = next((c.eos_token_id for c in prepared.stopping_criteria or () if hasattr(c, "eos_token_id")), None)
    pad = config._pad_token_tensor
    do_sample = bool(config.do_sample)
    tokens = torch.empty(batch, new_tokens, dtype=torch.long, device=prompt.device)
    ended = torch.zeros(new_tokens, dtype=torch.bool, device=prompt.device)
    unfinished = torch.ones(batch, dtype=torch.long, device=prompt.device)
    generator = device_generator(prompt.device) if do_sample and eos is not None else None
    states: list[torch.Tensor] = []
    update = functools.partial(model._update_model_kwargs_for_generation, is_encoder_decoder=False)
    sequence = prompt
    inputs: dict[str, Any] = {}
    advanced, mismatch = True, ""
    kept, handed = new_tokens, 0
    if generator is not None:
        states.append(generator.get_state())
    first = not getattr(config, "is_assistant", False)
    output = model._prefill(prompt, config, model_kwargs, is_first_iteration=first)
    optimized = getattr(model, "_optimize_model_for_decode", contextlib.nullcontext)
    with optimized():  # as generate()'s own loop runs the steps after the prefill
        for step in range(new_tokens):
            if step > 0:
                if generator is not None:
                    states.append(generator.get_state())
                if step == 1 or not advanced:
                    inputs = model.prepare_inputs_for_generation(sequence, next_sequence_length=1, **model_kwargs)
                    if step == 1:
                        inputs = _owned(inputs)
                elif step == 2:
                    actual = model.prepare_inputs_for_generation(sequence, next_sequence_length=1, **model_kwargs)
                    _advance(inputs, tokens[:, step - 1], column=start + 1)
                    mismatch = _difference(inputs, actual)
                    advanced = not mismatch
                    inputs = inputs if advanced else dict(actual)
                else:
                    _advance(inputs, tokens[:, step - 1], column=start + step - 1)
                output = model(**inputs, return_dict=True)
            if step < 2 or not advanced:  # transformers prepares these steps from the arguments it advanced
                model_kwargs = update(output, model_kwargs)
            scores = output.logits[:, -1].to(copy=True, dtype=torch.float32, device=prompt.device)
            del output
            chosen = _choose(scores, prepared.logits_processor, sequence, do_sample=do_sample)
            if eos is not None:
                chosen = chosen * unfinished + pad * (1 - unfinished)
                unfinished = unfinished & ~torch.isin(chosen, eos)
                ended[step] = unfinished.max() == 0
            tokens[:, step] = chosen
            if step < 2 or not advanced:
                sequence = torch.cat([sequence, chosen[:, None]], dim=-1)
            boundary = step == 0 or (step + 1) % CHECK_EVERY == 0 or step + 1 == new_tokens
            if boundary and (eos is not None or streamer is not None):  # the host waits here, and only here
                done = eos is not None and bool(ended[: step + 1].any())
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


def _choose(scores: torch.Tensor, processors: Any, sequence: torch.Tensor, *, do_sample: bool) -> torch.Tensor:
    """The next token per sequence, as ``generate()`` chooses it: its prepared warpers (they read the scores only),
    then ``multinomial`` or ``argmax``."""
    if processors:
        scores = processors(sequence, scores)
    if do_sample:
        probabilities = torch.nn.functional.softmax(scores, dim=-1)
        return torch.multinomial(probabilities, num_samples=1).squeeze(1)
    return torch.argmax(scores, dim=-1)


def _hand_over(streamer: Any, tokens: torch.Tensor, *, start: int, stop: int) -> int:
    """Hands the streamer the tokens of steps ``start`` to ``stop`` (one ``put`` per step, as ``generate()`` calls
    it); returns the next step to hand over. The first token goes at once; the rest every ``CHECK_EVERY`` steps."""
    if stop > start:
        host = tokens[:, start:stop].cpu()
        for column in range(stop - start):
            streamer.put(host[:, column])
    return max(start, stop)


def device_generator(device: torch.device) -> torch.Generator:
    """The default random-number generator ``torch.multinomial`` draws from on ``device``."""
    if device.type == "cuda":
        return torch.cuda.default_generators[device.index if device.index is not None else torch.cuda.current_device()]
    return torch.default_generator


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
