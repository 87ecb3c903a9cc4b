"""The synthetic workload generator behind `shockslurm trace generate` and the default job.

Jobs arrive as a Poisson process; each draws a model from the built-in catalogue, a gang size, an
adaptation mode, an initial batch size (any rung of the ladder but the top) and an epoch count
from the model's range. The batch-size schedule follows `adaptation`'s documented rules and the
throughputs come from the catalogue's own model, so the workload needs no external data. The same
seed always gives the same workload.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from ..model import JobSpec
from .adaptation import batch_size_schedule
from .catalogue import CATALOGUE

T = TypeVar("T")


@dataclass(frozen=True)
class GeneratorConfig:
    jobs: int = 60
    seed: int = 0
    jobs_per_hour: float = 40.0
    gang_sizes: tuple[tuple[int, float], ...] = ((1, 0.6), (2, 0.25), (4, 0.1), (8, 0.05))
    modes: tuple[tuple[str, float], ...] = (("static", 0.3), ("gns", 0.35), ("accordion", 0.35))
    max_exclusive_hours: float = 2.0   # epochs are cut so that no job runs longer exclusively

    def __post_init__(self) -> None:
        if self.jobs <= 0:
            raise ValueError(f"jobs must be positive, got {self.jobs}")
        if self.jobs_per_hour <= 0:
            raise ValueError(f"jobs_per_hour must be positive, got {self.jobs_per_hour}")
        if self.max_exclusive_hours <= 0:
            raise ValueError("max_exclusive_hours must be positive")


def _choice(rng: np.random.Generator, table: tuple[tuple[T, float], ...]) -> T:
    values = [v for v, _ in table]
    weights = np.array([w for _, w in table], dtype=float)
    return values[int(rng.choice(len(values), p=weights / weights.sum()))]


def generate(config: GeneratorConfig = GeneratorConfig()) -> list[JobSpec]:
    rng = np.random.default_rng(config.seed)
    models = sorted(CATALOGUE)
    arrival = 0.0
    jobs: list[JobSpec] = []
    for job_id in range(config.jobs):
        if job_id:
            arrival += float(rng.exponential(3600.0 / config.jobs_per_hour))
        info = CATALOGUE[models[int(rng.integers(len(models)))]]
        gang = int(_choice(rng, config.gang_sizes))
        mode = str(_choice(rng, config.modes))
        bs0 = int(info.ladder[int(rng.integers(len(info.ladder) - 1))])
        rates = {b: info.iterations_per_s(b, gang) for b in info.ladder}
        epochs = int(rng.integers(info.epochs[0], info.epochs[1] + 1))
        schedule = batch_size_schedule(mode, epochs, bs0, info.ladder)
        durations = [info.samples_per_epoch / b / rates[b] for b in schedule]
        while len(schedule) > 1 and sum(durations) > config.max_exclusive_hours * 3600:
            epochs = max(1, int(epochs * 0.8))
            schedule = batch_size_schedule(mode, epochs, bs0, info.ladder)
            durations = [info.samples_per_epoch / b / rates[b] for b in schedule]
        jobs.append(JobSpec(
            job_id=job_id, job_type=f"{info.model} (batch size {bs0})", model=info.model,
            dataset=info.dataset, samples_per_epoch=info.samples_per_epoch, gang_size=gang,
            arrival_s=round(arrival, 3), mode=mode, batch_sizes=tuple(schedule),
            epoch_durations=tuple(durations), throughput=rates))
    return jobs
