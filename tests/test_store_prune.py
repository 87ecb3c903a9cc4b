"""`shockslurm db prune` (store/retention.py) on SQLite and PostgreSQL: old throughput samples
and progress events go, each job's latest progress event and latest sample per batch size stay,
so what a round reads (`read_reports`) is the same before and after; epochs, checkpoints and
batch-size changes are never touched; a dry run deletes nothing."""

from __future__ import annotations

import time

from click.testing import CliRunner
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from shockslurm.cli.main import cli
from shockslurm.reports.reported_progress import read_reports
from shockslurm.store import open_store
from shockslurm.store import repository as repo
from shockslurm.store import retention
from shockslurm.store.models import BatchSizeChange, Checkpoint, JobEvent, ThroughputSample

from .conftest import make_spec
from .test_store import store_url  # noqa: F401 (a fixture: SQLite and PostgreSQL)

DAY = 86_400.0


def _fill(url: str, now: float) -> list[int]:
    """Two jobs reporting every hour for the ten days before `now` (the first at two batch
    sizes; each half an hour off the hour, so a cutoff taken up to 30 minutes after `now`
    counts the same rows), with epochs, a checkpoint and a batch-size change each; returns
    their store keys. (`now` was once the module's import time: a test that ran more than 30
    minutes after collection, in a long CI run, counted two rows more.)"""
    engine = open_store(url, create=True)
    pks = []
    try:
        with Session(engine) as s, s.begin():
            run = repo.add_run(s, policy="shocksub", kind="registry", cluster="c")
            for job_id in (1, 2):
                job = repo.add_job_spec(s, run, make_spec(job_id))
                s.flush()
                pks.append(job.id)
                for hour in range(240):
                    t = now - 10 * DAY + hour * 3600.0 + 1800.0     # off the cutoffs
                    bs = 64 if job_id == 1 and hour >= 200 else 32
                    repo.add_throughput_sample(s, job.id, time_s=t, samples_per_s=100.0 + hour,
                                               batch_size=bs, gpus=2)
                    repo.add_job_event(s, job, time_s=t, kind="progress",
                                       detail=f'{{"epoch_progress": {hour / 10}}}')
                    if hour % 10 == 0:
                        repo.add_job_event(s, job, time_s=t, kind="epoch_done",
                                           detail=f'{{"epoch": {hour // 10}, "batch_size": {bs}}}')
                repo.add_checkpoint(s, job.id, time_s=now - 9 * DAY, path="/c", step=1, ok=True)
                repo.add_batch_size_change(s, job.id, time_s=now - 9 * DAY, old=32, new=64)
    finally:
        engine.dispose()
    return pks


def _counts(url: str) -> dict[str, int]:
    engine = open_store(url)
    try:
        with Session(engine) as s:
            def n(model, *where) -> int:
                return int(s.scalar(select(func.count()).select_from(model).where(*where)) or 0)
            return {"samples": n(ThroughputSample),
                    "progress": n(JobEvent, JobEvent.kind == "progress"),
                    "epochs": n(JobEvent, JobEvent.kind == "epoch_done"),
                    "checkpoints": n(Checkpoint), "changes": n(BatchSizeChange)}
    finally:
        engine.dispose()


def _reports(url: str, pks: list[int]):
    engine = open_store(url)
    try:
        with Session(engine) as s:
            return read_reports(s, pks)
    finally:
        engine.dispose()


