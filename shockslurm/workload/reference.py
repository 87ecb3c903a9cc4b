"""Reader of the Shockwave/Gavel reference workload: TSV trace + throughput JSON (+ profiles).

Trace: one job per line, 12 TAB-separated fields, no header (see `FIELDS`). Throughputs:
`{gpu_type: {"('<job_type>', <gang>)": {"null": iterations/s, ...}}}`; only the isolated
("null") figure of one GPU type is used. Profiles (optional, JSON or gzipped JSON): a list indexed
by trace line with each job's per-epoch batch size and duration. Without profiles the epoch count
is derived as the reference does and the batch-size pattern comes from `adaptation`; the
simulator's `sim.reference_profiles.load_reference_trace` replaces it with what the reference's
rules make of each job alone, as the reference's own profiles are.

Every problem is reported as an `InputError` naming file, line and field, before anything runs.
"""

from __future__ import annotations

import ast
import gzip
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..errors import InputError
from ..model import ADAPTATION_MODES, MAX_EPOCHS, JobSpec
from .adaptation import batch_size_schedule
from .catalogue import CATALOGUE

FIELDS = ("job_type", "command", "working_directory", "num_steps_arg", "needs_data_dir",
          "total_steps", "scale_factor", "mode", "priority_weight", "SLO", "duration",
          "arrival_time")
JOB_TYPE_RE = re.compile(r"^(?P<model>[A-Za-z0-9_.-]+(?: [A-Za-z0-9_.-]+)*) \(batch size (?P<bs>\d+)\)$")
GANG_SIZES = (1, 2, 4, 8, 16, 32, 64)


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
            strict: bool = False) -> Any:
    try:
        value = kind(text)
    except ValueError:
        raise InputError(f"expected a {kind.__name__}, got {text!r}", source=source, line=line,
                         field=field) from None
    if isinstance(value, float) and not math.isfinite(value):
        raise InputError(f"expected a finite number, got {text!r}", source=source, line=line,
                         field=field)
    if value < minimum or (strict and value == minimum):
        bound = f"> {minimum}" if strict else f">= {minimum}"
        raise InputError(f"must be {bound}, got {text!r}", source=source, line=line, field=field)
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
    gang = _number(row["scale_factor"], int, field="scale_factor", minimum=1, **common)
    if gang not in GANG_SIZES:
        raise InputError(f"gang size must be one of {GANG_SIZES}, got {gang}", field="scale_factor",
                         **common)
    return TraceLine(
        line=line,
        job_type=row["job_type"],
        model=m["model"],
        batch_size=_number(m["bs"], int, field="job_type", minimum=0, strict=True, **common),
        total_steps=_number(row["total_steps"], int, field="total_steps", minimum=0, strict=True,
                            **common),
        gang_size=gang,
        mode=mode,
        priority_weight=_number(row["priority_weight"], float, field="priority_weight", minimum=0,
                                strict=True, **common),
        arrival_s=_number(row["arrival_time"], float, field="arrival_time", minimum=0, **common),
    )


def read_trace(path: str | Path) -> list[TraceLine]:
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read trace: {exc}", source=source) from None
    # Only "\n" ends a line (a "\r" before it is stripped by `parse_trace_line`): splitlines()
    # would also split on \f, \x1c, \x85, \u2028, ... inside a field and shift every line number.
    lines = text.split("\n")
    parsed = [parse_trace_line(ln, source=source, line=i + 1) for i, ln in enumerate(lines)
              if ln.strip()]
    if not parsed:
        raise InputError("the trace has no jobs", source=source)
    return parsed


