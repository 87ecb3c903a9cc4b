"""No action on stale state or a store that cannot record, on fake Slurm backends and real
stores:
- a store locked by another connection (SQLite `BEGIN EXCLUSIVE`): every round stops within the
  store timeout before any Slurm action, one outage line at each edge, no traceback; at start-up
  `open_store_waiting` logs one line and retries;
- a round whose Slurm snapshot got older than the bound does nothing, re-reads and re-plans
  (fake monotonic clock).
The leader lock and standbys are tests/test_leader.py."""

from __future__ import annotations

import logging
import os
import socket
import sqlite3
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from shockslurm.daemon import DaemonRunner, open_store_waiting, parse_config
from shockslurm.model import RoundPlan
from shockslurm.ops.metrics import DaemonMetrics
from shockslurm.live.cluster import SlurmCluster, StaleSnapshot
from shockslurm.store import StoreError, StoreUnavailable, open_store
from shockslurm.store.leader import FileLeaderLock

from .test_crash_safety import Backend, daemon, running
from .test_enact import job
from .test_live import FakeBackend
from .test_store import store_url  # noqa: F401 (a fixture)

TIMEOUT_S = 0.3


@pytest.fixture
def db(tmp_path: Path) -> str:
    return str(tmp_path / "store.db")


@pytest.fixture
def engine(db: str):
    e = open_store(db, create=True, timeout_s=TIMEOUT_S)
    yield e
    e.dispose()


class ExclusiveLock:
    """Another process's view of the store: `BEGIN EXCLUSIVE` held until `release`."""

    def __init__(self, path: str) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.conn.execute("BEGIN EXCLUSIVE")

    def release(self) -> None:
        self.conn.execute("COMMIT")
        self.conn.close()


def _tracebacks(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.exc_info or "Traceback" in
            r.getMessage()]


# ------------------------------------------------------------------ store locked
def test_locked_store_mid_round_no_action_one_line_each_edge(engine, db, caplog):
    b = Backend([running(1), job(2, gpus=8), job(3, gpus=8)])
    metrics = DaemonMetrics()
    d = daemon(engine, b, metrics=metrics, store_timeout_seconds=TIMEOUT_S)
    runner = DaemonRunner(d)
    caplog.set_level(logging.DEBUG, logger="shockslurm")
    assert runner.attempt() is None                       # one good round first
    b.log.clear()
    b._jobs.append(job(4, gpus=8))                        # something to do once it is back
    lock = ExclusiveLock(db)
    try:
        for _ in range(3):
            t0 = time.monotonic()
            assert runner.attempt() == d.loop.round_s     # abandoned, retried next round
            assert time.monotonic() - t0 < 10.0   # a few timeouts, never the old 30 s waits
        assert b.log == []                                 # no Slurm action while locked
    finally:
        lock.release()
    assert runner.attempt() is None
    assert b.log, "acts again within one round of the unlock"
    messages = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    down = [m for m in messages if "store is unavailable" in m]
    back = [m for m in messages if "writable again" in m]
    assert len(down) == 1 and "locked" in down[0] and len(back) == 1
    assert [m for m in messages if m not in down + back] == []   # nothing else above INFO
    assert _tracebacks(caplog) == []
    assert metrics.registry.get_sample_value("shockslurm_outages_total", {"what": "store"}) == 1


@pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)
def test_locked_postgresql_store_stops_the_round_within_the_timeout(store_url, caplog):
    # The schema made without a timeout, and 1 s per statement (not TIMEOUT_S): the rounds
    # before and after the lock must not time out on a loaded machine.
    open_store(store_url, create=True).dispose()
    engine = open_store(store_url, timeout_s=1.0)
    b = Backend([running(1), job(2, gpus=8)])
    d = daemon(engine, b)
    runner = DaemonRunner(d)
    assert runner.attempt() is None
    b.log.clear()
    b._jobs.append(job(3, gpus=8))
    admin = open_store(store_url)
    conn = admin.connect()
    conn.execute(text("LOCK TABLE runs, jobs, job_events, rounds, plan_entries, "
                      "enactment_intents, throughput_samples, batch_size_changes, checkpoints "
                      "IN ACCESS EXCLUSIVE MODE"))          # held until the rollback
    caplog.set_level(logging.DEBUG, logger="shockslurm")
    try:
        t0 = time.monotonic()
        assert runner.attempt() == d.loop.round_s
        assert time.monotonic() - t0 < 10.0     # a few timeouts, never the old 30 s waits
        assert b.log == []
    finally:
        conn.rollback()
        conn.close()
        admin.dispose()
    assert runner.attempt() is None and b.log
    down = [r.getMessage() for r in caplog.records if "store is unavailable" in r.getMessage()]
    assert len(down) == 1 and "statement timeout" in down[0]
    assert _tracebacks(caplog) == []
    engine.dispose()


