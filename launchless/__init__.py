"""launchless: safe, automatic, selective CUDA graphs for PyTorch models.

import launchless as ll
m = ll.wrap(model, cuda_graph="auto")   # False | True | "auto"
y = m(x)                                # replays a verified graph per input signature
"""

from .blockers import Blocker, dry_run
from .errors import CaptureError, ConfigError, LaunchlessError, NoCudaError, VerificationError
from .runtime import GraphedModule, wrap
from .train import GraphedStep, graphed_step

__version__ = "0.1.0"

__all__ = [
    "Blocker",
    "CaptureError",
    "ConfigError",
    "GraphedModule",
    "GraphedStep",
    "LaunchlessError",
    "NoCudaError",
    "VerificationError",
    "__version__",
    "dry_run",
    "graphed_step",
    "wrap",
]