def read_throughputs(path: str | Path, gpu_type: str = "v100") -> Throughputs:
    """Isolated throughputs {(job_type, gang): iterations/s} of one GPU type."""
    source = str(path)
    data = _load_json(path)
    if not isinstance(data, dict) or gpu_type not in data:
        raise InputError(f"no GPU type '{gpu_type}' in the throughput file", source=source)
    table: dict[tuple[str, int], float] = {}
    for key, entry in data[gpu_type].items():
        try:
            job_type, gang = ast.literal_eval(key)
            value = float(entry["null"])
        except (ValueError, SyntaxError, TypeError, KeyError):
            raise InputError(f"malformed entry {key!r}: expected \"('<job_type>', <gang>)\" with "
                             f"a numeric 'null' throughput", source=source, field=key) from None
        if not (value >= 0 and math.isfinite(value)):
            raise InputError(f"throughput must be a non-negative number, got {entry['null']!r}",
                             source=source, field=key)
        if value > 0:  # 0 marks a configuration that was not measured (e.g. out of memory)
            table[(str(job_type), int(gang))] = value
    return table


def read_profiles(path: str | Path) -> list[dict[str, Any]]:
    data = _load_json(path)
    if not isinstance(data, list):
        raise InputError("expected a JSON list of per-job profiles", source=str(path))
    return data


def _load_json(path: str | Path) -> Any:
    source = str(path)
    opener = gzip.open if source.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as fh:
            return json.load(fh)
    except FileNotFoundError:
        raise InputError("file not found", source=source) from None
    except (OSError, UnicodeDecodeError, EOFError) as exc:
        raise InputError(f"cannot read: {exc}", source=source) from None
    except json.JSONDecodeError as exc:
        raise InputError(f"invalid JSON: {exc.msg} (column {exc.colno})", source=source,
                         line=exc.lineno) from None


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
        if profs is not None:
            schedule, durations = _profile_schedule(profs[idx], tl, idx, profiles_source)
            missing = sorted(set(schedule) - set(rates))
            if missing:
                raise InputError(f"profile uses batch sizes {missing} with no throughput for "
                                 f"('{tl.model}', {tl.gang_size})", source=profiles_source,
                                 field=f"[{idx}].bs_every_epoch")
        else:
            iters_per_epoch = math.ceil(info.samples_per_epoch / tl.batch_size)
            epochs = math.ceil(tl.total_steps / iters_per_epoch)
            if epochs > MAX_EPOCHS:
                raise InputError(f"{tl.total_steps} steps make {epochs} epochs (at most "
                                 f"{MAX_EPOCHS})", source=source, line=tl.line,
                                 field="total_steps")
            schedule = batch_size_schedule(tl.mode, epochs, tl.batch_size, sorted(rates))
            durations = [info.samples_per_epoch / b / rates[b] for b in schedule]
        jobs.append(JobSpec(
            job_id=idx, job_type=tl.job_type, model=tl.model, dataset=info.dataset,
            samples_per_epoch=info.samples_per_epoch, gang_size=tl.gang_size,
            arrival_s=tl.arrival_s, mode=tl.mode, batch_sizes=tuple(schedule),
            epoch_durations=tuple(durations), throughput=rates,
            priority_weight=tl.priority_weight, total_iterations=tl.total_steps))
    return jobs


def _profile_schedule(entry: Any, tl: TraceLine, idx: int, source: str
                      ) -> tuple[list[int], list[float]]:
    where = f"[{idx}]"
    if not isinstance(entry, dict):
        raise InputError("expected an object", source=source, field=where)
    try:
        bs = [int(b) for b in entry["bs_every_epoch"]]
        dur = [float(d) for d in entry["duration_every_epoch"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"missing or non-numeric per-epoch data ({exc})", source=source,
                         field=where) from None
    if entry.get("model") != tl.model or int(entry.get("scale_factor", -1)) != tl.gang_size:
        raise InputError(f"profile is for ({entry.get('model')!r}, {entry.get('scale_factor')}) but "
                         f"trace line {tl.line} is ({tl.model!r}, {tl.gang_size})", source=source,
                         field=where)
    if not bs or len(bs) != len(dur):
        raise InputError("bs_every_epoch and duration_every_epoch must be non-empty and of equal "
                         "length", source=source, field=where)
    if any(b <= 0 for b in bs) or any(not (d > 0 and math.isfinite(d)) for d in dur):
        raise InputError("batch sizes and durations must be positive", source=source, field=where)
    return bs, dur
