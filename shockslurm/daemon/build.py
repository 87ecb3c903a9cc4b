"""Wiring the daemon: the live cluster on a Slurm backend, the policy, the store's journal and
training reports, the metrics, and the round loop over them (`build_daemon`); the store opened
at start-up, waiting while it is unavailable (`open_store_waiting`).

`Daemon.apply(cfg)` is the one path by which the keys SIGHUP may change (`RUNTIME_KEYS`: round
length, policy and `[policy]`, grace, timeouts, churn bounds, snapshot age) reach the loop and
the cluster: `build_daemon` wires what only a restart changes and then applies `cfg` with it;
a reload (`DaemonRunner.reload`) applies the new configuration the same way.

    RoundLoop(SlurmCluster(backend), make_policy(...), WallClock(), round_seconds)

The layers stay unaware of one another: `live/` only knows the `Journal`, `SpecRegistry` and
`ProgressSource` protocols, implemented here on the store (`journal.StoreJournal`) and on the
training reports (`reports.reported_progress.ReportedProgress`, which also ingests the spool
directory `[daemon] spool_dir` each round).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from sqlalchemy import Engine

from ..engine import Clock, RoundLoop, RoundObserver, WallClock
from ..errors import ShockslurmError
from ..live import enact as en
from ..live.cluster import SlurmCluster
from ..live.journaling import Journal
from ..masking import mask
from ..ops.config import DAEMON_KEYS, DaemonConfig
from ..policies import PolicySettings
from ..ops.metrics import DaemonMetrics, MetricsJournal, MetricsObserver
from ..policies import make_policy
from ..slurm.types import JobState, SlurmBackend, SlurmJob
from ..store import StoreUnavailable, open_store
from ..store.database import current_revision, head_revision, make_engine
from ..store.leader import LeaderLock
from .journal import StoreJournal
from .round_log import RoundLogger
from .startup import StartupSignals

if TYPE_CHECKING:
    from ..reports.reported_progress import ReportedProgress

log = logging.getLogger("shockslurm.daemon")


@dataclass
class Daemon:
    loop: RoundLoop
    cluster: SlurmCluster
    journal: StoreJournal | None
    logger: RoundLogger
    progress: ReportedProgress | None = None     # when the daemon has a store
    metrics: DaemonMetrics | None = None
    cfg: DaemonConfig = field(default_factory=DaemonConfig)   # the configuration applied

    def apply(self, cfg: DaemonConfig) -> list[str]:
        """Apply the reloadable keys of `cfg` to the loop and the cluster (start-up and SIGHUP
        alike); the policy is rebuilt only when its name, `[policy]` or the round length
        changed (it keeps state between rounds). Returns the reloadable keys that changed."""
        old, self.cfg = self.cfg, cfg
        if _policy_inputs(cfg) != _policy_inputs(old):
            self.loop.policy = make_policy(cfg.policy, cfg.policy_settings())
            if self.journal is not None:
                self.journal.policy = cfg.policy
        if self.journal is not None:        # the run row says what the rounds now run with
            self.journal.reconfigure(run_config(cfg, str(self.journal.config["backend"])))
        self.loop.round_s = cfg.round_seconds
        cluster = self.cluster
        cluster.round_s = cfg.round_seconds
        cluster.grace_seconds = cfg.grace_seconds
        cluster.stop_timeout_s = cfg.stop_timeout_seconds
        cluster.churn = churn_limits(cfg)
        cluster.max_snapshot_age_s = cfg.snapshot_age_bound
        changed = [k.dotted for k in DAEMON_KEYS
                   if k.reload and getattr(cfg, k.name) != getattr(old, k.name)]
        options = set(cfg.policy_options) | set(old.policy_options)
        return changed + [f"policy.{name}" for name in sorted(options)
                          if cfg.policy_options.get(name) != old.policy_options.get(name)]

    def reconcile(self, now: float | None = None) -> dict[str, int]:
        """Start-up reconciliation of the store with Slurm (see the module); raises
        `SlurmError` when Slurm cannot be read, `JournalUnavailable` when the store cannot."""
        if self.journal is None:
            return {}
        cluster = self.cluster
        jobs = cluster._read("squeue", cluster.backend.jobs)
        by_id = {j.job_id: j for j in jobs}
        for job_id, first in self.journal.first_submits(jobs).items():
            cluster.first_submit.seed(by_id[job_id], first)
        jobs = cluster._canonical(jobs)
        counts = self.journal.reconcile(jobs, time.time() if now is None else now)
        counts.update(self._whose_holds(jobs))
        if any(counts.values()):
            log.info("reconciled the store with Slurm: %s", ", ".join(
                f"{k}={v}" for k, v in counts.items()),
                extra={"fields": {"event": "reconcile", **counts}})
        return counts

    def _whose_holds(self, jobs: list[SlurmJob]) -> dict[str, int]:
        """Whose hold each held job of ours shows, from the store's last hold, release or
        requeuehold of it (what this process would otherwise have in memory): an
        administrator's `hold` an earlier daemon made (`own_admin_holds`: made a user hold in
        the first round), and a user hold put on a job the daemon had released (someone
        else's: left alone, `SlurmActions._released_by_us`). Counts for the log."""
        assert self.journal is not None
        cluster = self.cluster
        held = [j for j in jobs if cluster._tagged(j) and j.held and not j.special_exit]
        last = self.journal.last_hold_commands(held) if held else {}
        by_id = {j.job_id: j for j in held}
        cluster.own_admin_holds = {j for j, argv in last.items() if by_id[j].admin_held
                                   and argv == ("scontrol", "hold")}
        others = {j: by_id[j].submit_time for j, argv in last.items()
                  if not by_id[j].admin_held and argv[1:] == ("release",)}
        cluster.remember_released(others)
        return {k: v for k, v in (("own_admin_holds", len(cluster.own_admin_holds)),
                                  ("held_by_others_after_release", len(others))) if v}


def _policy_inputs(cfg: DaemonConfig) -> tuple[str, PolicySettings]:
    return cfg.policy, cfg.policy_settings()


def prefix_filter(prefix: str, job_filter: Callable[[SlurmJob], bool] | None = None
                  ) -> Callable[[SlurmJob], bool] | None:
    """`[daemon] job_name_prefix` combined with an in-process `job_filter` (tests)."""
    if not prefix:
        return job_filter
    if job_filter is None:
        return lambda j: j.name.startswith(prefix)
    return lambda j: j.name.startswith(prefix) and job_filter(j)


def churn_limits(cfg: DaemonConfig) -> en.ChurnLimits:
    return en.ChurnLimits.for_round(cfg.round_seconds, min_run_seconds=cfg.min_run_seconds,
                                    finish_window_seconds=cfg.finish_window_seconds,
                                    max_preemptions_per_day=cfg.max_preemptions_per_day,
                                    max_stops_without_checkpoint=cfg.max_stops_without_checkpoint)


def build_daemon(cfg: DaemonConfig, backend: SlurmBackend, *, engine: Engine | None = None,
                 job_filter: Callable[[SlurmJob], bool] | None = None,
                 stop_when_idle: bool = False, clock: Clock | None = None,
                 emit: Callable[[str], None] | None = None,
                 metrics: DaemonMetrics | None = None) -> Daemon:
    """Wire the loop: cluster on `backend`, policy from `cfg`, the store when `engine` is given
    (journal, spec registry, and progress from the training reports, spool ingested each round),
    the metrics when `metrics` is given; then apply `cfg` (`Daemon.apply`)."""
    journal, progress = _store_side(cfg, engine, getattr(backend, "name", cfg.backend))
    slurm_journal: Journal | None = journal
    if metrics is not None:
        slurm_journal = MetricsJournal(journal, metrics)
    clock = clock or WallClock()
    cluster = SlurmCluster(backend, partitions=cfg.partitions,
                           job_filter=prefix_filter(cfg.job_name_prefix, job_filter),
                           registry=journal, journal=slurm_journal, progress_source=progress,
                           ledger=journal, stop_when_idle=stop_when_idle)
    logger = RoundLogger(cluster, emit, clock=clock.now)
    observers: list[RoundObserver] = [logger] + ([journal] if journal is not None else [])
    if metrics is not None:
        observers.append(MetricsObserver(metrics, cluster, clock=clock.now))
    loop = RoundLoop(cluster, make_policy(*_policy_inputs(cfg)), clock, cfg.round_seconds,
                     observers=observers)
    daemon = Daemon(loop, cluster, journal, logger, progress, metrics, cfg)
    daemon.apply(cfg)
    return daemon


def _store_side(cfg: DaemonConfig, engine: Engine | None, backend_name: str
                ) -> tuple[StoreJournal | None, ReportedProgress | None]:
    """The store's journal and the training reports' progress (None, None without a store)."""
    if engine is None:
        if cfg.spool_dir:
            log.warning("spool_dir %s is not ingested: the daemon has no store", cfg.spool_dir)
        return None, None
    from ..reports.reported_progress import ReportedProgress

    progress = ReportedProgress(engine, cluster=cfg.cluster, spool_dir=cfg.spool_dir or None,
                                rejected_dir=cfg.rejected_dir,
                                allow_unsigned_reports=cfg.allow_unsigned_reports)
    journal = StoreJournal(engine, cluster=cfg.cluster, policy=cfg.policy,
                           config=run_config(cfg, backend_name))
    return journal, progress


def run_config(cfg: DaemonConfig, backend_name: str) -> dict[str, object]:
    """What the store records of a run's configuration: every `[daemon]` key (secrets such as
    the store URL's password masked), the backend in use and the policy's options."""
    out: dict[str, object] = {}
    for key in DAEMON_KEYS:
        value = getattr(cfg, key.name)
        if isinstance(value, tuple):
            value = list(value)
        out[key.name] = mask(value) if key.secret and isinstance(value, str) else value
    out.update(backend=backend_name, policy_options=dict(cfg.policy_options))
    return out


def open_store_waiting(url: str, *, timeout_s: float, retry_s: float, wait: bool = True,
                       signals: StartupSignals | None = None,
                       sleep: Callable[[float], None] | None = None,
                       monotonic: Callable[[], float] = time.monotonic,
                       leader: LeaderLock | None = None,
                       metrics: DaemonMetrics | None = None) -> Engine:
    """The store, created or upgraded (`open_store(create=True)`); while it is unavailable
    (locked, unreachable, or due an upgrade while another daemon holds `leader`), one log line
    and a retry every `retry_s`, never a traceback, and a store outage in `metrics` (until
    2026-12-03 the endpoint, already serving, showed none). Other store errors (newer schema,
    read-only) raise `StoreError`, and so does an unavailable store when not `wait` (`--once`).
    With `signals`, the wait sleeps on them and a signal ends it (`StartupInterrupted`)."""
    if sleep is None:
        sleep = signals.sleep if signals is not None else time.sleep
    down_since: float | None = None
    while True:
        try:
            if leader is not None:
                upgrade_after_the_leader(url, leader, timeout_s)
            engine = open_store(url, create=True, timeout_s=timeout_s)
        except StoreUnavailable as exc:
            if not wait:
                raise
            if down_since is None:
                down_since = monotonic()
                if metrics is not None:
                    metrics.outage("store", True)
                log.error("the store is unavailable at start-up (%s); waiting for it, retrying "
                          "every %g s", mask(str(exc)).strip(), retry_s,
                          extra={"fields": {"event": "outage", "what": "store"}})
            sleep(retry_s)
            if signals is not None:
                signals.check()
            continue
        if down_since is not None:
            took = monotonic() - down_since
            if metrics is not None:
                metrics.outage("store", False)
            log.warning("the store is available again after %.1f s; starting", took,
                        extra={"fields": {"event": "recovered", "what": "store",
                                          "outage_s": round(took, 3)}})
        return engine


def upgrade_after_the_leader(url: str, leader: LeaderLock, timeout_s: float) -> None:
    """Raise `StoreUnavailable` while the store's schema is behind this code's and another
    daemon leads the cluster (a newer daemon started beside a running one, as in a rolling
    upgrade): its upgrade would change the tables under the leader's writes. Whatever else
    is wrong with the store is left to `open_store` to say."""
    try:
        holder = leader.holder()
        if holder is None:
            return
        engine = make_engine(url, timeout_s=timeout_s)
        try:
            revision = current_revision(engine)
        finally:
            engine.dispose()
    except ShockslurmError:                 # the store's fault: open_store names it
        return
    if revision is None or revision == head_revision():
        return
    raise StoreUnavailable(f"the store is at schema revision {revision!r}, this daemon's is "
                           f"{head_revision()!r}, and pid {holder.pid} on {holder.host} leads "
                           f"this cluster: the upgrade waits until that daemon stops")
