"""Slurm-like gang FIFO with EASY backfill: the baseline an HPC center runs today.

Non-preemptive: a job that ran last round keeps its gang until it finishes. Waiting jobs start in
arrival order while their gang fits. When the head of the queue does not fit, it gets a
reservation at the earliest time enough GPUs free up (from the running jobs' remaining run time at
their current speed, standing in for Slurm's time limits); a later job may start now only if it
fits and either ends before that reservation or leaves the head's GPUs free at it.
"""

from __future__ import annotations

from ..model import JobView, RoundPlan, Snapshot


class Fifo:
    name = "fifo"

    def allocate(self, snapshot: Snapshot) -> RoundPlan:
        running = [j for j in snapshot.jobs if j.ran_last_round]
        free = snapshot.gpus - sum(j.gang_size for j in running)
        queue = sorted((j for j in snapshot.jobs if not j.ran_last_round),
                       key=lambda j: (j.arrival_s, j.job_id))
        ends = {j.job_id: j.remaining_time_at_current_rate for j in running}
        run = {j.job_id for j in running}
        reservation: tuple[float, int] | None = None  # (time the head starts, GPUs spare then)
        for job in queue:
            if reservation is None:
                if job.gang_size <= free:
                    run.add(job.job_id)
                    free -= job.gang_size
                    ends[job.job_id] = job.remaining_time_at_current_rate
                    continue
                reservation = _reserve(job, free, [(ends[j], _gang(snapshot, j)) for j in run])
                continue
            start_at, spare = reservation
            if job.gang_size > free:
                continue
            finishes_first = job.remaining_time_at_current_rate <= start_at
            if finishes_first or job.gang_size <= spare:
                run.add(job.job_id)
                free -= job.gang_size
                if not finishes_first:
                    reservation = (start_at, spare - job.gang_size)
        return RoundPlan(frozenset(run))


def _gang(snapshot: Snapshot, job_id: int) -> int:
    return snapshot.job(job_id).gang_size


def _reserve(head: JobView, free: int, running: list[tuple[float, int]]) -> tuple[float, int]:
    """Earliest time the head's gang fits as running jobs end, and the GPUs spare at that time."""
    available = free
    for end, gang in sorted(running):
        available += gang
        if available >= head.gang_size:
            return end, available - head.gang_size
    return float("inf"), 0
