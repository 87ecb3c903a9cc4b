"""Churn bounds (`ChurnLimits`, `keep_reason`, `bound_plan`): a running job the plan would stop
is kept running instead when
- its current run is younger than `min_run_seconds` (now - Slurm's start_time, so a restarted
  daemon knows it). Default 1.5 rounds: a job started in round k is not stopped in round k+1
  (it ran less than a round) and may be from round k+2 on (it ran about 2 rounds minus the
  start-up slack of the round, which must stay under half a round);
- it was preempted `max_preemptions_per_day` times (default 24) in the last 24 h: the
  daemon's successful `requeuehold` intents in the store (every incarnation), else its memory,
  counted at most Slurm's restart_count (every requeue raises it);
- it is expected to finish within `finish_window_seconds` (default two rounds; its remaining
  exclusive run time from its reports or declared spec): a stop would free its GPUs for a
  short time only, cost it a restart and a wait for its next turn, and could race its own end;
- its checkpoints keep failing (the job is then *flagged*: logged once, a `flagged` job event,
  and never stopped by the daemon again; it runs to its end). A job that sends training
  reports is flagged when its last `max_stops_without_checkpoint` (default 3) stop cycles
  brought no successful checkpoint report (cycle i is the run that ended with preemption i;
  it succeeded when an ok=true checkpoint was reported after preemption i-1), or when its
  latest that many checkpoint reports all say ok=false. Jobs that send no reports are never
  flagged (the daemon cannot tell).
Keeping a job running leaves fewer GPUs for the plan's starts: `bound_plan` removes planned
pending jobs, lowest priority first (latest submitted, then highest id), until what runs fits
the cluster's capacity; the diff of the bounded plan holds released ones and does not start
held ones. Never more GPUs than the cluster has.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Iterable, Sequence

from ..churn_rules import (FINISH_WINDOW_ROUNDS, MIN_RUN_ROUNDS, ChurnLimits,  # noqa: F401
                           bound_run, early_stop_reason)
from ..slurm.types import JobState, SlurmJob


def active_managed(jobs: Iterable[SlurmJob]) -> dict[int, SlurmJob]:
    """The managed jobs Slurm shows not finished, by id, but for those the daemon leaves alone
    (`hands_off`): no command ever names them."""
    return {j.job_id: j for j in jobs
            if j.managed and not j.state.finished and hands_off(j) is None}


def hands_off(job: SlurmJob) -> str | None:
    """Why the daemon must leave a managed job alone (never plan it, never name it in a
    command; GPUs it holds are planned around like another's), or None:
    - held by an administrator (`scontrol hold`: JobHeldAdmin, also on a running job: a stop
      would turn it into the daemon's requeue hold, which a later round releases) or by Slurm
      after a special exit (RequeueExitHold): a release would override them;
    - SUSPENDED (`scontrol suspend`, or Slurm's suspend preemption): a requeuehold would kill it
      without its USR1 checkpoint, and a later release override the suspension;
    - a job array record (one `scontrol release` of its id releases every pending task) or a
      heterogeneous job's component (its components start together): not supported;
    - a GPU request Slurm gave in a form the parser cannot read: its size is unknown."""
    if job.admin_held:
        if job.special_exit:
            return "held by Slurm after a special exit (RequeueExitHold)"
        return "held by an administrator (JobHeldAdmin)"
    if job.state is JobState.SUSPENDED:
        return "suspended (scontrol suspend or Slurm's preemption)"
    if job.array_job_id:
        return f"a job array record (array {job.array_job_id}): not supported"
    if job.het_job_id:
        return f"a heterogeneous job's component (het job {job.het_job_id}): not supported"
    if job.unreadable:
        return f"its GPU request cannot be read ({job.unreadable})"
    return None


DAY_S = 86_400.0
@dataclass(frozen=True)
class StopHistory:
    """What is known of a job's past stops and checkpoints (store, else memory)."""

    preemptions: tuple[float, ...] = ()     # Unix times the daemon requeued it, oldest first
    reports: bool = False                   # it sends training reports (runs the helper)
    last_ok_checkpoint: float | None = None  # time of its latest ok=true checkpoint report
    failed_checkpoints: int = 0             # ok=false checkpoint reports after that one


def stops_without_checkpoint(h: StopHistory) -> int:
    """Consecutive latest stop cycles with no successful checkpoint report (see the module)."""
    if h.last_ok_checkpoint is None:
        return len(h.preemptions)
    after = sum(1 for t in h.preemptions if t > h.last_ok_checkpoint)
    return max(0, after - 1)


def preemptions_today(job: SlurmJob, h: StopHistory, now: float) -> int:
    recent = sum(1 for t in h.preemptions if t >= now - DAY_S)
    return min(recent, max(0, job.restart_count))


def checkpoint_failing(h: StopHistory, limits: ChurnLimits) -> str | None:
    """Why the job's checkpoints are failing (it is to be flagged), or None."""
    n = limits.max_stops_without_checkpoint
    if n <= 0 or not h.reports:
        return None
    if h.failed_checkpoints >= n:
        return f"its last {h.failed_checkpoints} checkpoint reports say ok=false"
    cycles = stops_without_checkpoint(h)
    if cycles >= n:
        return f"its last {cycles} stops brought no successful checkpoint"
    return None


def keep_reason(job: SlurmJob, h: StopHistory, limits: ChurnLimits, now: float,
                remaining_s: float | None = None) -> tuple[str, str] | None:
    """(rule, explanation) when a running job must not be stopped now, else None. Rules:
    "flagged" (checkpoints failing), "nearly_done" (expected to finish within the finish
    window: `remaining_s`), "min_run", "max_per_day"."""
    why = checkpoint_failing(h, limits)
    if why is not None:
        return "flagged", why
    ran = None if job.start_time is None else now - job.start_time
    early = early_stop_reason(limits, ran, remaining_s)
    if early is not None:
        return early
    if limits.max_preemptions_per_day > 0:
        n = preemptions_today(job, h, now)
        if n >= limits.max_preemptions_per_day:
            return "max_per_day", (f"preempted {n} times in 24 h (max_preemptions_per_day "
                                   f"{limits.max_preemptions_per_day})")
    return None


def bound_plan(run: Collection[int], jobs: Sequence[SlurmJob], keep: Collection[int],
               capacity: int) -> tuple[frozenset[int], tuple[int, ...]]:
    """The plan's run set with the running jobs `keep` added and, if they no longer fit in
    `capacity` GPUs, planned pending jobs dropped (lowest priority first: latest submitted,
    then highest id). Returns (run set, dropped ids). Running planned jobs are never dropped."""
    managed = active_managed(jobs)
    keep = {j for j in keep if j in managed}
    running = {j for j, m in managed.items() if m.state in (JobState.RUNNING, JobState.SUSPENDED)}
    pending = {j for j, m in managed.items() if m.state is JobState.PENDING}
    order = sorted(pending, key=lambda j: (managed[j].submit_time, j))
    gpus = {j: m.gpus for j, m in managed.items()}
    return bound_run(run, running, keep, gpus, order, capacity)
