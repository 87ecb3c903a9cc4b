"""A managed job's declared spec, read from its Slurm comment or the store, and the epoch time
the daemon assumes for it (declared, else the catalogue's throughput model, else a default).

Any user writes these values (the comment with `sbatch --comment`, the registration with
`shocksub --db`), so every one is validated and bounded (`shockslurm.limits`): a key that is
missing takes its default, a key that is present must be valid. A spec that is not (not JSON,
longer than `MAX_SPEC_CHARS`, nested too deep, a wrong type, NaN or infinity, out of bounds)
raises `BadSpec`, naming the field; the live cluster then leaves that job held, flags it once in
the store and the log with the reason, and schedules every other job as usual (`live/cluster.py`).
Held rather than run with defaults: a spec decides the job's share, and a job must not get one by
declaring garbage. The user cancels and resubmits with a valid spec.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Mapping, Protocol, Sequence

from .. import limits
from ..errors import InputError
from ..model import ADAPTATION_MODES
from ..workload.catalogue import CATALOGUE
from ..slurm.types import SPEC_PREFIX, SlurmJob, tagged_value

DEFAULT_EPOCH_SECONDS = 600.0     # a job that declares nothing: ten minutes per epoch
DEFAULT_EPOCHS = 1
DEFAULT_SAMPLES_PER_EPOCH = 1000
DEFAULT_BATCH_SIZE = 32
DEFAULT_MODEL = "unknown"


class BadSpec(InputError):
    """A job's spec that the daemon cannot use (the message names the field and the source)."""


@dataclass(frozen=True)
class LiveSpec:
    """A managed job's declared spec, as the daemon uses it (always within `limits`)."""

    model: str
    epochs: int
    samples_per_epoch: int
    batch_sizes: tuple[int, ...]
    batch_size: int
    mode: str = "static"
    epoch_seconds: float | None = None
    source: str = "default"       # comment | store | default


def has_spec(comment: str) -> bool:
    """Whether the comment carries a `shock:spec=` token (valid or not)."""
    return tagged_value(comment, SPEC_PREFIX) is not None


def spec_from_comment(comment: str) -> dict | None:
    """The JSON object after `shock:spec=` in a `;`-separated comment, None when there is no such
    token; raises `BadSpec` when there is one that is not a JSON object of bounded size."""
    text = tagged_value(comment, SPEC_PREFIX)
    if text is None:
        return None
    if len(text) > limits.MAX_SPEC_CHARS:
        raise BadSpec(f"longer than {limits.MAX_SPEC_CHARS} characters ({len(text)})",
                      source="comment", field="shock:spec")
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:    # RecursionError: [[[[... nested deep
        raise BadSpec(f"not JSON ({type(exc).__name__})", source="comment",
                      field="shock:spec") from None
    if not isinstance(value, dict):
        raise BadSpec(f"must be a JSON object, got {type(value).__name__}",
                      source="comment", field="shock:spec")
    return value


def _ladder(raw: object, source: str) -> tuple[int, ...]:
    if not isinstance(raw, (list, tuple)):
        raise BadSpec("must be a list of batch sizes", source=source, field="batch_sizes")
    if not 1 <= len(raw) <= limits.MAX_LADDER:
        raise BadSpec(f"must hold 1..{limits.MAX_LADDER} batch sizes, got {len(raw)}",
                      source=source, field="batch_sizes")
    return tuple(sorted({limits.integer(b, "batch_sizes", 1, limits.MAX_BATCH_SIZE)
                         for b in raw}))


def spec_from_mapping(raw: Mapping[str, object], source: str) -> LiveSpec:
    """A `LiveSpec` from shocksub's keys (submit.JobRequest.spec): a missing key takes its
    default, a present one must be valid; raises `BadSpec` naming the field otherwise. Unknown
    keys are ignored (a newer shocksub may add some)."""
    try:
        model = limits.name(raw.get("model", DEFAULT_MODEL), "model")
        info = CATALOGUE.get(model)
        ladder = (_ladder(raw["batch_sizes"], source) if "batch_sizes" in raw
                  else info.ladder if info else (DEFAULT_BATCH_SIZE,))
        batch_size = (limits.integer(raw["batch_size"], "batch_size", 1, limits.MAX_BATCH_SIZE)
                      if "batch_size" in raw else ladder[0])
        epochs = limits.integer(raw.get("epochs", DEFAULT_EPOCHS), "epochs", 1,
                                limits.MAX_EPOCHS)
        samples = limits.integer(
            raw.get("samples_per_epoch", info.samples_per_epoch if info
                    else DEFAULT_SAMPLES_PER_EPOCH),
            "samples_per_epoch", 1, limits.MAX_SAMPLES_PER_EPOCH)
        mode = raw.get("mode", "static")
        if mode not in ADAPTATION_MODES:   # a list or dict is not in a tuple of strings either
            raise BadSpec(f"unknown mode {limits.shown(mode)} (known: "
                          f"{', '.join(ADAPTATION_MODES)})", field="mode")
        declared = raw.get("epoch_seconds")
        epoch_s = (None if declared is None else limits.number(
            declared, "epoch_seconds", limits.MIN_EPOCH_SECONDS, limits.MAX_EPOCH_SECONDS))
    except InputError as exc:
        raise BadSpec(exc.message, source=source, field=exc.field) from None
    return LiveSpec(model=model, epochs=epochs, samples_per_epoch=samples, batch_sizes=ladder,
                    batch_size=batch_size, mode=str(mode), epoch_seconds=epoch_s, source=source)


DEFAULT_SPEC = spec_from_mapping({}, "default")


def job_spec(comment: str, registered: Mapping[str, object] | None) -> LiveSpec:
    """The spec the daemon uses for a job: its comment's, else the one registered in the store,
    else the defaults; raises `BadSpec` when the one it would use is not valid."""
    raw = spec_from_comment(comment)
    if raw is not None:
        return spec_from_mapping(raw, "comment")
    if registered is not None:
        return spec_from_mapping(registered, "store")
    return DEFAULT_SPEC


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