def test_prune_keeps_what_the_daemon_and_status_read(store_url: str) -> None:
    now = time.time()
    pks = _fill(store_url, now)
    before, reports = _counts(store_url), _reports(store_url, pks)
    dry = CliRunner().invoke(cli, ["db", "prune", "--db", store_url, "--older-than", "2",
                                   "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert _counts(store_url) == before
    engine = open_store(store_url)
    try:
        # rows older than 2 days: hours 0..191 of 240; kept of those: job 1's latest sample at
        # batch size 32 (hour 199) is newer anyway, so nothing old is kept but by the cutoff
        assert retention.prune_reports(engine, now - 2 * DAY, dry_run=True) == \
            retention.Pruned(throughput_samples=2 * 192, progress_events=2 * 192)
        retention.BATCH_ROWS = 50                  # several batches
        pruned = retention.prune_reports(engine, now - 2 * DAY)
    finally:
        retention.BATCH_ROWS = 5_000
        engine.dispose()
    assert pruned == retention.Pruned(throughput_samples=384, progress_events=384)
    assert "would delete 384 throughput samples and 384 progress events" in dry.output
    after = _counts(store_url)
    assert after == {**before, "samples": before["samples"] - 384,
                     "progress": before["progress"] - 384}
    assert _reports(store_url, pks) == reports


def test_each_jobs_latest_sample_per_batch_size_and_progress_stay(store_url: str) -> None:
    pks = _fill(store_url, time.time())
    reports = _reports(store_url, pks)
    result = CliRunner().invoke(cli, ["db", "prune", "--db", store_url, "--older-than", "0.04"])
    assert result.exit_code == 0, result.output
    engine = open_store(store_url)
    try:
        with Session(engine) as s:
            kept = sorted((r.job_pk, r.batch_size) for r in s.scalars(select(ThroughputSample)))
            progress = sorted(e.job_pk for e in s.scalars(
                select(JobEvent).where(JobEvent.kind == "progress")))
    finally:
        engine.dispose()
    assert kept == sorted([(pks[0], 32), (pks[0], 64), (pks[1], 32)])
    assert progress == sorted(pks)
    assert _reports(store_url, pks) == reports
    again = CliRunner().invoke(cli, ["db", "prune", "--db", store_url, "--older-than", "0.04"])
    assert "deleted 0 throughput samples and 0 progress events" in again.output


def test_prune_refuses_a_missing_store_and_a_bad_age(tmp_path) -> None:
    missing = CliRunner().invoke(cli, ["db", "prune", "--db", str(tmp_path / "none.db"),
                                       "--older-than", "30"])
    assert missing.exit_code == 1 and "Error:" in missing.output
    assert not (tmp_path / "none.db").exists()
    for bad in ("0", "nan", "-1", "1e9"):
        out = CliRunner().invoke(cli, ["db", "prune", "--db", str(tmp_path / "s.db"),
                                       "--older-than", bad])
        assert out.exit_code == 2 and "--older-than" in out.output, (bad, out.output)


def test_prune_takes_the_store_from_the_daemons_configuration(tmp_path, monkeypatch) -> None:
    """Without --db, the daemon's configuration names the store (`--config`, as the systemd
    timer runs it); with neither, a usage error."""
    db = tmp_path / "s.db"
    _fill(str(db), time.time())
    config = tmp_path / "d.toml"
    config.write_text(f'[daemon]\ndb = "{db}"\n')
    monkeypatch.delenv("SHOCKSLURM_CONFIG", raising=False)
    monkeypatch.delenv("SHOCKSLURM_DB", raising=False)
    out = CliRunner().invoke(cli, ["db", "prune", "--config", str(config), "--older-than", "2"])
    assert out.exit_code == 0 and "deleted 384 throughput samples" in out.output, out.output
    monkeypatch.setattr("shockslurm.siteconfig.DEFAULT_PATH", tmp_path / "none.toml")
    bare = CliRunner().invoke(cli, ["db", "prune", "--older-than", "2"])
    assert bare.exit_code == 2 and "give --db URL" in bare.output, bare.output


def test_the_prune_timer_runs_the_command_as_documented() -> None:
    from .conftest import REPO
    unit = (REPO / "contrib" / "systemd" / "shockslurm-prune.service").read_text()
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    args = exec_start.split("shockslurm ", 1)[1].split()
    assert args[:2] == ["db", "prune"]
    result = CliRunner().invoke(cli, [*args, "--help"])
    assert result.exit_code == 0, result.output
    assert "OnCalendar=daily" in (REPO / "contrib" / "systemd" /
                                  "shockslurm-prune.timer").read_text()
