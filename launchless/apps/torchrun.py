"""Process groups started by PyTorch's own ``torchrun``, run as ``python -m torch.distributed.run`` by this
interpreter: the group then imports the same torch and launchless as the command that starts it, whatever
``torchrun`` script is (or is not) on the PATH."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def torchrun_command(*, nproc_per_node: int, module: str, args: Sequence[str]) -> list[str]:
    """The command that runs ``python -m <module> <args>`` in ``nproc_per_node`` processes of one group on this host
    (``--standalone``: its rendezvous on a free local port, so that groups started at the same time keep apart)."""
    return [
        *(sys.executable, "-m", "torch.distributed.run", "--standalone"),
        *("--nproc-per-node", str(nproc_per_node)),
        *("-m", module, *args),
    ]
