"""`SlurmActions`: how the live cluster reads and acts on Slurm, one journalled call at a time,
and how it waits for the jobs it stops.

- A read that fails raises `SlurmError` (nothing is enacted on stale state).
- Every action is journalled before it runs and its outcome after; a failed call is not
  retried here (the next round recomputes the diff from Slurm's state). An action whose failure
  says the controller cannot be reached raises `SlurmError` (the rest of the round is
  abandoned); a journal that cannot record an intent raises `JournalUnavailable` before the
  call. A `may_act` hook (the daemon's leader lock) is asked before every action.
- Stop waiting: after the USR1s, `await_exits` polls until the signalled jobs have let go of
  their GPUs or the rest of the grace period has passed; after the requeuehold, `wait_stopped`
  polls (bounded by `stop_timeout_s`) until they hold no GPUs, requeueholding any managed job
  that started outside the plan meanwhile. Each returns when it saw the GPUs free
  (`freed_at`, monotonic), for the switch's idle GPU-seconds.
- After a hold, `started_before_hold` reads which of its jobs Slurm had started first (a
  release of an earlier round racing the hold; 22.05 holds a running job without complaint and
  lets it run); the round keeps them or requeueholds them (`live.phases`).
"""

from __future__ import annotations

import logging
import re
import time
from typing import Callable, Mapping, Sequence

from . import enact as en
from . import stops
from .first_submit import FirstSubmitTimes
from .journaling import EnactStats, Journal, JournalUnavailable, NullJournal
from ..slurm.types import CommandResult, JobState, SlurmBackend, SlurmError, SlurmJob

log = logging.getLogger("shockslurm.live.cluster")

STOP_POLL_S = 0.5
# stderr of an action when slurmctld cannot be reached (or a CliBackend timeout): an outage.
# Of those, the timeouts and answers cut short may have reached slurmctld (whether the action
# took effect is not known: OUTCOME_UNKNOWN_RE); the others never reached it.
_MAYBE_REACHED = r"Socket timed out|Zero Bytes were transmitted|timed out after"
OUTCOME_UNKNOWN_RE = re.compile(_MAYBE_REACHED, re.I)
CONTROLLER_DOWN_RE = re.compile(r"Unable to contact slurm controller|Connection refused|"
                                rf"Communication connection failure|{_MAYBE_REACHED}", re.I)



# The live scheduler's defaults (the daemon's key table reads them from here).
PARTITIONS = ("gpu",)
GRACE_SECONDS = 30.0          # longest wait between USR1 and requeuehold
STOP_TIMEOUT_S = 60.0         # how long a round waits for requeued jobs to free their GPUs

