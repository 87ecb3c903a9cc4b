"""Wiring the daemon: the live cluster on a Slurm backend, the policy, the store's journal and
training reports, the metrics, and the round loop over them (`build_daemon`); the store opened
at start-up, waiting while it is unavailable (`open_store_waiting`).

    RoundLoop(SlurmCluster(backend), make_policy(...), WallClock(), round_seconds)

The layers stay unaware of one another: `live/` only knows the `Journal`, `SpecRegistry` and
`ProgressSource` protocols, implemented here on the store (`journal.StoreJournal`) and on the
training reports (`reports.reported_progress.ReportedProgress`, which also ingests the spool
directory `[daemon] spool_dir` each round).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from sqlalchemy import Engine

from ..engine import Clock, RoundLoop, RoundObserver, WallClock
from ..live import enact as en
from ..live.cluster import SlurmCluster
from ..live.journaling import Journal
from ..ops.config import DaemonConfig, mask
from ..ops.metrics import DaemonMetrics, MetricsJournal, MetricsObserver
from ..policies import make_policy
from ..slurm.types import SlurmBackend, SlurmJob
from ..store import StoreUnavailable, open_store
from .journal import StoreJournal
from .round_log import RoundLogger

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

    def reconcile(self, now: float | None = None) -> dict[str, int]:
        """Start-up reconciliation of the store with Slurm (see the module); raises
        `SlurmError` when Slurm cannot be read, `JournalUnavailable` when the store cannot."""
        if self.journal is None:
            return {}
        jobs = self.cluster._read("squeue", self.cluster.backend.jobs)
        counts = self.journal.reconcile(jobs, time.time() if now is None else now)
        if any(counts.values()):
            log.info("reconciled the store with Slurm: %s", ", ".join(
                f"{k}={v}" for k, v in counts.items()),
                extra={"fields": {"event": "reconcile", **counts}})
        return counts


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
                                    max_preemptions_per_day=cfg.max_preemptions_per_day,
                                    max_stops_without_checkpoint=cfg.max_stops_without_checkpoint)


def build_daemon(cfg: DaemonConfig, backend: SlurmBackend, *, engine: Engine | None = None,
                 job_filter: Callable[[SlurmJob], bool] | None = None,
                 stop_when_idle: bool = False, clock: Clock | None = None,
                 emit: Callable[[str], None] | None = None,
                 metrics: DaemonMetrics | None = None) -> Daemon:
    """Wire the loop: cluster on `backend`, policy from `cfg`, the store when `engine` is given
    (journal, spec registry, and progress from the training reports, spool ingested each round),
    the metrics when `metrics` is given."""
    journal: StoreJournal | None = None
    progress: ReportedProgress | None = None
    if engine is not None:
        from ..reports.reported_progress import ReportedProgress

        progress = ReportedProgress(engine, cluster=cfg.cluster, spool_dir=cfg.spool_dir or None,
                                    rejected_dir=cfg.rejected_dir,
                                    allow_unsigned_reports=cfg.allow_unsigned_reports)
        journal = StoreJournal(engine, cluster=cfg.cluster, policy=cfg.policy,
                               config={"round_seconds": cfg.round_seconds,
                                       "grace_seconds": cfg.grace_seconds,
                                       "partitions": list(cfg.partitions),
                                       "backend": getattr(backend, "name", cfg.backend),
                                       "spool_dir": cfg.spool_dir,
                                       "job_name_prefix": cfg.job_name_prefix,
                                       "min_run_seconds": cfg.min_run_seconds,
                                       "max_preemptions_per_day": cfg.max_preemptions_per_day,
                                       "max_stops_without_checkpoint":
                                           cfg.max_stops_without_checkpoint,
                                       "policy_options": dict(cfg.policy_options)})
    elif cfg.spool_dir:
        log.warning("spool_dir %s is not ingested: the daemon has no store", cfg.spool_dir)
    slurm_journal: Journal | None = journal
    if metrics is not None:
        slurm_journal = MetricsJournal(journal, metrics)
    clock = clock or WallClock()
    cluster = SlurmCluster(backend, partitions=cfg.partitions, grace_seconds=cfg.grace_seconds,
                           stop_timeout_s=cfg.stop_timeout_seconds,
                           job_filter=prefix_filter(cfg.job_name_prefix, job_filter),
                           registry=journal, journal=slurm_journal, progress_source=progress,
                           round_s=cfg.round_seconds, churn=churn_limits(cfg), ledger=journal,
                           stop_when_idle=stop_when_idle,
                           max_snapshot_age_s=cfg.snapshot_age_bound)
    policy = make_policy(cfg.policy, cfg.policy_settings())
    logger = RoundLogger(cluster, emit, clock=clock.now)
    observers: list[RoundObserver] = [logger] + ([journal] if journal is not None else [])
    if metrics is not None:
        observers.append(MetricsObserver(metrics, cluster, clock=clock.now))
    loop = RoundLoop(cluster, policy, clock, cfg.round_seconds, observers=observers)
    return Daemon(loop, cluster, journal, logger, progress, metrics)


def open_store_waiting(url: str, *, timeout_s: float, retry_s: float,
                       sleep: Callable[[float], None] = time.sleep,
                       monotonic: Callable[[], float] = time.monotonic) -> Engine:
    """The store, created or upgraded (`open_store(create=True)`); while it is unavailable
    (locked, unreachable), one log line and a retry every `retry_s`, never a traceback. Other
    store errors (newer schema, read-only) raise `StoreError`."""
    down_since: float | None = None
    while True:
        try:
            engine = open_store(url, create=True, timeout_s=timeout_s)
        except StoreUnavailable as exc:
            if down_since is None:
                down_since = monotonic()
                log.error("the store is unavailable at start-up (%s); waiting for it, retrying "
                          "every %g s", mask(str(exc)).strip(), retry_s,
                          extra={"fields": {"event": "outage", "what": "store"}})
            sleep(retry_s)
            continue
        if down_since is not None:
            took = monotonic() - down_since
            log.warning("the store is available again after %.1f s; starting", took,
                        extra={"fields": {"event": "recovered", "what": "store",
                                          "outage_s": round(took, 3)}})
        return engine
