"""Crash safety and outages of the live daemon, on fake Slurm backends and a SQLite store:
open intents are reconciled from Slurm's state, a Slurm outage is logged once and backed off, a
store that cannot record stops every action, and an impossible request is never planned. The
stops a killed daemon or a Slurm hiccup left under way are tests/test_resumed_stops.py."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import replace

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from shockslurm.daemon import RC_UNKNOWN, DaemonRunner, build_daemon, parse_config
from shockslurm.model import RoundPlan
from shockslurm.ops.metrics import DaemonMetrics
from shockslurm.slurm.types import CommandResult, JobState, SlurmError
from shockslurm.store import open_store
from shockslurm.store.models import EnactmentIntent, Job, JobEvent, stamp_seconds

from .test_enact import job
from .test_live import FakeBackend

NOW = time.time()   # the store stamps intents with the wall clock: see `fresh_now`


@pytest.fixture(autouse=True)
def fresh_now():
    """NOW is the wall clock at the start of each test (not at import: in a full run a test may
    start minutes after collection, and intents are stamped with the real clock)."""
    global NOW
    NOW = time.time()


class Killed(BaseException):
    """The daemon process dies here (SIGKILL): nothing after it runs."""


def running(job_id: int, *, started: float | None = None, gpus: int = 8):
    return replace(job(job_id, JobState.RUNNING, gpus=gpus),
                   start_time=NOW - 600 if started is None else started)


class Backend(FakeBackend):
    """FakeBackend whose USR1 makes the job exit (COMPLETED) like the test worker, and whose
    reads can be switched off (slurmctld down)."""

    def __init__(self, jobs, *, exit_on_usr1: bool = False):
        super().__init__(jobs)
        self.exit_on_usr1 = exit_on_usr1
        self.down = False
        self.kill_on: str | None = None      # argv[1] at which the daemon "dies" (before it)
        self.kill_on_read_after_signal = False   # it "dies" waiting for a signalled job's exit

    def jobs(self):
        if self.kill_on_read_after_signal and any(a[0] == "scancel" for a in self.log):
            raise Killed()
        if self.down:
            raise SlurmError("squeue --json failed", returncode=1,
                             stderr="slurm_load_jobs error: Unable to contact slurm controller")
        return super().jobs()

    def nodes(self):
        if self.down:
            raise SlurmError("sinfo --json failed", returncode=1)
        return super().nodes()

    def run(self, argv):
        argv = tuple(argv)
        if self.kill_on is not None and argv[1] == self.kill_on:
            raise Killed()
        res = super().run(argv)
        if argv[0] == "scancel" and self.exit_on_usr1:
            ids = {int(a) for a in argv[3:]}
            self._jobs = [replace(j, state=JobState.COMPLETED) if j.job_id in ids else j
                          for j in self._jobs]
        if argv[1] == "release":
            ids = {int(i) for i in argv[2].split(",")}
            self._jobs = [replace(j, state=JobState.RUNNING, priority=1, start_time=NOW + 1)
                          if j.job_id in ids else j for j in self._jobs]
        return res


@pytest.fixture
def engine(tmp_path):
    e = open_store(f"sqlite:///{tmp_path / 's.db'}", create=True)
    yield e
    e.dispose()


def daemon(engine, backend, metrics=None, **daemon_keys):
    cfg = parse_config({"daemon": {"round_seconds": 10, "grace_seconds": 5, "policy": "fifo",
                                   "min_run_seconds": 0, **daemon_keys}})
    d = build_daemon(cfg, backend, engine=engine, emit=lambda _line: None, metrics=metrics)
    sleeps: list[float] = []
    clock = [0.0]              # the cluster's monotonic clock moves only when it sleeps

    def sleep(s: float) -> None:
        sleeps.append(s)
        clock[0] += s

    d.cluster._sleep = sleep
    d.cluster._monotonic = lambda: clock[0]
    d.sleeps = sleeps          # type: ignore[attr-defined]
    return d


def round_(d, plan_ids, now=None):
    now = NOW if now is None else now
    snap = d.cluster.observe(now)
    d.cluster.enact(RoundPlan(frozenset(plan_ids)), snap)


def intents(engine):
    with Session(engine) as s:
        return [(i.action, i.return_code, i.stderr) for i in
                s.scalars(select(EnactmentIntent).order_by(EnactmentIntent.id))]


def _signal_stamp(engine) -> float:
    """Unix time the store stamped the first signal intent with (UTC when stored naive)."""
    with Session(engine) as s:
        when = s.scalars(select(EnactmentIntent.created_at)
                         .where(EnactmentIntent.action == "signal")
                         .order_by(EnactmentIntent.id)).first()
    assert when is not None
    return stamp_seconds(when)


# ------------------------------------------------------------------ reconciliation
def test_a_job_requeued_while_no_daemon_ran_keeps_its_registration(engine):
    """A job registered by shocksub, requeued an hour later while no daemon ran (Slurm's submit
    time is then the requeue's, far outside the registry's ten minutes): the daemon that
    starts takes the registration's time as the job's first submit time, so its registered
    spec is found and its live row is keyed by it."""
    from shockslurm.store import repository as repo
    first = NOW - 3600
    with Session(engine) as s, s.begin():
        repo.register_submitted_job(s, "slurm", job_id=7, submit_s=first, model="registered",
                                    epochs=3, samples_per_epoch=10, batch_sizes=[32],
                                    gang_size=2)
    requeued = replace(job(7, restarts=1), comment="shock:managed", submit_time=NOW - 5)
    b = Backend([requeued, running(1, gpus=2)])
    d = daemon(engine, b)
    d.reconcile(now=NOW)
    round_(d, {7, 1})
    with Session(engine) as s:
        rows = s.scalars(select(Job).where(Job.job_id == 7)).all()
        # the registration and the daemon's live row: one job, one submit time, its spec
        assert len(rows) == 2
        assert {(r.submit_s, r.model) for r in rows} == {(first, "registered")}, [
            (r.submit_s, r.model, r.run_id) for r in rows]


def test_killed_during_the_signal_call_resolves_it_unknown_and_resumes(engine):
    b = Backend([running(1), job(2, gpus=8)])
    b.kill_on = "--signal=USR1"
    with pytest.raises(Killed):
        round_(daemon(engine, b), {2})
    assert intents(engine) == [("signal", None, None)]      # the intent, before the call
    b.kill_on = None
    d2 = daemon(engine, b)
    d2.reconcile(now=NOW + 30)
    action, rc, stderr = intents(engine)[0]
    assert rc == RC_UNKNOWN and stderr.startswith("unknown (daemon restarted)")
    round_(d2, {2}, now=NOW + 30)
    assert [a[1] for a in b.log] == ["requeuehold", "release"], b.log
    assert d2.sleeps == []                                  # the grace is long over


def test_reconcile_resolves_open_intents_and_records_finished_and_vanished(engine):
    b = Backend([running(1), running(3, gpus=4), running(4, gpus=4)])
    b.kill_on = "requeuehold"
    with pytest.raises(Killed):
        round_(daemon(engine, b), {3, 4})       # signal 1, then die in the requeuehold call
    # meanwhile Slurm requeued job 1 (the call had gone through), 3 finished, 4 vanished
    b._jobs = [replace(j, state=JobState.PENDING, priority=0, restart_count=1)
               if j.job_id == 1 else j for j in b._jobs]
    b._jobs = [replace(j, state=JobState.COMPLETED) if j.job_id == 3 else j
               for j in b._jobs if j.job_id != 4]
    b.kill_on = None
    d2 = daemon(engine, b)
    counts = d2.reconcile(now=NOW + 5)
    assert counts["resolved_done"] == 1
    assert counts["finished"] == 1 and counts["vanished"] == 1
    requeue = [i for i in intents(engine) if i[0] == "requeuehold"]
    assert requeue[0][1] == 0 and "unknown (daemon restarted): done" in requeue[0][2]
    with Session(engine) as s:
        kinds = sorted(e.kind for e in s.scalars(select(JobEvent)))
    assert kinds == ["finished", "vanished"]
    assert d2.reconcile(now=NOW + 6) == {"resolved_done": 0, "resolved_unknown": 0,
                                         "finished": 0, "vanished": 0}   # idempotent
    b.log.clear()
    round_(d2, {1}, now=NOW + 10)                  # the requeued job just starts again
    assert [a[1] for a in b.log] == ["update", "release"]


# ------------------------------------------------------------------ outages
def test_slurm_outage_logged_once_backed_off_and_recovered(engine, caplog):
    b = Backend([running(1), job(2, gpus=8)])
    metrics = DaemonMetrics()
    runner = DaemonRunner(daemon(engine, b, metrics=metrics))

    def gauge(name, what):
        return metrics.registry.get_sample_value(name, {"what": what})
    t = [0.0]
    runner.monotonic = lambda: t[0]
    b.down = True
    caplog.set_level(logging.DEBUG, logger="shockslurm.daemon")
    delays = []
    for _ in range(9):
        delays.append(runner.attempt())
        t[0] += delays[-1]
    assert delays == [1, 2, 4, 8, 16, 32, 60, 60, 60]
    assert gauge("shockslurm_outage_active", "slurm") == 1           # one outage, still on
    assert gauge("shockslurm_outages_total", "slurm") == 1
    assert b.log == []                                           # nothing done on stale state
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "no actions" in errors[0].getMessage()
    b.down = False
    assert runner.attempt() is None and runner.attempt() is None
    back = [r.getMessage() for r in caplog.records if "answers again" in r.getMessage()]
    assert back == ["Slurm answers again after a 243.0 s outage; rounds resume"]
    assert runner.outages == {"slurm": 1, "store": 0}
    assert gauge("shockslurm_outage_active", "slurm") == 0
    assert (gauge("shockslurm_outages_total", "slurm"), gauge("shockslurm_outages_total",
                                                              "store")) == (1, 0)


def test_an_action_that_finds_the_controller_down_ends_the_round(engine):
    class Down(Backend):
        def run(self, argv):
            self.log.append(tuple(argv))
            return CommandResult(tuple(argv), 1, "", "scontrol: error: Unable to contact slurm "
                                 "controller (connect failure)", 0.0)
    b = Down([job(1, gpus=8), job(2, gpus=8)])
    runner = DaemonRunner(daemon(engine, b, policy="fifo"))
    assert runner.attempt() == 1.0 and runner.slurm_down_since is not None
    assert len(b.log) == 1            # the first failing call ends the round


def test_store_down_takes_no_action_logs_once_and_recovers(engine, tmp_path, caplog):
    b = Backend([running(1), job(2, gpus=8), job(3, gpus=8)])
    d = daemon(engine, b)
    runner = DaemonRunner(d)
    good = d.journal.engine
    dead = open_store(f"sqlite:///{tmp_path / 'gone.db'}", create=True)
    (tmp_path / "gone.db").unlink()
    (tmp_path / "gone.db").mkdir()                 # a directory: every write fails
    dead.dispose()
    d.journal.engine = dead
    caplog.set_level(logging.DEBUG, logger="shockslurm.daemon")
    for _ in range(3):
        assert runner.attempt() == d.loop.round_s  # retried every round
    assert b.log == []                             # never acts on state it cannot record
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "store is unavailable" in errors[0].getMessage()
    d.journal.engine = good
    assert runner.attempt() is None
    assert b.log, "acts again once the store records"
    assert sum("writable again" in r.getMessage() for r in caplog.records) == 1
    assert all(rc is not None for _a, rc, _e in intents(engine))


def test_store_down_between_intents_stops_before_the_next_call(engine):
    late = replace(running(1), submit_time=5000.0)       # fifo prefers the four others
    b = Backend([late] + [job(k, gpus=8) for k in (2, 3, 4, 5)])
    d = daemon(engine, b)
    journal = d.cluster.journal
    real = journal.intent
    calls = []

    def intent(step):
        calls.append(step.action)
        if step.action == "requeuehold":
            from sqlalchemy.exc import OperationalError
            raise OperationalError("INSERT", {}, Exception("database is locked"))
        return real(step)
    journal.intent = intent

    class Stop1:
        name = "stop1"

        def allocate(self, snapshot):
            return RoundPlan(frozenset({2, 3, 4, 5}))
    d.loop.policy = Stop1()
    runner = DaemonRunner(d)
    assert runner.attempt() == d.loop.round_s
    assert [a[1] for a in b.log] == ["--signal=USR1"]       # the requeuehold never ran
    journal.intent = real
    b.log.clear()
    assert runner.attempt() is None                         # the stop resumes, no 2nd USR1
    assert [a[1] for a in b.log][:1] == ["requeuehold"]


# ------------------------------------------------------------------ impossible requests
def test_impossible_request_is_never_planned_and_flagged_once(engine, caplog):
    big = job(5, gpus=16)                           # gres gpu:16 on 8-GPU nodes
    released = replace(job(6, gpus=16), priority=1, reason="Resources")
    b = Backend([big, released, job(7, gpus=8)])
    d = daemon(engine, b)
    caplog.set_level(logging.WARNING)
    for k in range(3):
        snap = d.cluster.observe(NOW + 10 * k)
        assert sorted(v.job_id for v in snap.jobs) == [7]
        d.cluster.enact(RoundPlan(frozenset({7})), snap)
    assert not any(a[1] == "release" and ("5" in a[2] or "6" in a[2]) for a in b.log)
    assert ("scontrol", "uhold", "6") in b.log         # a released one is held again
    assert sum("never scheduled" in r.getMessage() for r in caplog.records) == 2
    with Session(engine) as s:
        events = s.scalars(select(JobEvent).where(JobEvent.kind == "flagged")).all()
    assert len(events) == 2
    assert all("impossible request" in json.loads(e.detail)["reason"] for e in events)


# ------------------------------------------------------------------ ends recorded each round
def test_ends_are_recorded_each_round_and_give_live_runs_a_rho(engine):
    """A job that COMPLETED gets a `completed` event (Slurm's end time, the declared exclusive
    run time) at the next round, a failed one `finished`, one Slurm forgot `vanished`; a stop
    under way (exited on its USR1, about to be requeued) gets none; and the stored live run
    then has a rho per completed job."""
    from shockslurm.ops.runs import from_store

    b = Backend([running(1, gpus=4), running(2, gpus=2), running(3, gpus=2),
                 running(5, gpus=8)], exit_on_usr1=True)
    d = daemon(engine, b, metrics=DaemonMetrics())     # as the daemon runs: journal wrapped
    round_(d, {1, 2, 3, 5})
    b._jobs = [replace(j, state=JobState.COMPLETED, end_time=NOW + 7) if j.job_id == 1 else
               replace(j, state=JobState.FAILED, end_time=NOW + 8) if j.job_id == 2 else j
               for j in b._jobs if j.job_id != 3]
    round_(d, {5}, now=NOW + 10)
    with Session(engine) as s:
        events = {(s.get(Job, e.job_pk).job_id, e.kind): e for e in s.scalars(select(JobEvent))}
    assert set(events) == {(1, "completed"), (2, "finished"), (3, "vanished")}
    assert events[(1, "completed")].time_s == NOW + 7
    detail = json.loads(events[(1, "completed")].detail)
    assert detail["state"] == "COMPLETED" and detail["exclusive_runtime_s"] > 0
    assert json.loads(events[(2, "finished")].detail)["state"] == "FAILED"
    round_(d, {5}, now=NOW + 20)                  # recorded once
    with Session(engine) as s:
        assert len(s.scalars(select(JobEvent)).all()) == 3
    # a stop under way: job 5 exits on its USR1 (COMPLETED) and the daemon dies before the
    # requeuehold; the next incarnation resumes the stop, and records no end for it
    b.kill_on = "requeuehold"
    with pytest.raises(Killed):
        round_(d, set(), now=NOW + 30)
    b.kill_on = None
    d2 = daemon(engine, b)
    d2.reconcile(now=NOW + 35)
    round_(d2, set(), now=NOW + 40)
    round_(d2, set(), now=NOW + 50)
    with Session(engine) as s:
        assert not [(e.kind, e.detail) for e in s.scalars(select(JobEvent))
                    if s.get(Job, e.job_pk).job_id == 5]
    with Session(engine) as s:
        run_id = s.scalar(select(Job.run_id).where(Job.job_id == 1))
        series = from_store(s, run_id)
    assert len(series.rho) == 1 and series.rho[0] > 0
