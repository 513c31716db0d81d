"""Which loop decodes a class of calls: the host-ahead loop once proven at the class's first call, else generate()'s.

``generate()`` waits for the GPU at every token; the host-ahead loop (``decode_loop``) does not, but it must decode
as ``generate()``'s own loop does. The first call of a class (``call_classes.CallClass``) decodes both ways on the
same graphs, from the same random-number generator state, and the caller gets ``generate()``'s own loop's tokens.
Tokens and generator alike: later calls of the class run the host-ahead loop; else one WARNING says where they
parted, and the class keeps to ``generate()``'s own loop (its steps still replay graphs). A call the loop cannot
decode exactly (settings, processors or a cache it does not follow) goes through ``generate()``'s own loop, with one
line per reason.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable
from typing import Any

import torch

from .call_classes import CallClass, ClassRecord, LoopProof, parting, raised, with_padding
from .decode_loop import Prepared, device_generator, loop_refusal, own_loop, run_loop, unfollowed
from .generate_call import GenerateCall
from .step_routing import StepRouting

log = logging.getLogger("launchless")


class LoopProofs:
    """Where each class of calls stands with the host-ahead loop, and the decoding method ``generate()`` runs.

    ``log_once``: the decode steps' graph cache's, so that a line is said once per wrapped model.
    """

    def __init__(self, *, name: str, routing: StepRouting, log_once: Callable[[str, int, str], None]) -> None:
        self.name, self.routing, self._log_once = name, routing, log_once
        self.classes: dict[CallClass, ClassRecord] = {}  # where each class of calls stands with the loop
        self.loop_generations = self.loop_exact_inputs = 0  # generations the host-ahead loop decoded
        self.through_generate: collections.Counter[str] = collections.Counter()  # why others went through generate()
        self.proofs = 0  # first calls of a class, decoded both ways

    def takes(self, call: GenerateCall, *, given: bool) -> bool:
        """Whether the host-ahead loop (``decode_loop``) may decode the call; where not, one line per
        reason says why ``generate()``'s own loop decodes it."""
        if call.args:
            why = "generate() was given positional arguments"
        elif given:
            why = "a cache was passed in: generate() decodes on it as given"
        else:
            why = loop_refusal(call.model, call.kwargs, settings=call.settings)
            if not why:
                return True
        self.note_through_generate(why)
        return False

    def note_through_generate(self, why: str) -> None:
        self.through_generate[why] += 1
        self._log_once(
            f"loop:{why}",
            logging.INFO,
            f"launchless: {self.name}.generate() decodes through transformers' own loop, which waits for the GPU at "
            f"every token (its steps still replay graphs): {why}. Shown once.",
        )

    def decode(
        self, model: torch.nn.Module, kind: CallClass, cache: Any, streamer: Any, prepared: Prepared
    ) -> torch.Tensor:
        """The decoding method ``generate()`` runs once it has prepared the call: the host-ahead loop for a class of
        calls proven to decode in it as ``generate()``'s own loop does, that own loop for a class that parted, and
        both -- the proof -- at the first call of a class."""
        why = unfollowed(prepared)
        if why:
            self.note_through_generate(why)
            return own_loop(model, prepared, streamer=streamer)
        kind = with_padding(kind, prepared)
        record = self.classes.get(kind)
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
        self.routing.prefill_next()
        try:
            result = self._loop(model, prepared, None, proof=True)
            parted = parting(expected, result.sequences, start=prepared.input_ids.shape[1])
            if not parted and not torch.equal(generator.get_state(), after):
                parted = "the tokens agree, the random-number generator is left elsewhere"
        except Exception as exc:  # the loop's own failure: generate()'s own loop decodes this class
            parted = f"the loop raised {raised(exc)}"
        finally:
            generator.set_state(after)
        self.proofs += 1
        if not parted:
            self.classes[kind] = ClassRecord(LoopProof.PROVEN, "")
            return expected
        reason = f"the host-ahead loop parted from generate()'s own loop for {kind.describe()}: {parted}"
        self.classes[kind] = ClassRecord(LoopProof.PARTED, reason)
        self.through_generate[reason] += 1
        log.warning(
            f"launchless: {self.name}.generate(): {reason}; calls like it decode through generate()'s own loop, "
            "which waits for the GPU at every token (its steps still replay graphs)"
        )
        return expected

    def _loop(self, model: torch.nn.Module, prepared: Prepared, streamer: Any, *, proof: bool = False) -> Any:
        """The host-ahead loop's decoding of the prepared call, the model's forward routed (``step_routing``)."""
        result = run_loop(model, prepared, streamer=streamer)
        if not proof:
            self.loop_generations += 1
        if not result.advanced:
            self.loop_exact_inputs += 1
            self._log_once(
                "loop:inputs",
                logging.INFO,
                f"launchless: {self.name}.generate(): the decode loop's own inputs for a step differ from "
                f"transformers' ({result.mismatch}); every step takes transformers' inputs, waiting for the GPU",
            )
        return result
