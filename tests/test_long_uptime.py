"""A daemon runs for months beside slurmctld with tens of thousands of jobs passing through: what
it keeps between rounds must follow the jobs it has now, not every job it has ever seen, and an
open of the store that fails must not leave descriptors behind for the garbage collector."""

from __future__ import annotations

import gc
import os
import sqlite3
import time
from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from shockslurm.daemon import StoreJournal, build_daemon, parse_config
from shockslurm.engine import VirtualClock
from shockslurm.live.journaling import LiveJob
from shockslurm.live.specs import DEFAULT_SPEC
from shockslurm.model import RoundPlan, Snapshot
from shockslurm.ops.metrics import DaemonMetrics
from shockslurm.policies.finish_time_fairness import FinishTimeFairness
from shockslurm.slurm.types import JobState
from shockslurm.store import StoreUnavailable, open_store
from shockslurm.store.models import Job, PlanEntry

from .conftest import REQUIRE_ALL, make_view
from .test_crash_safety import Backend
from .test_enact import job

ROUNDS = 250          # two jobs arrive every round: 500 jobs come and go
ROUND_S = 10.0


@pytest.fixture(scope="module")
def churned(tmp_path_factory):
    """A daemon (Shockwave, the store, metrics) after `ROUNDS` rounds in which jobs arrive,
    run a few rounds, complete and leave the queue; and what Slurm listed at the last round."""
    engine = open_store(f"sqlite:///{tmp_path_factory.mktemp('uptime') / 's.db'}", create=True)
    backend = Backend([])
    clock = VirtualClock(time.time())
    cfg = parse_config({"daemon": {"round_seconds": ROUND_S, "grace_seconds": 0,
                                   "policy": "shockwave", "min_run_seconds": 0}})
    d = build_daemon(cfg, backend, engine=engine, emit=lambda _line: None,
                     metrics=DaemonMetrics(), clock=clock)
    mono = [0.0]
    d.cluster._sleep = lambda s: mono.__setitem__(0, mono[0] + s)
    d.cluster._monotonic = lambda: mono[0]
    ends: dict[int, int] = {}
    listed: set[int] = set()
    for r in range(ROUNDS):
        for k in range(2):
            job_id = 2 * r + k + 1
            backend._jobs.append(replace(job(job_id, gpus=2), submit_time=clock.now() - 1))
            ends[job_id] = r + 3 + job_id % 7
        queue = []
        for j in backend._jobs:
            if j.state is JobState.COMPLETED:
                continue                                  # gone from squeue
            if ends[j.job_id] <= r:
                j = replace(j, state=JobState.COMPLETED, end_time=clock.now())
            queue.append(j)
        backend._jobs = queue
        backend.log.clear()
        listed = {j.job_id for j in queue}
        snapshot = d.loop.run_round()
        clock.sleep_until(clock.now() + ROUND_S)
        mono[0] += ROUND_S
    yield d, engine, snapshot, listed
    engine.dispose()


def test_the_round_logger_keeps_the_latest_lines_only(churned):
    d, _, snapshot, _ = churned
    assert len(d.logger.lines) <= 100 < ROUNDS
    assert d.logger.lines[-1].startswith(f"round {snapshot.round_index}:")


def test_the_journal_keeps_the_store_keys_of_the_jobs_slurm_lists_only(churned):
    d, engine, _, listed = churned
    assert 0 < len(d.journal._job_pk) <= len(listed) < 2 * ROUNDS
    assert {job_id for job_id, _ in d.journal._job_pk} <= listed
    with Session(engine) as s:       # every job is in the store, once
        assert s.scalar(select(func.count()).select_from(Job)) == 2 * ROUNDS


def test_per_job_state_follows_the_live_jobs(churned):
    """Guards: the policy's forecasts, submissions and fairness series, the metrics' forecast
    records and the first submit times hold the jobs of the last round, not the 500 seen."""
    d, _, snapshot, listed = churned
    live = {v.job_id for v in snapshot.jobs}
    policy = d.loop.policy
    assert live and set(policy.states) == set(policy.submit) == set(policy.series) == live
    assert set(d.metrics._forecasts) <= live
    assert set(d.cluster.first_submit._seen) <= listed


