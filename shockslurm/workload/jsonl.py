"""Our own trace format: JSON Lines, one job per line, with an explicit batch-size schedule.

```
{"id": 7, "model": "ResNet-18", "gpus": 2, "arrival_s": 340.0, "mode": "accordion",
 "epochs": 60, "schedule": [[0, 32], [18, 256]],
 "dataset": "CIFAR-10", "samples_per_epoch": 50000,
 "throughput": {"32": 38.1, "256": 5.9}, "iterations": 93780, "priority": 1.0}
```

Required: `model`, `gpus`, `arrival_s`, `epochs`, `schedule` (segments `[first_epoch, batch
size]`, the first at epoch 0, epochs strictly increasing). Optional: `id` (default: line order),
`mode` (default `static`; informational), `dataset` and `samples_per_epoch` (default: the
built-in catalogue's), `throughput` (iterations/s of the whole gang per batch size; default: the
catalogue's throughput model), `iterations` (at the first batch size; default whole epochs),
`priority` (default 1). Blank lines and lines starting with `#` are ignored.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterable

from ..errors import InputError
from ..model import ADAPTATION_MODES, MAX_EPOCHS, JobSpec
from .catalogue import CATALOGUE

REQUIRED = ("model", "gpus", "arrival_s", "epochs", "schedule")
KNOWN = set(REQUIRED) | {"id", "mode", "dataset", "samples_per_epoch", "throughput", "iterations",
                         "priority"}
# The schedule is expanded to one entry per epoch: bound it so a typo cannot exhaust memory.


def _expand_schedule(segments: Any, epochs: int, where: dict) -> list[int]:
    if not isinstance(segments, list) or not segments:
        raise InputError("must be a non-empty list of [first_epoch, batch_size]", field="schedule",
                         **where)
    out: list[int] = []
    previous = -1
    for k, seg in enumerate(segments):
        if (not isinstance(seg, list) or len(seg) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in seg)):
            raise InputError(f"segment {k} must be [first_epoch, batch_size] integers, got "
                             f"{seg!r}", field="schedule", **where)
        first, bs = seg
        if (k == 0 and first != 0) or first <= previous or first >= epochs or bs <= 0:
            raise InputError(f"segment {k} {seg!r}: the first segment starts at epoch 0, epochs "
                             f"increase and stay below {epochs}, batch sizes are positive",
                             field="schedule", **where)
        previous = first
    for k, (first, bs) in enumerate(segments):
        end = segments[k + 1][0] if k + 1 < len(segments) else epochs
        out += [bs] * (end - first)
    return out


def _positive(row: dict, key: str, kind: type, where: dict, default: Any = None) -> Any:
    value = row.get(key, default)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    try:  # ints beyond a float's range (JSON allows 1e400 written as digits) are no use here
        ok = ok and math.isfinite(value) and (kind is not int or float(value).is_integer())
    except OverflowError:
        ok = False
    if not ok or value < 0 or (value == 0 and key != "arrival_s"):
        raise InputError(f"expected a positive {kind.__name__}, got {value!r}", field=key, **where)
    return kind(value)


def parse_job(row: Any, *, index: int, source: str = "<jsonl>", line: int = 1) -> JobSpec:
    where: dict[str, Any] = {"source": source, "line": line}
    if not isinstance(row, dict):
        raise InputError("each line must be a JSON object", **where)
    unknown = sorted(set(row) - KNOWN)
    if unknown:
        raise InputError(f"unknown keys {unknown} (known: {sorted(KNOWN)})", **where)
    for key in REQUIRED:
        if key not in row:
            raise InputError("missing", field=key, **where)
    model = row["model"]
    if not isinstance(model, str) or not model:
        raise InputError(f"expected a model name, got {model!r}", field="model", **where)
    info = CATALOGUE.get(model)
    if info is None and ("samples_per_epoch" not in row or "throughput" not in row):
        raise InputError(f"model {model!r} is not in the catalogue ({', '.join(sorted(CATALOGUE))});"
                         f" give samples_per_epoch and throughput", field="model", **where)
    mode = row.get("mode", "static")
    if mode not in ADAPTATION_MODES:
        raise InputError(f"unknown mode {mode!r} (known: {', '.join(ADAPTATION_MODES)})",
                         field="mode", **where)
    gpus = _positive(row, "gpus", int, where)
    epochs = _positive(row, "epochs", int, where)
    if epochs > MAX_EPOCHS:
        raise InputError(f"at most {MAX_EPOCHS} epochs, got {epochs}", field="epochs", **where)
    schedule = _expand_schedule(row["schedule"], epochs, where)
    samples = _positive(row, "samples_per_epoch", int, where,
                        info.samples_per_epoch if info else None)
    if "throughput" in row:
        raw = row["throughput"]
        if not isinstance(raw, dict):
            raise InputError("must map batch size to iterations/s", field="throughput", **where)
        try:
            rates = {int(k): float(v) for k, v in raw.items()}
        except (TypeError, ValueError, OverflowError):
            raise InputError(f"must map integer batch sizes to numbers, got {raw!r}",
                             field="throughput", **where) from None
        if any(not (v > 0 and math.isfinite(v)) for v in rates.values()):
            raise InputError("throughputs must be positive numbers", field="throughput", **where)
    else:
        assert info is not None      # refused above: an unknown model must give its throughput
        rates = {b: info.iterations_per_s(b, gpus) for b in sorted(set(schedule) | set(info.ladder))}
    missing = sorted(set(schedule) - set(rates))
    if missing:
        raise InputError(f"no throughput for batch sizes {missing}", field="throughput", **where)
    try:
        durations = tuple(samples / b / rates[b] for b in schedule)
    except OverflowError:
        durations = (math.inf,)
    if not all(math.isfinite(d) for d in durations):
        raise InputError("samples_per_epoch / batch size / throughput overflows an epoch's "
                         "duration", field="samples_per_epoch", **where)
    job_id = _id(row, where) if "id" in row else index
    return JobSpec(
        job_id=job_id, job_type=f"{model} (batch size {schedule[0]})", model=model,
        dataset=str(row.get("dataset", info.dataset if info else "unknown")),
        samples_per_epoch=samples, gang_size=gpus,
        arrival_s=_positive(row, "arrival_s", float, where), mode=mode,
        batch_sizes=tuple(schedule), epoch_durations=durations, throughput=rates,
        priority_weight=_positive(row, "priority", float, where, 1.0),
        total_iterations=_positive(row, "iterations", int, where) if "iterations" in row else None)


def _id(row: dict, where: dict) -> int:
    value = row["id"]
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InputError(f"expected a non-negative integer, got {value!r}", field="id", **where)
    return value


def read_jobs(path: str | Path) -> list[JobSpec]:
    source = str(path)
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read workload: {exc}", source=source) from None
    jobs: list[JobSpec] = []
    for number, text in enumerate(lines, start=1):
        if not text.strip() or text.lstrip().startswith("#"):
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"invalid JSON: {exc.msg} (column {exc.colno})", source=source,
                             line=number) from None
        except (ValueError, RecursionError) as exc:  # e.g. a 5000-digit number, deep nesting
            raise InputError(f"unreadable JSON: {str(exc)[:200]}", source=source,
                             line=number) from None
        jobs.append(parse_job(row, index=len(jobs), source=source, line=number))
    if not jobs:
        raise InputError("the workload has no jobs", source=source)
    ids = [j.job_id for j in jobs]
    if len(set(ids)) != len(ids):
        raise InputError("job ids must be unique", source=source, field="id")
    return jobs


def job_to_row(job: JobSpec) -> dict[str, Any]:
    """The inverse of `parse_job` (schedule compressed to segments)."""
    segments: list[list[int]] = []
    for epoch, bs in enumerate(job.batch_sizes):
        if not segments or segments[-1][1] != bs:
            segments.append([epoch, bs])
    row = {"id": job.job_id, "model": job.model, "dataset": job.dataset,
           "samples_per_epoch": job.samples_per_epoch, "gpus": job.gang_size,
           "arrival_s": job.arrival_s, "mode": job.mode, "epochs": job.num_epochs,
           "schedule": segments,
           "throughput": {str(b): round(v, 6) for b, v in sorted(job.throughput.items())}}
    if job.total_iterations is not None:
        row["iterations"] = job.total_iterations
    if job.priority_weight != 1.0:
        row["priority"] = job.priority_weight
    return row


def write_jobs(jobs: Iterable[JobSpec], path: str | Path) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for job in jobs:
            fh.write(json.dumps(job_to_row(job)) + "\n")
