"""Argument types the command line shares: a number out of range is an argparse error (exit code 2) that says what
to pass, before anything starts -- not a traceback from deep inside a run, nor a run that measures nothing."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def whole_number(minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number of at least ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; pass one of {minimum} or more") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value}: pass {minimum} or more")
        return value

    parse.__name__ = "whole number"  # what argparse names in its own messages
    return parse


def seconds(text: str) -> float:
    """An argparse type: a positive number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{value:g}: pass a number of seconds above 0")
    return value
