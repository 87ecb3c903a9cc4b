"""`EnactPhases`: how the live cluster enacts a round's plan, as a short sequence of phases that
hand each other small records:

1. `_prepare` -> `Prepared`: the plan within the churn bounds and the nodes, the stops begun
   earlier (resumed, never signalled again), and the diff against Slurm (`enact.diff`).
2. `_journal_round`: the round, its flags and the jobs that ended, in the store; then the
   snapshot's age is checked (`StaleSnapshot`) before the first action.
3. `_signal` -> `Signalled`: holds and one USR1 per stopped job; when each went out, and the
   jobs whose signal failed (not requeued this round: the plan is bounded around them).
4. `_stop` -> `Stopped`: wait for the signalled jobs to exit (at most the rest of the grace
   period), requeuehold them, wait until their GPUs are free.
5. `_start`: the updates and one release; then the round's bookkeeping (`_finish`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

from ..errors import InputError, ShockslurmError
from ..model import RoundPlan, Snapshot
from . import enact as en
from . import stops
from .acting import OUTCOME_UNKNOWN_RE, SlurmActions
from .churn import ChurnGuard
from .credentials import RecentDepartures
from .idle import SwitchClock
from .journaling import EnactStats, JournalUnavailable, LiveJob, StopLedger
from .node_steps import fit_nodes, keep_idle_stops, place_around_kept
from .specs import LiveSpec
from ..slurm.gres import expand_hostlist, gpus_per_allocated_node
from ..slurm.types import SlurmError, SlurmJob, SlurmNode

log = logging.getLogger("shockslurm.live.cluster")


class StaleSnapshot(ShockslurmError):
    """The round's Slurm snapshot is too old to act on: nothing was done; re-read and re-plan."""

    def __init__(self, age_s: float, bound_s: float) -> None:
        super().__init__(f"the Slurm snapshot is {age_s:.1f} s old (bound {bound_s:g} s)")
        self.age_s = age_s
        self.bound_s = bound_s


@dataclass
class Prepared:
    """The plan to enact and its diff against Slurm (phase 1)."""

    plan: RoundPlan
    ours: list[SlurmJob]
    e: en.Enactment
    moved: set[int]
    pins: dict[int, tuple[str, ...]]
    resumed: dict[int, float]      # stops begun earlier: {job id: when signalled}


@dataclass
class Signalled:
    """What the signals did (phase 3)."""

    plan: RoundPlan                # bounded around the unsignalled jobs
    starts: en.Enactment           # what to start (without the unsignalled jobs' successors)
    sent_at: dict[int, float] = field(default_factory=dict)   # wall time of each USR1
    unsignalled: set[int] = field(default_factory=set)
    escaped: set[int] = field(default_factory=set)   # started before their hold: requeueheld


@dataclass
class Stopped:
    """What the stops left (phase 4)."""

    requeued: list[int]            # the jobs requeueheld this round
    still: set[int]                # still holding GPUs at the stop timeout
    freed_at: float | None         # wall time their GPUs were seen free (None: no stop)


def _node_names(job: SlurmJob) -> tuple[str, ...]:
    """The nodes a job ran on (empty when Slurm's list cannot be read)."""
    try:
        return expand_hostlist(job.node_list) if job.node_list else ()
    except InputError:
        return ()


