"""`shockslurm status` / `shocksub --status` without Slurm: hand-made SlurmJob records and a
SQLite store with training reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy.orm import Session

from shockslurm.cli import status as status_cli
from shockslurm.cli.main import cli
from shockslurm.cli.shocksub import main as shocksub
from shockslurm.forecast import dirichlet_remaining_time
from shockslurm.ops.status import format_duration, format_table, read_store, status_rows
from shockslurm.slurm.types import JobState, SlurmJob
from shockslurm.store import open_store
from shockslurm.store import repository as repo
from shockslurm.train.records import add_rows

NOW = 1_700_010_000.0
SUBMIT = 1_700_000_000.0
SPEC = ('shock:managed;shock:spec={"model":"ResNet-18","epochs":10,"samples_per_epoch":50000,'
        '"batch_sizes":[32,64],"batch_size":32,"epoch_seconds":100}')


def _job(job_id: int, *, state: JobState = JobState.RUNNING, gpus: int = 2,
         comment: str = SPEC, restarts: int = 0, priority: int = 1) -> SlurmJob:
    return SlurmJob(job_id=job_id, name=f"train-{job_id}", user="alice", partition="gpu",
                    state=state, state_flags=frozenset(), reason="None", priority=priority,
                    gpus_per_node=gpus, gpus_per_job=0, nodes=1, node_list="n1",
                    submit_time=SUBMIT, start_time=SUBMIT + 10, restart_count=restarts,
                    comment=comment)


JOBS = [_job(101, restarts=3),
        _job(102, state=JobState.PENDING, gpus=4, priority=0),
        _job(103, comment="unmanaged")]


@pytest.fixture()
def store(tmp_path: Path) -> str:
    """Job 101 registered and reporting (4 epochs done at bs 32, now at bs 64); 102 registered
    without reports; 101's id also appears as an old job with a reused id (ignored)."""
    url = str(tmp_path / "s.db")
    engine = open_store(url, create=True)
    with Session(engine) as s, s.begin():
        for job_id, gang in ((101, 2), (102, 4)):
            repo.register_submitted_job(s, "slurm", job_id=job_id, submit_s=SUBMIT + 1,
                                        model="ResNet-18", epochs=10, samples_per_epoch=50000,
                                        batch_sizes=[32, 64], gang_size=gang)
        old = repo.register_submitted_job(s, "slurm", job_id=101, submit_s=SUBMIT - 86400,
                                          model="old", epochs=99, samples_per_epoch=1,
                                          batch_sizes=[1], gang_size=1)
        pk = repo.registered_jobs(s, "slurm", {101: SUBMIT})[101].id
        for epoch in range(4):
            add_rows(s, {"kind": "epoch_done", "time_s": SUBMIT + 100 * (epoch + 1),
                         "epoch": epoch, "step": 100, "batch_size": 32, "epochs": 10}, pk)
        add_rows(s, {"kind": "throughput", "time_s": SUBMIT + 50, "samples_per_s": 500.0,
                     "batch_size": 32, "gpus": 2}, pk)
        add_rows(s, {"kind": "throughput", "time_s": SUBMIT + 450, "samples_per_s": 1000.0,
                     "batch_size": 64, "gpus": 2}, pk)
        add_rows(s, {"kind": "epoch_done", "time_s": SUBMIT, "epoch": 50, "step": 1}, old.id)
        live = repo.add_run(s, policy="shockwave", kind="live", cluster="slurm")
        job = repo.add_job(s, live, job_id=102, submit_s=SUBMIT, model="ResNet-18", epochs=10,
                           samples_per_epoch=50000, batch_sizes=[32, 64], gang_size=4)
        rnd = repo.record_round(s, live, index=3, time_s=SUBMIT + 5, policy="shockwave",
                                solve_s=0.1, plan={job: 4})
        intent = repo.add_enactment_intent(s, rnd, job, action="release",
                                           argv=["scontrol", "release", "102"])
        repo.finish_enactment_intent(s, intent, return_code=0)
    engine.dispose()
    return url