def test_locked_store_at_start_up_waits_with_one_line(db, caplog):
    open_store(db, create=True).dispose()
    lock = ExclusiveLock(db)
    sleeps: list[float] = []

    def sleep(s: float) -> None:
        sleeps.append(s)
        if len(sleeps) == 3:
            lock.release()
    caplog.set_level(logging.DEBUG, logger="shockslurm")
    metrics = DaemonMetrics()
    active: list[float | None] = []

    def sleep_and_look(s: float) -> None:
        active.append(metrics.registry.get_sample_value("shockslurm_outage_active",
                                                        {"what": "store"}))
        sleep(s)
    engine = open_store_waiting(db, timeout_s=TIMEOUT_S, retry_s=2.0, sleep=sleep_and_look,
                                metrics=metrics)
    engine.dispose()
    assert sleeps == [2.0, 2.0, 2.0]
    # the endpoint serves during the wait: it shows the outage, then its end
    assert active == [1.0, 1.0, 1.0]
    assert metrics.registry.get_sample_value("shockslurm_outage_active", {"what": "store"}) == 0
    assert metrics.registry.get_sample_value("shockslurm_outages_total", {"what": "store"}) == 1
    lines = [r.getMessage() for r in caplog.records]
    assert sum("unavailable at start-up" in m for m in lines) == 1
    assert sum("available again after" in m for m in lines) == 1
    assert _tracebacks(caplog) == []


def test_a_new_daemon_upgrades_the_store_only_once_the_leader_has_stopped(db, caplog):
    """A newer daemon started beside the leader (a rolling upgrade) upgraded the shared store
    at once, under the older leader's writes; now it waits, with one line naming the leader,
    until the leader has stopped, then upgrades and starts. A store at this code's schema
    is opened at once beside a leader (a standby)."""
    from shockslurm.store.database import current_revision, head_revision, make_engine, upgrade

    old = make_engine(db)
    upgrade(old, "0004")
    running_leader, ours = FileLeaderLock(db + ".leader"), FileLeaderLock(db + ".leader")
    assert running_leader.acquire()
    sleeps: list[float] = []

    def sleep(s: float) -> None:
        sleeps.append(s)
        assert current_revision(old) == "0004"          # not upgraded under the leader
        if len(sleeps) == 2:
            running_leader.release()                    # the older daemon stops
    caplog.set_level(logging.INFO, logger="shockslurm")
    with pytest.raises(StoreUnavailable, match="revision '0004'.*pid .* leads this cluster"):
        open_store_waiting(db, timeout_s=TIMEOUT_S, retry_s=1.0, wait=False, leader=ours)
    engine = open_store_waiting(db, timeout_s=TIMEOUT_S, retry_s=1.0, sleep=sleep, leader=ours)
    assert sleeps == [1.0, 1.0] and current_revision(engine) == head_revision()
    lines = [r.getMessage() for r in caplog.records if "unavailable at start-up" in r.getMessage()]
    assert len(lines) == 1 and f"pid {os.getpid()}" in lines[0], lines
    assert running_leader.acquire()                     # at head now: a standby starts at once
    open_store_waiting(db, timeout_s=TIMEOUT_S, retry_s=1.0, leader=ours,
                       sleep=lambda s: pytest.fail("waited at this code's schema")).dispose()
    for e in (engine, old):
        e.dispose()
    running_leader.release()