class EnactPhases(SlurmActions):
    """`enact` for the live cluster (`SlurmCluster` holds the state these phases use)."""

    guard: ChurnGuard
    churn: en.ChurnLimits
    stops: stops.StopTracker
    ledger: StopLedger | None
    gpus: int
    rounds: int
    jobs: dict[int, LiveJob]
    last_stats: EnactStats
    max_snapshot_age_s: float | None
    observed_at: float
    switch: SwitchClock
    departures: RecentDepartures
    _planned: frozenset[int]
    _slurm_jobs: list[SlurmJob]
    _ended: list[tuple[LiveJob, SlurmJob | None]]
    _flags_new: list[tuple[SlurmJob, str]]
    _released_at: dict[int, float]
    _unplaceable_gpu_s: float

    _free_gpus: int
    _observe_started: float
    _nodes: list[SlurmNode]

    def _spec(self, job: SlurmJob, registered: Mapping[int, Mapping[str, object]]) -> LiveSpec:
        raise NotImplementedError      # SlurmCluster's

    def _closed(self) -> set[str]:
        """The nodes of the last sinfo read that take no new job (`SlurmNode.usable`)."""
        return {n.name for n in self._nodes if not n.usable}

    def enact(self, plan: RoundPlan, snapshot: Snapshot) -> None:
        """Stop what is not planned, then start what is; one journalled call per step."""
        self.rounds += 1
        stats = EnactStats(idle_unplaceable_gpu_s=self._unplaceable_gpu_s,
                           idle_waiting_gpu_s=self.switch.take_waiting(),
                           idle_switch_gpu_s=self.switch.take_switch())
        prep = self._prepare(plan, snapshot, stats)
        self._journal_round(prep, snapshot, {
            "switch": stats.idle_switch_gpu_s, "unplaceable": stats.idle_unplaceable_gpu_s,
            "waiting": stats.idle_waiting_gpu_s})
        if self.own_admin_holds:
            self.own_admin_holds_to_user_holds(self._slurm_jobs, stats)
        t_enact = self._monotonic()
        sig = self._signal(prep, snapshot, t_enact, stats)
        stopped = self._stop(prep, sig, snapshot, stats)
        self._start(sig, stopped, snapshot, t_enact, stats)
        self._finish(prep, sig, stopped, snapshot, stats)

    # ------------------------------------------------------------------ phase 1
    def _prepare(self, plan: RoundPlan, snapshot: Snapshot, stats: EnactStats) -> Prepared:
        """The plan within the churn bounds and the nodes, and its diff against Slurm."""
        ours = [j for j in self._slurm_jobs if self._ours(j)]
        remaining = {v.job_id: v.remaining_iterations / v.iterations_per_s
                     for v in snapshot.jobs if v.iterations_per_s > 0}
        moved = plan.info_ids("moved") if snapshot.nodes else set()
        plan = self.guard.bound(plan, ours, self.churn, self.gpus, snapshot.now, stats,
                                remaining, moved=moved)
        plan, moved = place_around_kept(
            plan, snapshot, stats.kept, lambda: self.guard.free_to_move(
                ours, plan.run, self.churn, snapshot.now, remaining), moved)
        pins = en.pin_nodes(plan.placement, ours) if snapshot.nodes else {}
        moved &= set(pins)     # a job that cannot be pinned elsewhere keeps running where it is
        plan = fit_nodes(plan, snapshot, ours, moved, stats, closed=self._closed())
        resumed = self.stops.pending(ours, self.grace_seconds)
        plan = keep_idle_stops(plan, snapshot, ours, moved, set(resumed), remaining, stats)
        e = en.diff(plan, ours, pins=pins, moved=moved)
        if resumed:   # stops begun earlier: completed (requeuehold), never signalled again
            e = replace(e, stop=tuple(sorted(set(e.stop) | set(resumed))),
                        signal=tuple(j for j in e.signal if j not in resumed),
                        keep=tuple(j for j in e.keep if j not in resumed))
            log.info("resuming the stop of %s (signalled earlier, not yet requeued): "
                     "requeuehold after the rest of the grace period",
                     ", ".join(str(j) for j in sorted(resumed)))
        self.allowed_running = frozenset(plan.run) | self._planned | frozenset(e.stop)
        stats.held = len(e.hold)
        return Prepared(plan, ours, e, moved, pins, resumed)

    # ------------------------------------------------------------------ phase 2
    def _journal_round(self, prep: Prepared, snapshot: Snapshot,
                       idle_gpu_s: Mapping[str, float]) -> None:
        """Record the round (with every job a step may name, and the idle GPU-seconds by
        cause since the last round, in its plan's `idle_gpu_s`), the new flags and the jobs that
        ended; then refuse to act on a stale snapshot."""
        e = prep.e
        # the journal must know every job a step may name: a resumed stop can act on a job that
        # already left the active set (it exited on its USR1 and shows COMPLETED)
        touched = set(e.stop) | set(e.signal) | set(e.hold) | set(e.start)
        ended = [(live, final) for live, final in self._ended
                 if live.slurm.job_id not in touched and live.slurm.job_id not in prep.resumed]
        journal_jobs = {live.slurm.job_id: live for live, _ in ended}
        journal_jobs.update(self.jobs)
        for job in prep.ours:
            if job.job_id in touched and job.job_id not in journal_jobs:
                journal_jobs[job.job_id] = LiveJob(job, self._spec(job, {}))
        plan = replace(prep.plan, info={**prep.plan.info, "idle_gpu_s": idle_gpu_s})
        try:
            self.journal.begin_round(snapshot, plan, journal_jobs)
        except JournalUnavailable:
            raise
        except Exception as exc:
            raise JournalUnavailable(f"cannot record the round: {type(exc).__name__}: "
                                     f"{exc}") from exc
        self._record_flags(snapshot.now)
        self._record_ended(ended, snapshot.now)
        self._check_fresh()      # after the round's store reads and writes, before any action

    def _check_fresh(self) -> None:
        """Raise `StaleSnapshot` when the Slurm snapshot this round planned on is older than
        `max_snapshot_age_s` (e.g. the store made the round wait): never act on stale state."""
        age = self._monotonic() - self.observed_at
        if self.max_snapshot_age_s is not None and age > self.max_snapshot_age_s:
            raise StaleSnapshot(age, self.max_snapshot_age_s)

    def _record_ended(self, ended: list[tuple[LiveJob, SlurmJob | None]], now: float) -> None:
        """Completion events of the jobs that left the queue (bookkeeping: a failure is
        logged, never stops the round; reconciliation at the next start covers a lost one)."""
        self._ended = []
        for live, final in ended:
            try:
                self.journal.job_ended(live, final, now)
            except Exception as exc:
                log.warning("could not record that job %s ended (%s: %s)", live.slurm.job_id,
                            type(exc).__name__, exc)

    def _record_flags(self, now: float) -> None:
        """Flag in the store the jobs found impossible or with a bad spec since the last
        round (bookkeeping: a failure is logged; the store keeps one flag per job)."""
        new, self._flags_new = self._flags_new, []
        for job, reason in new:
            if self.ledger is None:
                self.guard.flag(job, reason, now)
                continue
            try:
                self.ledger.job_event(job, "flagged", {"reason": reason}, now)
            except Exception as exc:
                log.warning("could not record that job %s is flagged (%s: %s)", job.job_id,
                            type(exc).__name__, exc)

    # ------------------------------------------------------------------ phase 3
    def _signal(self, prep: Prepared, snapshot: Snapshot, t_enact: float,
                stats: EnactStats) -> Signalled:
        """Holds and USR1s (`enact.stop_steps`); a job whose signal failed is not requeued
        this round, and the plan is bounded around the GPUs it keeps; a held job that Slurm
        had started before its hold is kept or requeueheld (`_escaped_holds`)."""
        by_id = {j.job_id: j for j in prep.ours}
        sig = Signalled(prep.plan, prep.e)
        for step in en.stop_steps(prep.e):
            for j in step.job_ids if step.action == "signal" else ():
                sig.sent_at[j] = snapshot.now + (self._monotonic() - t_enact)
            try:
                result = self._run(step, stats)
            except SlurmError as exc:     # no answer: a timed-out USR1 may have gone out
                maybe = step.action == "signal" and OUTCOME_UNKNOWN_RE.search(exc.stderr)
                for j in step.job_ids if maybe else ():
                    if j in by_id:        # a job that exited on it is requeued
                        self.stops.signalled(by_id[j], sig.sent_at[j], maybe=True)
                raise
            if step.action == "hold":
                self._escaped_holds(self._started_before_hold(step.job_ids), prep, sig,
                                    snapshot, stats)
            if step.action != "signal":
                continue
            if not result.ok:
                sig.unsignalled |= set(step.job_ids)
                continue
            for j in step.job_ids:
                if j in by_id:
                    self.stops.signalled(by_id[j], sig.sent_at[j])
        if sig.unsignalled:
            self._bound_unsignalled(prep, sig, snapshot, stats)
        return sig

    def _escaped_holds(self, jobs: Sequence[SlurmJob], prep: Prepared, sig: Signalled,
                       snapshot: Snapshot, stats: EnactStats) -> None:
        """Held jobs that Slurm had started first run outside the plan. The churn bounds decide
        as for any running job the plan stops: one they keep (a job that has just started is
        younger than the minimum run) keeps running, and the starts planned onto its GPUs wait
        for a later round (`fit_nodes`; released, they would wait in Reason=Resources); the
        others are requeueheld with the round's stops (`sig.escaped`)."""
        if not jobs:
            return
        histories = self.guard.histories(jobs)
        kept = {j.job_id: shares for j in jobs
                if en.keep_reason(j, histories[j.job_id], self.churn, snapshot.now) is not None
                and (shares := gpus_per_allocated_node(j)) is not None}
        sig.escaped = {j.job_id for j in jobs} - set(kept)
        if kept:
            log.info("jobs %s started before their hold: kept running (churn bounds)",
                     sorted(kept))
            plan = fit_nodes(sig.plan, snapshot, prep.ours, prep.moved, stats, unseen=kept,
                             closed=self._closed())
            sig.starts = sig.starts.without_starts(set(sig.plan.run) - set(plan.run))
            sig.plan = plan
        if sig.escaped:
            log.info("jobs %s started before their hold: requeuehold", sorted(sig.escaped))

    def _bound_unsignalled(self, prep: Prepared, sig: Signalled, snapshot: Snapshot,
                           stats: EnactStats) -> None:
        """Finished on their own (requeuehold would rerun a COMPLETED job), or the call failed
        (requeued now they would lose their work since the last checkpoint): not requeued; the
        next round decides again, with a fresh signal if they still run."""
        unsignalled = sig.unsignalled
        log.info("jobs %s could not be signalled; not requeued this round", sorted(unsignalled))
        run, dropped = en.bound_plan(sig.plan.run, prep.ours, unsignalled, self.gpus)
        plan = RoundPlan(run=run, info={**sig.plan.info, "unsignalled": sorted(unsignalled),
                                        "unsignalled_dropped": list(dropped)},
                         placement=sig.plan.placement)
        moved = prep.moved - unsignalled
        sig.plan = fit_nodes(plan, snapshot, prep.ours, moved, stats, closed=self._closed())
        sig.starts = en.diff(sig.plan, prep.ours, pins=prep.pins, moved=moved)
        if dropped:
            log.info("not starting %s this round (GPUs still held by %s)", list(dropped),
                     sorted(unsignalled))

    # ------------------------------------------------------------------ phase 4
    def _stop(self, prep: Prepared, sig: Signalled, snapshot: Snapshot,
              stats: EnactStats) -> Stopped:
        """Requeuehold the stopped jobs once they have exited (or at the grace deadline),
        then wait until their GPUs are free."""
        e = prep.e
        to_requeue = [j for j in e.stop if j not in sig.unsignalled]
        if to_requeue:
            wait = self.grace_seconds if e.signal else 0.0
            if prep.resumed:
                wait = max([wait] + [since + self.grace_seconds - snapshot.now
                                     for since in prep.resumed.values()])
            seen = self._await_exits(to_requeue, min(wait, self.grace_seconds), stats)
            to_requeue = self._not_done_before_signal(to_requeue, sig.sent_at, seen)
        to_requeue = sorted(set(to_requeue) | sig.escaped)   # escapes: no signal, no wait
        not_requeued = set(sig.starts.moved) - set(to_requeue)
        if not_requeued:      # a moved job that ended meanwhile, or kept its GPUs: not started
            sig.starts = sig.starts.without_starts(not_requeued)
        if not to_requeue:
            self.allowed_running = frozenset(sig.plan.run) | frozenset(e.hold)
            return Stopped([], set(), None)
        requeue = en.requeue_step(to_requeue)
        assert requeue is not None
        if self._run(requeue, stats).ok:
            for job in prep.ours:
                if job.job_id in requeue.job_ids:
                    self.stops.requeued(job)
                    self.guard.requeued(job, snapshot.now)
        stats.stopped = len(to_requeue)
        t0 = self._monotonic()
        still = self._wait_stopped(sig.plan.run, set(to_requeue), stats)
        stats.stop_wait_s = self._monotonic() - t0
        self.allowed_running = frozenset(sig.plan.run) | frozenset(still) | frozenset(e.hold)
        freed_at = self._wall(snapshot, t0 + stats.stop_wait_s)
        self.departures.left({j.job_id: _node_names(j) for j in prep.ours
                              if j.job_id in to_requeue and j.job_id not in still}, freed_at)
        return Stopped(to_requeue, still, freed_at)

    def _wall(self, snapshot: Snapshot, t_mono: float) -> float:
        """The wall time of monotonic `t_mono`, on the round's clock."""
        return snapshot.now + (t_mono - self._observe_started)

    # ------------------------------------------------------------------ phase 5
    def _start(self, sig: Signalled, stopped: Stopped, snapshot: Snapshot, t_enact: float,
               stats: EnactStats) -> None:
        """The updates, then one release (in the second after any of its jobs left a node it
        may use again: `credentials`); remember when each job was released."""
        for step in en.start_steps(sig.starts):
            if step.action == "release":
                self._await_credentials(step.job_ids, sig, snapshot)
            result = self._run(step, stats)
            if step.action == "release" and result.ok:
                released = snapshot.now + (self._monotonic() - t_enact)
                self._released_at.update(dict.fromkeys(step.job_ids, released))
        stats.moved = len(sig.starts.moved)
        stats.pinned = sum(1 for u in sig.starts.updates if u.nodes)
        stats.started = len(sig.starts.start)
        stats.updates = len(sig.starts.updates)

    def _await_credentials(self, job_ids: Sequence[int], sig: Signalled,
                           snapshot: Snapshot) -> None:
        pins = {u.job_id: u.nodes for u in sig.starts.updates if u.nodes}
        wait = self.departures.wait_s(job_ids, pins, self._wall(snapshot, self._monotonic()))
        if wait > 0:
            log.info("releasing %s in %.2f s: the second in which they left their nodes must "
                     "pass (Slurm refuses a credential of that second)", list(job_ids), wait)
            self._sleep(wait)

    def _finish(self, prep: Prepared, sig: Signalled, stopped: Stopped, snapshot: Snapshot,
                stats: EnactStats) -> None:
        """The round's bookkeeping: the enacted plan, the switch to time (the GPUs the stops
        freed, from `freed_at` until the jobs started in their place are RUNNING), and the
        waiting GPUs the round's releases took."""
        by_id = {j.job_id: j for j in prep.ours}
        started = {j: by_id[j].gpus for j in sig.starts.start if j in by_id}
        if stopped.freed_at is not None:
            freed = sum(by_id[j].gpus for j in stopped.requeued if j in by_id)
            self.switch.begin(stopped.freed_at, freed, started, self._free_gpus)
        self.switch.round_done(self._wall(snapshot, self._monotonic()), sum(started.values()))
        self._planned = frozenset(sig.plan.run)
        self.last_stats = stats

