"""Arguments of the helper's classes (`ShockTrainer`, `ShockwaveCallback`), checked when the
object is made: a bad value is a ValueError naming its owner and argument, not a
ZeroDivisionError at the first step."""

from __future__ import annotations

from typing import Any

from ..limits import finite
from .epochs import whole_number


def whole_arg(owner: str, name: str, value: Any, *, optional: bool = False,
              least: int | None = 1) -> Any:
    """`value` as an int (at least `least`; None too when `optional`), else a ValueError
    naming `owner`'s argument."""
    if value is None and optional:
        return None
    if not whole_number(value) or (least is not None and value < least):
        bound = "" if least is None else f" >= {least}"
        raise ValueError(f"{owner}: {name} must be a whole number{bound}"
                         f"{' or None' if optional else ''}, got {value!r}")
    return int(value)


def seconds_arg(owner: str, name: str, value: Any, *, optional: bool = False) -> Any:
    """`value` as a finite number of seconds >= 0 (None too when `optional`), else a
    ValueError naming `owner`'s argument."""
    if value is None and optional:
        return None
    seconds = finite(value)
    if seconds is None or seconds < 0:
        raise ValueError(f"{owner}: {name} must be a finite number of seconds >= 0"
                         f"{' or None' if optional else ''}, got {value!r}")
    return seconds
