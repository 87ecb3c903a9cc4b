"""The live cluster: `engine.Cluster` on a Slurm backend, so the daemon runs the simulator's loop.

Why it looks like this:
- `observe` makes exactly two reads (`backend.jobs()` = one `squeue --json`, `backend.nodes()` =
  one `sinfo --json`) whatever the number of jobs: squeue ignores its filters in 22.05, so
  everything is filtered here.
- What a job is comes from the spec shocksub put in its comment (`shock:spec={json}`), else from a
  spec registered in the store (`SpecRegistry`), else from documented defaults, so a managed job
  submitted by plain sbatch is still scheduled.
- Progress comes from a `ProgressSource`: by default an estimate from the run time this daemon
  has seen; the daemon plugs in the training helper's reports from the store (`refresh` is called
  once per round with all active jobs, so a source reads them in a few queries, not per job).
- Every action is journalled before it runs and its outcome after (`Journal`), and a failed call
  is not retried here: the next round recomputes the diff from Slurm's state, which retries it.
- The cluster's capacity is the GPUs of usable nodes in the managed partitions minus the GPUs
  held by jobs this daemon does not manage (unmanaged jobs, or managed ones outside `job_filter`),
  so a plan always fits what Slurm can actually give.
- Nodes: the snapshot names the nodes, where our running jobs sit and what others hold on each
  (`layout.read_layout`, from the same two reads), so the round loop places every plan on the
  real nodes; `enact` pins each job it starts to the plan's nodes (`ReqNodeList=`, see
  `enact`'s module), stops and restarts the jobs the plan moves, and does not start a job whose
  planned nodes are still held by jobs that keep running. Idle GPU-seconds while a released
  job waits in Reason=Resources with GPUs free are measured at each observe
  (`EnactStats.idle_unplaceable_gpu_s`, `idle_gpu_s`).
- Churn is bounded (`enact.ChurnLimits`: minimum run time, preemptions per day, jobs whose
  checkpoints keep failing are flagged and left running): a stop the bounds forbid is dropped and
  the plan's starts that no longer fit are dropped with it (`churn.ChurnGuard`). What the bounds
  need survives a daemon restart: the run's start from Slurm, the past preemptions and
  checkpoint reports from a `StopHistorySource` (the store, through the progress source), else
  from this process's memory, capped by Slurm's restart count.
- Crash safety: a stop is USR1 (one scancel per job), the grace period, then requeuehold. A
  stop begun but never completed is resumed, never signalled again, and no job that had ended
  before its signal is requeued (`stops.StopTracker`). A job whose signal failed is not
  requeued that round: it keeps its GPUs and the next round decides again.
- Outages: a Slurm read that fails raises `SlurmError` out of the round (nothing is enacted on
  stale state), and so does an action whose failure says the controller cannot be reached (the
  rest of the round is abandoned); a journal that cannot record an intent raises
  `JournalUnavailable` before the call, so no action is ever taken that the store does not
  know about. The daemon's runner logs, backs off and retries.
- Stale state: right before its first Slurm action (after the round's store reads and its
  round record), `enact` checks the age of the squeue read the round planned on; older than
  `max_snapshot_age_s` (a round delayed by a slow store, a long solve) it raises
  `StaleSnapshot` and does nothing, and the runner re-reads Slurm and re-plans. A `may_act`
  hook (the daemon's leader lock) is asked before every Slurm action.
- Impossible requests: a managed job asking more GPUs per node than any usable node of the
  managed partitions has (Slurm accepts such a job while it is held) is left out of the
  snapshot (never planned, so never released), logged once and flagged in the store.
- Bad specs: a job whose spec (comment or registration) is not valid or out of bounds
  (`specs.BadSpec`, `shockslurm.limits`) is treated the same way: left held, logged once and
  flagged once with the reason; it is journalled with the default spec, so the store can always
  record it. Nothing a job supplies raises out of the round or stops other jobs.
- Per-job state does not grow with what a job declares: the view's per-epoch profile is
  run-length encoded (`model.RunLength`), one run for the daemon's constant profile, and so is
  the batch-size history from reports.
"""

