"""Training: capture the whole step (forward, loss, backward, optimizer) and fall back softly."""

from .step import GraphedStep, graphed_step

__all__ = ["GraphedStep", "graphed_step"]
