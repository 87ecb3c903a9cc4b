"""The daemon's process: rounds on the wall clock around the daemon `build.build_daemon` wires.

Configuration lives in `ops/config.py` (one table of keys: validation, `shockslurm config check`,
the README table and contrib/shockslurm.toml come from it); a bad value is a `ConfigError` naming
the key. `DaemonRunner` is the long-running process: it handles SIGHUP (reload what can change at
runtime), SIGTERM/SIGINT (finish the round, exit), and serves the Prometheus metrics.

Crash safety and outages (`DaemonRunner.run`):
- Every intent is in the store before its Slurm call, so killing the daemon at any point loses
  nothing. At start (`Daemon.reconcile`, once Slurm answers) the intents a previous incarnation
  left without an outcome get one, `unknown (daemon restarted)`, resolved from Slurm's current
  state (return code 0 when Slurm shows it done, `RC_UNKNOWN` otherwise), and the jobs the
  store knew that Slurm shows finished or no longer knows get a `finished`/`vanished` job event.
  Stops begun and not completed are resumed by the cluster from the store (`pending_stops`):
  requeuehold after the rest of the grace period, never a second USR1.
- Slurm down or slow (a read raises `SlurmError`): no action on stale state; logged once per
  outage and at recovery (its duration); retried with backoff (1 s doubling, at most 60 s).
- Store down (`JournalUnavailable`: an intent, the round, or a read the round needs cannot be
  written/read; every store statement waits at most `[daemon] store_timeout_seconds`): no
  action at all (nothing is done that could not be recorded); logged once, retried every round,
  logged again at recovery with the outage's duration (also when a standby finds it back). At
  start-up `open_store_waiting` opens it: unavailable, one line and a retry every round.
- Stale state: a round whose Slurm snapshot is older than `max_snapshot_age_seconds` when it
  comes to act does nothing (`StaleSnapshot`); the runner re-reads and re-plans at once (a
  second stale round waits for the next round).
- One leader (`store.leader`): before any action the runner holds the store's leader lock. A
  daemon that cannot take it is a standby: it reads nothing and acts on nothing, and tries to
  take the lock every `standby_retry_seconds` (at most a round), so it takes over within one
  round of the leader's death. The lock is re-checked before every Slurm action (`may_act`):
  a leader that lost it stops at once. Transitions are logged; `shockslurm_leader` 1: leading.

Pacing (`pacing`): event-driven early rounds, the stop lead, and waits on the monotonic clock.
"""

from __future__ import annotations

import logging
import signal
import time
from dataclasses import replace
from typing import Any, Callable

from ..errors import ConfigError
from ..live.cluster import StaleSnapshot
from ..live.journaling import JournalUnavailable
from ..ops.config import (BACKENDS, DAEMON_KEYS, SETTINGS_KEYS, DaemonConfig, load_config,
                          mask, parse_config)
from ..ops.keys import RUNTIME_KEYS
from ..slurm.types import SlurmError
from ..store import StoreError
from ..store.leader import LeaderLock, LeadershipLost
from .build import Daemon, build_daemon, churn_limits, open_store_waiting
from .journal import RC_UNKNOWN, StoreJournal
from .pacing import event_poll_s, round_boundary
from .round_log import RoundLogger
from .wakeup import Wakeup

log = logging.getLogger("shockslurm.daemon")

__all__ = ["BACKENDS", "SETTINGS_KEYS", "DaemonConfig", "parse_config", "load_config",
           "StoreJournal", "RoundLogger", "Daemon", "build_daemon", "DaemonRunner",
           "RC_UNKNOWN", "RUNTIME_KEYS", "churn_limits", "open_store_waiting"]

OUTAGE_BACKOFF_START_S = 1.0
OUTAGE_BACKOFF_MAX_S = 60.0

# --------------------------------------------------------------------------- the process
def keep_restart_keys(new: DaemonConfig, running: DaemonConfig) -> DaemonConfig:
    """`new` with the running value of every changed key that needs a restart (logged)."""
    restart = [k for k in DAEMON_KEYS if not k.reload
               and getattr(new, k.name) != getattr(running, k.name)]
    if not restart:
        return new
    log.warning("configuration reload: %s changed but need a restart; keeping the "
                "running values", ", ".join(k.dotted for k in restart))
    return replace(new, **{k.name: getattr(running, k.name) for k in restart})


