"""`shockslurm status`: the managed jobs, their progress, forecast and fairness, in one table.

One `squeue --json` and one store read transaction, whatever the number of jobs (cheap enough to
run in `watch`). `--json` prints a list of objects with the same fields, unformatted (seconds,
floats, null for unknown) for scripts. The column definitions live in `ops/status.py`.

The daemon's configuration is found as the daemon finds it: `--config`, else
`$SHOCKSLURM_CONFIG`, else /etc/shockslurm/shockslurm.toml when that file exists (its `db`,
`cluster` and `partitions`, environment overrides included); `--db` and `--cluster` win.

With a store (`--db` or the config's), the table is followed by the line `leader: pid P on HOST
since TIME`: the daemon holding the store's leader lock (`store/leader.py`), the one that acts;
`leader: none` when no daemon holds it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import click

from ..errors import ShockslurmError, printable
from ..siteconfig import DEFAULT_CLUSTER
from ..slurm.types import SlurmJob
from .daemon_config import config_option, found_daemon_config
from .db import DB_HELP

if TYPE_CHECKING:
    from ..ops.config import DaemonConfig



def collect(jobs: Sequence[SlurmJob], db_url: str | None, cluster: str, *,
            partitions: Sequence[str] | None = None, history: bool = False,
            now: float | None = None) -> tuple[list, dict]:
    """Status rows of the managed `jobs` (and the store's view of them, for history)."""
    from ..ops.status import managed, read_store, status_rows
    from ..store import open_store

    ours = managed(jobs, partitions)
    store: dict = {}
    if db_url is not None and ours:
        engine = open_store(db_url)
        try:
            store = read_store(engine, cluster, ours, history=history)
        finally:
            engine.dispose()
    return status_rows(ours, store, time.time() if now is None else now), store


def read_slurm() -> list[SlurmJob]:
    from ..slurm.cli_backend import CliBackend

    return CliBackend().jobs()


@click.command("status")
@click.option("--db", "db_url", default=None,
              help=DB_HELP + " Default: the config file's [daemon] db; without either, progress "
                             "and forecasts show '-'.")
@config_option("its db, cluster name and partitions")
@click.option("--cluster", default=None,
              help=f"Cluster name specs are registered under (default: the config's, else "
                   f"{DEFAULT_CLUSTER!r}).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def status_cmd(db_url: str | None, config_path: Path | None, cluster: str | None,
               as_json: bool) -> None:
    """Managed jobs: state, GPUs, epochs done, forecast remaining, rho estimate, preemptions."""
    partitions = None
    cfg = found_daemon_config(config_path)
    if cfg is not None:
        db_url = db_url or cfg.db
        cluster = cluster or cfg.cluster
        partitions = cfg.partitions
    try:
        rows, _ = collect(read_slurm(), db_url, cluster or DEFAULT_CLUSTER,
                          partitions=partitions)
    except ShockslurmError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps([r.as_dict() for r in rows], indent=2))
        return
    from ..ops.status import format_table

    click.echo(format_table(rows) if rows else "no managed jobs")
    if db_url is not None:
        from ..store.leader import describe_leader

        try:
            click.echo(describe_leader(db_url, cluster or DEFAULT_CLUSTER))
        except ShockslurmError as exc:
            click.echo(f"leader: unknown ({exc})")


def describe_job(job_id: int, db_url: str | None, cluster: str,
                 jobs: Sequence[SlurmJob] | None = None, now: float | None = None) -> str:
    """`shocksub --status`: the job's status row, then its recent events and the daemon's
    recent intents for it (from the store). Raises `LookupError` when Slurm does not know it."""
    from ..ops.status import HISTORY, format_table, read_store, status_rows
    from ..store import open_store

    found = [j for j in (read_slurm() if jobs is None else jobs) if j.job_id == job_id]
    if not found:
        raise LookupError(f"job {job_id} is not in Slurm's queue (finished long ago, or never "
                          "submitted)")
    store: dict = {}
    if db_url is not None:
        engine = open_store(db_url)
        try:
            store = read_store(engine, cluster, found, history=True)
        finally:
            engine.dispose()
    row = status_rows(found, store, time.time() if now is None else now)[0]
    lines = [format_table([row]), f"spec from: {row.spec_source}"
             + ("" if found[0].managed else "  (not a managed job: the daemon ignores it)")]
    info = store.get(job_id)
    if db_url is None:
        lines.append("events/intents: no store given (--db)")
    else:
        events = info.events if info else []
        intents = info.intents if info else []
        lines.append(f"recent events (last {HISTORY}):" if events else "recent events: none")
        lines += [printable(f"  {t:.0f}  {kind}  {detail}".rstrip())
                  for t, kind, detail in events]
        lines.append(f"recent intents (last {HISTORY}):" if intents else "recent intents: none")
        lines += [printable(f"  {when}  {what}  {rc}  {argv}")
                  for when, what, rc, argv in intents]
    return "\n".join(lines)
