"""Exceptions a user can meet. Each message says what happened and how to fix it."""

from __future__ import annotations


def one_line(exc: BaseException, *, limit: int = 400) -> str:
    """``Type: first line of the message`` (the type alone where there is none), at most ``limit`` characters: an
    exception as one log line, report cell or reason."""
    lines = str(exc).strip().splitlines()
    return (f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__)[:limit]


class LaunchlessError(Exception):
    """Base class of every error launchless raises on purpose."""


class ConfigError(LaunchlessError, ValueError):
    """An argument to `wrap` or a method has a value launchless does not accept."""


class NoCudaError(LaunchlessError, RuntimeError):
    """A graph was asked for where no CUDA device holds the model or its inputs."""


class CaptureError(LaunchlessError, RuntimeError):
    """The forward cannot be captured as a CUDA graph.

    A wrong capture does not crash: its replay silently returns wrong values. So where no verified graph (whole,
    or a verified and faster split) serves the call under ``cuda_graph=True``, and for ``capture_graph()``,
    launchless refuses loudly instead of guessing.
    """

    def __init__(self, message: str, *, reason: str, operation: str | None = None, source: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.operation = operation
        self.source = source


class VerificationError(LaunchlessError, RuntimeError):
    """A captured graph replayed different values than eager; the graph is never used."""

    def __init__(self, message: str, *, report: dict) -> None:
        super().__init__(message)
        self.report = report


class RanksDisagree(LaunchlessError, RuntimeError):
    """The ranks of a forward or training step with collectives could not agree on its graph in time: a rank never
    arrived (it crashed, or calls the model with another input or not at all)."""