class DaemonRunner:
    """The long-running daemon: rounds on the wall clock, signals, config reload, metrics.

    - SIGHUP: the handler only queues a reload; between rounds `reload` re-reads the
      configuration and applies it by the start-up path (`apply`): what `KEYS` marks
      reloadable (`RUNTIME_KEYS`) takes effect, other changed keys are reported as needing a
      restart and keep their old value. An invalid new configuration is logged (naming the
      key) and the old one kept.
    - SIGTERM/SIGINT: the current round finishes, then `run` returns.
    - `leader`: the store's leader lock (None: this process always leads, e.g. a dry run).
    """

    def __init__(self, daemon: Daemon, *,
                 load: Callable[[], DaemonConfig] | None = None,
                 on_log_format: Callable[[str], None] | None = None,
                 leader: LeaderLock | None = None) -> None:
        self.daemon = daemon
        self.leader = leader
        self.leading: bool | None = None              # None until the lock was first tried
        self.stale_rounds = 0                         # consecutive rounds not enacted: stale
        if leader is not None:
            daemon.cluster.may_act = self._check_leader
        self.load = load
        self.on_log_format = on_log_format
        self.stop_requested = False
        self.reload_requested = False
        self._wake = Wakeup()             # rung by the handlers: no lock taken there
        self.reconciled = False
        self.slurm_down_since: float | None = None    # monotonic, during a Slurm outage
        self.store_down_since: float | None = None    # monotonic, while the store is down
        self.failures = 0                             # consecutive failed attempts (Slurm)
        self.outages = {"slurm": 0, "store": 0}
        self.early_rounds = 0                         # rounds started early by an event
        self.poll_read_s = 0.0                        # the last event poll's duration
        self.boundary = 0.0                           # the latest round's nominal start
        self.monotonic = time.monotonic
        self.backoff_start_s = OUTAGE_BACKOFF_START_S
        self.backoff_max_s = OUTAGE_BACKOFF_MAX_S

    @property
    def cfg(self) -> DaemonConfig:
        """The configuration in effect: the one `build_daemon` applied, or a reload since."""
        return self.daemon.cfg

    # signal handlers: set flags and ring `_wake` only (the round in progress is never
    # interrupted; safe from another thread too)
    def request_stop(self, signum: int | None = None, _frame: Any = None) -> None:
        self.stop_requested = True
        self._wake.set()

    def request_reload(self, signum: int | None = None, _frame: Any = None) -> None:
        self.reload_requested = True
        self._wake.set()

    def install_signals(self) -> None:
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)
        signal.signal(signal.SIGHUP, self.request_reload)

    def reload(self) -> bool:
        """SIGHUP, in the loop (never in the handler): load the configuration again and take
        the start-up path with it (`apply`); False (and the running one kept) when it is
        invalid."""
        self.reload_requested = False
        if self.load is None:
            return False
        try:
            new = self.load()
        except ConfigError as exc:
            log.error("configuration reload failed, keeping the running configuration: %s",
                      mask(str(exc)), extra={"fields": {"event": "reload", "ok": False,
                                                        "key": exc.field}})
            self._count_reload("error")
            return False
        changed = self.apply(keep_restart_keys(new, self.cfg))
        log.info("configuration reloaded: %s", ", ".join(
            f"{k}={new.value_of(k)}" for k in changed) or "nothing changed",
            extra={"fields": {"event": "reload", "ok": True, "changed": changed}})
        self._count_reload("ok")
        return True

    def apply(self, cfg: DaemonConfig) -> list[str]:
        """Run with `cfg` from now on: the daemon's reloadable keys (`Daemon.apply`, the path
        `build_daemon` takes at start-up), the log format, and the runner's own keys (read from
        `self.cfg`, the daemon's). Returns the reloadable keys that changed."""
        old_format = self.cfg.log_format
        changed = self.daemon.apply(cfg)
        if cfg.log_format != old_format and self.on_log_format is not None:
            self.on_log_format(cfg.log_format)
        return changed

    def _count_reload(self, result: str) -> None:
        if self.daemon.metrics is not None:
            self.daemon.metrics.reloads.labels(result=result).inc()

    # ------------------------------------------------------------------ outages
    def attempt(self) -> float | None:
        """One round (reconciling first when not done yet), if this process leads. None when
        it ran, else the seconds to wait before the next attempt (standby, Slurm or the store
        down, a stale snapshot: nothing done)."""
        standby = self._lead()
        if standby is not None:
            return standby
        try:
            if not self.reconciled and self.daemon.journal is not None:
                self.daemon.reconcile()
            self.reconciled = True
            self.daemon.loop.run_round()
        except SlurmError as exc:
            return self._slurm_failed(exc)
        except JournalUnavailable as exc:
            return self._store_failed(exc)
        except StaleSnapshot as exc:
            return self._stale(exc)
        except LeadershipLost as exc:
            self._set_leading(False, str(exc))
            return self._standby_delay()
        self.stale_rounds = 0
        self._recovered()
        return None

    # ------------------------------------------------------------------ leadership
    def _standby_delay(self) -> float:
        return min(self.cfg.standby_retry_seconds, self.daemon.loop.round_s)

    def _check_leader(self) -> None:
        """`SlurmCluster.may_act`: raise `LeadershipLost` unless this process holds the lock."""
        if self.leader is not None and not self.leader.still_held():
            raise LeadershipLost("the leader lock was lost")

    def _lead(self) -> float | None:
        """None when this process leads (taking the lock when it is free), else the seconds
        until the next try."""
        if self.leader is None or self.leader.still_held():
            return None
        if self.leading:
            self._set_leading(False, "the leader lock was lost")
        try:
            got = self.leader.acquire()
        except StoreError as exc:
            return self._store_failed(exc, slurm_read=False)
        self._set_leading(got)
        if not got:
            self._store_back("this daemon stands by")   # it answered: no outage to report
        return None if got else self._standby_delay()

    def _set_leading(self, leading: bool, why: str = "") -> None:
        """Log a transition (once each) and set the metric."""
        if leading == self.leading:
            return
        was, self.leading = self.leading, leading
        cluster = self.cfg.cluster
        if self.daemon.metrics is not None:
            self.daemon.metrics.leader.set(1 if leading else 0)
        fields = {"event": "leader" if leading else "standby", "cluster": cluster}
        if leading:
            info = getattr(self.leader, "info", None)
            log.warning("leader: this daemon %s cluster %r%s", "leads" if info is None else
                        f"({info.describe()}) leads", cluster,
                        " (took over)" if was is False else "", extra={"fields": fields})
            return
        self.reconciled = False        # whoever led meanwhile acted: reconcile again
        if was:
            log.error("%s: this daemon stops acting at once and stands by for cluster %r",
                      why or "lost the lead", cluster, extra={"fields": fields})
            return
        try:
            holder = self.leader.holder() if self.leader is not None else None
        except StoreError:
            holder = None
        log.warning("standby: %s leads cluster %r; this daemon takes no action and tries to "
                    "take over every %g s", "another daemon" if holder is None else
                    holder.describe(), cluster, self._standby_delay(), extra={"fields": fields})

    # ------------------------------------------------------------------ stale snapshots
    def _stale(self, exc: StaleSnapshot) -> float:
        self.stale_rounds += 1
        again = self.stale_rounds > 1
        log.warning("round not enacted: %s; %s", exc,
                    "stale again, next try in a round" if again
                    else "re-reading Slurm and re-planning now",
                    extra={"fields": {"event": "stale", "age_s": round(exc.age_s, 3),
                                      "bound_s": exc.bound_s, "retry": not again}})
        return self.daemon.loop.round_s if again else 0.0

    def _outage(self, what: str, active: bool) -> None:
        if active:
            self.outages[what] += 1
        if self.daemon.metrics is not None:
            self.daemon.metrics.outage(what, active)

    def _slurm_failed(self, exc: Exception) -> float:
        self.failures += 1
        delay = min(self.backoff_max_s, self.backoff_start_s * 2 ** (self.failures - 1))
        if self.slurm_down_since is None:
            self.slurm_down_since = self.monotonic()
            self._outage("slurm", True)
            log.error("Slurm cannot be read or reached (%s); no actions until it answers, "
                      "retrying with backoff (at most %g s)", mask(str(exc)).strip(),
                      self.backoff_max_s, extra={"fields": {"event": "outage", "what": "slurm"}})
        else:
            log.debug("Slurm still unavailable (%s); next try in %g s", exc, delay)
        return delay

    def _store_failed(self, exc: Exception, slurm_read: bool = True) -> float:
        """A store outage; `slurm_read`: the attempt had read Slurm first (the round's reads
        come before its store work), so a Slurm outage is over (not so for the leader lock)."""
        if self.store_down_since is None:
            self.store_down_since = self.monotonic()
            self._outage("store", True)
            log.error("the store is unavailable (%s); the daemon takes no action it cannot "
                      "record, retrying every round", mask(str(exc)).strip(),
                      extra={"fields": {"event": "outage", "what": "store"}})
        else:
            log.debug("store still unavailable (%s)", exc)
        if slurm_read:
            self.failures = 0
            if self.slurm_down_since is not None:
                self._slurm_back()
        return self.daemon.loop.round_s

    def _slurm_back(self) -> None:
        took = self.monotonic() - (self.monotonic() if self.slurm_down_since is None
                                 else self.slurm_down_since)
        self.slurm_down_since = None
        self._outage("slurm", False)
        log.warning("Slurm answers again after a %.1f s outage; rounds resume", took,
                    extra={"fields": {"event": "recovered", "what": "slurm",
                                      "outage_s": round(took, 3)}})

    def _recovered(self) -> None:
        self.failures = 0
        if self.slurm_down_since is not None:
            self._slurm_back()
        self._store_back()

    def _store_back(self, then: str = "rounds resume") -> None:
        if self.store_down_since is None:
            return
        took = self.monotonic() - self.store_down_since
        self.store_down_since = None
        self._outage("store", False)
        log.warning("the store is writable again after %.1f s; %s", took, then,
                    extra={"fields": {"event": "recovered", "what": "store",
                                      "outage_s": round(took, 3)}})

    def run(self, max_rounds: int | None = None) -> int:
        """Rounds until stopped (or `max_rounds`, or the cluster is finished); returns the
        number of rounds run (attempts that an outage cut short included)."""
        loop, cluster = self.daemon.loop, self.daemon.cluster
        rounds = 0
        nominal: float | None = None     # the next round's boundary when it starts ahead of it
        while not self.stop_requested and not cluster.finished():
            if self.reload_requested:
                self.reload()
            start, start_m = loop.clock.now(), self.monotonic()
            self.boundary = round_boundary(nominal, start, self._lead_s(), loop.round_s)
            retry = self.attempt()
            rounds += 1
            if max_rounds is not None and rounds >= max_rounds:
                break
            nominal = self._wait_next(start, start_m, retry)
        return rounds

    def _lead_s(self) -> float:
        """`stop_lead_seconds`, at most half a round."""
        return min(self.cfg.stop_lead_seconds, 0.5 * self.daemon.loop.round_s)

    def _wait_next(self, start: float, start_m: float, retry: float | None) -> float | None:
        """Wait until the next round is due: `stop_lead_seconds` before the next boundary
        (one round after this round's boundary) after a round that ran, `retry` seconds after
        `start` otherwise, or at once on an event (`wants_early_round`) or a stop request.
        Measured on the monotonic clock from `start_m` (the monotonic time at wall-clock time
        `start`). Returns the next round's boundary when it starts ahead of it, else None."""
        loop, cluster = self.daemon.loop, self.daemon.cluster
        while not self.stop_requested:
            if self.reload_requested:
                self.reload()
            # the round length may just have changed: measured from this round's boundary
            nominal = cluster.next_round_start(self.boundary, loop.round_s) \
                if retry is None else None
            end = nominal - self._lead_s() if nominal is not None else start + (retry or 0.0)
            due = start_m + (end - start)
            delay = due - self.monotonic()
            if delay <= 0:
                return nominal
            self._wake.clear()
            if self.stop_requested or self.reload_requested:
                continue
            poll = event_poll_s(self.cfg.event_poll_seconds, retry, self.leading,
                                self.poll_read_s)
            if poll is None:
                self._wake.wait(delay)
                continue
            if self._wake.wait(min(delay, poll)) or due - self.monotonic() <= 0:
                continue
            read_from = self.monotonic()
            early = cluster.wants_early_round()
            self.poll_read_s = self.monotonic() - read_from
            if early:
                self.early_rounds += 1
                return None
        return None
