"""Checked argparse types: every numeric flag is finite and in range, with the range in the error.

`type=int` accepts -1 and 10**12 and `type=float` accepts nan and inf; such values either end
in a traceback deep inside a command, exhaust memory, or leave output that cannot be read back
(nan is written to JSON as null). Each flag instead names its range here, argparse reports the
flag and the value, and the command never starts. Upper bounds are where a larger value would
exhaust memory or time rather than describe a real job; each is stated in the message.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

__all__ = [
    "MAX_BATCH",
    "MAX_TOKENS_PER_REPLICA",
    "float_in",
    "int_in",
    "non_empty",
    "seconds",
]

MAX_BATCH = 1 << 20  # sequences in one global batch: the planner keeps several arrays per sequence
MAX_TOKENS_PER_REPLICA = 1 << 30  # far above any device memory; int32-safe token offsets


def int_in(low: int, high: int | None = None, *, why: str = "") -> Callable[[str], int]:
    """An argparse type: an integer in [low, high] (`why` says what the upper bound guards)."""
    span = f"[{low}, {high:,}]" if high is not None else f">= {low}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer {span}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(
                f"{value} is outside {span}{f' ({why})' if why else ''}"
            )
        return value

    parse.__name__ = "integer"  # what argparse names in "invalid integer value"
    return parse


def float_in(
    low: float, high: float | None = None, *, low_open: bool = False, why: str = ""
) -> Callable[[str], float]:
    """An argparse type: a finite number in [low, high] ((low, high] with `low_open`)."""
    left = "(" if low_open else "["
    span = (
        f"{left}{low:g}, {high:g}]" if high is not None else f"{'>' if low_open else '>='} {low:g}"
    )

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number {span}") from None
        below = value <= low if low_open else value < low
        if not math.isfinite(value) or below or (high is not None and value > high):
            raise argparse.ArgumentTypeError(
                f"{text} is outside {span}: a finite number is needed{f' ({why})' if why else ''}"
            )
        return value

    parse.__name__ = "number"
    return parse


def seconds(high: float = 7 * 86400.0) -> Callable[[str], float]:
    """An argparse type: a finite number of seconds > 0 (at most a week by default)."""
    return float_in(0.0, high, low_open=True, why="seconds")


def non_empty(text: str) -> str:
    """An argparse type: a string that is not empty or blank (a field name, say)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


non_empty.__name__ = "string"
