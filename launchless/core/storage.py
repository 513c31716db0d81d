"""Where a tensor's memory lives: tensors that share it are views of one storage.

Several proofs follow memory rather than tensor objects -- an output that is a view of an input, a float a forward
casts into row ids, the state a training step writes -- and they all ask the same question of a tensor."""

from __future__ import annotations

import torch


def storage_address(t: torch.Tensor) -> int | None:
    """The address of the storage ``t`` is a view of; None where there is no plain storage to follow (a wrapper
    subclass such as a DTensor, a sparse or nested tensor)."""
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None
