"""The daemon's progress from the training reports in the store (`ReportedProgress`): reported
epochs, batch size, per-epoch batch sizes and throughput reach the JobView in one query per round,
a job without reports falls back to the run-time estimate, the spool is ingested each round, and
the Shockwave forecast moves with a reported batch-size change."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy import event
from sqlalchemy.orm import Session

from shockslurm.daemon import build_daemon, parse_config
from shockslurm.forecast import ForecastState, forecast
from shockslurm.reports.reported_progress import EXTRAPOLATE_AT_MOST_S, ReportedProgress
from shockslurm.live.cluster import SlurmCluster
from shockslurm.live.progress_source import RunTimeProgress
from shockslurm.slurm.types import JobState
from shockslurm.store import open_store
from shockslurm.store import repository as repo
from shockslurm.store.models import JobEvent
from shockslurm.train.records import derive_key
from shockslurm.train.reports import Reporter, SpoolSink

from .test_enact import job
from .test_live import FakeBackend
from .test_store import store_url  # noqa: F401  (SQLite, and PostgreSQL when it answers)

SPEC = {"model": "mnist-like", "epochs": 8, "samples_per_epoch": 2048,
        "batch_sizes": [32, 64, 128], "batch_size": 32, "epoch_seconds": 10.0}
T0 = 1.7e9
SECRET = "ab" * 16        # every test job's report secret


def live_job(job_id: int, state: JobState = JobState.RUNNING):
    comment = "shock:spec=" + json.dumps(SPEC, separators=(",", ":")) + ";shock:managed"
    return replace(job(job_id, state), comment=comment, start_time=985.0)   # 15 s run by the first observe


@pytest.fixture
def store(store_url):  # noqa: F811
    engine = open_store(store_url, create=True)
    yield engine
    engine.dispose()


def register(engine, job_id: int) -> int:
    with Session(engine) as s, s.begin():
        row = repo.register_submitted_job(s, "slurm", job_id=job_id,
                                          submit_s=1000.0 + job_id + 0.5, model="mnist-like",
                                          epochs=8, samples_per_epoch=2048,
                                          batch_sizes=[32, 64, 128], gang_size=2,
                                          report_key=derive_key(SECRET))
        return row.id


def report(engine, pk: int, *, epochs: list[int], changes: list[tuple[int, int]],
           position: float | None, sample: tuple[float, int] | None) -> None:
    """epoch_done events with their batch sizes, batch-size changes, a progress event and a
    throughput sample (samples/s, batch size), in time order."""
    t = T0
    with Session(engine) as s, s.begin():
        for e, bs in enumerate(epochs):
            t += 10
            s.add(JobEvent(job_pk=pk, time_s=t, kind="epoch_done",
                           detail=json.dumps({"epoch": e, "step": 64 * (e + 1),
                                              "batch_size": bs})))
        for old, new in changes:
            t += 1
            repo.add_batch_size_change(s, pk, time_s=t, old=old, new=new)
        if position is not None:
            t += 1
            s.add(JobEvent(job_pk=pk, time_s=t, kind="progress",
                           detail=json.dumps({"epoch_progress": position})))
        if sample is not None:
            repo.add_throughput_sample(s, pk, time_s=t, samples_per_s=sample[0],
                                       batch_size=sample[1], gpus=2)


def count_selects(engine):
    seen: list[str] = []

    def before(conn, cursor, statement, *args):
        if statement.lstrip().upper().startswith("SELECT"):
            seen.append(statement)
    event.listen(engine, "before_cursor_execute", before)
    return seen


def test_reports_give_epochs_batch_size_history_and_throughput(store):
    pk = register(store, 1)
    register(store, 2)                     # registered, but it has reported nothing yet
    report(store, pk, epochs=[32, 32, 64], changes=[(32, 64), (64, 128)], position=3.5,
           sample=(1280.0, 128))
    source = ReportedProgress(store, cluster="slurm")
    cluster = SlurmCluster(FakeBackend([live_job(1), live_job(2), live_job(3)]),
                           progress_source=source, sleep=lambda s: None)
    snap = cluster.observe(1000.0)
    v = snap.job(1)
    assert v.epochs_done == 3.5 and v.batch_size == 128
    assert v.observed_batch_sizes == (32, 32, 64)
    assert v.iterations_per_epoch == 16 and v.iterations_per_s == pytest.approx(10.0)
    assert v.remaining_iterations == pytest.approx((8 - 3.5) * 16)
    assert cluster.jobs[1].progress.source == "reports"
    # no reports (2) or not registered at all (3): the run-time estimate, spec batch size
    for jid in (2, 3):
        w = snap.job(jid)
        expected = RunTimeProgress().progress(cluster.jobs[jid].slurm, cluster.jobs[jid].spec,
                                              cluster.jobs[jid].run_time_s, 10.0)
        assert (w.epochs_done, w.batch_size) == (expected.epochs_done, 32)
        assert w.epochs_done == pytest.approx(1.5)     # 15 s running / 10 s an epoch
        assert w.iterations_per_s == pytest.approx(64 / 10.0)   # the spec's throughput
        assert w.observed_batch_sizes == (32,)
        assert cluster.jobs[jid].progress.source == "runtime"


def test_an_epoch_stopped_on_its_last_step_counts_at_the_current_batch_size(store):
    """The job stopped on the last step of epoch 2 (size 64): its position says 3.0, but epoch
    2 was never closed (no epoch_done; the helper closes it after the resume). That epoch ran at
    the size the job reports (64), not at the last closed epoch's (32)."""
    pk = register(store, 1)
    report(store, pk, epochs=[32, 32], changes=[(32, 64)], position=3.0, sample=(640.0, 64))
    source = ReportedProgress(store, cluster="slurm")
    cluster = SlurmCluster(FakeBackend([live_job(1)]), progress_source=source,
                           sleep=lambda s: None)
    v = cluster.observe(1000.0).job(1)
    assert (v.epochs_done, v.batch_size, v.observed_batch_sizes) == (3.0, 64, (32, 32, 64))


