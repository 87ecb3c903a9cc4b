"""Reader of the Shockwave/Gavel reference workload: TSV trace + throughput JSON (+ profiles).

Trace: one job per line, 12 TAB-separated fields, no header (see `FIELDS`). Throughputs:
`{gpu_type: {"('<job_type>', <gang>)": {"null": iterations/s, ...}}}`; only the isolated
("null") figure of one GPU type is used. Profiles (optional, JSON or gzipped JSON): a list indexed
by trace line with each job's per-epoch batch size and duration. Without profiles the epoch count
is derived as the reference does and the batch-size pattern comes from `adaptation`; the
simulator's `sim.reference_profiles.load_reference_trace` replaces it with what the reference's
rules make of each job alone, as the reference's own profiles are.

Every problem is reported as an `InputError` naming file, line and field (or the key of a JSON
file), before anything runs. Every value is bounded (`shockslurm.limits`: each bound and its
reason): the trace's numbers, each throughput, each profile's batch sizes and durations, and what
they make of a job (its epoch durations at every batch size, its exclusive run time).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from .. import limits
from ..errors import InputError
from ..limits import (MAX_ARRIVAL_S, MAX_BATCH_SIZE, MAX_EPOCH_SECONDS, MAX_EPOCHS, MAX_GPUS,
                      MAX_ITERATIONS, MAX_ITERATIONS_PER_S, MAX_PRIORITY, MIN_EPOCH_SECONDS,
                      MIN_ITERATIONS_PER_S, MIN_PRIORITY, shown)
from ..model import ADAPTATION_MODES, JobSpec
from .adaptation import batch_size_schedule
from .catalogue import CATALOGUE
from .checks import check_epoch_seconds, check_exclusive, epoch_seconds, place, read_text

FIELDS = ("job_type", "command", "working_directory", "num_steps_arg", "needs_data_dir",
          "total_steps", "scale_factor", "mode", "priority_weight", "SLO", "duration",
          "arrival_time")
JOB_TYPE_RE = re.compile(r"^(?P<model>[A-Za-z0-9_.-]+(?: [A-Za-z0-9_.-]+)*) \(batch size (?P<bs>\d+)\)$")
GANG_SIZES = (1, 2, 4, 8, 16, 32, 64)
# A throughput file's key, as the reference writes it: str(("<job_type>", <gang>)). No two
# neighbouring parts can match the same character, so a hostile key is matched in linear time.
THROUGHPUT_KEY_RE = re.compile(
    r"""\(\s*(?:'(?P<single>[^'\\]*)'|"(?P<double>[^"\\]*)")\s*,\s*(?P<gang>[^()\s]+)\s*\)""")
GANG_RE = re.compile(r"[0-9]{1,9}")


@dataclass(frozen=True)
class TraceLine:
    """One parsed line of the reference trace."""

    line: int
    job_type: str
    model: str
    batch_size: int
    total_steps: int
    gang_size: int
    mode: str
    priority_weight: float
    arrival_s: float


Throughputs = Mapping[tuple[str, int], float]


def _number(text: str, kind: type, *, source: str, line: int, field: str, minimum: float,
            maximum: float, strict: bool = False) -> Any:
    try:
        value = kind(text)
    except (ValueError, OverflowError):      # also an int of over 4300 digits
        raise InputError(f"expected {'an integer' if kind is int else 'a number'}, got "
                         f"{shown(text)}", source=source, line=line, field=field) from None
    if isinstance(value, float) and not math.isfinite(value):
        raise InputError(f"expected a finite number, got {shown(text)}", source=source,
                         line=line, field=field)
    if value < minimum or (strict and value == minimum):
        bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
        raise InputError(f"must be {bound}, got {shown(text)}", source=source, line=line,
                         field=field)
    if value > maximum:
        raise InputError(f"must be at most {maximum:g}, got {shown(text)}", source=source,
                         line=line, field=field)
    return value


