"""The run-time policy: ``wrap(model)`` replays a verified CUDA graph per input signature of an inference forward.

The policy decides the key (the input signature), the mode (``cuda_graph``) and what to capture; the core
(``launchless.core``) captures, verifies, guards and replays. Its rooms:

- ``graphed_module``: ``wrap`` and ``GraphedModule`` -- a call's way from signature to replay, capture or eager;
  ``capture_flow`` the capture, proof and speed judgement behind a graph kept; ``fallbacks`` what a call runs where
  no graph replays (eager, a split, the refusal's error); ``model_stand_in`` the model's API on the wrapper;
- ``split``: a forward refused whole run split by submodule, its pieces captured and the joined forward verified;
- ``batch_buckets``: a call's batch padded up to a captured size, once padding is proven not to reach its rows;
- ``decode_graphs``: a transformers model's ``generate()`` with its decode steps replayed on a static cache (the
  call read once in ``generate_call``, its class's proofs in ``loop_proofs`` and ``cache_proofs``, the model's forward
  sent to the steps by ``step_routing``);
- ``decode_loop``: the host-ahead loop those steps decode in, proven against ``generate()``'s own loop;
- ``cache_layers``: the static cache's layers as a decode graph sees them;
- ``state_keys``: the model's own ``state_dict`` keys through the wrapper.
"""

from __future__ import annotations

from .graphed_module import GraphedModule, Mode, wrap

__all__ = ["GraphedModule", "Mode", "wrap"]