def test_rows_progress_forecast_and_rho(store: str) -> None:
    ours = [j for j in JOBS if j.managed]
    rows, _ = status_cli.collect(JOBS, store, "slurm", now=NOW)
    assert [r.job_id for r in rows] == [101, 102]          # the unmanaged job is not listed
    r1, r2 = rows
    assert (r1.epochs_done, r1.epochs, r1.gpus, r1.preempted) == (4, 10, 2, 3)
    # 4 epochs at bs 32 done, bs 64 now: 50 s/epoch at 64 (measured), 100 s at 32 (measured)
    after = dirichlet_remaining_time(10, 4, [32] * 4 + [64], {32: 100.0, 64: 50.0})
    in_progress = max(0.0, 50.0 - (NOW - (SUBMIT + 400)))   # running: time since last epoch end
    assert r1.remaining_s == pytest.approx(after + in_progress)
    assert r1.rho == pytest.approx((NOW - SUBMIT + r1.remaining_s) / (10 * 100.0))
    assert r1.spec_source == "comment"
    # no report: "-" everywhere the store is needed
    assert (r2.epochs_done, r2.remaining_s, r2.rho, r2.gpus) == (None, None, None, 4)
    cells = r2.cells()
    assert cells[6:9] == ["-", "-", "-"]
    table = format_table(rows).splitlines()
    assert table[0].split() == ["JOBID", "NAME", "USER", "STATE", "REASON", "GPUS", "PROGRESS",
                                "REMAINING", "RHO", "PREEMPTED", "REPORTED"]
    assert table[1].split()[:7] == ["101", "train-101", "alice", "RUNNING", "None", "2", "4/10"]
    # 101 last reported at SUBMIT + 450 (its bs-64 throughput), 9550 s before NOW
    assert table[1].split()[-3:] == ["3", "2h39m", "ago"]
    assert (r1.last_report_s, r1.last_report_age_s) == (SUBMIT + 450, 9550.0)
    assert table[2].split() == ["102", "train-102", "alice", "PENDING", "None", "4", "-", "-",
                                "-", "0", "-"]
    assert (r2.last_report_s, r2.last_report_age_s) == (None, None)
    # aligned: the text columns start, and the numeric ones end, where their headers do
    head = table[0]
    for row in table[1:]:
        for word in ("NAME", "USER", "STATE", "REASON"):
            cell = row[head.index(word):].split()[0]
            assert row.index(cell, head.index(word)) == head.index(word), (word, row)
        gpus_end = head.index("GPUS") + len("GPUS")
        assert row[:gpus_end].split()[-1] in {"2", "4"} and row[gpus_end] == " "
    assert ours[0].job_id == 101


@pytest.mark.parametrize("report", [
    {"kind": "batch_size_change", "old_batch_size": 32, "new_batch_size": 64},
    {"kind": "checkpoint", "path": "ck.pt", "step": 9, "ok": False},
    {"kind": "checkpoint", "path": "ck.pt", "step": 9, "ok": True},
    {"kind": "throughput", "samples_per_s": 900.0, "batch_size": 64, "gpus": 2,
     "epoch_progress": 4.5},
])
def test_reported_is_the_latest_report_of_any_kind(store: str, report: dict) -> None:
    engine = open_store(store)
    with Session(engine) as s, s.begin():
        pk = repo.registered_jobs(s, "slurm", {101: SUBMIT})[101].id
        add_rows(s, {**report, "time_s": NOW - 7}, pk)
    rows, _ = status_cli.collect(JOBS, store, "slurm", now=NOW)
    engine.dispose()
    assert rows[0].last_report_s == NOW - 7 and rows[0].cells()[-1] == "7s ago"


def test_without_store_everything_from_the_store_is_a_dash() -> None:
    rows, _ = status_cli.collect(JOBS, None, "slurm", now=NOW)
    assert all(r.epochs_done is None and r.rho is None for r in rows)


def test_spec_from_the_store_when_the_comment_has_none(store: str) -> None:
    job = _job(102, comment="shock:managed")
    engine = open_store(store)
    info = read_store(engine, "slurm", [job])
    engine.dispose()
    (row,) = status_rows([job], info, NOW)
    assert row.spec_source == "store" and row.epochs == 10


