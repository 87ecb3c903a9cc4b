"""Arguments of the helper's classes (`ShockTrainer`, `ShockwaveCallback`), checked when the
object is made: a bad value is a ValueError naming its owner and argument, not a
ZeroDivisionError at the first step."""

from __future__ import annotations

import pickle
from typing import Any

from ..limits import finite
from .epochs import whole_number


def module_arg(owner: str, name: str, value: Any) -> Any:
    """`value` when it is one `torch.nn.Module` (wrapped or not), else a TypeError naming
    `owner`'s argument: several models go in one module (`nn.ModuleDict`), whose state holds
    each of them."""
    import torch

    if not isinstance(value, torch.nn.Module):
        several = " (several models: put them in one torch.nn.ModuleDict, e.g. " \
                  "ModuleDict({'g': g, 'd': d}))" if isinstance(value, (list, tuple, dict)) else ""
        raise TypeError(f"{owner}: {name} must be a torch.nn.Module, got "
                        f"{type(value).__name__}{several}")
    return value


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


def picklable_dict_arg(owner: str, name: str, value: dict[str, Any] | None) -> dict[str, Any]:
    """`value` itself (the caller's dict: what they change in it later is saved), or a new one
    for None; a ValueError naming `owner`'s argument when a checkpoint could not hold it."""
    out = value if value is not None else {}
    if not isinstance(out, dict):
        raise ValueError(f"{owner}: {name} must be a dict, got {type(out).__name__}")
    try:
        pickle.dumps(out)
    except Exception as exc:    # PicklingError, TypeError, AttributeError: a lambda, a lock...
        raise ValueError(f"{owner}: {name} must be picklable (saved with every checkpoint): "
                         f"{type(exc).__name__}: {exc}") from None
    return out
