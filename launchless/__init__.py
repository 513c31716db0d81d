"""launchless: safe, automatic, selective CUDA graphs for PyTorch models.

import launchless as ll
m = ll.wrap(model, cuda_graph="auto")   # False | True | "auto"
y = m(x)                                # replays a verified graph per input signature
"""

from typing import Any

from .core.budget import memory_budget, set_memory_budget
from .core.streams import capture_stream
from .core.workspaces import own_blas_workspaces
from .diagnose.blockers import Blocker
from .diagnose.dry_run import dry_run
from .errors import CaptureError, ConfigError, LaunchlessError, NoCudaError, RanksDisagree, VerificationError
from .runtime import GraphedModule, wrap
from .train import GraphedStep, graphed_step

__version__ = "0.1.0"


def explain(model: Any, *inputs: Any, calls: int = 4, backend_options: dict | None = None, **kwargs: Any) -> Any:
    """What ``torch.compile(model, backend="launchless")`` does with each graph of ``model``, and why
    (see ``launchless.compiler.explain``); imported lazily because it loads torch.compile."""
    from .compiler.explain import explain as _explain

    return _explain(model, *inputs, calls=calls, backend_options=backend_options, **kwargs)


__all__ = [
    "Blocker",
    "CaptureError",
    "ConfigError",
    "GraphedModule",
    "GraphedStep",
    "LaunchlessError",
    "NoCudaError",
    "RanksDisagree",
    "VerificationError",
    "__version__",
    "capture_stream",
    "dry_run",
    "explain",
    "graphed_step",
    "memory_budget",
    "own_blas_workspaces",
    "set_memory_budget",
    "wrap",
]