def parse_trace_line(text: str, *, source: str = "<trace>", line: int = 1) -> TraceLine:
    parts = text.rstrip("\r\n").split("\t")
    if len(parts) != len(FIELDS):
        raise InputError(f"expected {len(FIELDS)} TAB-separated fields, found {len(parts)}",
                         source=source, line=line)
    row = dict(zip(FIELDS, parts))
    m = JOB_TYPE_RE.match(row["job_type"])
    if not m:
        raise InputError(f"expected '<model> (batch size <N>)', got {row['job_type']!r}",
                         source=source, line=line, field="job_type")
    if m["model"] not in CATALOGUE:
        raise InputError(f"unknown model {m['model']!r} (known: {', '.join(sorted(CATALOGUE))})",
                         source=source, line=line, field="job_type")
    mode = row["mode"].strip()
    if mode not in ADAPTATION_MODES:
        raise InputError(f"unknown mode {mode!r} (known: {', '.join(ADAPTATION_MODES)})",
                         source=source, line=line, field="mode")
    common: dict[str, Any] = {"source": source, "line": line}
    gang = _number(row["scale_factor"], int, field="scale_factor", minimum=1,
                   maximum=max(GANG_SIZES), **common)
    if gang not in GANG_SIZES:
        raise InputError(f"gang size must be one of {GANG_SIZES}, got {gang}", field="scale_factor",
                         **common)
    return TraceLine(
        line=line,
        job_type=row["job_type"],
        model=m["model"],
        batch_size=_number(m["bs"], int, field="job_type", minimum=0, strict=True,
                           maximum=MAX_BATCH_SIZE, **common),
        total_steps=_number(row["total_steps"], int, field="total_steps", minimum=0, strict=True,
                            maximum=MAX_ITERATIONS, **common),
        gang_size=gang,
        mode=mode,
        priority_weight=_number(row["priority_weight"], float, field="priority_weight",
                                minimum=MIN_PRIORITY, maximum=MAX_PRIORITY, **common),
        arrival_s=_number(row["arrival_time"], float, field="arrival_time", minimum=0,
                          maximum=MAX_ARRIVAL_S, **common),
    )


def read_trace(path: str | Path) -> list[TraceLine]:
    source = str(path)
    text = read_text(path, "trace")
    # Only "\n" ends a line (a "\r" before it is stripped by `parse_trace_line`): splitlines()
    # would also split on \f, \x1c, \x85, \u2028, ... inside a field and shift every line number.
    lines = text.split("\n")
    parsed = [parse_trace_line(ln, source=source, line=i + 1) for i, ln in enumerate(lines)
              if ln.strip()]
    if not parsed:
        raise InputError("the trace has no jobs", source=source)
    return parsed


def read_throughputs(path: str | Path, gpu_type: str = "v100") -> Throughputs:
    """Isolated throughputs {(job_type, gang): iterations/s} of one GPU type. Each key is
    `('<job_type>', <gang>)` with a whole number of GPUs, each "null" figure 0 (not measured:
    left out) or within `MIN_ITERATIONS_PER_S` .. `MAX_ITERATIONS_PER_S`."""
    source = str(path)
    data = _load_json(path)
    if not isinstance(data, dict):
        raise InputError(f"expected a JSON object of GPU types, got a {type(data).__name__}",
                         source=source)
    if gpu_type not in data:
        raise InputError(f"no GPU type '{gpu_type}' in the throughput file", source=source)
    entries = data[gpu_type]
    if not isinstance(entries, dict):
        raise InputError(f"expected an object of \"('<job_type>', <gang>)\" entries, got a "
                         f"{type(entries).__name__}", source=source, field=gpu_type)
    table: dict[tuple[str, int], float] = {}
    keys: dict[tuple[str, int], str] = {}
    for key, entry in entries.items():
        where: dict[str, Any] = {"source": source, "field": place(key)}
        m = THROUGHPUT_KEY_RE.fullmatch(key)
        if m is None:
            raise InputError("malformed key: expected \"('<job_type>', <gang>)\"", **where)
        job_type = m["single"] if m["single"] is not None else m["double"]
        gang_text = m["gang"]
        if not GANG_RE.fullmatch(gang_text) or not 1 <= int(gang_text) <= MAX_GPUS:
            raise InputError(f"the gang size must be a whole number of GPUs in 1..{MAX_GPUS}, "
                             f"got {shown(gang_text)}", **where)
        gang = int(gang_text)
        jt = JOB_TYPE_RE.match(job_type)
        if jt and not (len(jt["bs"]) <= 9 and 1 <= int(jt["bs"]) <= MAX_BATCH_SIZE):
            raise InputError(f"the batch size must be in 1..{MAX_BATCH_SIZE}, got "
                             f"{shown(jt['bs'])}", **where)
        raw = entry.get("null") if isinstance(entry, dict) else None
        if isinstance(raw, bool) or not isinstance(raw, (int, float)):
            raise InputError(f"expected an object with a numeric 'null' throughput, got "
                             f"{shown(entry)}", **where)
        try:
            value = float(raw)
        except OverflowError:                     # an integer beyond a float
            value = math.inf
        if value != 0 and not MIN_ITERATIONS_PER_S <= value <= MAX_ITERATIONS_PER_S:
            raise InputError(f"the 'null' throughput must be 0 (not measured) or "
                             f"{MIN_ITERATIONS_PER_S:g}..{MAX_ITERATIONS_PER_S:g} iterations/s, "
                             f"got {shown(raw)}", **where)
        if (job_type, gang) in keys:
            raise InputError(f"a second entry for ('{place(job_type)}', {gang}) (the first: "
                             f"{place(keys[job_type, gang])})", **where)
        keys[job_type, gang] = key
        if value > 0:  # 0 marks a configuration that was not measured (e.g. out of memory)
            table[(job_type, gang)] = value
    return table