from __future__ import annotations

import logging
import math
import re
import time
from dataclasses import replace
from typing import Callable, Mapping, Sequence

from ..errors import ShockslurmError
from ..model import JobView, RoundPlan, RunLength, Snapshot
from . import enact as en
from . import stops
from .churn import ChurnGuard
from .layout import Layout, read_layout, unplaceable_idle_gpu_s
from .journaling import (EnactStats, Journal, JournalUnavailable, LiveJob, NullJournal,
                         StopHistorySource, StopLedger)
from .progress_source import ProgressSource, RunTimeProgress
from .specs import (DEFAULT_EPOCH_SECONDS, DEFAULT_SPEC, BadSpec, LiveSpec, SpecRegistry,
                    epoch_seconds, has_spec, job_spec)
from ..slurm.types import CommandResult, JobState, SlurmBackend, SlurmError, SlurmJob, SlurmNode

log = logging.getLogger(__name__)

STOP_POLL_S = 0.5
# stderr of an action when slurmctld cannot be reached (or a CliBackend timeout): an outage.
CONTROLLER_DOWN_RE = re.compile(
    r"Unable to contact slurm controller|Socket timed out|Connection refused|"
    r"Zero Bytes were transmitted|timed out after|Communication connection failure", re.I)


def _job_ids(value: object) -> set[int]:
    """Job ids from a plan's `info` entry (a list of ids, or absent)."""
    return {int(j) for j in value} if isinstance(value, (list, tuple)) else set()


class StaleSnapshot(ShockslurmError):
    """The round's Slurm snapshot is too old to act on: nothing was done; re-read and re-plan."""

    def __init__(self, age_s: float, bound_s: float) -> None:
        super().__init__(f"the Slurm snapshot is {age_s:.1f} s old (bound {bound_s:g} s)")
        self.age_s = age_s
        self.bound_s = bound_s


