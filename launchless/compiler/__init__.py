"""The compiler path: ``torch.compile(model, backend="launchless")``.

``graph_info()`` lists what every live compiled graph replays (see ``backend.graph_info``); under
``without_graphs()`` compiled code runs its programs without graphs (the reference its graphs are held to).
"""

from .backend import graph_info
from .compiled_graphs import without_graphs

__all__ = ["graph_info", "without_graphs"]
