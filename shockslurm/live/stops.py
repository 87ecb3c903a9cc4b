"""`StopTracker`: the live cluster's memory of stops under way, for crash safety.

A stop is USR1, then requeuehold as soon as the job has exited (it saved and exited on its
signal) or at the end of the grace period, whichever comes first. A stop that was begun (its
`signal` intent is in the store, or this process sent it) but whose requeuehold never succeeded
(the daemon died in the grace period, or the call failed) is *resumed*, never restarted: the job
is not signalled again, it is requeueheld once it has exited or the rest of its grace period has
passed, also when it has meanwhile exited (COMPLETED after its checkpoint), since otherwise its
training would end there.

One rule is shared by the stop of this round and the resumed ones: a job that had ended on its
own before its signal went out is never requeued (`ended_before`). Slurm can show a job RUNNING
for a moment after its script exited; the USR1 then finds no process (scancel still says 0),
and requeuehold would rerun a finished job. A job that ended in the same second as its signal,
or after it (its checkpoint and exit), is requeued.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

from .journaling import JournalUnavailable, StopLedger
from ..slurm.types import JobState, SlurmJob


# Final states a stop (USR1, then requeuehold) never brings about: the user or an administrator
# cancelled the job (scancel), or Slurm ended it (time limit, deadline, node or boot failure,
# preemption by cancel, out of memory). A stopped job Slurm shows ended so is never requeued,
# whenever it ended: requeuehold requeues finished jobs too, and the job would run again against
# their decision. COMPLETED (it saved and exited on its USR1) and FAILED (a USR1 the job did not
# handle ends it so) are the stop's own ends: requeued.
ENDED_BY_OTHERS = frozenset({JobState.CANCELLED, JobState.TIMEOUT, JobState.DEADLINE,
                             JobState.NODE_FAIL, JobState.BOOT_FAIL, JobState.PREEMPTED,
                             JobState.OUT_OF_MEMORY})
# The stop's own ends, requeued also when the stop is resumed (until 2026-12-03 a resumed stop
# took COMPLETED only, and a job its USR1 had killed stayed FAILED, its training over).
STOP_ENDS = frozenset({JobState.COMPLETED, JobState.FAILED})


def ended_by_others(job: SlurmJob) -> bool:
    """Ended (or ending: COMPLETING with its final state among the flags, 23.02+) in a state of
    `ENDED_BY_OTHERS`."""
    return job.state in ENDED_BY_OTHERS or (
        job.state is JobState.COMPLETING
        and any(s.value in job.state_flags for s in ENDED_BY_OTHERS))


def ended_before(job: SlurmJob, t: float) -> bool:
    """Whether Slurm shows `job` ended (finished or completing) in a second before `t`."""
    return ((job.state.finished or job.state is JobState.COMPLETING)
            and job.end_time is not None and job.end_time < math.floor(t))


class StopTracker:
    """Stops begun and not completed: the store's (`StopLedger`) and this process's."""

    def __init__(self, ledger: StopLedger | None = None) -> None:
        self.ledger = ledger
        self._signalled: dict[tuple[int, float], float] = {}  # stops started in this process
        self._maybe: dict[tuple[int, float], float] = {}      # USR1s whose call timed out

    def signalled(self, job: SlurmJob, sent_at: float, *, maybe: bool = False) -> None:
        """The job's USR1 went out at `sent_at`; `maybe`: its call timed out, so it may have
        (a stop begun only once the job shows it ended after it, `maybe_sent`)."""
        (self._maybe if maybe else self._signalled)[(job.job_id, job.submit_time)] = sent_at

    def requeued(self, job: SlurmJob) -> None:
        self._signalled.pop((job.job_id, job.submit_time), None)
        self._maybe.pop((job.job_id, job.submit_time), None)

    def pending(self, ours: Sequence[SlurmJob], grace_s: float = math.inf) -> dict[int, float]:
        """Jobs whose stop was begun (USR1) and never completed (no requeuehold since): still
        running the run that was signalled, or ended after it (`STOP_ENDS`) within twice
        `grace_s` and a minute (`under_way`). {job id: since}. Raises
        `JournalUnavailable` when the store cannot say (no action then)."""
        candidates = [j for j in ours if j.managed and (
            j.state in (JobState.RUNNING, JobState.SUSPENDED) or j.state in STOP_ENDS)]
        live = {(j.job_id, j.submit_time) for j in ours}
        self._signalled = {k: v for k, v in self._signalled.items() if k in live}
        self._maybe = {k: v for k, v in self._maybe.items() if k in live}
        if not candidates:
            return {}
        found: dict[int, float] = {}
        if self.ledger is not None:
            try:
                found = dict(self.ledger.pending_stops(candidates))
            except JournalUnavailable:
                raise
            except Exception as exc:   # cannot know which stops are under way: no action
                raise JournalUnavailable(f"pending stops: {type(exc).__name__}: {exc}") from exc
        out = {}
        for job in candidates:
            maybe = self._maybe.get((job.job_id, job.submit_time))
            since = max([t for t in (found.get(job.job_id),
                                     self._signalled.get((job.job_id, job.submit_time)),
                                     maybe if maybe is not None and maybe_sent(job, maybe)
                                     else None)
                         if t is not None], default=None)
            if since is None:
                continue
            # the run that was signalled: a job restarted since then is not being stopped; nor
            # is one that had finished on its own before the signal
            if not under_way(job, since, grace_s):
                self.requeued(job)
                continue
            out[job.job_id] = since
        return out


def under_way(job: SlurmJob, since: float, grace_s: float = math.inf) -> bool:
    """Whether the stop begun at `since` (its USR1) is still to be completed on `job`: not when
    the job has been started again since (that run is not being stopped), nor when it had
    finished on its own before the signal, nor when it ended (`STOP_ENDS`) later than twice
    `grace_s` and a minute after it (it ignored the signal while no daemon requeued it, then
    finished or crashed on its own: requeued, it would run again)."""
    if (job.start_time is not None and job.start_time > since + 1.0) or ended_before(job, since):
        return False
    return not (job.state in STOP_ENDS and job.end_time is not None
                and job.end_time > since + 2 * grace_s + 60.0)


def maybe_sent(job: SlurmJob, sent_at: float) -> bool:
    """Whether a USR1 whose call timed out at `sent_at` counts as sent: the job has ended in a
    stop's own way (`STOP_ENDS`) since. One still running did not get it, and is signalled
    again (until 2026-12-03 such a signal counted as failed also for a job that had saved and
    exited on it, which stayed COMPLETED, its training ended early)."""
    return job.state in STOP_ENDS and not ended_before(job, sent_at)


def not_done_before_signal(job_ids: Sequence[int], sent_at: Mapping[int, float],
                           now: Sequence[SlurmJob]) -> tuple[list[int], set[int]]:
    """(`job_ids` to requeue, those left out): the jobs Slurm shows, in `now`, ended before
    their signal went out, or ended in a state the stop never brings about (`ENDED_BY_OTHERS`:
    cancelled, timed out, ...), are left out."""
    by_id = {j.job_id: j for j in now}
    done = {j for j in job_ids if j in by_id and (
        ended_by_others(by_id[j]) or (j in sent_at and ended_before(by_id[j], sent_at[j])))}
    return [j for j in job_ids if j not in done], done
