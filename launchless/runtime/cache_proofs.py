"""A static cache proven per class of calls, where the model's class does not tell transformers it runs on one.

transformers takes a ``StaticCache`` from any causal LM; most classes that do not vouch for it
(``call_classes.vouches_for_static_cache``) decode on it as on their own cache, some overflow it, ignore it or mask it
otherwise. Decode graphs replay on the static cache, so for such a model the first call of each class of calls
decodes both ways, and later calls of the class decode through graphs only where they agreed; else the class goes
through ``generate()`` as called from then on.
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import Any

import torch

from ..errors import CaptureError
from .cache_layers import checked_writes, uneven_lengths
from .call_classes import AsCalled, CacheProof, CallClass, ClassRecord, parting, raised, sequences
from .decode_loop import device_generator
from .generate_call import GenerateCall
from .static_caches import StaticCaches

log = logging.getLogger("launchless")


class CacheProofs:
    """Where each class of calls stands with a static cache its model's class does not vouch for.

    ``explicit``: ``cuda_graph=True`` (a class that parted raises). ``eager_generations`` and ``as_called``: the
    decode graphs' own count of what decoded as called and why, and their memory of calls known to (a class that
    parted goes through ``generate()`` as called from then on, recognised without reading its calls).
    """

    def __init__(
        self,
        *,
        name: str,
        explicit: bool,
        caches: StaticCaches,
        lock: threading.RLock,
        eager_generations: collections.Counter[str],
        as_called: AsCalled,
    ) -> None:
        self.name, self.explicit, self._caches, self._lock = name, explicit, caches, lock
        self._eager_generations, self._as_called = eager_generations, as_called
        self.classes: dict[CallClass, ClassRecord] = {}
        self.proofs = 0  # first calls of a class, decoded both ways

    def prove(self, call: GenerateCall, kind: CallClass) -> Any:
        """The first call of a class whose model's class does not vouch for the static cache
        (``vouches_for_static_cache``) decodes twice from the same random-number generator state: eager on the
        static cache later calls would replay graphs on, every write to it checked on the host first (a write past
        its end is a device-side assert on the GPU, fatal to the process), then by ``model.generate()`` as called
        (the model's own cache, the caller's streamer), whose output the caller gets. Tokens and generator state
        alike, and one length in every attention layer: later calls of the class decode through graphs (whose steps
        are verified against eager on the same cache). Else one WARNING says where they parted, or what the static
        cache raised, and the class goes through ``generate()`` as called from then on."""
        model, args, kwargs = call.model, call.args, call.kwargs
        generator = device_generator(next(model.parameters()).device)
        before = generator.get_state()
        quiet = call.quiet()  # the caller's streamer gets eager's tokens
        static, parted = None, ""
        try:
            with self._lock:
                cache = quiet.own_cache(self._caches)
                with checked_writes(cache):
                    static = model.generate(*args, **quiet.on_cache(cache))
                parted = uneven_lengths(cache)
        except Exception as exc:
            parted = f"decoding on the static cache raised {raised(exc)}"
        static_state = generator.get_state()
        generator.set_state(before)
        expected = model.generate(*args, **kwargs)  # what raises here is the model's own error, raised as is
        if not parted:
            parted = parting(sequences(expected), sequences(static), start=call.new_tokens_start())
            if not parted and not torch.equal(generator.get_state(), static_state):
                parted = "the tokens agree, the random-number generator is left elsewhere"
        self.proofs += 1
        if not parted:
            self.classes[kind] = ClassRecord(CacheProof.PROVEN, "")
            return expected
        reason = (
            f"{kind.model} does not tell transformers it runs on a static cache, and decoding on one parted from "
            f"generate() as called for {kind.describe()}: {parted}"
        )
        self.classes[kind] = ClassRecord(CacheProof.PARTED, reason)
        self._eager_generations[reason] += 1
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