def test_one_query_per_round_for_all_jobs(store):
    pks = [register(store, j) for j in range(1, 7)]
    for pk in pks:
        report(store, pk, epochs=[32, 32], changes=[(32, 64)], position=2.25, sample=(640.0, 64))
    source = ReportedProgress(store, cluster="slurm")
    cluster = SlurmCluster(FakeBackend([live_job(j) for j in range(1, 7)]),
                           progress_source=source, sleep=lambda s: None)
    cluster.observe(1000.0)                 # first round: the registrations are looked up too
    seen = count_selects(store)
    snap = cluster.observe(1010.0)
    assert len(seen) == 1, seen             # epochs, positions, samples, changes: one UNION ALL
    assert all(v.batch_size == 64 and v.epochs_done == 2.25 for v in snap.jobs)
    assert source.queries == 2


def test_progress_is_kept_short_of_the_end_and_stale_positions_ignored(store):
    pk = register(store, 1)
    # 8 epochs reported done (the trainer ran more epochs than declared): one iteration short
    report(store, pk, epochs=[32] * 8, changes=[], position=1.0, sample=None)
    cluster = SlurmCluster(FakeBackend([live_job(1)]),
                           progress_source=ReportedProgress(store, cluster="slurm"),
                           sleep=lambda s: None)
    v = cluster.observe(1000.0).job(1)
    assert v.epochs_done == pytest.approx(8 - 1 / 64)
    assert len(v.observed_batch_sizes) == 7 and v.remaining_iterations >= 1


def test_unreadable_store_falls_back_to_run_time(tmp_path, caplog):
    from shockslurm.store.database import make_engine

    engine = make_engine(f"sqlite:///{tmp_path / 'empty.db'}")   # no tables at all
    cluster = SlurmCluster(FakeBackend([live_job(1)]),
                           progress_source=ReportedProgress(engine, cluster="slurm"),
                           sleep=lambda s: None)
    with caplog.at_level(logging.WARNING, logger="shockslurm.daemon"):
        v = cluster.observe(1000.0).job(1)
    assert v.batch_size == 32 and v.epochs_done == pytest.approx(1.5)
    assert "could not read training reports" in caplog.text
    engine.dispose()


def test_forecast_moves_with_a_reported_batch_size_change(store):
    changed, steady = register(store, 1), register(store, 2)
    report(store, changed, epochs=[32, 32, 64], changes=[(32, 64), (64, 128)], position=3.5,
           sample=(640.0, 128))
    report(store, steady, epochs=[32, 32, 32], changes=[], position=3.5, sample=(640.0, 32))
    cluster = SlurmCluster(FakeBackend([live_job(1), live_job(2), live_job(3)]),
                           progress_source=ReportedProgress(store, cluster="slurm"),
                           sleep=lambda s: None)
    snap = cluster.observe(1000.0)
    a, b = snap.job(1), snap.job(2)
    assert (a.batch_size, b.batch_size) == (128, 32)
    fa, fb = forecast(a, ForecastState(1)), forecast(b, ForecastState(2))
    # same position and samples/s; the job that grew its batch size does fewer, faster
    # iterations per epoch at 64 and 128 in the forecaster's throughput model: less time left
    assert fa.epochs_done == fb.epochs_done == 3
    assert fa.remaining_s != pytest.approx(fb.remaining_s)
    assert fa.remaining_s < fb.remaining_s
    # and without reports (the run-time view) the forecast is different again
    fc = forecast(snap.job(3), ForecastState(3))
    assert fc.epochs_done == 1 and fc.remaining_s != pytest.approx(fa.remaining_s)


