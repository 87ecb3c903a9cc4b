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
  is not retried here: the next round recomputes the diff from Slurm's state, which retries it
  (`acting.SlurmActions`). `enact` is a sequence of phases (`phases.EnactPhases`).
- The cluster's capacity is the GPUs of usable nodes in the managed partitions minus the GPUs
  held by jobs this daemon does not manage (unmanaged jobs, or managed ones outside `job_filter`),
  so a plan always fits what Slurm can actually give.
- Nodes: the snapshot names the nodes, where our running jobs sit, where our released jobs
  are pinned to start and what others hold on each (`layout.read_layout`, from the same two
  reads), so the round loop places every plan on the
  real nodes; `enact` pins each job it starts to the plan's nodes (`ReqNodeList=`, see
  `enact`'s module), stops and restarts the jobs the plan moves, and does not start a job whose
  planned nodes are still held by jobs that keep running. Idle GPU-seconds are measured by
  cause from the reads the cluster makes anyway (`idle`: switch, unplaceable, waiting;
  `EnactStats.idle_*_gpu_s`, `idle_gpu_s`).
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
- Jobs left alone (`SlurmActions._hands_off`): an administrator's hold (JobHeldAdmin, or a
  user hold on a job this process released), a special-exit hold, a SUSPENDED job, job arrays,
  heterogeneous jobs and unreadable GPU requests are never planned nor named in a command; their
  GPUs count as others'. Logged when they go aside and when they come back.
- Per-job state does not grow with what a job declares: the view's per-epoch profile is
  run-length encoded (`model.RunLength`), one run for the daemon's constant profile, and so is
  the batch-size history from reports.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Mapping, Sequence

from ..model import JobView, Snapshot
from ..policies import PolicySettings
from . import enact as en
from . import stops
from .acting import (CONTROLLER_DOWN_RE, GRACE_SECONDS, PARTITIONS, STOP_POLL_S,
                     STOP_TIMEOUT_S)
from .churn import ChurnGuard
from .events import others_holding, watched_partitions
from .credentials import RecentDepartures
from .idle import SwitchClock, waiting_gpus
from .layout import Layout, read_layout, unplaceable_idle_gpu_s
from .journaling import (EnactStats, Journal, JournalUnavailable, LiveJob, StopHistorySource,
                         StopLedger)
from .phases import StaleSnapshot  # noqa: F401 (re-exported)
from .never_planned import NeverPlanned
from .polling import EventPolling
from .progress_source import ProgressSource, RunTimeProgress, job_view
from .specs import SpecRegistry, epoch_seconds, has_spec
from ..slurm.types import JobState, SlurmBackend, SlurmJob, SlurmNode

log = logging.getLogger(__name__)

__all__ = ["SlurmCluster", "StaleSnapshot", "STOP_POLL_S", "CONTROLLER_DOWN_RE"]

ACTIVE_STATES = (JobState.PENDING, JobState.RUNNING, JobState.SUSPENDED, JobState.COMPLETING)


