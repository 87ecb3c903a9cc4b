"""Slurm's JSON fields, one reader each, for every shape the supported versions write (plain
values in 22.05, `{"set", "infinite", "number"}` objects from 23.02 on); a bad value is an
`InputError` naming the source, the job or node and the field (`Ctx`). Used by `parse`."""

from __future__ import annotations

import math
import re
from typing import Any, Mapping

from ..errors import InputError


class Ctx:
    """Where we are, so every error names the source, the job and the field."""

    def __init__(self, source: str, ident: object) -> None:
        self.source = source
        self.ident = ident

    def fail(self, field: str, message: str) -> InputError:
        return InputError(f"job/node {self.ident}: {message}", source=self.source, field=field)


# --- generic field readers ------------------------------------------------------------------

def number(value: Any, ctx: Ctx, field: str, default: int | None = 0) -> int | None:
    """A plain int, a numeric string, null, or a 23.02+ `{"set","infinite","number"}` object.

    Unset (`set: false`) and infinite values give `default`.
    """
    original = value
    while isinstance(value, Mapping):          # a loop, not recursion: nesting depth is untrusted
        if value.get("infinite") or not value.get("set", True):
            return default
        if "number" not in value:
            break
        value = value["number"]
    if value is None:
        return default
    if isinstance(value, bool):
        raise ctx.fail(field, f"expected a number, got {original!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):           # json.loads accepts NaN / Infinity
            raise ctx.fail(field, f"expected a finite number, got {original!r}")
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
        return whole(value, ctx, field)
    raise ctx.fail(field, f"expected a number, got {original!r}")


def whole(digits: str, ctx: "Ctx | None", field: str) -> int:
    """int() of a string of digits; one too long for Python (over 4300 digits) is an InputError."""
    try:
        return int(digits)
    except ValueError:
        message = f"number too long: {digits[:40]!r}... ({len(digits)} characters)"
        if ctx is not None:
            raise ctx.fail(field, message) from None
        raise InputError(message, field=field) from None


def text(value: Any, ctx: Ctx, field: str) -> str:
    """A string; null and missing give ""."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise ctx.fail(field, f"expected a string, got {value!r}")


def timestamp(value: Any, ctx: Ctx, field: str) -> float | None:
    """Unix seconds; 0, unset and infinite give None."""
    n = number(value, ctx, field, default=None)
    return float(n) if n else None


def strings(value: Any, ctx: Ctx, field: str) -> tuple[str, ...]:
    """A list of strings, or one comma-separated string (older CSV fields)."""
    if value is None or value == "":
        return ()
    if isinstance(value, str):
        return tuple(p for p in value.split(",") if p)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise ctx.fail(field, f"expected a list of strings, got {value!r}")
