"""A managed job's declared spec, read from its Slurm comment or the store, and the epoch time
the daemon assumes for it (declared, else the catalogue's throughput model, else a default)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Mapping, Protocol, Sequence

from ..workload.catalogue import CATALOGUE
from .types import SPEC_PREFIX, SlurmJob

DEFAULT_EPOCH_SECONDS = 600.0     # a job that declares nothing: ten minutes per epoch
DEFAULT_EPOCHS = 1
DEFAULT_SAMPLES_PER_EPOCH = 1000
DEFAULT_BATCH_SIZE = 32


@dataclass(frozen=True)
class LiveSpec:
    """A managed job's declared spec, as the daemon uses it."""

    model: str
    epochs: int
    samples_per_epoch: int
    batch_sizes: tuple[int, ...]
    batch_size: int
    mode: str = "static"
    epoch_seconds: float | None = None
    source: str = "default"       # comment | store | default


def spec_from_comment(comment: str) -> dict | None:
    """The JSON after `shock:spec=` in a `;`-separated comment, or None."""
    for part in comment.split(";"):
        if part.startswith(SPEC_PREFIX):
            try:
                value = json.loads(part[len(SPEC_PREFIX):])
            except ValueError:
                return None
            return value if isinstance(value, dict) else None
    return None


def _pos_int(value: object, default: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 1:
        return default
    return int(value)


def spec_from_mapping(raw: Mapping[str, object], source: str) -> LiveSpec:
    """A `LiveSpec` from shocksub's keys (submit.JobRequest.spec), tolerant of missing keys."""
    model = str(raw.get("model") or "unknown")
    info = CATALOGUE.get(model)
    ladder_raw = raw.get("batch_sizes")
    ladder: tuple[int, ...] = ()
    if isinstance(ladder_raw, (list, tuple)):
        ladder = tuple(sorted({int(b) for b in ladder_raw
                               if isinstance(b, (int, float)) and not isinstance(b, bool)
                               and b >= 1}))
    if not ladder:
        ladder = info.ladder if info else (DEFAULT_BATCH_SIZE,)
    batch_size = _pos_int(raw.get("batch_size"), ladder[0])
    default_samples = info.samples_per_epoch if info else DEFAULT_SAMPLES_PER_EPOCH
    epoch_s = raw.get("epoch_seconds")
    epoch_seconds = (float(epoch_s) if isinstance(epoch_s, (int, float))
                     and not isinstance(epoch_s, bool) and epoch_s > 0 else None)
    return LiveSpec(model=model, epochs=_pos_int(raw.get("epochs"), DEFAULT_EPOCHS),
                    samples_per_epoch=_pos_int(raw.get("samples_per_epoch"), default_samples),
                    batch_sizes=ladder, batch_size=batch_size,
                    mode=str(raw.get("mode") or "static"), epoch_seconds=epoch_seconds,
                    source=source)


def epoch_seconds(spec: LiveSpec, gpus: int) -> float:
    """Exclusive seconds of one epoch on `gpus` GPUs: declared, else the catalogue's throughput
    model, else `DEFAULT_EPOCH_SECONDS`."""
    if spec.epoch_seconds is not None:
        return spec.epoch_seconds
    info = CATALOGUE.get(spec.model)
    if info is not None:
        ips = info.iterations_per_s(spec.batch_size, max(1, gpus))
        return math.ceil(spec.samples_per_epoch / spec.batch_size) / ips
    return DEFAULT_EPOCH_SECONDS


class SpecRegistry(Protocol):
    """Specs registered out of band (the store, by `shocksub --db`)."""

    def lookup(self, jobs: Sequence[SlurmJob]) -> Mapping[int, Mapping[str, object]]:
        """Spec mappings for those of `jobs` it knows, by Slurm job id (one query per round)."""
