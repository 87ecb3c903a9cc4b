"""Reference-like workloads: jobs drawn the way the Shockwave reference's trace generator draws
them (`shockslurm trace generate --like reference`).

The distributions are facts read from the reference's published generator
(`scheduler/scripts/utils/generate_trace.py`, `scheduler/utils.py`, `scheduler/job_table.py` in
uw-mad-dash/shockwave) and from its 120-job trace (`../shared/data/shockwave-120`); the code
is ours. Each job, in order:

1. **Job type**: one of 21 (model, initial batch size) templates, uniformly (`TEMPLATES`):
   ResNet-18 at 32/64/128/256, ResNet-50 at 16/32/64, Transformer at 16/32/64/128, LM at
   5/10/20/40/80, Recommendation at 512-8192. Recommendation is the one model the reference does
   not distribute.
2. **Gang size**: 1/2/4/8 GPUs with probabilities 0.6/0.3/0.09/0.01 (`gang_mix`) for a
   distributed model, 1 for Recommendation (so over all jobs 1 GPU is drawn about 70 % of the
   time).
3. **Static duration** (exclusive run time at the initial batch size): `duration_choices`
   values evenly spaced from `min_duration_h` to `max_duration_h` (100 values, 0.2-5 h, the grid
   the 120-job trace's durations lie on), split into four tiers at 20 %, 50 % and 90 % of the
   grid, drawn with probabilities 0.72/0.20/0.05/0.03 (`duration_tiers`), then uniformly inside
   the tier; rounded to whole seconds. Small jobs (0.2-1.2 h) dominate, a few run 4.5-5 h.
4. **Adaptation mode**: static/accordion/gns with probabilities 0/0.5/0.5 (`mode_mix`; the
   generator's default is a third each, the 120-job trace was drawn with no static jobs), and an
   accordion job shorter than `short_accordion_s` (1,000 s) runs static, as in the reference (it
   would otherwise shrink to a few minutes).
5. **Length in iterations**: `total_steps = int(duration x throughput)` at the initial batch size
   and the gang size, from the throughput table (the reference's `throughputs-tacc.json`,
   `v100`, isolated figure), or, without one, from the built-in catalogue's throughput model.
6. **Arrival**: the first job at 0 s, then exponential inter-arrival times with mean
   `mean_interarrival_s` (a Poisson process; 42 s is the 120-job trace's rate, chosen there for
   32 GPUs: scale it by 32 / GPUs to keep that load on another cluster). Whole seconds, as the
   reference writes them.

Each field draws from its own random stream seeded from `seed`, so one seed always gives the
same workload. The result is a list of `DrawnJob`s (a `TraceLine` and its duration): written as
a reference TSV trace (simulate it with the same `--throughputs` file: the `reference`
adaptation mode applies) or turned into job specs for our JSONL format
(`reference.reference_jobs`, then each job's profile from the reference's rules alone:
`sim.reference_profiles`, as for a TSV trace without a profile file).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..atomic import write_file
from .catalogue import CATALOGUE
from .checks import stored
from .reference import FIELDS, TraceLine, Throughputs

# (model, initial batch sizes, distributed) of the reference's job table.
TEMPLATES: tuple[tuple[str, tuple[int, ...], bool], ...] = (
    ("ResNet-18", (32, 64, 128, 256), True),
    ("ResNet-50", (16, 32, 64), True),
    ("Transformer", (16, 32, 64, 128), True),
    ("LM", (5, 10, 20, 40, 80), True),
    ("Recommendation", (512, 1024, 2048, 4096, 8192), False),
)
JOB_TYPES: tuple[tuple[str, int, bool], ...] = tuple(
    (model, bs, dist) for model, sizes, dist in TEMPLATES for bs in sizes)
GANG_SIZES = (1, 2, 4, 8)


@dataclass(frozen=True)
class ReferenceLikeConfig:
    jobs: int = 120
    seed: int = 0
    mean_interarrival_s: float = 42.0
    gang_mix: tuple[float, ...] = (0.6, 0.3, 0.09, 0.01)        # P(1, 2, 4, 8 GPUs) if distributed
    mode_mix: tuple[tuple[str, float], ...] = (("static", 0.0), ("accordion", 0.5), ("gns", 0.5))
    min_duration_h: float = 0.2
    max_duration_h: float = 5.0
    duration_choices: int = 100
    # (end of the tier as a fraction of the duration grid, probability of the tier)
    duration_tiers: tuple[tuple[float, float], ...] = ((0.2, 0.72), (0.5, 0.2), (0.9, 0.05),
                                                       (1.0, 0.03))
    short_accordion_s: float = 1000.0

    def __post_init__(self) -> None:
        if self.jobs < 1:
            raise ValueError(f"jobs must be >= 1, got {self.jobs}")
        if not (self.mean_interarrival_s >= 0 and math.isfinite(self.mean_interarrival_s)):
            raise ValueError("mean_interarrival_s must be a finite number >= 0")
        if not 0 < self.min_duration_h <= self.max_duration_h:
            raise ValueError("durations must satisfy 0 < min_duration_h <= max_duration_h")
        if self.duration_choices < len(self.duration_tiers):
            raise ValueError("duration_choices must be at least the number of tiers")
        for name, probs in (("gang_mix", self.gang_mix),
                            ("mode_mix", [p for _, p in self.mode_mix]),
                            ("duration_tiers", [p for _, p in self.duration_tiers])):
            if any(p < 0 for p in probs) or abs(sum(probs) - 1.0) > 1e-6:
                raise ValueError(f"{name}: probabilities must be >= 0 and sum to 1")
        if len(self.gang_mix) != len(GANG_SIZES):
            raise ValueError(f"gang_mix needs one probability per gang size {GANG_SIZES}")

    def duration_grid_s(self) -> np.ndarray:
        return np.linspace(self.min_duration_h, self.max_duration_h, self.duration_choices) * 3600

    def tier_bounds(self) -> list[tuple[int, int]]:
        """[start, end) indices of each duration tier in the grid."""
        ends = [round(self.duration_choices * end) for end, _ in self.duration_tiers]
        return list(zip([0] + ends[:-1], ends))


def catalogue_throughputs() -> dict[tuple[str, int], float]:
    """A throughput table for every job type and gang size from the built-in catalogue's model
    (used when no reference throughput file is given)."""
    return {(f"{model} (batch size {bs})", gang): CATALOGUE[model].iterations_per_s(bs, gang)
            for model, bs, _ in JOB_TYPES for gang in GANG_SIZES}


@dataclass(frozen=True)
class DrawnJob:
    line: TraceLine
    duration_s: int          # the static exclusive run time the job was drawn with


def generate_reference_like(config: ReferenceLikeConfig, table: Throughputs) -> list[DrawnJob]:
    """Draw `config.jobs` jobs (see the module docstring); `table` gives iterations/s per
    (job type, gang size)."""
    streams = np.random.SeedSequence(config.seed).spawn(5)
    job_rng, gang_rng, duration_rng, mode_rng, arrival_rng = (np.random.default_rng(s)
                                                             for s in streams)
    grid = config.duration_grid_s()
    tiers = config.tier_bounds()
    tier_p = np.array([p for _, p in config.duration_tiers])
    modes = [m for m, _ in config.mode_mix]
    mode_p = np.array([p for _, p in config.mode_mix])
    drawn: list[DrawnJob] = []
    arrival = 0.0
    for idx in range(config.jobs):
        model, bs, distributed = JOB_TYPES[int(job_rng.integers(len(JOB_TYPES)))]
        gang = int(GANG_SIZES[int(gang_rng.choice(len(GANG_SIZES), p=config.gang_mix))]) \
            if distributed else 1
        lo, hi = tiers[int(duration_rng.choice(len(tiers), p=tier_p))]
        duration = round(float(grid[int(duration_rng.integers(lo, max(hi, lo + 1)))]))
        mode = modes[int(mode_rng.choice(len(modes), p=mode_p))]
        if mode == "accordion" and duration < config.short_accordion_s:
            mode = "static"
        job_type = f"{model} (batch size {bs})"
        rate = table.get((job_type, gang))
        if rate is None:
            raise ValueError(f"the throughput table has no entry for ('{job_type}', {gang})")
        if idx:
            arrival += float(arrival_rng.exponential(config.mean_interarrival_s))
        line = TraceLine(line=idx + 1, job_type=job_type, model=model, batch_size=bs,
                         total_steps=max(1, int(duration * rate)), gang_size=gang, mode=mode,
                         priority_weight=1.0, arrival_s=float(int(arrival)))
        drawn.append(DrawnJob(line, duration))
    return drawn


def write_reference_trace(drawn: list[DrawnJob], path: str | Path) -> None:
    """The reference's 12-field TSV. The command, working directory and steps argument are
    placeholders (only a physical cluster of the reference uses them). Written whole or not at
    all (`atomic.write_file`: a failure is an `OutputWriteError` naming the file)."""
    lines = []
    for job in drawn:
        tl = job.line
        row = {"job_type": tl.job_type,
               "command": f"train {tl.model} --batch_size {tl.batch_size}",
               "working_directory": CATALOGUE[tl.model].dataset.lower(),
               "num_steps_arg": "--num_steps", "needs_data_dir": "1",
               "total_steps": str(tl.total_steps), "scale_factor": str(tl.gang_size),
               "mode": tl.mode, "priority_weight": f"{tl.priority_weight:g}",
               "SLO": "-1.000000", "duration": str(job.duration_s),
               "arrival_time": str(int(tl.arrival_s))}
        lines.append("\t".join(row[f] for f in FIELDS) + "\n")
    write_file(path if isinstance(path, Path) else Path(path),
               stored(path, "".join(lines).encode("utf-8")))
