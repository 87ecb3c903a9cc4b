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
`priority` (default 1), `nodes` (the names of the nodes the job may run on, e.g. `["node03",
"node04"]`: the simulated cluster's `--cluster` names its nodes node01, node02, ...; `bench
live`'s are the live partition's; default: any node), `node_count` (the nodes the job asks for,
its `gpus` split evenly over them, as Slurm's `-N 2 --gres=gpu:4` is 8 GPUs on two nodes; it must
divide `gpus`; default 1: on one node when one holds the gang, else on whole nodes). Blank lines
and lines starting with `#` are ignored.

Every value is bounded (`shockslurm.limits`: each bound and its reason): `id` 0..2^53-1, `gpus`
1..65536, `epochs` 1..10^6, batch sizes 1..2^24, `samples_per_epoch` 1..10^12, `arrival_s`
0..10^9 s, throughputs 10^-6..10^6 iterations/s, `priority` 10^-6..10^6, the epoch duration
at every batch size of `throughput` 10^-3..10^7 s, the job's exclusive run time at most 366 days;
`model` and each node a name as shocksub takes it (1-64 letters, digits, '.', '_', '-'), at most
100,000 nodes (`MAX_JOB_NODES`). `iterations`, when
given, ends the job within its last epoch: `(epochs - 1) x I < iterations <= epochs x I`, I the
iterations of an epoch at the first batch size (`ceil(samples_per_epoch / batch size)`), as the
reference's `total_steps` makes its epoch count.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Iterable

from .. import limits
from ..errors import InputError
from ..limits import (MAX_ARRIVAL_S, MAX_BATCH_SIZE, MAX_GPUS, MAX_ITERATIONS,
                      MAX_ITERATIONS_PER_S, MAX_JOB_ID, MAX_LADDER, MAX_PRIORITY,
                      MAX_SAMPLES_PER_EPOCH, MIN_ITERATIONS_PER_S, MIN_PRIORITY, shown)
from ..model import ADAPTATION_MODES, MAX_EPOCHS, JobSpec
from .catalogue import CATALOGUE
from .checks import (check_epoch_seconds, check_exclusive, epoch_seconds, place, read_text,
                     stored)

REQUIRED = ("model", "gpus", "arrival_s", "epochs", "schedule")
KNOWN = set(REQUIRED) | {"id", "mode", "dataset", "samples_per_epoch", "throughput", "iterations",
                         "priority", "nodes", "node_count"}
BATCH_KEY_RE = re.compile(r"[1-9][0-9]{0,8}")     # a batch size as a throughput key
MAX_DATASET_CHARS = 128
MAX_JOB_NODES = 100_000          # a node has a GPU, and a cluster at most 100,000 (model.py)
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
                             f"{shown(seg)}", field="schedule", **where)
        first, bs = seg
        if ((k == 0 and first != 0) or first <= previous or first >= epochs
                or not 1 <= bs <= MAX_BATCH_SIZE):
            raise InputError(f"segment {k} {shown(seg)}: the first segment starts at epoch 0, "
                             f"epochs increase and stay below {epochs}, batch sizes are in "
                             f"1..{MAX_BATCH_SIZE}", field="schedule", **where)
        previous = first
    for k, (first, bs) in enumerate(segments):
        end = segments[k + 1][0] if k + 1 < len(segments) else epochs
        out += [bs] * (end - first)
    return out


def _throughputs(raw: Any, where: dict) -> dict[int, float]:
    """The `throughput` object: batch sizes (decimal keys) to iterations/s, each bounded."""
    if not isinstance(raw, dict) or not 1 <= len(raw) <= MAX_LADDER:
        raise InputError(f"must map 1..{MAX_LADDER} batch sizes to iterations/s, got "
                         f"{shown(raw)}", field="throughput", **where)
    rates: dict[int, float] = {}
    for key, value in raw.items():
        if not BATCH_KEY_RE.fullmatch(key) or int(key) > MAX_BATCH_SIZE:
            raise InputError(f"batch size {place(key)!r}: keys must be batch sizes 1.."
                             f"{MAX_BATCH_SIZE} in decimal digits", field="throughput", **where)
        try:
            rates[int(key)] = limits.number(value, "throughput", MIN_ITERATIONS_PER_S,
                                            MAX_ITERATIONS_PER_S)
        except limits.BadValue as exc:
            raise InputError(f"batch size {key}: {exc.message} (iterations/s of the gang)",
                             field="throughput", **where) from None
    return rates