def read_profiles(path: str | Path) -> list[dict[str, Any]]:
    data = _load_json(path)
    if not isinstance(data, list):
        raise InputError("expected a JSON list of per-job profiles", source=str(path))
    return data


def _load_json(path: str | Path) -> Any:
    """A JSON file (gzip-compressed when named .gz); every failure an `InputError`."""
    source = str(path)
    text = read_text(path, "JSON file")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"invalid JSON: {exc.msg} (column {exc.colno})", source=source,
                         line=exc.lineno) from None
    except (ValueError, RecursionError) as exc:  # e.g. a 5000-digit number, deep nesting
        raise InputError(f"unreadable JSON: {_reason(exc)}", source=source) from None


def _reason(exc: BaseException) -> str:
    """Why the JSON module gave up, in a line (less its advice to raise Python's limit)."""
    return str(exc).split("; use sys.")[0][:200] or type(exc).__name__


def _job_throughputs(tl: TraceLine, table: Throughputs, source: str) -> dict[int, float]:
    """Iterations/s of every batch size of the job's model at its gang size."""
    out: dict[int, float] = {}
    for (job_type, gang), value in table.items():
        m = JOB_TYPE_RE.match(job_type)
        if m and gang == tl.gang_size and m["model"] == tl.model:
            out[int(m["bs"])] = value
    if tl.batch_size not in out:
        raise InputError(f"no throughput for ('{tl.job_type}', {tl.gang_size}) in the throughput "
                         f"file", source=source, line=tl.line, field="job_type")
    return out


def load_reference_workload(trace: str | Path, throughputs: str | Path,
                            profiles: str | Path | None = None,
                            gpu_type: str = "v100") -> list[JobSpec]:
    """Read and validate the whole workload; job ids are 0-based trace line order."""
    lines = read_trace(trace)
    table = read_throughputs(throughputs, gpu_type)
    profs = read_profiles(profiles) if profiles is not None else None
    if profs is not None and len(profs) != len(lines):
        raise InputError(f"{len(profs)} profiles for {len(lines)} trace jobs", source=str(profiles))
    return reference_jobs(lines, table, str(trace), profs, str(profiles))


