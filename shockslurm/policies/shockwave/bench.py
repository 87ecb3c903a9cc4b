"""Timing of single Shockwave re-solves on synthetic snapshots (`shockslurm bench solver`)."""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

from ...model import JobView, Snapshot
from .config import ShockwaveConfig
from .planner import Shockwave

GANGS = (1, 2, 4, 8)
GANG_P = (0.6, 0.25, 0.1, 0.05)


def synthetic_snapshot(jobs: int, gpus: int, seed: int = 0, round_s: float = 120.0) -> Snapshot:
    """`jobs` active jobs with mixed gang sizes, two-batch-size profiles and 0-50 % progress."""
    rng = np.random.default_rng(seed)
    views = []
    now = 3600.0
    for j in range(jobs):
        gang = int(rng.choice(GANGS, p=GANG_P))
        gang = min(gang, gpus)
        E = int(rng.integers(10, 200))
        bs0 = int(rng.choice((32, 64, 128)))
        switch = int(rng.integers(E // 3, E))          # gns-like: the batch size doubles once
        bss = tuple([bs0] * switch + [2 * bs0] * (E - switch))
        d0 = float(rng.uniform(20, 600))
        durs = tuple(d0 if b == bs0 else 0.7 * d0 for b in bss)
        done = float(rng.uniform(0, 0.5)) * E
        e = int(done)
        bs = bss[min(e, E - 1)]
        ipe = 10_000 // bs
        ips = ipe / (d0 if bs == bs0 else 0.7 * d0)
        views.append(JobView(
            job_id=j, gang_size=gang, arrival_s=float(rng.uniform(0, now)), num_epochs=E,
            epochs_done=done, batch_size=bs, iterations_per_s=ips,
            remaining_iterations=(E - done) * ipe, iterations_per_epoch=ipe,
            observed_batch_sizes=bss[:e], profile_batch_sizes=bss, profile_epoch_durations=durs,
            exclusive_runtime_s=sum(durs), run_time_s=sum(durs[:e]) + (done - e) * durs[e % E],
            ran_last_round=bool(rng.random() < 0.5)))
    return Snapshot(now=now, round_index=30, round_s=round_s, gpus=gpus, jobs=tuple(views))


def identical_snapshot(jobs: int, gpus: int, round_s: float = 120.0) -> Snapshot:
    """`jobs` identical 1-GPU jobs that have not started (a parameter sweep just submitted):
    the market's integer program is then fully symmetric, its hardest case."""
    epochs, ipe, epoch_s = 10, 64, 60.0
    views = tuple(JobView(
        job_id=j + 1, gang_size=1, arrival_s=1000.0, num_epochs=epochs, epochs_done=0.0,
        batch_size=32, iterations_per_s=ipe / epoch_s, remaining_iterations=epochs * ipe,
        iterations_per_epoch=ipe, observed_batch_sizes=(), profile_batch_sizes=(32,) * epochs,
        profile_epoch_durations=(epoch_s,) * epochs, exclusive_runtime_s=epochs * epoch_s,
        run_time_s=0.0, ran_last_round=False) for j in range(jobs))
    return Snapshot(now=2000.0, round_index=0, round_s=round_s, gpus=gpus, jobs=views)


def bench_solver(jobs: int, gpus: int, repeats: int = 5, seed: int = 0,
                 config: ShockwaveConfig | None = None, identical: bool = False
                 ) -> dict[str, Any]:
    """Median and p95 wall time of a full re-solve (forecasts, both market attempts, packing)
    of a fresh policy on a synthetic snapshot of `jobs` active jobs on `gpus` GPUs (mixed, or
    all `identical`)."""
    snap = identical_snapshot(jobs, gpus) if identical else synthetic_snapshot(jobs, gpus, seed)
    times, info = [], {}
    for _ in range(max(1, repeats)):
        policy = Shockwave(config)
        t0 = time.perf_counter()
        plan = policy.allocate(snap)
        times.append(time.perf_counter() - t0)
        info = dict(plan.info)
    times.sort()
    p95 = times[min(len(times) - 1, int(round(0.95 * (len(times) - 1))))]
    return {"jobs": jobs, "gpus": gpus, "identical": identical,
            "median_solve_s": statistics.median(times),
            "p95_solve_s": p95, "objective": info.get("objective"), "status": info.get("status"),
            "relaxed": info.get("relaxed")}