class SlurmCluster(NeverPlanned, EventPolling):
    """`engine.Cluster` on a real Slurm (through a `SlurmBackend`)."""

    def __init__(self, backend: SlurmBackend, *, partitions: Sequence[str] = PARTITIONS,
                 grace_seconds: float = GRACE_SECONDS, stop_timeout_s: float = STOP_TIMEOUT_S,
                 job_filter: Callable[[SlurmJob], bool] | None = None,
                 registry: SpecRegistry | None = None,
                 progress_source: ProgressSource | None = None,
                 journal: Journal | None = None, round_s: float = PolicySettings.round_s,
                 stop_when_idle: bool = False,
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
        super().__init__(backend, partitions=partitions, job_filter=job_filter, journal=journal,
                         grace_seconds=grace_seconds, stop_timeout_s=stop_timeout_s,
                         sleep=sleep, monotonic=monotonic, may_act=may_act)
        self.registry = registry
        self.progress_source = progress_source or RunTimeProgress()
        self.round_s = float(round_s)
        self.stop_when_idle = stop_when_idle
        self.churn = churn if churn is not None else en.ChurnLimits.for_round(self.round_s)
        if stop_history is None and hasattr(self.progress_source, "stop_history"):
            stop_history = self.progress_source  # type: ignore[assignment]
        self.stop_history = stop_history
        self.guard = ChurnGuard(stop_history)
        self.ledger = ledger
        self.stops = stops.StopTracker(ledger)
        self.max_snapshot_age_s = max_snapshot_age_s
        self._init_state()

    def _init_state(self) -> None:
        """What the cluster learns round by round."""
        self.impossible: dict[tuple[int, float], str] = {}  # never planned: the reason
        self.bad_specs: dict[tuple[int, float], str] = {}   # never planned: the reason
        self.aside: dict[tuple[int, float], str] = {}       # left alone this round: the reason
        self._flags_new = []                                 # flagged, not yet in the store
        self.observed_at = self._monotonic()  # when the last squeue read returned (monotonic)
        self._observe_started = self.observed_at  # when the last observe began (its `now`)
        self.gpus = 0
        self.jobs = {}
        self.rounds = 0
        self.last_stats = EnactStats()
        self._last_now: float | None = None
        self._seen_any = False
        self._idle = False
        self._slurm_jobs = []
        # jobs that left the queue since the last recorded round: (what we knew, final state)
        self._ended = []
        # the last enacted plan's jobs: one of them finishing is an event (`wants_early_round`)
        self._planned = frozenset()
        self.layout: Layout | None = None    # the last observe's nodes (None: one pool)
        self._nodes: list[SlurmNode] = []    # the last observe's sinfo read
        self._released_at = {}               # jobs this daemon released, still pending
        self._unplaceable_gpu_s = 0.0        # measured by the last observe
        self.switch = SwitchClock()          # switch and waiting idle GPU-seconds
        self.departures = RecentDepartures() # jobs stopped within the current second
        self._poll_seen: frozenset[tuple[str, str]] | None = None  # the last poll's jobs
        self._watched = tuple(self.partitions)   # partitions the poll reads (`events`)
        self._others_holding = frozenset()      # GPUs we plan around at the last round
        self._free_gpus = 0                  # free GPUs at the last read (idle sample)

    @property
    def idle_gpu_s(self) -> dict[str, float]:
        """Idle GPU-seconds by cause since the daemon started (`idle.CAUSES`)."""
        return self.switch.totals

    # ------------------------------------------------------------------ helpers
    def _capacity(self, nodes: Sequence[SlurmNode], jobs: Sequence[SlurmJob]) -> int:
        total = sum(n.gpus for n in nodes
                    if n.usable and set(n.partitions) & set(self.partitions))
        # GPUs the policy cannot hand out: other jobs', and ours that are still completing.
        held = others_holding(jobs, self._ours, None)
        return max(0, total - sum(j.gpus for j in jobs if j.job_id in held))

    def _leave_alone(self, tagged: Sequence[SlurmJob]) -> None:
        """The managed jobs the daemon leaves alone this round (`_hands_off`: an admin's hold,
        SUSPENDED, ...) in `aside`; each logged when it goes aside and when it comes back."""
        aside = {(j.job_id, j.submit_time): why for j in tagged
                 if (why := self._hands_off(j)) is not None}
        for key, why in aside.items():
            if self.aside.get(key) != why:
                log.warning("job %s is left alone: %s; never released, stopped or planned "
                            "while it lasts", key[0], why)
        for key in set(self.aside) - set(aside):
            log.info("job %s is no longer left alone (%s): scheduled again", key[0],
                     self.aside[key])
        self.aside = aside

    # ------------------------------------------------------------------ observe
    def observe(self, now: float) -> Snapshot:
        self._observe_started = self._monotonic()
        self._poll_seen = None                                  # the next poll reads in full
        slurm_jobs = self._squeue()                             # read 1: squeue --json
        self.first_submit.forget_others(j.job_id for j in slurm_jobs)
        self.observed_at = self._monotonic()
        nodes = self._read("sinfo", self.backend.nodes)         # read 2: sinfo --json
        self._slurm_jobs, self._nodes = slurm_jobs, nodes
        self.layout = read_layout(nodes, slurm_jobs, self.partitions, self._ours)
        self.gpus = (self.layout.gpus if self.layout is not None
                     else self._capacity(nodes, slurm_jobs))
        self._watched = watched_partitions(nodes, self.partitions)
        self._others_holding = others_holding(
            slurm_jobs, self._ours,
            None if self.layout is None else [n.name for n in self.layout.nodes])
        self._measure_unplaceable(slurm_jobs, now)
        tagged = [j for j in slurm_jobs if self._tagged(j) and j.state in ACTIVE_STATES]
        self._leave_alone(tagged)
        active = [j for j in tagged if (j.job_id, j.submit_time) not in self.aside]
        impossible = self._impossible(active, nodes)
        current = self._track(tagged, self._registered(tagged), now)   # aside: tracked too
        self._note_ended(current, slurm_jobs)
        self._sample_idle(slurm_jobs, now)      # after `_track`: it knows the bad specs
        self._last_now = now
        self._seen_any = self._seen_any or bool(current)
        self._idle = self._seen_any and not any(
            j.slurm.state in (JobState.PENDING, JobState.RUNNING, JobState.SUSPENDED)
            for j in current.values())
        self._refresh_progress(current, now)
        return self._snapshot(current, impossible, now)

    def _registered(self, active: Sequence[SlurmJob]) -> Mapping[int, Mapping[str, object]]:
        """Registered specs of the new jobs that carry none in their comment (one read)."""
        unspecified = [j for j in active if not has_spec(j.comment) and (
            j.job_id not in self.jobs or self.jobs[j.job_id].slurm.submit_time != j.submit_time)]
        if self.registry is None or not unspecified:
            return {}
        try:
            return self.registry.lookup(unspecified)
        except JournalUnavailable:
            raise
        except Exception as exc:   # a spec guessed now would stick: no round without it
            raise JournalUnavailable(f"spec registry: {type(exc).__name__}: {exc}") from exc

    def _track(self, active: Sequence[SlurmJob], registered: Mapping[int, Mapping[str, object]],
               now: float) -> dict[int, LiveJob]:
        """The active jobs as `LiveJob`s, with the run time this daemon has seen."""
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
        return current

    def _note_ended(self, current: dict[int, LiveJob], slurm_jobs: Sequence[SlurmJob]) -> None:
        """Queue the jobs that left the active set finished (or gone) for `job_ended`."""
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
        self.impossible = {k: r for k, r in self.impossible.items() if k in active_keys}

    def _refresh_progress(self, current: Mapping[int, LiveJob], now: float) -> None:
        refresh = getattr(self.progress_source, "refresh", None)
        if refresh is None:
            return
        try:
            refresh([j.slurm for j in current.values()], now)
        except JournalUnavailable:   # the store is down: no round on guesses
            raise
        except Exception as exc:  # a failing source must not stop the daemon
            log.warning("progress source refresh failed (%s: %s); using what it had",
                        type(exc).__name__, exc)

    def _snapshot(self, current: Mapping[int, LiveJob], impossible: set[int],
                  now: float) -> Snapshot:
        # COMPLETING jobs hold GPUs but will never run again: not offered to the policy; nor
        # are impossible requests and bad specs (they stay held: the diff holds them if
        # released, and stops them if they run).
        views = tuple(self._view(j) for j in current.values()
                      if j.slurm.state is not JobState.COMPLETING
                      and j.slurm.job_id not in impossible
                      and (j.slurm.job_id, j.slurm.submit_time) not in self.bad_specs
                      and (j.slurm.job_id, j.slurm.submit_time) not in self.aside)
        layout = self.layout or Layout(())
        return Snapshot(now=now, round_index=self.rounds, round_s=self.round_s, gpus=self.gpus,
                        jobs=views, nodes=layout.nodes, placements=dict(layout.placements),
                        reserved=dict(layout.reserved), pinned=dict(layout.pinned),
                        allowed_nodes=dict(layout.allowed), node_counts=dict(layout.node_counts))

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
        self.switch.totals["unplaceable"] += self._unplaceable_gpu_s

    def _sample_idle(self, jobs: Sequence[SlurmJob], now: float) -> None:
        """One squeue read for the switch and waiting idle GPU-seconds (`idle`)."""
        layout = read_layout(self._nodes, jobs, self.partitions, self._ours) \
            if self._nodes else None
        if layout is None:
            self._free_gpus = 0
            self.switch.read(now, jobs, 0)
            return
        free = sum(max(0, f) for f in layout.free().values())
        ours = {j.job_id for j in jobs if self._ours(j)}
        self._free_gpus = free
        self.switch.read(now, jobs, waiting_gpus(jobs, free, ours, self._never()))

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
        return job_view(job, spec, prog, epoch_s, live.run_time_s)

    # ------------------------------------------------------------------ between rounds
    def finished(self) -> bool:
        return self.stop_when_idle and self._idle

    def next_round_start(self, now: float, round_s: float) -> float:
        return now + round_s
