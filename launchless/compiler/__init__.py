"""The compiler path: ``torch.compile(model, backend="launchless")``.

``graph_info()`` lists what every live compiled graph replays (see ``backend.graph_info``).
"""

from .backend import graph_info

__all__ = ["graph_info"]
