"""No action on stale state, and one leader, on fake Slurm backends and real stores:
- a store locked by another connection (SQLite `BEGIN EXCLUSIVE`): every round stops within the
  store timeout before any Slurm action, one outage line at each edge, no traceback; at start-up
  `open_store_waiting` logs one line and retries;
- a round whose Slurm snapshot got older than the bound does nothing, re-reads and re-plans
  (fake monotonic clock);
- the leader lock (flock beside SQLite, advisory lock on PostgreSQL): one holder, who it is,
  released when its holder goes; a standby runner takes no action and takes over when the
  lock is free; a leader that lost its lock stops before its next action."""

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
from shockslurm.store.leader import (AdvisoryLeaderLock, FileLeaderLock, LeadershipLost,
                                     leader_lock)

from .test_crash_safety import Backend, daemon, running
from .test_enact import job
from .test_live import FakeBackend
from .conftest import skip_unless_required
from .test_store import PG_URL, _pg_reason, store_url  # noqa: F401 (a fixture)

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


# ------------------------------------------------------------------ the leader lock
def test_file_lock_one_holder_who_and_release(db):
    a, b = FileLeaderLock(db + ".leader"), FileLeaderLock(db + ".leader")
    assert a.holder() is None
    assert a.acquire() and a.acquire()               # idempotent
    assert not b.acquire()
    who = b.holder()
    assert who is not None and (who.pid, who.host) == (os.getpid(), socket.gethostname())
    assert abs(who.since - time.time()) < 5
    a.release()
    assert b.holder() is None and b.acquire() and not a.acquire()
    b.release()


def test_daemons_of_two_clusters_on_one_sqlite_store_both_lead(db):
    """The file lock was one per store: the daemon of a second cluster stood by for ever,
    naming the first cluster's daemon as its leader. Now each cluster has its own file; the
    default cluster's is the one earlier daemons locked, so an older daemon and a new one of
    that cluster still exclude each other."""
    from shockslurm.store.leader import leader_lock

    url = f"sqlite:///{db}"
    locks = {c: leader_lock(url, c, timeout_s=1) for c in ("slurm", "a", "b", "a/../x y")}
    rivals = {c: leader_lock(url, c, timeout_s=1) for c in locks}
    older = FileLeaderLock(db + ".leader")
    try:
        assert all(lock.acquire() for lock in locks.values())
        assert not any(lock.acquire() for lock in rivals.values())
        assert not older.acquire()
        paths = {c: str(lock.path) for c, lock in locks.items()}       # type: ignore
        assert [paths[c] for c in ("slurm", "a", "b")] == [
            db + ".leader", db + ".a.leader", db + ".b.leader"], paths
        odd = paths["a/../x y"]
        assert os.path.dirname(odd) == os.path.dirname(db) and ".." not in odd
    finally:
        for lock in [*locks.values(), *rivals.values(), older]:
            lock.release()


def test_file_lock_replaced_under_the_holder_is_lost(db):
    a, b = FileLeaderLock(db + ".leader"), FileLeaderLock(db + ".leader")
    assert a.acquire()
    os.unlink(db + ".leader")                        # someone removes it: b could lock anew
    assert not a.still_held()
    assert b.acquire()
    b.release()
    a.release()


