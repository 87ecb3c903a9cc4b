"""The live benchmark's workload: the built-in default, time scaling, the stand-in's plans.

The default workload (`default_workload`) is drawn by the synthetic generator
(`workload.generator`, fixed seed: models, gang sizes, static/gns/accordion modes, initial batch
sizes), then shaped for a live run of minutes:
- at most `MAX_EPOCHS` epochs per job, the batch-size schedule re-derived for that count by the
  same adaptation rules (`workload.adaptation`);
- each job's exclusive run time drawn log-uniformly in `EXCLUSIVE_RANGE_S` (trace seconds); its
  throughput is divided by the same factor as its durations, so the spec stays consistent;
- arrivals (the generator's Poisson order) stretched to span the first third of the work's
  lower bound, total GPU-seconds / GPUs: with 24 jobs asking ~1.5x the cluster's 32 GPUs, the
  cluster is oversubscribed for most of the run.

`scale` turns trace seconds into real seconds (`time_scale` real seconds per trace second):
arrivals and epoch durations are multiplied, throughputs divided. The simulator's prediction
runs on the scaled workload, so live and simulated numbers are both in real seconds.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from ..model import JobSpec
from ..workload.adaptation import batch_size_schedule
from ..workload.catalogue import CATALOGUE
from ..workload.generator import GeneratorConfig, generate

DEFAULT_JOBS = 24
DEFAULT_SEED = 10
MAX_EPOCHS = 30
EXCLUSIVE_RANGE_S = (300.0, 1800.0)
ARRIVAL_SPAN_FRACTION = 1 / 3


def _reshaped(job: JobSpec, exclusive_s: float) -> JobSpec:
    """`job` with at most MAX_EPOCHS epochs and `exclusive_s` exclusive seconds in all."""
    info = CATALOGUE[job.model]
    epochs = min(job.num_epochs, MAX_EPOCHS)
    schedule = batch_size_schedule(job.mode, epochs, job.initial_batch_size, info.ladder)
    durations = [job.samples_per_epoch / b / job.throughput[b] for b in schedule]
    factor = exclusive_s / sum(durations)
    return replace(job, batch_sizes=tuple(schedule),
                   epoch_durations=tuple(d * factor for d in durations),
                   throughput={b: r / factor for b, r in job.throughput.items()},
                   total_iterations=None)


def default_workload(gpus: int, *, jobs: int = DEFAULT_JOBS,
                     seed: int = DEFAULT_SEED) -> list[JobSpec]:
    """The built-in live workload for a cluster of `gpus` GPUs (trace seconds)."""
    drawn = generate(GeneratorConfig(jobs=jobs, seed=seed))
    rng = np.random.default_rng(seed)
    low, high = EXCLUSIVE_RANGE_S
    lengths = np.exp(rng.uniform(math.log(low), math.log(high), size=len(drawn)))
    shaped = [_reshaped(j, float(x)) for j, x in zip(drawn, lengths)]
    work_bound_s = sum(j.exclusive_runtime_s * j.gang_size for j in shaped) / gpus
    last = max(j.arrival_s for j in shaped) or 1.0
    stretch = ARRIVAL_SPAN_FRACTION * work_bound_s / last
    return [replace(j, arrival_s=round(j.arrival_s * stretch, 3)) for j in shaped]


def scale(jobs: Sequence[JobSpec], time_scale: float) -> list[JobSpec]:
    """`jobs` in real seconds: `time_scale` real seconds per trace second."""
    if not time_scale > 0:
        raise ValueError(f"the time scale must be positive, got {time_scale}")
    return [replace(j, arrival_s=j.arrival_s * time_scale,
                    epoch_durations=tuple(d * time_scale for d in j.epoch_durations),
                    throughput={b: r / time_scale for b, r in j.throughput.items()})
            for j in jobs]


@dataclass(frozen=True)
class StandinPlan:
    """What the stand-in job follows: per-epoch real seconds and batch sizes."""

    epoch_seconds: tuple[float, ...]
    batch_sizes: tuple[int, ...]
    samples_per_epoch: int
    gpus: int

    @classmethod
    def of(cls, job: JobSpec) -> "StandinPlan":
        return cls(tuple(job.epoch_durations), tuple(job.batch_sizes), job.samples_per_epoch,
                   job.gang_size)

    def to_json(self) -> str:
        return json.dumps({"epoch_seconds": list(self.epoch_seconds),
                           "batch_sizes": list(self.batch_sizes),
                           "samples_per_epoch": self.samples_per_epoch, "gpus": self.gpus})

    @classmethod
    def from_json(cls, text: str) -> "StandinPlan":
        data = json.loads(text)
        return cls(tuple(float(x) for x in data["epoch_seconds"]),
                   tuple(int(b) for b in data["batch_sizes"]),
                   int(data["samples_per_epoch"]), int(data["gpus"]))


def summary(jobs: Sequence[JobSpec], gpus: int) -> dict[str, object]:
    """A workload's shape: jobs, modes, GPUs asked against the cluster, work bound."""
    return {"jobs": len(jobs),
            "modes": {m: sum(j.mode == m for j in jobs) for m in sorted({j.mode for j in jobs})},
            "gpus_asked": sum(j.gang_size for j in jobs), "cluster_gpus": gpus,
            "oversubscription": round(sum(j.gang_size for j in jobs) / gpus, 2),
            "last_arrival_s": max(j.arrival_s for j in jobs),
            "work_bound_s": round(sum(j.exclusive_runtime_s * j.gang_size for j in jobs) / gpus,
                                  1),
            "longest_exclusive_s": round(max(j.exclusive_runtime_s for j in jobs), 1)}
