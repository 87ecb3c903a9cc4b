"""`shockslurm report`: PNG charts of runs in the store (GPU allocation timeline, rho per policy,
utilisation per round), one file per chart, their paths printed one per line.

The charts are `ops.plots`; the store is read through `ops.runs.from_store`, the same plain data
`shockslurm simulate --plot` draws from a `SimResult`. A run damaged in the store (a value that
is not what the store writes) is named on stderr with the row at fault, and the others are
drawn all the same; the exit status is then 1.
"""

from __future__ import annotations

from pathlib import Path

import click
from ..errors import ShockslurmError
from .db import DB_HELP
from .paths import OutputDir


@click.command("report")
@click.option("--db", "db_url", required=True, help=DB_HELP)
@click.option("--out", "out_dir", type=OutputDir(),
              required=True, help="Directory for the PNG files (created if needed).")
@click.option("--run", "runs", type=int, multiple=True,
              help="Run id to report (repeatable). Default: every simulated and live run.")
def report_cmd(db_url: str, out_dir: Path, runs: tuple[int, ...]) -> None:
    """Draw each run's GPU timeline and utilisation, and rho per policy, as PNG files."""
    from sqlalchemy.orm import Session

    from ..ops.plots import write_run_plots
    from ..ops.runs import RunDamaged, from_store, run_ids
    from ..store import open_store

    try:
        engine = open_store(db_url)
    except ShockslurmError as exc:
        raise click.ClickException(str(exc)) from None
    series, damaged = [], []
    try:
        with Session(engine) as session:
            ids = run_ids(session, runs)
            if not ids:
                raise click.ClickException("the store has no simulated or live run to report")
            for run_id in ids:
                try:
                    series.append(from_store(session, run_id))
                except RunDamaged as exc:
                    damaged.append(str(exc))
    except LookupError as exc:
        raise click.ClickException(str(exc.args[0])) from None
    finally:
        engine.dispose()
    for message in damaged:
        click.echo(f"Error: {message}", err=True)
    if series:
        for path in write_run_plots(series, out_dir):
            click.echo(str(path))
    if damaged:
        raise click.exceptions.Exit(1)