def test_start_up_refuses_what_a_retry_cannot_fix(tmp_path):
    with pytest.raises(StoreError) as info:
        open_store_waiting(str(tmp_path / "nodir" / "s.db"), timeout_s=TIMEOUT_S, retry_s=1,
                           sleep=lambda s: pytest.fail("retried a missing directory"))
    assert not isinstance(info.value, StoreUnavailable)


def test_daemon_construction_writes_nothing(engine, db):
    lock = ExclusiveLock(db)
    try:
        d = daemon(engine, Backend([running(1)]), store_timeout_seconds=TIMEOUT_S)
    finally:
        lock.release()
    assert d.journal.run_id is None                 # the run row comes with the first round
    DaemonRunner(d).attempt()
    assert d.journal.run_id is not None
    with engine.connect() as conn:
        config = conn.execute(text("SELECT config FROM runs WHERE kind = 'live'")).scalar()
    assert f'"pid": {os.getpid()}' in config and socket.gethostname() in config


# ------------------------------------------------------------------ stale snapshots
def test_stale_snapshot_is_not_enacted():
    t = [100.0]
    b = FakeBackend([job(1), job(2)])
    c = SlurmCluster(b, grace_seconds=0, sleep=lambda s: None, monotonic=lambda: t[0],
                     max_snapshot_age_s=3.0)
    snap = c.observe(1000.0)
    t[0] += 3.5                                      # the round waited (a slow store, a solve)
    with pytest.raises(StaleSnapshot, match="3.5 s old"):
        c.enact(RoundPlan(frozenset({1})), snap)
    assert b.log == []
    snap = c.observe(1003.5)                        # re-read: fresh
    t[0] += 2.9
    c.enact(RoundPlan(frozenset({1})), snap)
    assert [a[1] for a in b.log] == ["release"]


def test_no_bound_means_no_check():
    t = [0.0]
    c = SlurmCluster(FakeBackend([job(1)]), sleep=lambda s: None, monotonic=lambda: t[0])
    snap = c.observe(0.0)
    t[0] += 1e6
    c.enact(RoundPlan(frozenset({1})), snap)


def test_a_slow_store_inside_enact_makes_the_snapshot_stale(engine):
    b = Backend([job(1, gpus=8)])
    d = daemon(engine, b, max_snapshot_age_seconds=2)
    t = [0.0]
    d.cluster._monotonic = lambda: t[0]
    real = d.journal.begin_round

    def slow(*args):                                 # the round record waited 3 s on a lock
        t[0] += 3.0
        real(*args)
    d.journal.begin_round = slow
    snap = d.cluster.observe(1000.0)
    with pytest.raises(StaleSnapshot):
        d.cluster.enact(RoundPlan(frozenset({1})), snap)
    assert b.log == []


def test_runner_re_reads_at_once_then_waits_a_round(engine, caplog):
    b = Backend([job(1, gpus=8)])
    d = daemon(engine, b, max_snapshot_age_seconds=2)
    assert d.cluster.max_snapshot_age_s == 2.0
    runner = DaemonRunner(d)
    t = [0.0]
    d.cluster._monotonic = lambda: t[0]
    real = d.loop.policy.allocate

    def slow(snapshot):                              # every solve "takes" 5 s
        t[0] += 5.0
        return real(snapshot)
    d.loop.policy.allocate = slow
    caplog.set_level(logging.INFO, logger="shockslurm.daemon")
    assert runner.attempt() == 0.0                   # first stale round: re-read at once
    assert runner.attempt() == d.loop.round_s        # stale again: next round
    assert b.log == []
    lines = [r.getMessage() for r in caplog.records if "not enacted" in r.getMessage()]
    assert len(lines) == 2 and "5.0 s old (bound 2 s)" in lines[0]
    assert "re-reading Slurm" in lines[0] and "next try in a round" in lines[1]
    d.loop.policy.allocate = real
    assert runner.attempt() is None and b.log


def test_defaults_of_the_new_keys():
    cfg = parse_config({})
    assert (cfg.store_timeout_seconds, cfg.standby_retry_seconds) == (5.0, 5.0)
    assert parse_config({"daemon": {"round_seconds": 6}}).snapshot_age_bound == 3.0
    assert parse_config({"daemon": {"max_snapshot_age_seconds": 0.5}}).snapshot_age_bound == 0.5
