"""Gavel's round mechanism: a fractional allocation in, whole-gang choices per round out.

An `AllocationPolicy` says what fraction of time each job should hold its gang. Rounds are
indivisible, so each round this mechanism ranks jobs by `fraction / share of time received since
the last re-solve` (then by accumulated deficit, then by fraction, then arrival order) and gives
GPUs greedily down that list, skipping gangs that do not fit (so smaller jobs backfill). Jobs with
no allocation still run when GPUs are left over: the mechanism is work-conserving.

Re-solving, as the reference (Gavel) does it, is gated: the policy is called again only when the
job set changed *and* `min_resolve_interval_s` (1000 s) has passed since the last call (plus one
early exception: while the last call was at time 0). In between, a newly arrived job has no
allocation; with `idle_unallocated=True` (the reference's behaviour) it may still be picked in the
greedy pass but does not run, so its GPUs stay idle for the round. Both knobs are kept so that our
baselines reproduce the reference's published numbers; set `min_resolve_interval_s=0` and
`idle_unallocated=False` for a Gavel that reacts at once.

Time received is counted in seconds of useful run time (after restart overheads), not GPU-seconds,
and starts at half a round for every job at each re-solve, as in Gavel.
"""

from __future__ import annotations

import logging

from ..model import JobView, RoundPlan, Snapshot
from .base import AllocationPolicy

log = logging.getLogger(__name__)

UNRUN_PRIORITY_SCALE = 1e9


class GavelRounds:
    """Wraps an `AllocationPolicy` into a round `Policy` (stateful: time received, deficits)."""

    def __init__(self, allocation_policy: AllocationPolicy, *, round_s: float = 120.0,
                 min_resolve_interval_s: float = 1000.0, idle_unallocated: bool = True) -> None:
        self.allocation_policy = allocation_policy
        self.name = allocation_policy.name
        self.round_s = round_s
        self.min_resolve_interval_s = min_resolve_interval_s
        self.idle_unallocated = idle_unallocated
        self.allocation: dict[int, float] = {}
        self.resolves = 0
        self._need_resolve = False
        self._last_resolve_s: float | None = None
        self._job_time: dict[int, float] = {}
        self._worker_time = 0.0
        self._deficit: dict[int, float] = {}
        self._seen_run_time: dict[int, float] = {}

    def allocate(self, snapshot: Snapshot) -> RoundPlan:
        self._account(snapshot)
        resolved = self._maybe_resolve(snapshot)
        jobs = sorted(snapshot.jobs, key=lambda j: (j.arrival_s, j.job_id))
        ranked = sorted(jobs, key=self._rank_key, reverse=True)  # stable: ties keep arrival order
        free, run, idle = snapshot.gpus, set(), 0
        for job in ranked:
            if free == 0:
                break
            if job.iterations_per_s <= 0 or job.gang_size > free:
                continue
            free -= job.gang_size
            if job.job_id in self.allocation or not self.idle_unallocated:
                run.add(job.job_id)
            else:
                idle += job.gang_size
        return RoundPlan(frozenset(run), {"resolved": resolved, "idle_unallocated_gpus": idle})

    # ------------------------------------------------------------------ bookkeeping
    def _account(self, snapshot: Snapshot) -> None:
        """Add last round's run time to each job; notice arrivals and departures."""
        active = {j.job_id for j in snapshot.jobs}
        for gone in set(self._job_time) - active:
            self._need_resolve = True
            for table in (self._job_time, self._deficit, self._seen_run_time):
                table.pop(gone, None)
        for job in snapshot.jobs:
            if job.job_id not in self._job_time:
                self._need_resolve = True
                self._job_time[job.job_id] = self.round_s / 2
                self._deficit[job.job_id] = 0.0
                self._seen_run_time[job.job_id] = job.run_time_s
                continue
            received = job.run_time_s - self._seen_run_time[job.job_id]
            if received > 0:
                self._job_time[job.job_id] += received
                self._worker_time += received
                self._seen_run_time[job.job_id] = job.run_time_s

    def _maybe_resolve(self, snapshot: Snapshot) -> bool:
        last = self._last_resolve_s
        due = (last is None or last == 0  # Gavel quirk: a re-solve at t=0 does not start the gate
               or snapshot.now - last >= self.min_resolve_interval_s)
        if not (self._need_resolve and due):
            return False
        elapsed = snapshot.now - (last or 0.0)
        for job in snapshot.jobs:
            received = self._job_time[job.job_id] - self.round_s / 2
            self._deficit[job.job_id] += self.allocation.get(job.job_id, 0.0) * elapsed - received
            self._job_time[job.job_id] = self.round_s / 2
        self._worker_time = self.round_s / 2 * len(snapshot.jobs)
        jobs = sorted(snapshot.jobs, key=lambda j: j.job_id)
        self.allocation = dict(self.allocation_policy.fractions(jobs, snapshot.gpus, snapshot.now))
        self._last_resolve_s = snapshot.now
        self._need_resolve = False
        self.resolves += 1
        return True

    def _rank_key(self, job: JobView) -> tuple[float, float, float]:
        x = self.allocation.get(job.job_id, 0.0)
        if x <= 0 or job.iterations_per_s <= 0:
            priority = 0.0
        else:
            share = self._job_time[job.job_id] / self._worker_time if self._worker_time > 0 else 0.0
            priority = x / share if share > 0 else x * UNRUN_PRIORITY_SCALE
        return (priority, self._deficit[job.job_id], x)
