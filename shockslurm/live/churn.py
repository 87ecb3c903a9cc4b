"""`ChurnGuard`: the live cluster's churn bounds applied to a round's plan, with their memory.

The rules are pure and live in `enact` (`ChurnLimits`, `keep_reason`, `bound_plan`); this module
keeps what they need between rounds and across daemon restarts:

- past preemptions: the `StopHistorySource` (the store) when it answers, else this process's own
  record of the requeueholds it made (also used when the store lost some, e.g. failed writes);
- flagged jobs (checkpoints keep failing): logged and recorded once per job, then left running.

The limits themselves stay on the cluster (`SlurmCluster.churn`) because a SIGHUP reload swaps
them; they are passed in each round.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Collection, Mapping, Sequence

from ..model import RoundPlan
from . import enact as en
from .journaling import EnactStats, JournalUnavailable, StopHistorySource
from ..slurm.types import JobState, SlurmJob

log = logging.getLogger("shockslurm.live.cluster")


class ChurnGuard:
    """Drops the stops the churn bounds forbid (and the starts that no longer fit)."""

    def __init__(self, stop_history: StopHistorySource | None = None) -> None:
        self.stop_history = stop_history
        self.flagged: set[tuple[int, float]] = set()           # (job id, submit time)
        self._requeued_at: dict[tuple[int, float], list[float]] = {}

    def requeued(self, job: SlurmJob, now: float) -> None:
        """Remember a successful requeuehold of `job` (this process's memory of its stops)."""
        self._requeued_at.setdefault((job.job_id, job.submit_time), []).append(now)

    def flag(self, job: SlurmJob, reason: str, now: float) -> None:
        """Record in the store that `job` is flagged; a failure is logged, never raised."""
        if self.stop_history is None:
            return
        try:
            self.stop_history.flag(job, reason, now)
        except Exception as exc:
            log.warning("could not record that job %s is flagged (%s: %s)", job.job_id,
                        type(exc).__name__, exc)

    def histories(self, jobs: Sequence[SlurmJob]) -> dict[int, en.StopHistory]:
        """Past stops of `jobs`: the store's when it answers, else this process's memory."""
        found: Mapping[int, en.StopHistory] = {}
        if self.stop_history is not None:
            try:
                found = self.stop_history.stop_history(jobs)
            except JournalUnavailable:   # the store is down: the round stops, no action
                raise
            except Exception as exc:  # a failing store must not stop the daemon
                log.warning("stop history unavailable (%s: %s); using this daemon's memory",
                            type(exc).__name__, exc)
        out = {}
        for job in jobs:
            h = found.get(job.job_id)
            mine = tuple(self._requeued_at.get((job.job_id, job.submit_time), ()))
            if h is None:
                h = en.StopHistory(preemptions=mine)
            elif len(mine) > len(h.preemptions):   # the store lost some (failed writes)
                h = en.StopHistory(mine, h.reports, h.last_ok_checkpoint, h.failed_checkpoints)
            out[job.job_id] = h
        return out

    def free_to_move(self, ours: Sequence[SlurmJob], run: Collection[int],
                     limits: en.ChurnLimits, now: float,
                     remaining_s: Mapping[int, float] | None = None) -> set[int]:
        """The running managed jobs of `run` that the bounds would let the round stop, and so
        move (`keep_reason` None): the ones placing the plan again may put on other nodes."""
        running = [j for j in ours if j.managed and j.job_id in run
                   and j.state in (JobState.RUNNING, JobState.SUSPENDED)]
        histories = self.histories(running)
        remaining_s = remaining_s or {}
        return {j.job_id for j in running if en.keep_reason(
            j, histories[j.job_id], limits, now, remaining_s.get(j.job_id)) is None}

    def bound(self, plan: RoundPlan, ours: Sequence[SlurmJob], limits: en.ChurnLimits,
              gpus: int, now: float, stats: EnactStats,
              remaining_s: Mapping[int, float] | None = None,
              moved: Collection[int] = ()) -> RoundPlan:
        """The plan with the stops `limits` forbid dropped, and the starts that no longer fit
        in `gpus` with them (`enact.bound_plan`); what was kept and dropped goes to `stats`.
        `remaining_s`: each job's expected remaining run time (for the finish window).
        `moved`: planned running jobs placement moves (a stop and a restart): bound like
        stops; one kept stays where it runs (in `stats.kept`)."""
        live = {(j.job_id, j.submit_time) for j in ours if not j.state.finished}
        self._requeued_at = {k: v for k, v in self._requeued_at.items() if k in live}
        self.flagged &= live
        if not (limits.min_run_seconds > 0 or limits.max_preemptions_per_day > 0
                or limits.max_stops_without_checkpoint > 0
                or limits.finish_window_seconds > 0):
            return plan
        remaining_s = remaining_s or {}
        stopping = [j for j in ours if j.managed
                    and (j.job_id not in plan.run or j.job_id in moved)
                    and j.state in (JobState.RUNNING, JobState.SUSPENDED)]
        if not stopping:
            return plan
        histories = self.histories(stopping)
        keep: dict[int, tuple[str, str]] = {}
        for job in stopping:
            reason = en.keep_reason(job, histories[job.job_id], limits, now,
                                    remaining_s.get(job.job_id))
            if reason is None:
                continue
            keep[job.job_id] = reason
            key = (job.job_id, job.submit_time)
            if reason[0] == "flagged" and key not in self.flagged:
                self.flagged.add(key)
                log.warning("job %s flagged: %s; it is left running (never stopped by the "
                            "daemon again) instead of being requeued in a loop", job.job_id,
                            reason[1])
                self.flag(job, reason[1], now)
        if not keep:
            return plan
        run, dropped = en.bound_plan(plan.run, ours, keep, gpus)
        stats.kept = {j: r[0] for j, r in keep.items()}
        stats.dropped = dropped
        log.info("churn bounds keep %s running%s", ", ".join(
            f"{j} ({r[1]})" for j, r in sorted(keep.items())),
            f"; not starting {list(dropped)} (no GPUs left for them)" if dropped else "")
        info = dict(plan.info)
        info["churn_kept"] = sorted(keep)
        info["churn_dropped"] = list(dropped)
        return replace(plan, run=run, info=info)
