"""Run metrics, defined exactly as the Shockwave reference computes them (see SHOCKWAVE.md).

- makespan: first arrival to last completion.
- JCT: completion minus arrival; average and p99.
- rho (finish-time fairness, the reference's static-contention form):
  `JCT / (exclusive_runtime * max(1, N_trace / G))`; worst, median, and the share of jobs above
  1.05 and 1.1.
- utilisation: GPU-seconds held by jobs / (G * makespan).
- Themis-style rho: like rho, but the contention factor is the job's own, time-averaged over its
  life: `max(1, GPUs demanded by active jobs / G)` integrated from its arrival to its completion.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

UNFAIR_THRESHOLDS = (1.05, 1.1)


@dataclass(frozen=True)
class JobOutcome:
    job_id: int
    arrival_s: float
    completion_s: float
    exclusive_runtime_s: float
    gang_size: int

    @property
    def jct_s(self) -> float:
        return self.completion_s - self.arrival_s


@dataclass(frozen=True)
class RunMetrics:
    jobs: int
    makespan_s: float
    avg_jct_s: float
    p99_jct_s: float
    worst_rho: float
    median_rho: float
    unfair_fraction: float          # rho > 1.05
    unfair_fraction_1_1: float      # rho > 1.1
    utilization: float
    themis_worst_rho: float
    themis_median_rho: float

    def as_dict(self) -> dict[str, float]:
        return dict(self.__dict__)


def static_rho(outcomes: Sequence[JobOutcome], gpus: int, trace_jobs: int | None = None) -> np.ndarray:
    n = trace_jobs if trace_jobs is not None else len(outcomes)
    contention = max(1.0, n / gpus)
    return np.array([o.jct_s / (o.exclusive_runtime_s * contention) for o in outcomes])


def themis_rho(outcomes: Sequence[JobOutcome], gpus: int,
               demand_timeline: Sequence[tuple[float, int]]) -> np.ndarray:
    """rho with each job's own contention: `demand_timeline` is (time, GPUs demanded) steps."""
    times = np.array([t for t, _ in demand_timeline] + [np.inf])
    load = np.array([max(1.0, d / gpus) for _, d in demand_timeline])
    rhos = []
    for o in outcomes:
        start = np.clip(times[:-1], o.arrival_s, o.completion_s)
        end = np.clip(times[1:], o.arrival_s, o.completion_s)
        span = o.completion_s - o.arrival_s
        avg = float(np.sum((end - start) * load) / span) if span > 0 else 1.0
        rhos.append(o.jct_s / (o.exclusive_runtime_s * max(1.0, avg)))
    return np.array(rhos)


def compute_metrics(outcomes: Sequence[JobOutcome], gpus: int, gpu_seconds_used: float,
                    demand_timeline: Iterable[tuple[float, int]] = (),
                    trace_jobs: int | None = None) -> RunMetrics:
    if not outcomes:
        raise ValueError("no finished jobs to compute metrics from")
    if gpus <= 0:
        raise ValueError("the cluster must have at least one GPU")
    jct = np.array([o.jct_s for o in outcomes])
    makespan = max(o.completion_s for o in outcomes) - min(o.arrival_s for o in outcomes)
    rho = static_rho(outcomes, gpus, trace_jobs)
    timeline = list(demand_timeline)
    trho = themis_rho(outcomes, gpus, timeline) if timeline else rho
    return RunMetrics(
        jobs=len(outcomes),
        makespan_s=float(makespan),
        avg_jct_s=float(jct.mean()),
        p99_jct_s=float(np.percentile(jct, 99)),
        worst_rho=float(rho.max()),
        median_rho=float(np.median(rho)),
        unfair_fraction=float(np.mean(rho > UNFAIR_THRESHOLDS[0])),
        unfair_fraction_1_1=float(np.mean(rho > UNFAIR_THRESHOLDS[1])),
        utilization=float(gpu_seconds_used / (gpus * makespan)) if makespan > 0 else 0.0,
        themis_worst_rho=float(trho.max()),
        themis_median_rho=float(np.median(trho)),
    )
