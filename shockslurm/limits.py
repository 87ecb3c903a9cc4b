"""Bounds on every value a job supplies, and the checks that enforce them.

A job supplies values three ways: the spec in its Slurm comment (`shock:spec={json}`), the spec
`shocksub --db` registered in the store, and the training reports it sends. Any user can write
any of them, so each value is checked here before the daemon computes with it or stores it:
numbers must be finite, integers must fit the store's columns, and everything that sizes per-job
work has a documented cap. The caps are generous for real training and small enough that one
job cannot make the daemon's work or memory grow (the live path also keeps each job's profile
run-length encoded, `model.RunLength`, so even a capped epoch count costs O(1) per round).

The caps (each constant below), and why:
- epochs: 1 .. `MAX_EPOCHS` (10^6), the trace readers' cap; fits the store's 32-bit column.
- samples_per_epoch: 1 .. `MAX_SAMPLES_PER_EPOCH` (10^12), a trillion samples per epoch.
- batch sizes (spec and reports): 1 .. `MAX_BATCH_SIZE` (2^24), 16 M samples per step.
- batch-size ladder: 1 .. `MAX_LADDER` (64) sizes; doubling from 1 to 2^24 takes 25.
- declared epoch_seconds: `MIN_EPOCH_SECONDS` .. `MAX_EPOCH_SECONDS` (1 ms .. 10^7 s, 116 days).
- model name: `NAME_RE` (1-64 letters, digits, '.', '_', '-'), as shocksub takes it: no
  control character reaches a log line, and it fits the store's 128-character column.
- spec text in the comment: `MAX_SPEC_CHARS` (4096); shocksub writes under 300.
- reported GPUs: 0 .. `MAX_GPUS` (65536), 0 for a CPU run of the helper.
- reported samples/s: 0 .. `MAX_SAMPLES_PER_S` (10^12); reported epoch: 0 .. `MAX_EPOCHS`;
  reported step: 0 .. `INT64_MAX` (the store's 64-bit column).
- reported checkpoint path: `MAX_PATH_CHARS` (4096, PATH_MAX), no NUL (PostgreSQL's text).

Every check raises `BadValue` (an `InputError` naming the field) and nothing else, whatever the
value's type: a bool is not a number, a float is an integer only when it is integral (`10.0`).
"""

from __future__ import annotations

import math
import re

from .errors import InputError
from .model import MAX_EPOCHS

MAX_SAMPLES_PER_EPOCH = 10 ** 12
MAX_BATCH_SIZE = 2 ** 24
MAX_LADDER = 64
MIN_EPOCH_SECONDS = 1e-3
MAX_EPOCH_SECONDS = 1e7
MAX_SPEC_CHARS = 4096
MAX_GPUS = 65_536
MAX_SAMPLES_PER_S = 1e12
MAX_PATH_CHARS = 4096
INT64_MAX = 2 ** 63 - 1
NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")        # job and model names (always fullmatch)

__all__ = ["MAX_EPOCHS", "MAX_SAMPLES_PER_EPOCH", "MAX_BATCH_SIZE", "MAX_LADDER",
           "MIN_EPOCH_SECONDS", "MAX_EPOCH_SECONDS", "MAX_SPEC_CHARS", "MAX_GPUS",
           "MAX_SAMPLES_PER_S", "MAX_PATH_CHARS", "INT64_MAX", "NAME_RE", "BadValue",
           "integer", "number", "name", "text", "shown"]


class BadValue(InputError):
    """A job-supplied value that is of the wrong type, not finite, or out of its bounds."""


def shown(value: object) -> str:
    """The value for a message, cut short (a hostile value can be megabytes long)."""
    if isinstance(value, (str, list, tuple, dict)) and len(value) > 40:
        return f"<{type(value).__name__} of length {len(value)}>"
    try:
        out = repr(value)
    except Exception:                       # noqa: BLE001 - e.g. an int over the digit limit
        out = f"<{type(value).__name__}>"
    return out if len(out) <= 40 else out[:37] + "..."


def integer(value: object, field: str, low: int, high: int) -> int:
    """`value` as an int in [low, high]: an int, or an integral finite float."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadValue(f"must be an integer, got {shown(value)}", field=field)
    if not low <= value <= high:
        raise BadValue(f"must be an integer in {low}..{high}, got {shown(value)}", field=field)
    return value


def number(value: object, field: str, low: float, high: float) -> float:
    """`value` as a finite float in [low, high] (an int or a float, not a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadValue(f"must be a number, got {shown(value)}", field=field)
    try:
        as_float = float(value)
    except OverflowError:                   # an int beyond the float range
        raise BadValue(f"must be a number in {low:g}..{high:g}, got {shown(value)}",
                       field=field) from None
    if not math.isfinite(as_float):
        raise BadValue(f"must be a finite number, got {shown(value)}", field=field)
    if not low <= as_float <= high:
        raise BadValue(f"must be a number in {low:g}..{high:g}, got {shown(value)}",
                       field=field)
    return as_float


def name(value: object, field: str) -> str:
    """`value` as a name (`NAME_RE`: 1-64 letters, digits, '.', '_', '-')."""
    if not isinstance(value, str) or not NAME_RE.fullmatch(value):
        raise BadValue(f"must be 1-64 characters from letters, digits, '.', '_' and '-', got "
                       f"{shown(value)}", field=field)
    return value


def text(value: object, field: str, max_chars: int) -> str:
    """`value` as a string of at most `max_chars` characters that encodes as UTF-8 and holds no
    NUL (PostgreSQL's text cannot store one)."""
    if not isinstance(value, str):
        raise BadValue(f"must be a string, got {shown(value)}", field=field)
    if len(value) > max_chars:
        raise BadValue(f"must be at most {max_chars} characters, got {len(value)}", field=field)
    if "\x00" in value:
        raise BadValue("must not contain a NUL character", field=field)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise BadValue("is not valid Unicode text", field=field) from None
    return value