def test_a_stored_ladder_that_is_no_json_is_that_jobs_bad_spec(store: str) -> None:
    """A registration whose ladder is no JSON (edited by hand) made the whole status command
    fail with a JSONDecodeError traceback; now that job's spec is bad (the defaults are shown,
    as the daemon would use them) and every other row is as before."""
    import sqlite3

    with sqlite3.connect(store) as conn:
        conn.execute("UPDATE jobs SET batch_sizes = '{bad' WHERE job_id = 102")
    jobs = [_job(101), _job(102, comment="shock:managed")]
    engine = open_store(store)
    info = read_store(engine, "slurm", jobs)
    engine.dispose()
    good, bad = status_rows(jobs, info, NOW)
    assert good.epochs == 10 and good.epochs_done == 4
    assert bad.job_id == 102 and bad.epochs != 10


def test_finished_job_forecasts_zero(tmp_path: Path) -> None:
    from shockslurm.ops.status import StoreJob

    info = StoreJob(epochs_done=10, reported=True, observed=[32] * 10)
    (row,) = status_rows([_job(5)], {5: info}, NOW)
    assert row.remaining_s == 0.0 and row.epochs_done == 10


def test_status_command_table_and_json(store: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(status_cli, "read_slurm", lambda: list(JOBS))
    runner = CliRunner()
    result = runner.invoke(cli, ["status", "--db", store])
    assert result.exit_code == 0, result.output
    assert "4/10" in result.output and "103" not in result.output
    result = runner.invoke(cli, ["status", "--db", store, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert [d["job_id"] for d in data] == [101, 102]
    assert data[0]["epochs_done"] == 4 and data[0]["remaining_s"] > 0
    assert data[1]["epochs_done"] is None and data[1]["rho"] is None
    assert data[0]["last_report_s"] == SUBMIT + 450 and data[1]["last_report_s"] is None


def test_status_with_config(store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(status_cli, "read_slurm", lambda: list(JOBS))
    cfg = tmp_path / "d.toml"
    cfg.write_text(f'[daemon]\ndb = "{store}"\npartitions = ["other"]\n')
    result = CliRunner().invoke(cli, ["status", "--config", str(cfg)])
    assert result.exit_code == 0 and "no managed jobs" in result.output  # partition filter
    cfg.write_text(f'[daemon]\ndb = "{store}"\n')
    result = CliRunner().invoke(cli, ["status", "--config", str(cfg), "--json"])
    assert [d["epochs_done"] for d in json.loads(result.output)] == [4, None]


def test_status_finds_the_config_as_the_daemon_does(store: str, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """No --config: $SHOCKSLURM_CONFIG names the daemon's file, whose store is read."""
    monkeypatch.setattr(status_cli, "read_slurm", lambda: list(JOBS))
    cfg = tmp_path / "d.toml"
    cfg.write_text(f'[daemon]\ndb = "{store}"\n')
    monkeypatch.setenv("SHOCKSLURM_CONFIG", str(cfg))
    result = CliRunner().invoke(cli, ["status", "--json"])
    assert result.exit_code == 0, result.output
    assert [d["epochs_done"] for d in json.loads(result.output)] == [4, None]
    monkeypatch.setenv("SHOCKSLURM_CONFIG", str(tmp_path / "missing.toml"))
    result = CliRunner().invoke(cli, ["status"])
    assert result.exit_code == 1 and "missing.toml" in result.output


def test_shocksub_status(store: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(status_cli, "read_slurm", lambda: list(JOBS))
    runner = CliRunner()
    result = runner.invoke(shocksub, ["--status", "101", "--db", store])
    assert result.exit_code == 0, result.output
    assert "4/10" in result.output and "epoch_done" in result.output
    assert "recent intents: none" in result.output
    assert "epoch\": 50" not in result.output          # the old job with the reused id
    result = runner.invoke(shocksub, ["--status", "999"])
    assert result.exit_code == 1 and "not in Slurm's queue" in result.output
    result = runner.invoke(shocksub, ["--status", "102"])
    assert result.exit_code == 0 and "no store given" in result.output
    result = runner.invoke(shocksub, ["--status", "102", "--db", store])
    assert result.exit_code == 0, result.output
    assert "round 3 release  rc=0  scontrol release 102" in result.output


def test_a_job_name_cannot_forge_a_row_or_a_column() -> None:
    """A job named with a newline and a row of text showed as two jobs in the table (and NUL
    and terminal escapes reached the terminal); now each is shown escaped, one row a job."""
    from dataclasses import replace

    forged = "rec-run\n   99  forged  alice  RUNNING"
    jobs = [replace(_job(101), name=forged), replace(_job(102), name="x\x00\x1b[2J\u202eok")]
    rows, _ = status_cli.collect(jobs, None, "slurm", now=NOW)
    lines = format_table(rows).splitlines()
    assert len(lines) == 3, lines
    assert "rec-run\\n   99  forged" in lines[1] and lines[1].split()[0] == "101"
    assert "x\\x00\\x1b[2J\\u202eok" in lines[2]
    assert all(line.isprintable() for line in lines)
    assert rows[0].name == forged          # --json keeps the name as Slurm has it


def test_format_duration() -> None:
    assert [format_duration(x) for x in (None, 42.2, 310, 3 * 3600 + 125)] == [
        "-", "42s", "5m10s", "3h02m"]


def test_a_job_requeued_long_after_its_submission_counts_from_its_submission(tmp_path: Path
                                                                             ) -> None:
    """Slurm sets the submit time anew at each requeue: a job requeued an hour after it was
    submitted still finds its registration and reports, and its rho counts from the
    submission (the row is the one it had before the requeue). A registration of another
    user's job with the same id (Slurm reuses ids) is not taken."""
    url = str(tmp_path / "s.db")
    engine = open_store(url, create=True)
    with Session(engine) as s, s.begin():
        for job_id, owner in ((104, "alice"), (105, "bob")):
            reg = repo.register_submitted_job(s, "slurm", job_id=job_id, submit_s=SUBMIT + 1,
                                              model="ResNet-18", epochs=10,
                                              samples_per_epoch=50000, batch_sizes=[32, 64],
                                              gang_size=2, owner=owner)
            add_rows(s, {"kind": "throughput", "time_s": SUBMIT + 50, "samples_per_s": 500.0,
                         "batch_size": 32, "gpus": 2}, reg.id)
    engine.dispose()

    def view(job_id: int, submit: float, restarts: int) -> SlurmJob:
        job = _job(job_id, state=JobState.PENDING, comment="shock:managed", restarts=restarts,
                   priority=0)
        return SlurmJob(**{**job.__dict__, "submit_time": submit})

    (before,), _ = status_cli.collect([view(104, SUBMIT, 0)], url, "slurm", now=NOW)
    rows, _ = status_cli.collect([view(j, SUBMIT + 3600, 1) for j in (104, 105)], url, "slurm",
                                 now=NOW)
    mine, other = rows
    assert mine.spec_source == "store" and mine.last_report_s == SUBMIT + 50
    assert before.rho is not None and mine.rho == pytest.approx(before.rho, rel=1e-3)
    assert other.spec_source == "default" and other.last_report_s is None


@pytest.mark.parametrize("argv, shown", [("'scontrol rel'", "scontrol rel"),
                                         ("'[1, 2]'", "1 2")])
def test_a_stored_argv_edited_by_hand_is_shown_as_it_is(store: str, argv: str, shown: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """An intent's argv that is no JSON, or a list of numbers (a hand-edited SQLite file):
    `shocksub --status` failed with a JSONDecodeError or TypeError traceback; now the history
    shows the stored value."""
    import sqlite3

    with sqlite3.connect(store) as conn:
        conn.execute(f"UPDATE enactment_intents SET argv = {argv}")
    monkeypatch.setattr(status_cli, "read_slurm", lambda: list(JOBS))
    result = CliRunner().invoke(shocksub, ["--status", "102", "--db", store])
    assert result.exit_code == 0, result.output
    assert f"round 3 release  rc=0  {shown}" in result.output
