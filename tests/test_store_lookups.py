"""Revision 0005's indexes and the per-round lookups they serve: a round reads its own jobs'
latest reports and intents, never a table's whole history (a daemon runs for months; a job
reporting every 10 s made each round read its whole history: 0.4 s for 50 jobs after a day)."""

from __future__ import annotations

from sqlalchemy import inspect, text
from sqlalchemy.engine import Engine

from shockslurm.daemon.journal import StoreJournal
from shockslurm.reports.reported_progress import _reports_query
from shockslurm.store import head_revision, make_engine, open_store
from shockslurm.store.database import alembic_config, upgrade

from .test_store import store_url  # noqa: F401 (a fixture: SQLite and PostgreSQL)

NEW = {"job_events": "ix_job_events_job_pk_kind_id",
       "throughput_samples": "ix_throughput_samples_job_pk_id",
       "enactment_intents": "ix_enactment_intents_job_pk",
       "jobs": "ix_jobs_job_id"}


def _indexes(engine: Engine) -> set[str]:
    names: set[str] = set()
    for table in NEW:
        names |= {ix["name"] for ix in inspect(engine).get_indexes(table)}
    return names


def test_0005_adds_the_lookup_indexes_and_drops_them_on_downgrade(store_url: str) -> None:
    from alembic import command
    eng = make_engine(store_url)
    try:
        assert upgrade(eng, "0004") == "0004"
        assert not set(NEW.values()) & _indexes(eng)
        assert upgrade(eng) == head_revision() == "0005"
        assert set(NEW.values()) <= _indexes(eng)
        with eng.begin() as conn:
            command.downgrade(alembic_config(conn), "0004")
        assert not set(NEW.values()) & _indexes(eng)
    finally:
        eng.dispose()


def _plan(engine: Engine, query) -> list[str]:
    sql = query.compile(engine, compile_kwargs={"literal_binds": True})
    with engine.connect() as conn:
        return [str(row[-1]) for row in conn.execute(text(f"EXPLAIN QUERY PLAN {sql}"))]


def _scans(plan: list[str]) -> list[str]:
    """The steps that read a whole table (SQLite says SCAN; SEARCH is an index lookup)."""
    return [step for step in plan if step.startswith("SCAN")]


def test_a_rounds_report_read_seeks_each_jobs_latest_rows(tmp_path) -> None:
    engine = open_store(f"sqlite:///{tmp_path}/s.db", create=True)
    try:
        plan = _plan(engine, _reports_query([1, 2, 3]))
        assert _scans(plan) == [], plan
        assert any("ix_job_events_job_pk_kind_id" in step for step in plan), plan
        assert any("ix_throughput_samples_job_pk_id" in step for step in plan), plan
    finally:
        engine.dispose()


def test_the_stops_under_way_are_read_by_job_not_by_scanning_every_intent(tmp_path) -> None:
    engine = open_store(f"sqlite:///{tmp_path}/s.db", create=True)
    try:
        journal = StoreJournal(engine, cluster="c", policy="fifo")
        plan = _plan(engine, journal.live_rows_query([11, 12]))
        assert not [s for s in _scans(plan) if "enactment_intents" in s or "jobs" in s], plan
    finally:
        engine.dispose()
