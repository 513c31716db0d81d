"""The interpreter lock handed to the calls sooner while a thread of ours runs Python beside them.

A thread running Python holds the interpreter lock; another that wants it -- the calls' thread, back from a launch
it made without the lock -- asks, and gets it once the holder has run for the switch interval
(``sys.getswitchinterval()``, 5 ms by default), against calls of a fraction of a millisecond. Where launchless
itself runs Python in a thread beside the calls for seconds -- pickling a model's structure for its compiler
process, reading a compiled program (Inductor imported: seconds of Python) -- ``calls_first()`` shortens the
interval for that time: a call waits about ``SHORT_SWITCH_S`` for the lock instead of up to 5 ms, and the thread's
work takes a little longer. The interval is process-wide: it is restored when the last such thread is done, unless
someone else set another one meanwhile (theirs stands).
"""

from __future__ import annotations

import contextlib
import math
import sys
import threading
from collections.abc import Iterator

SHORT_SWITCH_S = 0.0002  # the switch interval while a thread of ours runs Python beside the calls

_lock = threading.Lock()
_inside = 0  # threads inside ``calls_first()``
_saved: float | None = None  # the interval before the first of them entered
_set: float | None = None  # the interval the first of them set


@contextlib.contextmanager
def calls_first() -> Iterator[None]:
    """Run the block with the switch interval at ``SHORT_SWITCH_S`` (where it is longer), then restore it."""
    global _inside, _saved, _set
    with _lock:
        if _inside == 0:
            _saved = sys.getswitchinterval()
            _set = None
            if _saved > SHORT_SWITCH_S:
                sys.setswitchinterval(SHORT_SWITCH_S)
                _set = sys.getswitchinterval()  # as the interpreter keeps it (microseconds)
        _inside += 1
    try:
        yield
    finally:
        with _lock:
            _inside -= 1
            if _inside == 0:
                if _set is not None and _saved is not None and math.isclose(sys.getswitchinterval(), _set):
                    sys.setswitchinterval(_saved)
                _saved = _set = None