class SlurmCluster:
    """`engine.Cluster` on a real Slurm (through a `SlurmBackend`)."""

    def __init__(self, backend: SlurmBackend, *, partitions: Sequence[str] = ("gpu",),
                 grace_seconds: float = 30.0, stop_timeout_s: float = 60.0,
                 job_filter: Callable[[SlurmJob], bool] | None = None,
                 registry: SpecRegistry | None = None,
                 progress_source: ProgressSource | None = None,
                 journal: Journal | None = None, round_s: float = 120.0,
                 restart_overhead_s: float = 0.0, stop_when_idle: bool = False,
                 churn: en.ChurnLimits | None = None,
                 stop_history: StopHistorySource | None = None,
                 ledger: StopLedger | None = None,
                 sleep: Callable[[float], None] = time.sleep,
                 monotonic: Callable[[], float] = time.monotonic,
                 max_snapshot_age_s: float | None = None,
                 may_act: Callable[[], None] | None = None) -> None:
        """`churn`: the churn bounds (default `ChurnLimits.for_round(round_s)`; `ChurnLimits(0,
        0, 0)` disables them). `stop_history`: where past stops are read (default: the progress
        source when it provides `stop_history`, e.g. `ReportedProgress`).
        `max_snapshot_age_s`: `enact` raises `StaleSnapshot` when the squeue read is older
        (None: no bound). `may_act`: called before every Slurm action; raises to forbid it."""
        self.backend = backend
        self.partitions = tuple(partitions)
        self.grace_seconds = float(grace_seconds)
        self.stop_timeout_s = float(stop_timeout_s)
        self.job_filter = job_filter
        self.registry = registry
        self.progress_source = progress_source or RunTimeProgress()
        self.journal = journal or NullJournal()
        self.round_s = float(round_s)
        self.restart_overhead_s = float(restart_overhead_s)
        self.stop_when_idle = stop_when_idle
        self.churn = churn if churn is not None else en.ChurnLimits.for_round(self.round_s)
        if stop_history is None and hasattr(self.progress_source, "stop_history"):
            stop_history = self.progress_source  # type: ignore[assignment]
        self.stop_history = stop_history
        self.guard = ChurnGuard(stop_history)
        self.ledger = ledger
        self.stops = stops.StopTracker(ledger)
        self.impossible: dict[tuple[int, float], str] = {}  # never planned: the reason
        self.bad_specs: dict[tuple[int, float], str] = {}   # never planned: the reason
        self._flags_new: list[tuple[SlurmJob, str]] = []    # flagged, not yet in the store
        self._sleep = sleep
        self._monotonic = monotonic
        self.max_snapshot_age_s = max_snapshot_age_s
        self.may_act = may_act
        self.observed_at = monotonic()      # when the last squeue read returned (monotonic)
        self.gpus = 0
        self.jobs: dict[int, LiveJob] = {}
        self.rounds = 0
        self.last_stats = EnactStats()
        self._last_now: float | None = None
        self._seen_any = False
        self._idle = False
        self._previous_plan: frozenset[int] = frozenset()
        self._slurm_jobs: list[SlurmJob] = []
        # jobs that left the queue since the last recorded round: (what we knew, final state)
        self._ended: list[tuple[LiveJob, SlurmJob | None]] = []
        # What may hold GPUs right now (plan ∪ jobs being stopped): for watchers and tests.
        self.allowed_running: frozenset[int] = frozenset()
        # the last enacted plan's jobs: one of them finishing is an event (`wants_early_round`)
        self._planned: frozenset[int] = frozenset()
        self.layout: Layout | None = None    # the last observe's nodes (None: one pool)
        self._released_at: dict[int, float] = {}  # jobs this daemon released, still pending
        self._unplaceable_gpu_s = 0.0        # measured by the last observe
        # idle GPU-seconds by cause since the daemon started (a counter for metrics)
        self.idle_gpu_s: dict[str, float] = {"unplaceable": 0.0}

    # ------------------------------------------------------------------ helpers
    def _ours(self, job: SlurmJob) -> bool:
        if not job.managed or not set(job.partition.split(",")) & set(self.partitions):
            return False
        return self.job_filter is None or self.job_filter(job)

    def _capacity(self, nodes: Sequence[SlurmNode], jobs: Sequence[SlurmJob]) -> int:
        total = sum(n.gpus for n in nodes
                    if n.usable and set(n.partitions) & set(self.partitions))
        # GPUs the policy cannot hand out: other jobs', and ours that are still completing.
        foreign = sum(j.gpus for j in jobs if j.state.holds_gpus and (
            not self._ours(j) or j.state is JobState.COMPLETING))
        return max(0, total - foreign)

    def _spec(self, job: SlurmJob, registered: Mapping[int, Mapping[str, object]]) -> LiveSpec:
        """The job's spec; for a bad one (`BadSpec`) the defaults, and the job is recorded in
        `bad_specs` (never planned) and queued to be flagged, once per job."""
        try:
            spec = job_spec(job.comment, registered.get(job.job_id))
        except BadSpec as exc:
            key = (job.job_id, job.submit_time)
            if key not in self.bad_specs:
                reason = f"bad spec: {exc}"
                self.bad_specs[key] = reason
                self._flags_new.append((job, reason))
                log.warning("job %s is never scheduled: %s; it stays held", job.job_id, reason)
            return DEFAULT_SPEC
        if spec.source == "default":
            log.warning("job %s carries no shock:spec and is not registered; using defaults "
                        "(%s s per epoch)", job.job_id, DEFAULT_EPOCH_SECONDS)
        return spec

    # ------------------------------------------------------------------ Cluster protocol
    def _read(self, what: str, read: Callable[[], list]) -> list:
        try:
            return read()
        except SlurmError:
            raise
        except Exception as exc:   # a half-written answer during a controller restart, ...
            raise SlurmError(f"{what} failed: {type(exc).__name__}: {exc}") from exc

    def _impossible(self, active: Sequence[SlurmJob], nodes: Sequence[SlurmNode]) -> set[int]:
        """Pending jobs of ours no usable node can ever hold (more GPUs per node than any)."""
        usable = [n.gpus for n in nodes if n.usable and set(n.partitions) & set(self.partitions)]
        if not usable:       # nothing usable now: no verdict (capacity is 0 anyway)
            return set()
        biggest, total = max(usable), sum(usable)
        out = set()
        for job in active:
            if job.state is not JobState.PENDING:
                continue
            reason = None
            if job.gpus_per_node > biggest:
                reason = (f"impossible request: {job.gpus_per_node} GPUs per node, the "
                          f"largest usable node has {biggest}")
            elif job.gpus > total:
                reason = (f"impossible request: {job.gpus} GPUs, the managed partitions have "
                          f"{total}")
            if reason is None:
                continue
            out.add(job.job_id)
            key = (job.job_id, job.submit_time)
            if key not in self.impossible:
                self.impossible[key] = reason
                self._flags_new.append((job, reason))
                log.warning("job %s is never scheduled: %s; it stays held", job.job_id, reason)
        return out

    def observe(self, now: float) -> Snapshot:
        slurm_jobs = self._read("squeue", self.backend.jobs)    # read 1: squeue --json
        self.observed_at = self._monotonic()
        nodes = self._read("sinfo", self.backend.nodes)         # read 2: sinfo --json
        self._slurm_jobs = slurm_jobs
        self.layout = read_layout(nodes, slurm_jobs, self.partitions, self._ours)
        self.gpus = (self.layout.gpus if self.layout is not None
                     else self._capacity(nodes, slurm_jobs))
        self._measure_unplaceable(slurm_jobs, now)
        active = [j for j in slurm_jobs if self._ours(j)
                  and j.state in (JobState.PENDING, JobState.RUNNING, JobState.SUSPENDED,
                                  JobState.COMPLETING)]
        impossible = self._impossible(active, nodes)
        new = [j for j in active if j.job_id not in self.jobs
               or self.jobs[j.job_id].slurm.submit_time != j.submit_time]
        registered: Mapping[int, Mapping[str, object]] = {}
        unspecified = [j for j in new if not has_spec(j.comment)]
        if self.registry is not None and unspecified:
            try:
                registered = self.registry.lookup(unspecified)
            except JournalUnavailable:
                raise
            except Exception as exc:   # a spec guessed now would stick: no round without it
                raise JournalUnavailable(f"spec registry: {type(exc).__name__}: {exc}") from exc
        elapsed = 0.0 if self._last_now is None else max(0.0, now - self._last_now)
        current: dict[int, LiveJob] = {}
        for job in active:
            live = self.jobs.get(job.job_id)
            if live is None or live.slurm.submit_time != job.submit_time:
                live = LiveJob(job, self._spec(job, registered))
            running = job.state is JobState.RUNNING
            if running:
                if live.last_seen_running:
                    live.run_time_s += elapsed
                elif job.start_time is not None:
                    since = job.start_time if self._last_now is None else \
                        max(job.start_time, self._last_now)
                    live.run_time_s += max(0.0, now - since)
            live.last_seen_running = running
            live.slurm = job
            current[job.job_id] = live
        by_key = {(j.job_id, j.submit_time): j for j in slurm_jobs}
        for job_id, live in self.jobs.items():
            if job_id in current and current[job_id].slurm.submit_time == live.slurm.submit_time:
                continue
            final = by_key.get((job_id, live.slurm.submit_time))
            if final is None or final.state.finished:
                self._ended.append((live, final))
        self.jobs = current
        active_keys = {(j.slurm.job_id, j.slurm.submit_time) for j in current.values()}
        self.bad_specs = {k: r for k, r in self.bad_specs.items() if k in active_keys}
        self._last_now = now
        if current:
            self._seen_any = True
        self._idle = self._seen_any and not any(
            j.slurm.state in (JobState.PENDING, JobState.RUNNING, JobState.SUSPENDED)
            for j in current.values())
        refresh = getattr(self.progress_source, "refresh", None)
        if refresh is not None:
            try:
                refresh([j.slurm for j in current.values()])
            except JournalUnavailable:   # the store is down: no round on guesses
                raise
            except Exception as exc:  # a failing source must not stop the daemon
                log.warning("progress source refresh failed (%s: %s); using what it had",
                            type(exc).__name__, exc)
        # COMPLETING jobs hold GPUs but will never run again: not offered to the policy; nor
        # are impossible requests and bad specs (they stay held: the diff holds them if
        # released, and stops them if they run).
        views = tuple(self._view(j) for j in current.values()
                      if j.slurm.state is not JobState.COMPLETING
                      and j.slurm.job_id not in impossible
                      and (j.slurm.job_id, j.slurm.submit_time) not in self.bad_specs)
        layout = self.layout or Layout(())
        snap = Snapshot(now=now, round_index=self.rounds, round_s=self.round_s, gpus=self.gpus,
                        jobs=views, restart_overhead_s=self.restart_overhead_s,
                        nodes=layout.nodes, placements=dict(layout.placements),
                        reserved=dict(layout.reserved))
        return snap

    def _measure_unplaceable(self, jobs: Sequence[SlurmJob], now: float) -> None:
        """Idle GPU-seconds since the last observe while our released jobs waited in
        Reason=Resources with GPUs free (`layout.unplaceable_idle_gpu_s`); a job counts from
        its release when that came later."""
        pending = {j.job_id for j in jobs if self._ours(j) and j.state is JobState.PENDING}
        self._released_at = {j: t for j, t in self._released_at.items() if j in pending}
        self._unplaceable_gpu_s = 0.0
        if self.layout is None or self._last_now is None:
            return
        last = self._last_now
        waited = {j: now - max(last, self._released_at.get(j, last)) for j in pending}
        free = sum(max(0, f) for f in self.layout.free().values())
        self._unplaceable_gpu_s = unplaceable_idle_gpu_s(jobs, free, waited)
        self.idle_gpu_s["unplaceable"] += self._unplaceable_gpu_s

    def _view(self, live: LiveJob) -> JobView:
        job, spec = live.slurm, live.spec
        gang = max(1, job.gpus)
        epoch_s = epoch_seconds(spec, gang)
        try:
            prog = self.progress_source.progress(job, spec, live.run_time_s, epoch_s)
        except Exception as exc:  # a failing source must not stop the daemon
            log.warning("progress of job %s failed (%s: %s); estimating from run time",
                        job.job_id, type(exc).__name__, exc)
            prog = RunTimeProgress().progress(job, spec, live.run_time_s, epoch_s)
        live.progress = prog
        iters_per_epoch = math.ceil(spec.samples_per_epoch / prog.batch_size)
        remaining = max(1.0, (spec.epochs - prog.epochs_done) * iters_per_epoch)
        ips = (prog.iterations_per_s if prog.iterations_per_s is not None
               and prog.iterations_per_s > 0 else iters_per_epoch / epoch_s)
        observed = (prog.observed_batch_sizes if prog.observed_batch_sizes is not None
                    else RunLength.repeat(prog.batch_size, int(prog.epochs_done)))
        return JobView(
            job_id=job.job_id, gang_size=gang, arrival_s=job.submit_time,
            num_epochs=spec.epochs, epochs_done=prog.epochs_done, batch_size=prog.batch_size,
            iterations_per_s=ips, remaining_iterations=remaining,
            iterations_per_epoch=iters_per_epoch,
            observed_batch_sizes=observed,
            profile_batch_sizes=RunLength.repeat(spec.batch_size, spec.epochs),
            profile_epoch_durations=RunLength.repeat(epoch_s, spec.epochs),
            exclusive_runtime_s=epoch_s * spec.epochs, run_time_s=live.run_time_s,
            ran_last_round=job.state is JobState.RUNNING)

    def _check_fresh(self) -> None:
        """Raise `StaleSnapshot` when the Slurm snapshot this round planned on is older than
        `max_snapshot_age_s` (e.g. the store made the round wait): never act on stale state."""
        age = self._monotonic() - self.observed_at
        if self.max_snapshot_age_s is not None and age > self.max_snapshot_age_s:
            raise StaleSnapshot(age, self.max_snapshot_age_s)

    def enact(self, plan: RoundPlan, snapshot: Snapshot) -> None:
        """Stop what is not planned, then start what is; one journalled call per step."""
        self.rounds += 1
        ours = [j for j in self._slurm_jobs if self._ours(j)]
        stats = EnactStats()
        remaining = {v.job_id: v.remaining_iterations / v.iterations_per_s
                     for v in snapshot.jobs if v.iterations_per_s > 0}
        stats.idle_unplaceable_gpu_s = self._unplaceable_gpu_s
        moved = _job_ids(plan.info.get("moved")) if snapshot.nodes else set()
        plan = self.guard.bound(plan, ours, self.churn, self.gpus, snapshot.now, stats,
                                remaining, moved=moved)
        moved -= set(stats.kept)
        pins = en.pin_nodes(plan.placement, ours) if snapshot.nodes else {}
        moved &= set(pins)     # a job that cannot be pinned elsewhere keeps running where it is
        plan = self._fit_nodes(plan, snapshot, ours, moved, stats)
        resumed = self.stops.pending(ours)
        e = en.diff(plan, ours, pins=pins, moved=moved)
        if resumed:   # stops begun earlier: completed (requeuehold), never signalled again
            e = replace(e, stop=tuple(sorted(set(e.stop) | set(resumed))),
                        signal=tuple(j for j in e.signal if j not in resumed),
                        keep=tuple(j for j in e.keep if j not in resumed))
            log.info("resuming the stop of %s (signalled earlier, not yet requeued): "
                     "requeuehold after the rest of the grace period",
                     ", ".join(str(j) for j in sorted(resumed)))
        self.allowed_running = frozenset(plan.run) | self._previous_plan | frozenset(e.stop)
        # the journal must know every job a step may name: a resumed stop can act on a job that
        # already left the active set (it exited on its USR1 and shows COMPLETED)
        touched = set(e.stop) | set(e.signal) | set(e.hold) | set(e.start)
        ended = [(live, final) for live, final in self._ended
                 if live.slurm.job_id not in touched and live.slurm.job_id not in resumed]
        journal_jobs = {live.slurm.job_id: live for live, _ in ended}
        journal_jobs.update(self.jobs)
        for job in ours:
            if job.job_id in touched and job.job_id not in journal_jobs:
                journal_jobs[job.job_id] = LiveJob(job, self._spec(job, {}))
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
        by_id = {j.job_id: j for j in ours}
        unsignalled: set[int] = set()
        t_enact = self._monotonic()
        sent_at: dict[int, float] = {}       # wall time each signal went out
        for step in en.stop_steps(e):
            for j in step.job_ids if step.action == "signal" else ():
                sent_at[j] = snapshot.now + (self._monotonic() - t_enact)
            result = self._run(step, stats)
            if step.action != "signal":
                continue
            if not result.ok:
                unsignalled |= set(step.job_ids)
                continue
            for j in step.job_ids:
                if j in by_id:
                    self.stops.signalled(by_id[j], sent_at[j])
        if unsignalled:
            # Finished on their own (requeuehold would rerun a COMPLETED job), or the call failed
            # (requeued now they would lose their work since the last checkpoint): not requeued;
            # the next round decides again, with a fresh signal if they still run.
            log.info("jobs %s could not be signalled; not requeued this round",
                     sorted(unsignalled))
            run, dropped = en.bound_plan(plan.run, ours, unsignalled, self.gpus)
            plan = RoundPlan(run=run, info={**plan.info, "unsignalled": sorted(unsignalled),
                                            "unsignalled_dropped": list(dropped)},
                             placement=plan.placement)
            moved -= unsignalled
            plan = self._fit_nodes(plan, snapshot, ours, moved, stats)
            starts = en.diff(plan, ours, pins=pins, moved=moved)
            if dropped:
                log.info("not starting %s this round (GPUs still held by %s)", list(dropped),
                         sorted(unsignalled))
        else:
            starts = e
        stats.held = len(e.hold)
        to_requeue = [j for j in e.stop if j not in unsignalled]
        if to_requeue:
            wait = self.grace_seconds if e.signal else 0.0
            if resumed:
                wait = max([wait] + [since + self.grace_seconds - snapshot.now
                                     for since in resumed.values()])
            seen = self._await_exits(to_requeue, min(wait, self.grace_seconds), stats)
            to_requeue = self._not_done_before_signal(to_requeue, sent_at, seen)
        not_requeued = set(starts.moved) - set(to_requeue)
        if not_requeued:      # a moved job that ended meanwhile, or kept its GPUs: not started
            starts = starts.without_starts(not_requeued)
        if to_requeue:
            requeue = en.requeue_step(to_requeue)
            assert requeue is not None
            if self._run(requeue, stats).ok:
                for job in ours:
                    if job.job_id in requeue.job_ids:
                        self.stops.requeued(job)
                        self.guard.requeued(job, snapshot.now)
            stats.stopped = len(to_requeue)
            t0 = self._monotonic()
            still = self._wait_stopped(plan, set(to_requeue), stats)
            stats.stop_wait_s = self._monotonic() - t0
            self.allowed_running = frozenset(plan.run) | frozenset(still) | frozenset(e.hold)
        else:
            self.allowed_running = frozenset(plan.run) | frozenset(e.hold)
        for step in en.start_steps(starts):
            result = self._run(step, stats)
            if step.action == "release" and result.ok:
                released = snapshot.now + (self._monotonic() - t_enact)
                self._released_at.update(dict.fromkeys(step.job_ids, released))
        stats.moved = len(starts.moved)
        stats.pinned = sum(1 for u in starts.updates if u.nodes)
        stats.started = len(starts.start)
        stats.updates = len(starts.updates)
        self._previous_plan = frozenset(plan.run)
        self._planned = frozenset(plan.run)
        self.last_stats = stats

    def _fit_nodes(self, plan: RoundPlan, snapshot: Snapshot, ours: Sequence[SlurmJob],
                   moved: set[int], stats: EnactStats) -> RoundPlan:
        """The plan without the starts whose planned nodes lack GPUs once the jobs that keep
        running are counted (`enact.fit_on_nodes`): planned running jobs that are not moved,
        and running jobs the churn bounds or a failed signal keep (they are in `plan.run`)."""
        if not snapshot.nodes or not plan.placement:
            return plan
        by_id = {j.job_id: j for j in ours}
        holding = {j for j in plan.run if j in snapshot.placements and j not in moved}
        free = Layout(snapshot.nodes, snapshot.placements, snapshot.reserved).free(holding)
        starts = sorted((j for j in plan.run if j in by_id and j not in holding),
                        key=lambda j: (by_id[j].submit_time, j))
        dropped = en.fit_on_nodes(starts, plan.placement, free)
        if not dropped:
            return plan
        log.info("not starting %s this round: their planned nodes are still held by jobs "
                 "that keep running", list(dropped))
        stats.dropped = tuple(sorted(set(stats.dropped) | set(dropped)))
        return replace(plan, run=plan.run - frozenset(dropped),
                       info={**plan.info, "node_dropped": list(dropped)})

    # ------------------------------------------------------------------ bookkeeping
    def _await_exits(self, job_ids: list[int], wait_s: float,
                     stats: EnactStats) -> list[SlurmJob] | None:
        """Wait until every job of `job_ids` has let go of its GPUs (it saved and exited on its
        USR1) or `wait_s` (the rest of the grace period) has passed, whichever comes first;
        returns the last squeue read (None when there was nothing to wait for). Polled every
        `STOP_POLL_S`: a job that exits 1.3 s after its signal is requeued then, not after the
        whole grace period."""
        if wait_s <= 0:
            return None
        waiting = set(job_ids)
        t0 = self._monotonic()
        deadline = t0 + wait_s
        while True:
            jobs = self._read("squeue", self.backend.jobs)
            if not any(j.job_id in waiting and j.state.holds_gpus for j in jobs):
                break
            left = deadline - self._monotonic()
            if left <= 0:
                break
            self._sleep(min(STOP_POLL_S, left))
        stats.grace_wait_s = self._monotonic() - t0
        return jobs

    def _not_done_before_signal(self, job_ids: list[int], sent_at: Mapping[int, float],
                                seen: list[SlurmJob] | None = None) -> list[int]:
        """`job_ids` without the jobs that had ended before their signal (`stops`), judged on
        `seen` (the last squeue read) or one fresh read, only in rounds that stop jobs."""
        if not any(j in sent_at for j in job_ids):
            return job_ids
        if seen is None:
            seen = self._read("squeue", self.backend.jobs)
        keep, done = stops.not_done_before_signal(job_ids, sent_at, seen)
        if done:
            log.info("jobs %s had finished before their stop signal; not requeued", sorted(done))
        return keep

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
            stats.failed_calls += 1
            if CONTROLLER_DOWN_RE.search(result.stderr or ""):
                raise SlurmError(f"{' '.join(step.argv)}: the controller cannot be reached",
                                 argv=step.argv, returncode=result.returncode,
                                 stderr=result.stderr)
            log.warning("%s failed (rc=%s): %s; the next round retries from Slurm's state",
                        " ".join(step.argv), result.returncode, result.stderr.strip())
        return result

    def _wait_stopped(self, plan: RoundPlan, stopping: set[int], stats: EnactStats) -> set[int]:
        """Poll (bounded) until the stopped jobs hold no GPUs; requeuehold any managed job that
        started outside the plan meanwhile (a release that raced a hold). Returns the jobs that
        still hold GPUs at the deadline."""
        deadline = self._monotonic() + self.stop_timeout_s
        requeued = set(stopping)
        while True:
            jobs = [j for j in self._read("squeue", self.backend.jobs) if self._ours(j)]
            holding = {j.job_id for j in jobs if j.job_id in stopping and j.state.holds_gpus}
            escaped = {j.job_id for j in jobs if j.state is JobState.RUNNING
                       and j.job_id not in plan.run and j.job_id not in requeued}
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

    def finished(self) -> bool:
        return self.stop_when_idle and self._idle

    def wants_early_round(self) -> bool:
        """True when a round now would fill GPUs a completion freed: a job of the last enacted
        plan has finished (a final state, or left the queue: its GPUs are free; COMPLETING still
        holds them) while a job of ours outside the plan is pending. One `squeue --json` read,
        no action; a read that fails is "no event" (the next round sees the outage)."""
        if not self._planned:
            return False
        try:
            jobs = self.backend.jobs()
        except Exception as exc:       # noqa: BLE001 - an outage is the round's to handle
            log.debug("event poll: squeue failed (%s: %s); no event", type(exc).__name__, exc)
            return False
        state = {j.job_id: j.state for j in jobs}
        freed = sorted(j for j in self._planned if j not in state or state[j].finished)
        if not freed:
            return False
        never = {job_id for job_id, _ in self.impossible} | {job_id for job_id, _ in
                                                              self.bad_specs}
        waiting = sorted(j.job_id for j in jobs if j.state is JobState.PENDING and self._ours(j)
                         and j.job_id not in self._planned and j.job_id not in never)
        if waiting:
            log.info("jobs %s finished with %s waiting: starting the next round now", freed,
                     waiting[:10], extra={"fields": {"event": "early_round", "finished": freed,
                                                     "waiting": len(waiting)}})
        return bool(waiting)

    def next_round_start(self, now: float, round_s: float) -> float:
        return now + round_s
