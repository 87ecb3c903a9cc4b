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

Workload files (the simulator's and the benchmarks' input: reference TSV traces, throughput and
profile JSON, our JSONL; `shockslurm.workload`) are bounded by the caps above where they supply
the same value (epochs, samples per epoch, batch sizes, gang sizes, epoch durations, model names)
and by these, checked at the reader so that nothing downstream overflows, loses precision or runs
for ever (every file in the shared reference data and every built-in workload is well inside):
- job id: 0 .. `MAX_JOB_ID` (2^53 - 1): exact as a float and in any JSON reader; fits the
  store's 64-bit column.
- iterations (`total_steps`, JSONL `iterations`, and the count a job's epochs make):
  1 .. `MAX_ITERATIONS` (2^53 - 1): the simulator mixes iteration counts with float arithmetic,
  where larger integers are no longer exact; fits the store's 64-bit column.
- arrival: 0 .. `MAX_ARRIVAL_S` (10^9 s, 31.7 years, past any cluster trace): a float keeps
  sub-microsecond resolution there, so arrival + run times stay exact (1e300 made every job's
  times collapse into its arrival: a simulation of all zeros).
- throughput: `MIN_ITERATIONS_PER_S` .. `MAX_ITERATIONS_PER_S` (10^-6 .. 10^6 iterations/s of
  the gang; 0 in a reference throughput file marks a configuration not measured): a microsecond
  per step is beyond any GPU's step, an iteration per 11.6 days below any training job; the
  epoch durations derived from it are then bounded as declared ones are (`MIN_EPOCH_SECONDS`
  .. `MAX_EPOCH_SECONDS`), so that no rho of 300 digits comes out of 1e-300 s epochs.
- priority weight: `MIN_PRIORITY` .. `MAX_PRIORITY` (10^-6 .. 10^6): a ratio of 10^12
  between two jobs' weights is beyond any use, and keeps the policies' weighted sums well
  conditioned.
- a job's whole exclusive run time: at most `MAX_EXCLUSIVE_S` (366 days): a simulation steps
  through every round of a job's run (120 s each by default), so this keeps one job's share at
  about 264,000 rounds (where samples_per_epoch 10^20 made `simulate` run for ever).
- a file: at most `MAX_WORKLOAD_BYTES` (256 MiB, after decompression of a .gz): the reference's
  120-job files are 1.2 MB at most; a gzip bomb or a wrong file must not exhaust memory.

Every check raises `BadValue` (an `InputError` naming the field) and nothing else, whatever the
value's type: a bool is not a number, a float is an integer only when it is integral (`10.0`).
"""

from __future__ import annotations

import math
import numbers
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

# Workload files (module docstring: each bound and its reason).
MAX_JOB_ID = 2 ** 53 - 1
MAX_ITERATIONS = 2 ** 53 - 1
MAX_ARRIVAL_S = 1e9
MIN_ITERATIONS_PER_S = 1e-6
MAX_ITERATIONS_PER_S = 1e6
MIN_PRIORITY = 1e-6
MAX_PRIORITY = 1e6
MAX_EXCLUSIVE_S = 366 * 86400.0
MAX_WORKLOAD_BYTES = 256 * 2 ** 20

__all__ = ["MAX_EPOCHS", "MAX_SAMPLES_PER_EPOCH", "MAX_BATCH_SIZE", "MAX_LADDER",
           "MIN_EPOCH_SECONDS", "MAX_EPOCH_SECONDS", "MAX_SPEC_CHARS", "MAX_GPUS",
           "MAX_SAMPLES_PER_S", "MAX_PATH_CHARS", "INT64_MAX", "NAME_RE", "MAX_JOB_ID",
           "MAX_ITERATIONS", "MAX_ARRIVAL_S", "MIN_ITERATIONS_PER_S", "MAX_ITERATIONS_PER_S",
           "MIN_PRIORITY", "MAX_PRIORITY", "MAX_EXCLUSIVE_S", "MAX_WORKLOAD_BYTES", "BadValue",
           "integer", "number", "name", "text", "shown"]


class BadValue(InputError):
    """A job-supplied value that is of the wrong type, not finite, or out of its bounds."""


SETTING_CHARS = 200
"""How much of a bad setting's value a config error shows (an admin's own file: more of it than
of a job's value, still cut short)."""


def shown(value: object, limit: int = 40) -> str:
    """The value for a message, cut short to `limit` characters (a hostile value can be
    megabytes long, or nested thousands deep)."""
    if isinstance(value, (str, list, tuple, dict)) and len(value) > limit:
        return f"<{type(value).__name__} of length {len(value)}>"
    try:
        out = repr(value)
    except Exception:                       # noqa: BLE001 - an int over the digit limit, depth
        out = f"<{type(value).__name__}>"
    return out if len(out) <= limit else out[:limit - 3] + "..."


def integer(value: object, field: str, low: int, high: int, *, source: str | None = None,
            line: int | None = None) -> int:
    """`value` as an int in [low, high]: an int, or an integral finite float. `source` and
    `line` name the place in a file, for the error."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadValue(f"must be an integer, got {shown(value)}",
                       field=field, source=source, line=line)
    if not low <= value <= high:
        raise BadValue(f"must be an integer in {low}..{high}, got {shown(value)}",
                       field=field, source=source, line=line)
    return value


def is_real(value: object) -> bool:
    """An int or a float (any real number type, numpy's too), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def finite(value: object) -> float | None:
    """`value` as a float when it is a finite real number (`is_real`), else None: nan, inf and
    an int beyond the float range (where `float` raises OverflowError and `math.isfinite` too)
    are None. Every check of a finite number in the package starts here."""
    if not is_real(value):
        return None
    try:
        as_float = float(value)             # type: ignore[arg-type]
    except (OverflowError, ValueError, TypeError):
        return None
    return as_float if math.isfinite(as_float) else None


def number(value: object, field: str, low: float, high: float, *, source: str | None = None,
           line: int | None = None) -> float:
    """`value` as a finite float in [low, high] (an int or a float, not a bool). `source` and
    `line` name the place in a file, for the error."""
    if not is_real(value):
        raise BadValue(f"must be a number, got {shown(value)}",
                       field=field, source=source, line=line)
    as_float = finite(value)
    if as_float is None:
        raise BadValue(f"must be a finite number, got {shown(value)}",
                       field=field, source=source, line=line)
    if not low <= as_float <= high:
        raise BadValue(f"must be a number in {low:g}..{high:g}, got {shown(value)}",
                       field=field, source=source, line=line)
    return as_float


def name(value: object, field: str, *, source: str | None = None,
         line: int | None = None) -> str:
    """`value` as a name (`NAME_RE`: 1-64 letters, digits, '.', '_', '-')."""
    if not isinstance(value, str) or not NAME_RE.fullmatch(value):
        raise BadValue(f"must be 1-64 characters from letters, digits, '.', '_' and '-', got "
                       f"{shown(value)}", field=field, source=source, line=line)
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