def test_file_lock_does_not_follow_a_symlink(db, tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    os.symlink(target, db + ".leader")
    with pytest.raises(StoreUnavailable):
        FileLeaderLock(db + ".leader").acquire()
    assert target.read_text() == "keep"


def test_lock_of_a_store_url(db):
    assert isinstance(leader_lock(db, "c", timeout_s=1), FileLeaderLock)
    assert isinstance(leader_lock(f"sqlite:///{db}", "c", timeout_s=1), FileLeaderLock)
    with pytest.raises(StoreError):
        leader_lock("sqlite://", "c", timeout_s=1)


@pytest.fixture
def pg_url():
    reason = _pg_reason()
    if reason is not None:
        skip_unless_required(reason)
    return PG_URL


def test_advisory_lock_one_holder_who_and_session_end(pg_url):
    cluster = f"leader-test-{os.getpid()}-{time.time_ns()}"
    a = AdvisoryLeaderLock(pg_url, cluster, timeout_s=2)
    b = AdvisoryLeaderLock(pg_url, cluster, timeout_s=2)
    other = AdvisoryLeaderLock(pg_url, cluster + "-other", timeout_s=2)
    try:
        assert b.holder() is None
        assert a.acquire() and a.still_held() and a.acquire()
        assert not b.acquire()
        assert other.acquire()                       # a key per cluster
        who = b.holder()
        assert who is not None and who.pid == os.getpid() and abs(who.since - time.time()) < 5
        assert socket.gethostname().startswith(who.host)   # application_name: 63 bytes
        # the server ends the leader's session (a dropped connection): the lock is gone
        backend_pid = a._conn.execute(text("SELECT pg_backend_pid()")).scalar()
        with b._engine.connect() as conn:
            # waits (up to 30 s, PostgreSQL 14+) until the backend has ended and its lock gone
            conn.execute(text("SELECT pg_terminate_backend(:p, 30000)"), {"p": backend_pid})
        assert not a.still_held()
        assert b.acquire() and not a.acquire()
    finally:
        for lock in (a, b, other):
            lock.dispose()


def test_advisory_lock_unreachable_server_is_unavailable():
    lock = AdvisoryLeaderLock("postgresql+psycopg://postgres@127.0.0.1:1/test", "c", timeout_s=1)
    with pytest.raises(StoreUnavailable):
        lock.acquire()
    lock.dispose()


# ------------------------------------------------------------------ standby and takeover
def test_standby_takes_no_action_and_takes_over(engine, db, caplog):
    b = Backend([running(1), job(2, gpus=8), job(3, gpus=8)])
    m1, m2 = DaemonMetrics(), DaemonMetrics()
    first = DaemonRunner(daemon(engine, b, metrics=m1, standby_retry_seconds=2),
                         leader=FileLeaderLock(db + ".leader"))
    second_d = daemon(engine, b, metrics=m2, standby_retry_seconds=2)
    second = DaemonRunner(second_d, leader=FileLeaderLock(db + ".leader"))
    caplog.set_level(logging.INFO, logger="shockslurm.daemon")
    assert first.attempt() is None and b.log
    calls = b.calls["jobs"]
    b.log.clear()
    for _ in range(3):
        assert second.attempt() == 2.0               # standby: retries every 2 s (< a round)
    assert b.log == [] and b.calls["jobs"] == calls   # reads nothing, does nothing
    assert second_d.journal.run_id is None            # not even a run row
    assert (m1.registry.get_sample_value("shockslurm_leader"),
            m2.registry.get_sample_value("shockslurm_leader")) == (1, 0)
    standby = [r.getMessage() for r in caplog.records if r.getMessage().startswith("standby")]
    assert len(standby) == 1 and f"pid {os.getpid()}" in standby[0]
    first.leader.release()                           # the leader dies
    b._jobs.append(job(4, gpus=8))
    assert second.attempt() is None and b.log        # takes over at its next try
    assert m2.registry.get_sample_value("shockslurm_leader") == 1
    leader = [r.getMessage() for r in caplog.records if r.getMessage().startswith("leader")]
    assert len(leader) == 2 and "(took over)" in leader[1]
    second.leader.release()


def test_a_leader_gone_standby_in_a_store_outage_reports_the_store_back(engine, db, caplog):
    """The store was locked while this daemon led; meanwhile another took the lead. Its next
    try found the store answering (the lock's query) and stood by: the outage it had reported
    stayed active for ever (`shockslurm_outage_active{what="store"}` 1, no recovery line)."""
    b = Backend([running(1), job(2, gpus=8), job(3, gpus=8)])
    metrics = DaemonMetrics()
    first = DaemonRunner(daemon(engine, b, metrics=metrics, store_timeout_seconds=TIMEOUT_S),
                         leader=FileLeaderLock(db + ".leader"))
    assert first.attempt() is None and first.leading
    b._jobs.append(job(4, gpus=8))
    lock = ExclusiveLock(db)
    try:
        assert first.attempt() == first.daemon.loop.round_s       # the store outage
    finally:
        lock.release()
    active = {"what": "store"}
    assert metrics.registry.get_sample_value("shockslurm_outage_active", active) == 1
    os.unlink(db + ".leader")                                     # the lock lost to ...
    other = FileLeaderLock(db + ".leader")
    assert other.acquire()                                        # ... another daemon
    caplog.set_level(logging.INFO, logger="shockslurm.daemon")
    assert first.attempt() == first._standby_delay() and first.leading is False
    assert metrics.registry.get_sample_value("shockslurm_outage_active", active) == 0
    assert first.store_down_since is None
    assert sum("writable again" in r.getMessage() for r in caplog.records) == 1
    other.release()


def test_a_leader_that_lost_its_lock_stops_before_the_next_action(engine, db, caplog):
    b = Backend([running(1), job(2, gpus=8), job(3, gpus=8)])
    lock = FileLeaderLock(db + ".leader")
    d = daemon(engine, b)
    runner = DaemonRunner(d, leader=lock)
    assert runner.attempt() is None and runner.leading
    b.log.clear()
    b._jobs.append(job(4, gpus=8))
    real = d.journal.begin_round

    def lose(*args):                                 # the lock goes mid-round
        real(*args)
        os.unlink(db + ".leader")
    d.journal.begin_round = lose
    caplog.set_level(logging.INFO, logger="shockslurm.daemon")
    assert runner.attempt() == runner._standby_delay()
    assert b.log == [] and runner.leading is False   # no action after the loss
    assert sum("stops acting at once" in r.getMessage() for r in caplog.records) == 1
    with pytest.raises(LeadershipLost):
        runner._check_leader()
    lock.release()


def test_status_shows_the_leader(engine, db, monkeypatch):
    from click.testing import CliRunner

    from shockslurm.cli import status as status_cli
    from shockslurm.cli.main import cli

    monkeypatch.setattr(status_cli, "read_slurm", lambda: [])
    result = CliRunner().invoke(cli, ["status", "--db", db, "--cluster", "c1"])
    assert result.exit_code == 0, result.output
    assert "leader: none" in result.output
    lock = leader_lock(db, "c1", timeout_s=1)
    assert lock.acquire()
    result = CliRunner().invoke(cli, ["status", "--db", db, "--cluster", "c1"])
    assert f"leader: pid {os.getpid()} on {socket.gethostname()} since" in result.output
    lock.dispose()


@pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)
def test_postgresql_standby_takes_over_when_the_leader_session_ends(store_url, caplog):
    engine = open_store(store_url, create=True, timeout_s=2)
    cluster = f"takeover-{os.getpid()}-{time.time_ns()}"
    b = Backend([running(1), job(2, gpus=8)])
    first = DaemonRunner(daemon(engine, b, cluster=cluster),
                         leader=AdvisoryLeaderLock(store_url, cluster, timeout_s=2))
    second = DaemonRunner(daemon(engine, b, cluster=cluster),
                          leader=AdvisoryLeaderLock(store_url, cluster, timeout_s=2))
    caplog.set_level(logging.INFO, logger="shockslurm.daemon")
    try:
        assert first.attempt() is None and b.log
        b.log.clear()
        assert second.attempt() == second.cfg.standby_retry_seconds and b.log == []
        assert any(f"standby: pid {os.getpid()}" in r.getMessage() for r in caplog.records)
        first.leader.dispose()                       # the leader's session ends
        b._jobs.append(job(3, gpus=8))
        assert second.attempt() is None and b.log and second.leading
    finally:
        first.leader.dispose()
        second.leader.dispose()
        engine.dispose()


def test_the_server_notices_a_vanished_leader_within_seconds(pg_url):
    """The lock's session keeps TCP keepalives on the server's side too: a leader whose host
    lost power held its session, and so the lock, until the server's OS keepalive (some 2 h
    on Linux), and no standby could take over; now the server drops it after
    idle + 3 x 1 s of silence (idle = the store timeout)."""
    lock = AdvisoryLeaderLock(pg_url, f"keepalive-{os.getpid()}-{time.time_ns()}", timeout_s=4)
    try:
        assert lock.acquire()
        assert lock._conn is not None
        shown = {name: lock._conn.execute(text(f"SHOW {name}")).scalar()
                 for name in ("tcp_keepalives_idle", "tcp_keepalives_interval",
                              "tcp_keepalives_count")}
        assert shown == {"tcp_keepalives_idle": "4", "tcp_keepalives_interval": "1",
                         "tcp_keepalives_count": "3"}, shown
    finally:
        lock.dispose()