class SlurmActions:
    """Reads, journalled actions and stop waits on one Slurm backend (the live cluster's base)."""

    def __init__(self, backend: SlurmBackend, *, partitions: Sequence[str],
                 job_filter: Callable[[SlurmJob], bool] | None, journal: Journal | None,
                 grace_seconds: float, stop_timeout_s: float,
                 sleep: Callable[[float], None] = time.sleep,
                 monotonic: Callable[[], float] = time.monotonic,
                 may_act: Callable[[], None] | None = None) -> None:
        self.backend = backend
        # False for a dry run's backend: a stop it prints stops nothing, so nothing is awaited
        self.changes_slurm = bool(getattr(backend, "changes_slurm", True))
        self.partitions = tuple(partitions)
        self.job_filter = job_filter
        self.journal: Journal = journal or NullJournal()
        self.grace_seconds = float(grace_seconds)
        self.stop_timeout_s = float(stop_timeout_s)
        self._sleep = sleep
        self._monotonic = monotonic
        self.may_act = may_act
        # What may hold GPUs right now (plan ∪ jobs being stopped): for watchers and tests.
        self.allowed_running: frozenset[int] = frozenset()
        # Each job's first submit time, across requeues (`first_submit`): every read of the
        # queue hands back jobs keyed as they were first seen.
        self.first_submit = FirstSubmitTimes()
        # Jobs this process released and has not held (nor requeueheld) since: {id: submit}.
        # One of them that shows a user hold (JobHeldUser) was held by someone else.
        self._released_by_us: dict[int, float] = {}
        self._submits: dict[int, float] = {}       # the last read's active jobs: {id: submit}
        # Jobs an earlier version of the daemon held with an administrator's hold (`scontrol
        # hold`), found in the store at start (`Daemon.reconcile`): made user holds in the
        # first round (`own_admin_holds_to_user_holds`).
        self.own_admin_holds: set[int] = set()

    def _tagged(self, job: SlurmJob) -> bool:
        """A managed job of the managed partitions that `job_filter` lets this daemon see."""
        if not job.managed or not set(job.partition.split(",")) & set(self.partitions):
            return False
        return self.job_filter is None or self.job_filter(job)

    def _ours(self, job: SlurmJob) -> bool:
        """A job this daemon schedules: `_tagged` and not one it leaves alone (`_hands_off`)."""
        return self._tagged(job) and self._hands_off(job) is None

    def _hands_off(self, job: SlurmJob) -> str | None:
        """Why the daemon leaves a job alone (`enact.hands_off`), or None; also a job this
        process released that shows a user hold it did not make (`scontrol uhold` by an
        administrator)."""
        why = en.hands_off(job)
        if why is None and job.user_held and \
                self._released_by_us.get(job.job_id) == job.submit_time:
            return "held (JobHeldUser) by someone else after the daemon released it"
        return why

    def _read(self, what: str, read: Callable[[], list]) -> list:
        try:
            return read()
        except SlurmError:
            raise
        except Exception as exc:   # a half-written answer during a controller restart, ...
            raise SlurmError(f"{what} failed: {type(exc).__name__}: {exc}") from exc

    def _squeue(self) -> list[SlurmJob]:
        """The queue, each job with its first submit time (`first_submit`)."""
        jobs = self._canonical(self._read("squeue", self.backend.jobs))
        self._submits = {j.job_id: j.submit_time for j in jobs if not j.state.finished}
        self._released_by_us = {j: t for j, t in self._released_by_us.items()
                                if self._submits.get(j) == t}
        return jobs

    def _canonical(self, jobs: Sequence[SlurmJob]) -> list[SlurmJob]:
        return [self.first_submit.canonical(j) for j in jobs]

    # ------------------------------------------------------------------ actions
    def _run(self, step: en.Step, stats: EnactStats) -> CommandResult:
        if self.may_act is not None:     # e.g. still the leader; raises otherwise
            self.may_act()
        try:   # never act without the intent recorded first
            handle = self.journal.intent(step)
        except JournalUnavailable:
            raise
        except Exception as exc:
            raise JournalUnavailable(f"cannot record the intent {' '.join(step.argv)}: "
                                     f"{type(exc).__name__}: {exc}") from exc
        if step.action in ("hold", "requeuehold"):   # tried: a hold seen later may be ours
            for job_id in step.job_ids:
                self._released_by_us.pop(job_id, None)
        try:
            result = self.backend.run(list(step.argv))
        except Exception as exc:  # a backend that raises must not kill the daemon
            result = CommandResult(step.argv, -1, "", f"{type(exc).__name__}: {exc}", 0.0)
        stats.steps.append(step)
        try:
            self.journal.outcome(handle, result)
        except Exception as exc:   # done but not recorded: reconciled at the next start
            raise JournalUnavailable(f"cannot record the outcome of {' '.join(step.argv)}: "
                                     f"{type(exc).__name__}: {exc}") from exc
        if not result.ok:
            self._failed(step, result, stats)
        elif step.action == "release":
            self._note_released(step.job_ids)
        return result

    def own_admin_holds_to_user_holds(self, jobs: Sequence[SlurmJob], stats: EnactStats) -> None:
        """Daemons before 2026-11-29 held with `scontrol hold` (JobHeldAdmin), which the daemon
        now leaves alone as an administrator's; of those the store says were its own
        (`own_admin_holds`), the ones still so held get one `scontrol uhold` (an operator may
        turn an admin hold into a user hold): the user holds it holds with now, scheduled from
        the next round. Once, in the first round after the start."""
        ids = sorted(j.job_id for j in jobs if j.job_id in self.own_admin_holds
                     and self._tagged(j) and j.admin_held and j.state is JobState.PENDING)
        self.own_admin_holds = set()
        if ids:
            result = self._run(en.hold_step(ids), stats)
            log.warning("jobs %s: the administrator's holds an earlier version of the daemon put "
                        "on them made user holds, the daemon's holds now%s", ids,
                        "" if result.ok else f" - failed: {result.stderr.strip()[:200]}",
                        extra={"fields": {"event": "own_admin_holds", "jobs": ids,
                                          "ok": result.ok}})

    def remember_released(self, released: Mapping[int, float]) -> None:
        """Jobs {id: submit time} an earlier incarnation released, as the store says (the
        daemon's start): a user hold one of them shows is someone else's (`_hands_off`)."""
        self._released_by_us.update(released)

    def _note_released(self, job_ids: Sequence[int]) -> None:
        """Remember the jobs a release let go (by submit time, from the round's read)."""
        for job_id in job_ids:
            if job_id in self._submits:
                self._released_by_us[job_id] = self._submits[job_id]

    @staticmethod
    def _failed(step: en.Step, result: CommandResult, stats: EnactStats) -> None:
        stats.failed_calls += 1
        if CONTROLLER_DOWN_RE.search(result.stderr or ""):
            raise SlurmError(f"{' '.join(step.argv)}: the controller cannot be reached",
                             argv=step.argv, returncode=result.returncode,
                             stderr=result.stderr)
        log.warning("%s failed (rc=%s): %s; the next round retries from Slurm's state",
                    " ".join(step.argv), result.returncode, result.stderr.strip())

    # ------------------------------------------------------------------ stop waiting
    def _await_exits(self, job_ids: list[int], wait_s: float,
                     stats: EnactStats) -> list[SlurmJob] | None:
        """Wait until every job of `job_ids` has let go of its GPUs (it saved and exited on its
        USR1) or `wait_s` (the rest of the grace period) has passed, whichever comes first;
        returns the last squeue read (None when there was nothing to wait for). Polled every
        `STOP_POLL_S`: a job that exits 1.3 s after its signal is requeued then, not after the
        whole grace period."""
        if wait_s <= 0 or not self.changes_slurm:
            return None
        waiting = set(job_ids)
        t0 = self._monotonic()
        deadline = t0 + wait_s
        while True:
            jobs = self._squeue()
            if not any(j.job_id in waiting and j.holds_gpus for j in jobs):
                break
            left = deadline - self._monotonic()
            if left <= 0:
                break
            self._sleep(min(STOP_POLL_S, left))
        stats.grace_wait_s = self._monotonic() - t0
        return jobs

    def _not_done_before_signal(self, job_ids: list[int], sent_at: Mapping[int, float],
                                seen: list[SlurmJob] | None = None) -> list[int]:
        """`job_ids` without the jobs that had ended before their signal, or that the user, an
        administrator or Slurm ended meanwhile (`stops`: cancelled, timed out, ...), judged on
        `seen` (the last squeue read) or one fresh read when a job was signalled this round."""
        if seen is None:
            if not any(j in sent_at for j in job_ids):
                return job_ids
            seen = self._squeue()
        keep, done = stops.not_done_before_signal(job_ids, sent_at, seen)
        if done:
            log.info("jobs %s had ended before their stop signal, or were ended by their user, "
                     "an administrator or Slurm; not requeued", sorted(done))
        return keep

    def _started_before_hold(self, job_ids: Sequence[int]) -> list[SlurmJob]:
        """The jobs of a hold that hold GPUs now (one fresh read): Slurm started them between
        the round's read and the hold (a release of an earlier round racing it). The hold
        succeeds on a running job (Slurm 22.05: rc 0, priority 0, Reason=JobHeldUser for the
        daemon's `uhold`, still RUNNING), so they would run outside the plan on GPUs it gave to
        others."""
        wanted = set(job_ids)
        return [j for j in self._squeue() if j.job_id in wanted and j.holds_gpus]

    def _wait_stopped(self, run: frozenset[int], stopping: set[int],
                      stats: EnactStats) -> set[int]:
        """Poll (bounded) until the stopped jobs hold no GPUs; requeuehold any managed job that
        started outside the plan (`run`) meanwhile (a release that raced a hold). Returns the
        jobs that still hold GPUs at the deadline (none in a dry run: it stopped nothing)."""
        if not self.changes_slurm:
            return set()
        deadline = self._monotonic() + self.stop_timeout_s
        requeued = set(stopping)
        while True:
            jobs = [j for j in self._squeue() if self._ours(j)]
            holding = {j.job_id for j in jobs if j.job_id in stopping and j.holds_gpus}
            escaped = {j.job_id for j in jobs if j.state is JobState.RUNNING
                       and j.job_id not in run and j.job_id not in requeued}
            if escaped:
                stopping |= escaped
                requeued |= escaped
                self.allowed_running |= frozenset(escaped)
                step = en.requeue_step(sorted(escaped))
                assert step is not None
                self._run(step, stats)
                continue
            if not holding:
                return set()
            if self._monotonic() >= deadline:
                log.warning("jobs %s still hold GPUs %.0f s after requeuehold", sorted(holding),
                            self.stop_timeout_s)
                return holding
            self._sleep(STOP_POLL_S)
