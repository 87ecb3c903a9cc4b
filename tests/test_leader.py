"""One leader, on fake Slurm backends and real stores: the leader lock (flock beside SQLite,
advisory lock on PostgreSQL) has one holder, says who it is and is released when its holder
goes; a standby runner takes no action and takes over when the lock is free; a leader that
lost its lock stops before its next action. (Split from tests/test_stale_and_leader.py, whose
fixtures it shares.)"""

from __future__ import annotations

import logging
import os
import socket
import time

import pytest
from sqlalchemy import text

from shockslurm.daemon import DaemonRunner
from shockslurm.ops.metrics import DaemonMetrics
from shockslurm.store import StoreError, StoreUnavailable, open_store
from shockslurm.store.leader import (AdvisoryLeaderLock, FileLeaderLock, LeadershipLost,
                                     leader_lock)

from .conftest import skip_unless_required
from .test_crash_safety import Backend, daemon, running
from .test_enact import job
from .test_stale_and_leader import TIMEOUT_S, ExclusiveLock, db, engine  # noqa: F401 (fixtures)
from .test_store import PG_URL, _pg_reason, store_url  # noqa: F401 (a fixture)


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


class UnreachableLock:
    """A leader lock whose store can stop answering: `acquire` then raises."""

    info = None

    def __init__(self) -> None:
        self.held, self.reachable = False, True

    def still_held(self) -> bool:
        return self.held

    def acquire(self) -> bool:
        if not self.reachable:
            raise StoreUnavailable("the leader lock's query failed")
        self.held = True
        return True

    def holder(self):
        return None


def test_a_store_outage_at_the_leader_lock_does_not_end_a_slurm_outage(engine, db, caplog):
    """Slurm is down; then the lock is lost and the store does not answer its acquire. That
    try read no Slurm: the Slurm outage goes on (it was logged over and its gauge cleared)."""
    b = Backend([running(1), job(2, gpus=8)])
    metrics = DaemonMetrics()
    lock = UnreachableLock()
    runner = DaemonRunner(daemon(engine, b, metrics=metrics), leader=lock)  # type: ignore[arg-type]
    b.down = True
    assert runner.attempt() == 1.0 and runner.slurm_down_since is not None
    lock.held, lock.reachable = False, False
    caplog.set_level(logging.INFO, logger="shockslurm.daemon")
    assert runner.attempt() == runner.daemon.loop.round_s          # the store outage
    slurm = {"what": "slurm"}
    assert metrics.registry.get_sample_value("shockslurm_outage_active", slurm) == 1
    assert runner.slurm_down_since is not None and runner.failures == 1
    assert not [r for r in caplog.records if "answers again" in r.getMessage()]
    lock.reachable, b.down = True, False
    assert runner.attempt() is None
    assert sum("answers again" in r.getMessage() for r in caplog.records) == 1
    assert metrics.registry.get_sample_value("shockslurm_outage_active", slurm) == 0


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
