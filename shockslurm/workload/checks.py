"""What every workload reader checks the same way: reading a file, and the bounds of a job's
derived values (its epoch durations and its whole exclusive run time).

The bounds themselves are declared once, with their reasons, in `shockslurm.limits`; every
failure is an `InputError` naming the file, and the line and field (or key) where one is at
fault.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path
from typing import IO, Iterable, Mapping, cast

from ..atomic import Payload
from ..errors import InputError
from ..limits import (MAX_EPOCH_SECONDS, MAX_EXCLUSIVE_S, MAX_WORKLOAD_BYTES, MIN_EPOCH_SECONDS,
                      shown)


def is_compressed(path: str | Path) -> bool:
    """Whether a workload file is gzip-compressed: its name ends in `.gz` (in any case), for
    the readers and the writers alike."""
    return str(path).lower().endswith(".gz")


def stored(path: str | Path, data: Payload) -> Payload:
    """`data` (the bytes, or a function writing them: `atomic.Payload`) as a workload file
    named `path` holds it: gzip-compressed when `is_compressed` (with no time stamp: the same
    workload gives the same file)."""
    if not is_compressed(path):
        return data
    if isinstance(data, bytes):
        return gzip.compress(data, mtime=0)
    write = data

    def compressed(fh: IO[bytes]) -> None:
        with gzip.GzipFile(fileobj=fh, mode="wb", mtime=0) as gz:
            write(cast(IO[bytes], gz))
    return compressed


def read_text(path: str | Path, what: str) -> str:
    """The text of a workload file (gzip-compressed when its name ends in `.gz`, in any case),
    at most `MAX_WORKLOAD_BYTES` once decompressed, as UTF-8; line ends read as Python's text
    mode reads them ("\\r\\n" and "\\r" as "\\n"). `what` names the file in errors."""
    source = str(path)
    compressed = is_compressed(source)
    try:
        with (gzip.open(path, "rb") if compressed else open(path, "rb")) as fh:
            data = fh.read(MAX_WORKLOAD_BYTES + 1)
    except FileNotFoundError:
        raise InputError(f"cannot read {what}: file not found", source=source) from None
    except (OSError, EOFError, zlib.error) as exc:    # gzip.BadGzipFile is an OSError
        raise InputError(f"cannot read {what}: {str(exc)[:200] or type(exc).__name__}",
                         source=source) from None
    if len(data) > MAX_WORKLOAD_BYTES:
        raise InputError(f"cannot read {what}: larger than {MAX_WORKLOAD_BYTES:,} bytes"
                         f"{' uncompressed' if compressed else ''}", source=source)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"cannot read {what}: not UTF-8 text ({exc.reason} at byte {exc.start})",
                         source=source) from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def epoch_seconds(samples_per_epoch: int, batch_size: int, iterations_per_s: float) -> float:
    """Exclusive seconds of one epoch (`JobSpec.epoch_duration_at`); inf where it overflows."""
    try:
        return samples_per_epoch / batch_size / iterations_per_s
    except (OverflowError, ZeroDivisionError):
        return float("inf")


def check_epoch_seconds(samples_per_epoch: int, rates: Mapping[int, float], *, field: str,
                        source: str, line: int | None = None, origin: str = "") -> None:
    """Every batch size's epoch duration (`epoch_seconds`) within `MIN_EPOCH_SECONDS` ..
    `MAX_EPOCH_SECONDS`: the schedule's and those a forecaster reads from the throughputs.
    `origin` says where the throughputs come from, for the message."""
    for bs, rate in sorted(rates.items()):
        seconds = epoch_seconds(samples_per_epoch, bs, rate)
        if not MIN_EPOCH_SECONDS <= seconds <= MAX_EPOCH_SECONDS:
            raise InputError(f"an epoch at batch size {bs} would take {seconds:.3g} s "
                             f"({samples_per_epoch} samples at {rate:g} iterations/s{origin}): "
                             f"outside {MIN_EPOCH_SECONDS:g}..{MAX_EPOCH_SECONDS:g} s",
                             source=source, line=line, field=field)


def check_exclusive(durations: Iterable[float], *, field: str, source: str,
                    line: int | None = None) -> None:
    """A job's whole exclusive run time (the sum of its epoch durations) at most
    `MAX_EXCLUSIVE_S`."""
    total = sum(durations)
    if not total <= MAX_EXCLUSIVE_S:
        raise InputError(f"the job's epochs take {total:.3g} s exclusively, over "
                         f"{MAX_EXCLUSIVE_S:.3g} s ({MAX_EXCLUSIVE_S / 86400:.0f} days)",
                         source=source, line=line, field=field)


def place(key: str) -> str:
    """A key of a file for an error message: as it is when short and printable, else cut
    short (a hostile key can be megabytes long or hold terminal escapes)."""
    return key if len(key) <= 80 and key.isprintable() else shown(key)

