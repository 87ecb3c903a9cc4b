"""The SQL store on both backends: SQLite (a temporary file) and the local PostgreSQL.

PostgreSQL tests run in a fresh schema each (`search_path` set through the URL), dropped
afterwards, so they never touch `public`. They skip, with the reason printed, only when no
server answers at SHOCKSLURM_TEST_PG (default postgresql+psycopg://postgres@127.0.0.1:5432/test).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import stat
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from click.testing import CliRunner
from sqlalchemy import insert, inspect, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from shockslurm.cli.main import cli
from shockslurm.store import StoreError, current_revision, head_revision, make_engine, open_store
from shockslurm.store import repository as repo
from shockslurm.store.ddl import generate_ddl
from shockslurm.store.database import alembic_config, upgrade
from shockslurm.store.models import (Base, BatchSizeChange, Checkpoint, EnactmentIntent, Job,
                                     JobEvent, PlanEntry, Round, Run, ThroughputSample)

from .conftest import REPO, make_spec, skip_unless_required

PG_URL = os.environ.get("SHOCKSLURM_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
WRITERS, SAMPLES_EACH = 8, 200


def _pg_reason() -> str | None:
    """None when the PostgreSQL server answers, else why not."""
    import psycopg
    url = make_url(PG_URL)
    try:
        psycopg.connect(host=url.host, port=url.port or 5432, user=url.username,
                        dbname=url.database, connect_timeout=3).close()
    except psycopg.Error as exc:
        return f"no PostgreSQL at {PG_URL}: {' '.join(str(exc).split())}"
    return None


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty store URL, isolated per test."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
        return
    reason = _pg_reason()
    if reason is not None:
        print(reason)
        skip_unless_required(reason)
    schema = f"t_{uuid.uuid4().hex[:12]}"
    admin = make_engine(PG_URL)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))  # generated name, not user input
    try:
        yield f"{PG_URL}?options=-csearch_path%3D{schema}"
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture
def engine(store_url: str):
    eng = open_store(store_url, create=True)
    yield eng
    eng.dispose()


def _run_and_job(session: Session) -> tuple[Run, Job]:
    run = repo.add_run(session, policy="shockwave", config={"gpus": 8})
    job = repo.add_job_spec(session, run, make_spec(7, schedule=[32, 64], arrival=12.5),
                            owner="alice")
    return run, job


@pytest.mark.parametrize("timeout_s, user_ms, idle_s", [(30.0, "30000", "30"),
                                                         (0.3, "2000", "1")])
def test_a_postgresql_connection_gives_up_on_a_server_gone_from_the_network(
        timeout_s: float, user_ms: str, idle_s: str) -> None:
    """libpq is given a TCP user timeout and keepalives from the store's timeout: a server that
    drops off the network ends a statement under way (it waited for the kernel's
    retransmissions, some 15 minutes: the statement timeout is the server's own), and an idle
    connection's end is noticed. The store's engine had neither; only the leader lock's had
    keepalives."""
    reason = _pg_reason()
    if reason is not None:
        skip_unless_required(reason)
    engine = make_engine(PG_URL, timeout_s=timeout_s)
    try:
        with engine.connect() as conn:
            params = conn.connection.dbapi_connection.info.get_parameters()
            assert conn.execute(text("SHOW statement_timeout")).scalar() in (
                f"{int(timeout_s * 1000)}ms", f"{int(timeout_s)}s")
    finally:
        engine.dispose()
    assert params["tcp_user_timeout"] == user_ms and params["keepalives"] == "1", params
    assert params["keepalives_idle"] == idle_s and params["keepalives_count"] == "3", params


def test_a_store_urls_own_tcp_settings_win() -> None:
    from shockslurm.store.database import postgresql_timeouts
    url = make_url("postgresql+psycopg://u@h/d?tcp_user_timeout=90000&keepalives_idle=60")
    args = postgresql_timeouts(url, 5.0)
    assert "tcp_user_timeout" not in args and "keepalives_idle" not in args
    assert args["keepalives"] == 1 and args["options"].endswith("-c statement_timeout=5000")


def test_round_trip_every_record(engine) -> None:
    with Session(engine) as s, s.begin():
        run, job = _run_and_job(s)
        assert repo.add_job_spec(s, run, make_spec(7, schedule=[32, 64], arrival=12.5)).id == job.id
        repo.add_job_event(s, job, time_s=12.5, kind="submitted", detail="sbatch")
        rnd = repo.record_round(s, run, index=0, time_s=120.0, policy="shockwave", solve_s=0.25,
                                plan={job: 2}, status="optimal", objective=float("nan"))
        intent = repo.add_enactment_intent(s, rnd, job, action="resume",
                                           argv=["scontrol", "resume", "7", "x'; DROP TABLE"])
        repo.finish_enactment_intent(s, intent, return_code=1, stderr="busy")
        repo.add_throughput_sample(s, job.id, time_s=130.0, samples_per_s=812.5, batch_size=64,
                                   gpus=2)
        repo.add_batch_size_change(s, job.id, time_s=140.0, old=32, new=64)
        repo.add_checkpoint(s, job.id, time_s=150.0, path="/ckpt/7/step100.pt", step=100, ok=True)
    with Session(engine) as s:
        run = s.scalars(select(Run)).one()
        assert (run.policy, run.kind, run.config) == ("shockwave", "sim", {"gpus": 8})
        assert run.started_at.tzinfo is not None or engine.dialect.name == "sqlite"
        job = s.scalars(select(Job)).one()
        assert (job.job_id, job.submit_s, job.owner, job.model, job.epochs, job.batch_sizes,
                job.gang_size) == (7, 12.5, "alice", "ResNet-18", 2, [32, 64], 1)
        ev = s.scalars(select(JobEvent)).one()
        assert (ev.job_pk, ev.kind, ev.detail) == (job.id, "submitted", "sbatch")
        rnd = s.scalars(select(Round)).one()
        assert (rnd.round_index, rnd.time_s, rnd.solve_s, rnd.status, rnd.objective) == (
            0, 120.0, 0.25, "optimal", None)
        pe = s.scalars(select(PlanEntry)).one()
        assert (pe.round_id, pe.job_pk, pe.gpus) == (rnd.id, job.id, 2)
        ei = s.scalars(select(EnactmentIntent)).one()
        assert ei.argv == ["scontrol", "resume", "7", "x'; DROP TABLE"]
        assert (ei.action, ei.return_code, ei.stderr) == ("resume", 1, "busy")
        assert ei.finished_at is not None and ei.created_at <= ei.finished_at
        ts = repo.throughput_history(s, job.id)
        assert [(x.time_s, x.samples_per_s, x.batch_size, x.gpus) for x in ts] == [
            (130.0, 812.5, 64, 2)]
        bc = s.scalars(select(BatchSizeChange)).one()
        assert (bc.time_s, bc.old_batch_size, bc.new_batch_size) == (140.0, 32, 64)
        ck = s.scalars(select(Checkpoint)).one()
        assert (ck.path, ck.step, ck.ok) == ("/ckpt/7/step100.pt", 100, True)


def test_migrations_match_models(engine) -> None:
    with engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []


def test_db_upgrade_twice_is_idempotent(store_url: str) -> None:
    runner = CliRunner()
    first = runner.invoke(cli, ["db", "upgrade", "--db", store_url])
    assert first.exit_code == 0, first.output
    assert f"to schema revision {head_revision()}" in first.output
    second = runner.invoke(cli, ["db", "upgrade", "--db", store_url])
    assert second.exit_code == 0, second.output
    assert "already at schema revision" in second.output
    eng = make_engine(store_url)
    assert current_revision(eng) == head_revision()
    eng.dispose()


def test_upgrade_from_0001_keeps_rows(store_url: str) -> None:
    eng = make_engine(store_url)
    try:
        assert upgrade(eng, "0001") == "0001"
        with Session(eng) as s, s.begin():   # Core inserts: the models have later columns
            run = repo.add_run(s, policy="shockwave", config={"gpus": 8})
            job_id = s.execute(insert(Job.__table__).values(
                run_id=run.id, job_id=7, submit_s=12.5, owner="alice", model="m", epochs=2,
                samples_per_epoch=10, batch_sizes=[32, 64], gang_size=1)).inserted_primary_key[0]
            repo.add_throughput_sample(s, job_id, time_s=1.0, samples_per_s=10.0, batch_size=32,
                                       gpus=1)
        with pytest.raises(StoreError, match="db upgrade"):
            open_store(store_url)
        assert upgrade(eng) == head_revision()
        with Session(eng) as s:
            assert (repo.count(s, Run), repo.count(s, Job), repo.count(s, ThroughputSample)) == (
                1, 1, 1)
        names = {ix["name"] for ix in inspect(eng).get_indexes("throughput_samples")}
        assert "ix_throughput_samples_job_pk_time_s" in names
        assert "report_key" in {c["name"] for c in inspect(eng).get_columns("jobs")}
        with Session(eng) as s:
            assert s.scalars(select(Job)).one().report_key is None
    finally:
        eng.dispose()


def test_round_idle_columns_from_0003(store_url: str) -> None:
    """0004 adds the rounds' idle GPU-seconds by cause: a round recorded before it reads NULL,
    a new one its values; a downgrade to 0003 drops them again."""
    eng = make_engine(store_url)
    try:
        assert upgrade(eng, "0003") == "0003"
        with Session(eng) as s, s.begin():
            run = repo.add_run(s, policy="fifo", config={})
            s.execute(insert(Round.__table__).values(run_id=run.id, round_index=0, time_s=1.0,
                                                     policy="fifo", solve_s=0.0))
        assert upgrade(eng) == head_revision()
        with Session(eng) as s, s.begin():
            run = s.scalars(select(Run)).one()
            repo.record_round(s, run, index=1, time_s=2.0, policy="fifo", solve_s=0.0, plan={},
                              idle_gpu_s={"switch": 12.5, "unplaceable": 0.0, "waiting": 3.0})
        with Session(eng) as s:
            rows = [(r.round_index, r.idle_switch_gpu_s, r.idle_unplaceable_gpu_s,
                     r.idle_waiting_gpu_s) for r in s.scalars(select(Round).order_by(
                         Round.round_index))]
        assert rows == [(0, None, None, None), (1, 12.5, 0.0, 3.0)]
        with eng.begin() as conn:
            command.downgrade(alembic_config(conn), "0003")
        assert "idle_switch_gpu_s" not in {c["name"] for c in inspect(eng).get_columns("rounds")}
    finally:
        eng.dispose()


def test_newer_schema_is_refused(engine, store_url: str) -> None:
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = :v"), {"v": "9999_future"})
    with pytest.raises(StoreError, match="newer than this shockslurm"):
        open_store(store_url)
    with pytest.raises(StoreError, match="newer than this shockslurm"):
        open_store(store_url, create=True)
    result = CliRunner().invoke(cli, ["db", "upgrade", "--db", store_url])
    assert result.exit_code != 0 and "newer than this shockslurm" in result.output


def test_simulate_records_the_run(store_url: str, tmp_path: Path) -> None:
    runner = CliRunner()
    trace = tmp_path / "w.jsonl"
    assert runner.invoke(cli, ["trace", "generate", "--jobs", "12", "--seed", "3",
                               "--out", str(trace)]).exit_code == 0
    result = runner.invoke(cli, ["simulate", "--trace", str(trace), "--gpus", "4", "--policy",
                                 "fifo,max_min_fairness", "--no-progress", "--db", store_url,
                                 "--json", str(tmp_path / "r.json")])
    assert result.exit_code == 0, result.output
    eng = open_store(store_url)
    try:
        with Session(eng) as s:
            runs = s.scalars(select(Run).order_by(Run.id)).all()
            assert [r.policy for r in runs] == ["fifo", "max_min_fairness"]
            assert repo.count(s, Job) == 24
            assert repo.count(s, Round) > 0 and repo.count(s, PlanEntry) > 0
            rounds = s.scalars(select(Round).where(Round.run_id == runs[0].id)
                               .order_by(Round.round_index)).all()
            assert [r.round_index for r in rounds] == list(range(len(rounds)))
            # every batch-size change the simulation made is a row (the workload adapts)
            changes = sum(r["batch_size_changes"]
                          for r in json.loads((tmp_path / "r.json").read_text()))
            assert changes > 0 and repo.count(s, BatchSizeChange) == changes
            assert all(c.old_batch_size != c.new_batch_size
                       for c in s.scalars(select(BatchSizeChange)))
    finally:
        eng.dispose()


@pytest.mark.parametrize("url, message", [
    ("postgresql+psycopg://postgres@127.0.0.1:1/test", "cannot reach the store"),
    ("mysql://root@127.0.0.1/x", "unsupported store"),
    ("postgresql+nosuchdriver://postgres@127.0.0.1/test", "cannot use the store URL"),
])
def test_bad_or_unreachable_url(url: str, message: str) -> None:
    with pytest.raises(StoreError, match=message):
        open_store(url)
    result = CliRunner().invoke(cli, ["db", "upgrade", "--db", url])
    assert result.exit_code != 0 and message in result.output


def test_read_only_sqlite_file(tmp_path: Path) -> None:
    path = tmp_path / "ro.db"
    open_store(str(path), create=True).dispose()
    path.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
    try:
        with pytest.raises(StoreError, match="read-only"):
            open_store(str(path))
        result = CliRunner().invoke(cli, ["db", "upgrade", "--db", f"sqlite:///{path}"])
        assert result.exit_code != 0 and "read-only" in result.output
    finally:
        path.chmod(stat.S_IRUSR | stat.S_IWUSR)


def test_missing_directory_sqlite(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="does not exist"):
        open_store(str(tmp_path / "nope" / "s.db"), create=True)


def _writer(url: str, job_pk: int, writer: int) -> int:
    """One writer process: SAMPLES_EACH samples, each in its own transaction (as reports come)."""
    eng = make_engine(url)
    try:
        for i in range(SAMPLES_EACH):
            with Session(eng) as s, s.begin():
                repo.add_throughput_sample(s, job_pk, time_s=writer * 1e6 + i, samples_per_s=1.0,
                                           batch_size=32, gpus=writer + 1)
    finally:
        eng.dispose()
    return SAMPLES_EACH


def test_concurrent_writers_and_reader(engine, store_url: str) -> None:
    with Session(engine) as s, s.begin():
        _, job = _run_and_job(s)
        job_pk = job.id
    ctx = mp.get_context("spawn")
    seen: list[int] = []
    with ctx.Pool(WRITERS) as pool:
        pending = [pool.apply_async(_writer, (store_url, job_pk, w)) for w in range(WRITERS)]
        deadline = time.monotonic() + 240
        while not all(p.ready() for p in pending):
            assert time.monotonic() < deadline, "writers did not finish in time"
            with Session(engine) as s:
                seen.append(repo.count(s, ThroughputSample))
            time.sleep(0.02)
        written = sum(p.get() for p in pending)  # re-raises any writer's error
    assert seen == sorted(seen), "the reader saw rows disappear"
    with Session(engine) as s:
        assert repo.count(s, ThroughputSample) == written == WRITERS * SAMPLES_EACH
        per_writer = s.execute(select(ThroughputSample.gpus, ThroughputSample.time_s)).all()
    assert len(set(per_writer)) == WRITERS * SAMPLES_EACH


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
def test_frozen_ddl_matches_models(dialect: str) -> None:
    frozen = (REPO / "sql" / f"schema-{dialect}.sql").read_text()
    assert frozen == generate_ddl(dialect), (
        f"sql/schema-{dialect}.sql is stale: run `shockslurm db ddl --dialect {dialect} > "
        f"sql/schema-{dialect}.sql`")