def test_daemon_ingests_the_spool_each_round(tmp_path, store, caplog):
    pk = register(store, 1)
    spool = tmp_path / "spool"
    rep = Reporter(SpoolSink(spool), cluster="slurm", job_id=1, min_interval_s=0.0,
                   clock=lambda: T0, secret=SECRET)
    rep.epoch_done(0, 64, batch_size=32, epochs=8)
    rep.epoch_done(1, 128, batch_size=32, epochs=8)
    rep.batch_size_change(32, 64, epoch=2, step=128)
    rep.throughput(960.0, 64, gpus=2, epoch=2, epochs=8, step=144, step_in_epoch=16,
                   steps_per_epoch=32, epoch_progress=2.5)
    rep.close()
    (spool / "zz-garbage.json").write_text("{not json")
    cfg = parse_config({"daemon": {"round_seconds": 5, "grace_seconds": 0,
                                   "spool_dir": str(spool), "policy": "fifo"}})
    d = build_daemon(cfg, FakeBackend([live_job(1)]), engine=store)
    with caplog.at_level(logging.INFO, logger="shockslurm"):
        v = d.cluster.observe(1000.0).job(1)
    assert d.progress.ingested == 4 and "ingested 4 report(s)" in caplog.text
    assert not list(spool.glob("*.json"))
    assert (Path(f"{spool}.rejected") / "zz-garbage.json").exists()
    assert (v.epochs_done, v.batch_size, v.observed_batch_sizes) == (2.5, 64, (32, 32))
    assert v.iterations_per_s == pytest.approx(15.0)
    with Session(store) as s:
        assert [(x.samples_per_s, x.batch_size) for x in repo.throughput_history(s, pk)] == [
            (960.0, 64)]
        assert repo.count(s, JobEvent) == 3          # 2 epoch ends + 1 position


def test_daemon_without_store_or_spool_keeps_run_time_progress():
    cfg = parse_config({"daemon": {"spool_dir": "/nonexistent"}})
    d = build_daemon(cfg, FakeBackend([live_job(1)]))
    assert d.progress is None and isinstance(d.cluster.progress_source, RunTimeProgress)
    assert d.cluster.observe(1000.0).job(1).batch_size == 32


def test_a_running_jobs_position_is_carried_on_at_its_speed_for_a_capped_time(store):
    """The last progress report (1.25 epochs, 1 iteration/s, 64 iterations an epoch) is 4 s
    old: the job is at 1.25 + 4/64 epochs. A report 60 s old carries it 10 s at most
    (`EXTRAPOLATE_AT_MOST_S`: a hung job gains no more), and never past its epoch's last
    iteration (the next epoch may run at another batch size); a report from before the job's
    current start (an earlier run) is not carried; nor is a pending job's."""
    report(store, register(store, 1), epochs=[32], changes=[], position=1.25,
           sample=(32.0, 32))
    report(store, register(store, 2), epochs=[32], changes=[], position=1.95,
           sample=(32.0, 32))
    reported_at = T0 + 11          # the progress events' time (`report` above)
    source = ReportedProgress(store, cluster="slurm")

    def seen(job_id, now, **change):
        job = replace(live_job(job_id), **{"start_time": T0, **change})
        cluster = SlurmCluster(FakeBackend([job]), progress_source=source, sleep=lambda s: None)
        return cluster.observe(now).job(job_id).epochs_done

    assert seen(1, reported_at + 4) == pytest.approx(1.25 + 4 / 64)
    assert seen(1, reported_at + 60) == pytest.approx(1.25 + EXTRAPOLATE_AT_MOST_S / 64)
    assert seen(2, reported_at + 2) == pytest.approx(1.95 + 2 / 64)
    assert seen(2, reported_at + 9) == pytest.approx(2 - 1 / 64)      # its epoch's end
    assert seen(1, reported_at + 4, start_time=reported_at + 1) == 1.25
    assert seen(1, reported_at + 4, state=JobState.PENDING) == 1.25
