"""`shockslurm daemon`: run the Shockwave round loop beside slurmctld.

    shockslurm daemon [--config /etc/shockslurm/shockslurm.toml] [--dry-run] [--once]

The configuration file is `--config`, else `$SHOCKSLURM_CONFIG`, else
/etc/shockslurm/shockslurm.toml; environment overrides apply (`ops/config.py`). An invalid
value stops the daemon before it starts, naming the key. `--dry-run` reads the real cluster but
only prints the scontrol/scancel argv lists it would run (no store, no metrics endpoint);
`--once` runs a single round and exits (no metrics endpoint), with status 1 when an outage
(Slurm unreadable, the store unwritable) cut that round short, when the store cannot be opened
(it does not wait) or when it stood by (another daemon leads). SIGHUP re-reads the
configuration, SIGTERM/SIGINT finish the current round and exit 0.

A store that is unavailable at start (locked, unreachable) is waited for: one log line, a retry
every round; signals in that wait are recorded, not fatal (`daemon/startup.py`): SIGHUP starts
again with the configuration re-read (an invalid file is logged and the one read before kept),
SIGTERM/SIGINT exit 0. The daemon then acts only while
it holds the store's leader lock (`store/leader.py`); a second daemon on the same store stands
by and takes over within a round of the leader's death.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import click

from ..errors import ShockslurmError

if TYPE_CHECKING:
    from ..daemon.runner import DaemonRunner
    from ..daemon.startup import StartupSignals
    from ..ops.config import DaemonConfig
    from ..ops.metrics import DaemonMetrics
    from ..store.leader import LeaderLock


def _fail_if_down(runner: DaemonRunner) -> None:
    """`--once` reports its round's fate in its exit status: an outage that cut the round short
    (Slurm could not be read, the store could not record), a standby (another daemon leads,
    so this one did nothing) or a snapshot too old to enact (nothing done; until 2026-12-03
    exit 0) is an error. A failed Slurm call is not: the next round retries it from Slurm's
    state, and a race (a job that ended as it was released) fails one benignly."""
    down = [what for what, since in (("Slurm could not be read", runner.slurm_down_since),
                                     ("the store could not record", runner.store_down_since))
            if since is not None]
    if runner.leading is False:
        down.append("this daemon is on standby (another daemon leads the cluster)")
    if runner.stale_rounds:
        down.append("its Slurm snapshot was too old to enact (max_snapshot_age_seconds)")
    if down:
        raise click.ClickException(f"--once: the round did not run: {' and '.join(down)} "
                                   "(the log above says why)")


@click.command("daemon")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="TOML file with [daemon] and [policy] tables (default: "
                                 "$SHOCKSLURM_CONFIG, else /etc/shockslurm/shockslurm.toml).")
@click.option("--dry-run", is_flag=True,
              help="Read Slurm for real, print the actions instead of running them; no store.")
@click.option("--once", is_flag=True, help="Run one round and exit.")
def daemon_cmd(config_path: Path | None, dry_run: bool, once: bool) -> None:
    """Schedule managed Slurm jobs with a policy, one round every round_seconds."""
    from ..ops.config import config_path as resolve_path
    from ..masking import mask

    from ..daemon.startup import StartupSignals

    path = resolve_path(config_path, os.environ)
    signals = StartupSignals()
    signals.install()           # from here on a signal is only recorded (the runner's later)
    stop_metrics = None
    leader = None
    try:
        started = _start_until_up(path, dry_run, once, signals)
        if started is None:
            logging.getLogger("shockslurm.daemon").warning(
                "shockslurm daemon: stopped during start-up",
                extra={"fields": {"event": "stop", "rounds": 0}})
            return
        runner, stop_metrics, leader = started
        rounds = runner.run(max_rounds=1 if once else None)
        logging.getLogger("shockslurm.daemon").info(
            "shockslurm daemon: stopped after %d rounds", rounds,
            extra={"fields": {"event": "stop", "rounds": rounds}})
        if once:
            _fail_if_down(runner)
    except ShockslurmError as exc:
        raise click.ClickException(mask(str(exc))) from None
    finally:
        if leader is not None:
            leader.release()
        if stop_metrics is not None:
            stop_metrics()


def _start_until_up(path: Path, dry_run: bool, once: bool, signals: StartupSignals
                    ) -> tuple[DaemonRunner, Callable[[], None] | None, LeaderLock | None] | None:
    """`_start`; again from the top, the configuration re-read, after a SIGHUP in its wait for
    the store (a re-read file that is invalid is logged and the one read before is kept, as a
    running daemon's reload keeps it); None after a SIGTERM or SIGINT there."""
    from ..daemon.startup import StartupInterrupted
    from ..errors import ConfigError
    from ..masking import mask
    from ..ops.config import load_config

    cfg = load_config(path, os.environ)     # invalid: the daemon does not start
    while True:
        try:
            return _start(path, cfg, dry_run, once, signals)
        except StartupInterrupted as exc:
            if not exc.reload:
                return None
        log = logging.getLogger("shockslurm.daemon")
        try:
            cfg = load_config(path, os.environ)
        except ConfigError as exc:
            log.error("SIGHUP while waiting for the store: the configuration re-read is "
                      "invalid, keeping the one read before: %s", mask(str(exc)),
                      extra={"fields": {"event": "reload", "ok": False, "key": exc.field,
                                        "during": "start-up"}})
            continue
        log.warning("SIGHUP while waiting for the store: starting again with the "
                    "configuration re-read",
                    extra={"fields": {"event": "reload", "during": "start-up"}})


def _start(path: Path, cfg: DaemonConfig, dry_run: bool, once: bool, signals: StartupSignals
           ) -> tuple[DaemonRunner, Callable[[], None] | None, LeaderLock | None]:
    """The start-up path: the configuration, logs, Slurm backend, metrics endpoint, store and
    leader lock, the daemon built and `cfg` applied (the path a SIGHUP reload takes too:
    `DaemonRunner.reload`). Returns the runner, the metrics endpoint's stop, the lock. `--once`
    does not wait for an unavailable store; a signal in the wait ends it (`StartupInterrupted`,
    the metrics endpoint stopped)."""
    from ..daemon.runner import DaemonRunner, build_daemon, open_store_waiting
    from ..ops import logsetup
    from ..ops.config import load_config
    from ..ops.metrics import DaemonMetrics
    from ..slurm.backend import make_backend
    from ..slurm.dryrun import DryRunBackend
    from ..slurm.sched_delay import release_delay_advice
    from ..store.leader import leader_lock

    # The round line is the daemon's heartbeat: INFO on stdout (journald keeps it); the global
    # `--log-level DEBUG` adds the debug lines.
    logsetup.configure(cfg.log_format, stream=sys.stdout, journald=cfg.journald,
                       level=logsetup.daemon_level(logging.getLogger().level))
    backend = make_backend(cfg.backend)
    advice = release_delay_advice(backend.run)     # read before a dry run wraps the actions
    if dry_run:
        backend = DryRunBackend(backend, echo=click.echo)
    metrics = DaemonMetrics()
    stop_metrics = None if dry_run or once else _serve_metrics(metrics, cfg, path)
    _log_start(cfg, path, backend.name, bool(stop_metrics), dry_run)
    if advice:
        logging.getLogger("shockslurm.daemon").warning(
            "%s", advice, extra={"fields": {"event": "slurm_advice"}})
    engine = leader = None
    if not dry_run:
        leader = leader_lock(cfg.db, cfg.cluster, timeout_s=cfg.store_timeout_seconds)
        try:
            engine = open_store_waiting(cfg.db, timeout_s=cfg.store_timeout_seconds,
                                        retry_s=cfg.round_seconds, wait=not once,
                                        signals=signals, leader=leader, metrics=metrics)
        except BaseException:
            leader.dispose()
            if stop_metrics is not None:
                stop_metrics()
            raise
    daemon = build_daemon(cfg, backend, engine=engine, metrics=metrics)
    journald = cfg.journald     # a restart key: SIGHUP changes only the format

    def relog(log_format: str) -> None:
        logsetup.configure(log_format, journald=journald)

    runner = DaemonRunner(daemon, load=lambda: load_config(path, os.environ),
                          on_log_format=relog, leader=leader)
    runner.install_signals()
    signals.hand_over(runner.request_stop, runner.request_reload)
    return runner, stop_metrics, leader


def _serve_metrics(metrics: DaemonMetrics, cfg: DaemonConfig, path: Path
                   ) -> Callable[[], None] | None:
    """The Prometheus endpoint (None when `metrics_port` is 0); a port that cannot be bound
    is an error naming the key."""
    if not cfg.metrics_port:
        return None
    try:
        return metrics.serve(cfg.metrics_address, cfg.metrics_port)
    except OSError as exc:
        raise click.ClickException(
            f"{path}, field 'daemon.metrics_port': cannot serve metrics on "
            f"{cfg.metrics_address}:{cfg.metrics_port}: {exc.strerror or exc}") from None


def _log_start(cfg: DaemonConfig, path: Path, backend: str, serving: bool,
               dry_run: bool) -> None:
    from ..masking import mask

    logging.getLogger("shockslurm.daemon").info(
        "shockslurm daemon: config=%s policy=%s round=%gs grace=%gs partitions=%s "
        "backend=%s db=%s metrics=%s%s%s", path, cfg.policy, cfg.round_seconds,
        cfg.grace_seconds, ",".join(cfg.partitions), backend, mask(cfg.db),
        f"{cfg.metrics_address}:{cfg.metrics_port}" if serving else "off",
        f" job_name_prefix={cfg.job_name_prefix}" if cfg.job_name_prefix else "",
        " (dry run)" if dry_run else "",
        extra={"fields": {"event": "start", "policy": cfg.policy,
                          "round_seconds": cfg.round_seconds}})
