"""`shockslurm db`: create/upgrade the store, print its DDL; and the glue that records a run.

The glue lives here, not in `store/`, because only `cli/` may know both the simulator and the
store (the store stays independent of `sim/`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Sequence

import click
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from ..model import JobSpec
from ..sim.run import SimResult
from ..store import StoreError, current_revision, make_engine, open_store, upgrade
from ..store import repository as repo
from ..masking import mask
from ..store.database import describe
from ..store.ddl import DIALECTS, generate_ddl
from .daemon_config import config_option, found_daemon_config
from .options import FiniteFloat

DB_HELP = ("Store URL: a SQLite file path, sqlite:///PATH, or "
           "postgresql+psycopg://USER@HOST[:PORT]/DB.")


@click.group("db")
def db_group() -> None:
    """The SQL store of jobs, rounds, throughput and adaptation history."""


@db_group.command("upgrade")
@click.option("--db", "url", required=True, help=DB_HELP)
def db_upgrade(url: str) -> None:
    """Create the store, or upgrade it in place to this version's schema (idempotent)."""
    try:
        engine = make_engine(url)
        before = current_revision(engine)
        after = upgrade(engine)
    except StoreError as exc:
        raise click.ClickException(str(exc)) from None
    if before == after:
        click.echo(f"store already at schema revision {after}")
    else:
        click.echo(f"store upgraded from {before or 'empty'} to schema revision {after}")


@db_group.command("prune")
@click.option("--db", "url", default=None, help=DB_HELP + " Default: the config's [daemon] db.")
@config_option("its db")
@click.option("--older-than", "days", type=FiniteFloat(0.04, 36_500), required=True,
              metavar="DAYS", help="Delete the training reports older than this many days "
              "(at least 0.04, about an hour), but each job's latest.")
@click.option("--dry-run", is_flag=True, help="Count what would go; delete nothing.")
def db_prune(url: str | None, config_path: Path | None, days: float, dry_run: bool) -> None:
    """Thin the training reports: throughput samples and progress events older than DAYS go,
    but each job's latest progress event and its latest sample per batch size (what the daemon
    plans with and `status` shows); jobs, rounds, epochs and checkpoints stay."""
    from ..store.retention import DAY_S, prune_reports

    if url is None:
        cfg = found_daemon_config(config_path)
        if cfg is None:
            raise click.UsageError("give --db URL, or the daemon's configuration (--config, "
                                   "$SHOCKSLURM_CONFIG or /etc/shockslurm/shockslurm.toml)")
        url = cfg.db
    try:
        engine = open_store(url)
    except StoreError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        pruned = prune_reports(engine, time.time() - days * DAY_S, dry_run=dry_run)
    except SQLAlchemyError as exc:
        raise click.ClickException(f"cannot prune the store: {type(exc).__name__}: "
                                   f"{mask(describe(exc))[:300]}") from None
    finally:
        engine.dispose()
    click.echo(f"{'would delete' if dry_run else 'deleted'} {pruned.throughput_samples} "
               f"throughput samples and {pruned.progress_events} progress events older than "
               f"{days:g} days (each job's latest kept)")


@db_group.command("ddl")
@click.option("--dialect", type=click.Choice(sorted(DIALECTS)), required=True)
def db_ddl(dialect: str) -> None:
    """Print the schema's CREATE statements for a dialect (what sql/schema-*.sql holds)."""
    click.echo(generate_ddl(dialect), nl=False)


def record_simulation(url: str, jobs: Sequence[JobSpec], results: Sequence[SimResult]) -> list[int]:
    """Store each policy's run (jobs, rounds, plan entries, batch-size changes, and a `completed`
    job event per finished job whose detail is `{"exclusive_runtime_s": ...}`); returns run ids."""
    engine = open_store(url, create=True)
    run_ids = []
    try:
        for result in results:
            with Session(engine) as session, session.begin():
                cfg = result.config
                run = repo.add_run(session, policy=result.policy, kind="sim", cluster="sim",
                                   config={"gpus": cfg.gpus, "nodes": cfg.cluster,
                                           "round_s": cfg.round_s,
                                           "restart_overhead_s": cfg.restart_overhead_s,
                                           "adaptation": cfg.adaptation, "jobs": len(jobs)})
                by_id = {spec.job_id: repo.add_job_spec(session, run, spec) for spec in jobs}
                gang = {spec.job_id: spec.gang_size for spec in jobs}
                for index, rec in enumerate(result.rounds):
                    info = rec.info
                    status = info.get("status")
                    objective = info.get("objective")
                    repo.record_round(
                        session, run, index=index, time_s=rec.start_s, policy=result.policy,
                        solve_s=rec.solve_s, status=None if status is None else str(status),
                        objective=float(objective) if isinstance(objective, (int, float)) else None,
                        plan={by_id[j]: gang[j] for j in rec.run})
                for time_s, job_id, old, new in result.batch_size_events:
                    repo.add_batch_size_change(session, by_id[job_id].id, time_s=time_s, old=old,
                                               new=new)
                # Completion time and exclusive runtime, so `shockslurm report` recomputes rho
                # from the store alone (the jobs table has no column for either).
                for outcome in result.outcomes:
                    repo.add_job_event(session, by_id[outcome.job_id], time_s=outcome.completion_s,
                                       kind="completed", detail=json.dumps(
                                           {"exclusive_runtime_s": outcome.exclusive_runtime_s},
                                           sort_keys=True))
                run_ids.append(run.id)
    finally:
        engine.dispose()
    return run_ids