def reference_jobs(lines: list[TraceLine], table: Throughputs, source: str,
                   profs: list[dict[str, Any]] | None = None,
                   profiles_source: str = "<profiles>") -> list[JobSpec]:
    """Job specs of parsed trace lines (job ids = list order) with `table`'s throughputs."""
    jobs = []
    for idx, tl in enumerate(lines):
        info = CATALOGUE[tl.model]
        rates = _job_throughputs(tl, table, source)
        check_epoch_seconds(info.samples_per_epoch, rates, field="job_type", source=source,
                            line=tl.line, origin=f" at {tl.gang_size} GPUs in the throughput "
                                                 f"table")
        iters_per_epoch = math.ceil(info.samples_per_epoch / tl.batch_size)
        epochs = math.ceil(tl.total_steps / iters_per_epoch)
        if profs is not None:
            schedule, durations = _profile_schedule(profs[idx], tl, idx, profiles_source, epochs)
            missing = sorted(set(schedule) - set(rates))
            if missing:
                raise InputError(f"profile uses batch sizes {missing} with no throughput for "
                                 f"('{tl.model}', {tl.gang_size})", source=profiles_source,
                                 field=f"[{idx}].bs_every_epoch")
        else:
            if epochs > MAX_EPOCHS:
                raise InputError(f"{tl.total_steps} steps make {epochs} epochs (at most "
                                 f"{MAX_EPOCHS})", source=source, line=tl.line,
                                 field="total_steps")
            schedule = batch_size_schedule(tl.mode, epochs, tl.batch_size, sorted(rates))
            durations = [epoch_seconds(info.samples_per_epoch, b, rates[b]) for b in schedule]
            check_exclusive(durations, field="total_steps", source=source, line=tl.line)
        jobs.append(JobSpec(
            job_id=idx, job_type=tl.job_type, model=tl.model, dataset=info.dataset,
            samples_per_epoch=info.samples_per_epoch, gang_size=tl.gang_size,
            arrival_s=tl.arrival_s, mode=tl.mode, batch_sizes=tuple(schedule),
            epoch_durations=tuple(durations), throughput=rates,
            priority_weight=tl.priority_weight, total_iterations=tl.total_steps))
    return jobs


def _profile_schedule(entry: Any, tl: TraceLine, idx: int, source: str, epochs: int
                      ) -> tuple[list[int], list[float]]:
    """The per-epoch batch sizes and durations of profile `idx` (`entry`), for trace line `tl`,
    whose `total_steps` make `epochs` epochs (the reference's own count: `num_epochs =
    ceil(total_steps / ceil(samples_per_epoch / initial batch size))`)."""
    where = f"[{idx}]"
    if not isinstance(entry, dict):
        raise InputError(f"expected an object, got {shown(entry)}", source=source, field=where)
    model = entry.get("model")
    gang = limits.integer(entry.get("scale_factor"), f"{where}.scale_factor", 1, MAX_GPUS,
                          source=source)
    if model != tl.model or gang != tl.gang_size:
        raise InputError(f"profile is for ({shown(model)}, {gang}) but trace line {tl.line} is "
                         f"({tl.model!r}, {tl.gang_size})", source=source, field=where)
    lists = []
    for key in ("bs_every_epoch", "duration_every_epoch"):
        values = entry.get(key)
        if not isinstance(values, list) or not 1 <= len(values) <= MAX_EPOCHS:
            raise InputError(f"expected a list of 1..{MAX_EPOCHS} per-epoch values, got "
                             f"{shown(values)}", source=source, field=f"{where}.{key}")
        lists.append(values)
    if len(lists[0]) != len(lists[1]):
        raise InputError(f"bs_every_epoch has {len(lists[0])} epochs, duration_every_epoch "
                         f"{len(lists[1])}", source=source, field=where)
    bs = [limits.integer(b, f"{where}.bs_every_epoch[{e}]", 1, MAX_BATCH_SIZE, source=source)
          for e, b in enumerate(lists[0])]
    dur = [limits.number(d, f"{where}.duration_every_epoch[{e}]", MIN_EPOCH_SECONDS,
                         MAX_EPOCH_SECONDS, source=source) for e, d in enumerate(lists[1])]
    if len(bs) != epochs:
        raise InputError(f"{len(bs)} epochs, but trace line {tl.line}'s {tl.total_steps} steps "
                         f"make {epochs} (ceil(total_steps / ceil(samples_per_epoch / "
                         f"{tl.batch_size})))", source=source, field=f"{where}.bs_every_epoch")
    check_exclusive(dur, field=f"{where}.duration_every_epoch", source=source)
    return bs, dur
