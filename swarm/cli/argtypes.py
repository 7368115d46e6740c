"""argparse types shared by every `swarm` subcommand: a bad value is a one-line error."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any


def number(kind: Callable[[str], Any], low: float | None, high: float | None, what: str) -> Any:
    """A parser for ``kind`` within [low, high]; ``what`` describes the allowed values."""

    def parse(text: str) -> Any:
        try:
            value = kind(text.replace("_", "").replace(",", "") if kind is int else text)
        except ValueError:
            noun = "a whole number" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None
        if (low is not None and value < low) or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{text} is out of range: must be {what}")
        return value

    return parse


def int_in(low: int, high: int) -> Any:
    return number(int, low, high, f"a whole number in {low}..{high}")


def float_in(low: float, high: float) -> Any:
    return number(float, low, high, f"a number in {low:g}..{high:g}")


positive_int = number(int, 1, None, "a whole number >= 1")
non_negative_int = number(int, 0, None, "a whole number >= 0")


def share(text: str) -> float:
    """A governor share: (0, 1]."""
    value: float = number(float, None, None, "")(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text} is out of range: the share must be in (0, 1]")
    return value


def rate(text: str) -> float:
    """A probability of failure: [0, 1)."""
    value: float = number(float, None, None, "")(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"{text} is out of range: a rate must be in [0, 1)")
    return value


def worker_list(text: str) -> list[int]:
    parts = [p for p in text.split(",") if p.strip()]
    if not parts:
        raise argparse.ArgumentTypeError("give worker counts like 25,50,100")
    return [positive_int(p.strip()) for p in parts]