def _node_names(raw: Any, where: dict) -> frozenset[str]:
    """The `nodes` list: 1..MAX_JOB_NODES node names."""
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_JOB_NODES:
        raise InputError(f"must list 1..{MAX_JOB_NODES:,} node names, got {shown(raw)}",
                         field="nodes", **where)
    return frozenset(limits.name(n, "nodes", **where) for n in raw)


def parse_job(row: Any, *, index: int, source: str = "<jsonl>", line: int = 1) -> JobSpec:
    where: dict[str, Any] = {"source": source, "line": line}
    if not isinstance(row, dict):
        raise InputError("each line must be a JSON object", **where)
    unknown = sorted(set(row) - KNOWN)
    if unknown:
        listed = ", ".join(place(k) for k in unknown[:5]) + (", ..." if len(unknown) > 5 else "")
        raise InputError(f"unknown keys [{listed}] (known: {', '.join(sorted(KNOWN))})", **where)
    for key in REQUIRED:
        if key not in row:
            raise InputError("missing", field=key, **where)
    model = limits.name(row["model"], "model", **where)
    info = CATALOGUE.get(model)
    if info is None and ("samples_per_epoch" not in row or "throughput" not in row):
        raise InputError(f"model {model!r} is not in the catalogue ({', '.join(sorted(CATALOGUE))});"
                         f" give samples_per_epoch and throughput", field="model", **where)
    mode = row.get("mode", "static")
    if not isinstance(mode, str) or mode not in ADAPTATION_MODES:
        raise InputError(f"unknown mode {shown(mode)} (known: {', '.join(ADAPTATION_MODES)})",
                         field="mode", **where)
    gpus = limits.integer(row["gpus"], "gpus", 1, MAX_GPUS, **where)
    epochs = limits.integer(row["epochs"], "epochs", 1, MAX_EPOCHS, **where)
    schedule = _expand_schedule(row["schedule"], epochs, where)
    samples = limits.integer(row.get("samples_per_epoch", info.samples_per_epoch if info else None),
                             "samples_per_epoch", 1, MAX_SAMPLES_PER_EPOCH, **where)
    if "throughput" in row:
        rates = _throughputs(row["throughput"], where)
    else:
        assert info is not None      # refused above: an unknown model must give its throughput
        rates = {b: info.iterations_per_s(b, gpus) for b in sorted(set(schedule) | set(info.ladder))}
    missing = sorted(set(schedule) - set(rates))
    if missing:
        raise InputError(f"no throughput for batch sizes {missing}", field="throughput", **where)
    check_epoch_seconds(samples, rates, field="throughput" if "throughput" in row else "gpus",
                        origin="" if "throughput" in row else " by the catalogue's model",
                        **where)
    durations = tuple(epoch_seconds(samples, b, rates[b]) for b in schedule)
    check_exclusive(durations, field="epochs", **where)
    per_epoch = -(-samples // schedule[0])          # iterations of an epoch at the first size
    if "iterations" in row:
        iterations = limits.integer(row["iterations"], "iterations", 1, MAX_ITERATIONS, **where)
        if not (epochs - 1) * per_epoch < iterations <= epochs * per_epoch:
            raise InputError(f"{iterations} iterations of {per_epoch} per epoch (at batch size "
                             f"{schedule[0]}) make {-(-iterations // per_epoch)} epochs, not "
                             f"{epochs}: give {(epochs - 1) * per_epoch + 1}.."
                             f"{epochs * per_epoch}, or leave iterations out (whole epochs)",
                             field="iterations", **where)
    elif epochs * per_epoch > MAX_ITERATIONS:
        raise InputError(f"{epochs} epochs of {per_epoch} iterations (at batch size "
                         f"{schedule[0]}) are over {MAX_ITERATIONS} iterations",
                         field="samples_per_epoch", **where)
    if "dataset" in row:
        dataset = row["dataset"]
        if (not isinstance(dataset, str) or not 1 <= len(dataset) <= MAX_DATASET_CHARS
                or not dataset.isprintable()):
            raise InputError(f"expected a name of 1..{MAX_DATASET_CHARS} printable characters, "
                             f"got {shown(dataset)}", field="dataset", **where)
    else:
        dataset = info.dataset if info else "unknown"
    job_id = limits.integer(row["id"], "id", 0, MAX_JOB_ID, **where) if "id" in row else index
    return JobSpec(
        job_id=job_id, job_type=f"{model} (batch size {schedule[0]})", model=model,
        dataset=dataset, samples_per_epoch=samples, gang_size=gpus,
        arrival_s=limits.number(row["arrival_s"], "arrival_s", 0, MAX_ARRIVAL_S, **where),
        mode=mode, batch_sizes=tuple(schedule), epoch_durations=durations, throughput=rates,
        priority_weight=limits.number(row.get("priority", 1.0), "priority", MIN_PRIORITY,
                                      MAX_PRIORITY, **where),
        total_iterations=iterations if "iterations" in row else None,
        allowed_nodes=_node_names(row["nodes"], where) if "nodes" in row else None,
        node_count=_node_count(row.get("node_count", 1), gpus, where))


def _node_count(raw: Any, gpus: int, where: dict) -> int:
    """`node_count`: 1..`gpus` nodes that split the job's GPUs evenly."""
    count = limits.integer(raw, "node_count", 1, min(gpus, MAX_JOB_NODES), **where)
    if gpus % count:
        raise InputError(f"{gpus} GPUs do not split evenly over {count} nodes",
                         field="node_count", **where)
    return count


def read_jobs(path: str | Path) -> list[JobSpec]:
    source = str(path)
    lines = read_text(path, "workload").splitlines()
    jobs: list[JobSpec] = []
    first_line: dict[int, int] = {}      # job id -> the line that gave it first
    for number, text in enumerate(lines, start=1):
        if not text.strip() or text.lstrip().startswith("#"):
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"invalid JSON: {exc.msg} (column {exc.colno})", source=source,
                             line=number) from None
        except (ValueError, RecursionError) as exc:  # e.g. a 5000-digit number, deep nesting
            raise InputError(f"unreadable JSON: {str(exc).split('; use sys.')[0][:200]}",
                             source=source, line=number) from None
        job = parse_job(row, index=len(jobs), source=source, line=number)
        if job.job_id in first_line:
            raise InputError(f"job ids must be unique: {job.job_id} is line "
                             f"{first_line[job.job_id]}'s too", source=source, line=number,
                             field="id")
        first_line[job.job_id] = number
        jobs.append(job)
    if not jobs:
        raise InputError("the workload has no jobs", source=source)
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
    if job.allowed_nodes is not None:
        row["nodes"] = sorted(job.allowed_nodes)
    if job.node_count != 1:
        row["node_count"] = job.node_count
    return row


def write_jobs(jobs: Iterable[JobSpec], path: str | Path) -> None:
    """Write `jobs` to `path`, one JSON line each, atomically: a failure (disk full, a file size
    limit) is an `atomic.OutputWriteError` naming the path (and its option, `--out`, when it
    came from the command line) and leaves the file already there untouched."""
    from typing import IO

    from ..atomic import write_file

    def lines(fh: IO[bytes]) -> None:
        for job in jobs:
            fh.write((json.dumps(job_to_row(job)) + "\n").encode("utf-8"))

    write_file(path if isinstance(path, Path) else Path(path), stored(path, lines))