def test_a_job_the_journal_forgot_finds_its_row_again(tmp_path):
    """A job absent from a round (e.g. exited on its USR1 before its requeuehold) and back
    later is journalled on the row it had: the pruned cache is refilled from the store."""
    engine = open_store(f"sqlite:///{tmp_path / 's.db'}", create=True)
    journal = StoreJournal(engine, cluster="c", policy="fifo")
    one, two = (LiveJob(job(i, JobState.RUNNING), DEFAULT_SPEC) for i in (1, 2))
    for r, jobs in enumerate(({1: one}, {2: two}, {1: one})):
        snap = Snapshot(now=100.0 * r, round_index=r, round_s=100.0, gpus=8, jobs=())
        journal.begin_round(snap, RoundPlan(frozenset(jobs)), jobs)
        assert set(journal._job_pk) == {(i, jobs[i].slurm.submit_time) for i in jobs}
    with Session(engine) as s:
        rows = s.scalars(select(Job.id).where(Job.job_id == 1)).all()
        assert len(rows) == 1
        assert s.scalars(select(PlanEntry.job_pk).where(PlanEntry.job_pk == rows[0])
                         ).all() == [rows[0], rows[0]]
    engine.dispose()


def test_finish_time_fairness_forgets_the_jobs_long_gone():
    """Four jobs a call, each in four calls: a job absent from ten calls in a row is dropped;
    job 100, out for five calls (a live job out of the queue for a moment), keeps its account."""
    policy = FinishTimeFairness()
    for k in range(25):
        views = [make_view(j, remaining=100.0 - k) for j in range(k, k + 4)]
        if not 10 <= k < 15:
            views.append(make_view(100, remaining=1000.0 - 10 * k))
        fractions = policy.fractions(views, gpus=2, now=10.0 * (k + 1))
        assert set(fractions) == {v.job_id for v in views}
    assert set(policy.cum_iso) == set(range(15, 28)) | {100}
    assert policy.cum_iso[100] > 0
    assert set(policy.prev_R) == set(policy.prev_iso) == {24, 25, 26, 27, 100}


def _open_on(db: Path) -> int:
    """Descriptors of this process open on the store's files (the database, WAL, shared
    memory)."""
    found = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        found += target.startswith(str(db))
    return found


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd") and not REQUIRE_ALL,
                    reason="needs /proc/self/fd")
def test_a_failed_open_of_the_store_leaves_no_descriptor_open(tmp_path):
    """The daemon's start-up retries `open_store` every round while the store is locked: each
    failed attempt closes what it opened, without waiting for the garbage collector."""
    db = tmp_path / "s.db"
    open_store(str(db), create=True).dispose()
    lock = sqlite3.connect(db, isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")
    enabled = gc.isenabled()
    gc.disable()            # what the collector would close must already be closed
    try:
        for attempt in range(21):
            with pytest.raises(StoreUnavailable):
                open_store(str(db), create=True, timeout_s=0.01)
            if attempt == 0:   # SQLite may keep one descriptor of a closed connection for
                first = _open_on(db)   # reuse while the lock holder has the file locked
        assert _open_on(db) == first
    finally:
        if enabled:
            gc.enable()
        lock.execute("COMMIT")
        lock.close()


def test_an_impossible_job_is_forgotten_once_it_leaves_the_queue():
    """`SlurmCluster.impossible` (never planned: a request no node holds) keeps only the jobs
    still in the queue, as `bad_specs` does (before: every impossible job ever seen, and every
    round and event poll walked them all)."""
    from shockslurm.live.cluster import SlurmCluster

    from .test_live import FakeBackend
    big = job(1, gpus=64)                       # 4 nodes of 8 GPUs: no node, no cluster holds it
    b = FakeBackend([big, job(2)])
    c = SlurmCluster(b, grace_seconds=0, sleep=lambda s: None)
    c.observe(1000.0)
    assert [k for k, _ in c.impossible] == [1]
    b._jobs = [job(2)]                          # its user cancelled it: gone from squeue
    c.observe(1010.0)
    assert c.impossible == {}


def test_departures_of_past_seconds_are_forgotten_as_new_ones_come():
    """`RecentDepartures` keeps only the current second's departures (before: they were
    dropped only when a release asked, so rounds that stopped without starting piled them)."""
    from shockslurm.live.credentials import RecentDepartures
    recent = RecentDepartures()
    for k in range(1000):
        recent.left({k: ("gpu01",)}, at=1000.0 + k)
    assert list(recent._left) == [999]
    assert recent.wait_s([999], {}, 1999.5) > 0 and recent.wait_s([998], {}, 1999.5) == 0
