"""`shocksub`: submit a training job to Slurm for the Shockwave meta-scheduler.

    shocksub --gpus 2 --model ResNet-18 --epochs 30 -- python train.py --lr 0.1
    shocksub --nodes 2 --gpus 8 --model ResNet-50 --epochs 10 --script train.py --dry-run

Building the request (pure, what --dry-run prints) is kept apart from running sbatch, so what a
user reviews is exactly what is sent. Bad input exits with code 2 naming the option.

The job's reports reach the daemon with no setting by the user: the job script exports the
site's report spool, `[daemon] spool_dir` of the configuration the daemon reads
(`$SHOCKSLURM_CONFIG`, else /etc/shockslurm/shockslurm.toml; `shockslurm.siteconfig`), unless the
job's environment names one.
"""

from __future__ import annotations

import os
import shlex
import tempfile
import time
from pathlib import Path
from typing import Any

import click

from ..errors import ConfigError, InputError, ShockslurmError
from ..model import ADAPTATION_MODES
from ..limits import shown
from ..siteconfig import DEFAULT_CLUSTER, check_cluster, report_spool
from ..slurm.cli_backend import CliBackend
from ..slurm.job_script import load_template, new_report_secret, render_script
from ..slurm.submit import (TEMPLATES, JobRequest, check_fits, require_utf8, sbatch_argv,
                            submit)
from ..workload.catalogue import CATALOGUE
from .output_errors import OutputCommand

DEFAULT_SCRIPT_DIR = "~/.shockslurm/scripts"


def _option_of(field: str | None) -> str:
    """The CLI spelling of a JobRequest field, for error messages."""
    if field in (None, "command"):
        return "COMMAND"
    return "--" + field.replace("_", "-")


def _cluster_name(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """`--cluster` by the rule of the daemon's `[daemon] cluster` (`siteconfig.check_cluster`)."""
    try:
        require_utf8("cluster", value)
        return check_cluster(value)
    except InputError as exc:
        raise click.BadParameter(exc.message) from None
    except ValueError as exc:
        raise click.BadParameter(f"{exc}, got {shown(value)}") from None


def _ladder(value: str | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        return tuple(int(p) for p in value.split(",") if p.strip())
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of integers",
                                 param_hint="'--batch-sizes'") from None


def build_request(*, model: str, command: tuple[str, ...], script: str | None,
                  samples_per_epoch: int | None, batch_sizes: tuple[int, ...] | None,
                  batch_size: int | None, template: str | None, job_name: str | None,
                  nodes: int, **fields: Any) -> JobRequest:
    """Fill catalogue defaults (dataset size, ladder) and build the validated request."""
    info = CATALOGUE.get(model)
    if samples_per_epoch is None:
        if info is None:
            raise InputError(f"model {model!r} is not in the catalogue "
                             f"({', '.join(sorted(CATALOGUE))}); give --samples-per-epoch",
                             field="model")
        samples_per_epoch = info.samples_per_epoch
    if batch_sizes is None:
        if info is None:
            raise InputError(f"model {model!r} is not in the catalogue; give --batch-sizes",
                             field="model")
        batch_sizes = info.ladder
    if batch_size is None:
        batch_size = batch_sizes[0] if batch_sizes else 0
    try:
        return JobRequest(
            job_name=job_name if job_name is not None else f"shock-{model}",
            model=model, command=tuple(command), script=script,
            samples_per_epoch=samples_per_epoch, batch_sizes=tuple(batch_sizes),
            batch_size=batch_size, nodes=nodes,
            template=template or ("multi_node" if nodes > 1 else "single_node"),
            **fields)
    except InputError as exc:
        if job_name is None and exc.field == "job_name":    # derived: the user gave the model
            raise InputError("the model name is used to build the job name (shock-MODEL): "
                             + exc.message, field="model") from None
        raise


@click.command(cls=OutputCommand,
               context_settings={"help_option_names": ["-h", "--help"],
                                 "allow_interspersed_args": False})
@click.option("--gpus", type=int, default=1, show_default=True, help="GPUs per node (1..64).")
@click.option("--nodes", type=int, default=1, show_default=True, help="Nodes.")
@click.option("--gpu-type", help="The GPUs' type, as the nodes' gres names it (e.g. a100): "
                                 "--gres=gpu:TYPE:N.")
@click.option("--partition", help="Slurm partition (default: the cluster's).")
@click.option("--time", help="Time limit in Slurm's format (e.g. 90, 4:00:00, 2-00:00:00).")
@click.option("--account", help="Slurm account.")
@click.option("--qos", help="Slurm QOS.")
@click.option("--cpus-per-gpu", type=int, help="CPUs per GPU.")
@click.option("--constraint", help="Node features the job needs (Slurm's --constraint, e.g. a100 "
                                   "or a100|h100).")
@click.option("--exclude", help="Nodes the job must not run on (a host list, e.g. gpu[01-02]).")
@click.option("-w", "--nodelist", help="Nodes the job runs on (a host list; the daemon then "
                                        "never moves it off them).")
@click.option("--output", default="%x-%j.out", show_default=True,
              help="Log file pattern (appended across requeues).")
@click.option("--job-name", help="Job name (letters, digits, . _ -). Default: shock-MODEL.")
@click.option("--model", default=None,
              help=f"Model; catalogue models ({', '.join(sorted(CATALOGUE))}) default the "
                   "dataset size and batch-size ladder.")
@click.option("--epochs", type=int, default=None, help="Epochs to train (required).")
@click.option("--samples-per-epoch", type=int, help="Dataset size (default: the catalogue's).")
@click.option("--batch-sizes", help="Batch-size ladder, ascending, e.g. 32,64,128.")
@click.option("--batch-size", type=int, help="Initial batch size (default: smallest of ladder).")
@click.option("--mode", type=click.Choice(ADAPTATION_MODES), default="static", show_default=True,
              help="How the job adapts its batch size.")
@click.option("--template", type=click.Choice(TEMPLATES),
              help="Job script template (default: multi_node when --nodes > 1).")
@click.option("--grace-seconds", type=int, default=60, show_default=True,
              help="USR1 is sent this long before the time limit, to checkpoint.")
@click.option("--max-restarts", type=int, default=50, show_default=True,
              help="The script gives up after this many requeues.")
@click.option("--epoch-seconds", type=float,
              help="Exclusive seconds per epoch on the whole gang, if known (scheduling hint; "
                   "otherwise the catalogue's throughput model or a default is used).")
@click.option("--db", "db_url", default=None,
              help="Store URL (SQLite path or postgresql+psycopg://...): also register the job "
                   "spec there (the store is opened before anything is submitted).")
@click.option("--cluster", default=DEFAULT_CLUSTER, show_default=True, callback=_cluster_name,
              help="Cluster name the spec is registered under (the daemon's [daemon] cluster).")
@click.option("--script", "script", type=click.Path(dir_okay=False),
              help="Python training script, relative to the submit directory (the job runs "
                   "there; trailing args are its args); it must exist unless --dry-run.")
@click.option("--script-dir", default=DEFAULT_SCRIPT_DIR, show_default=True,
              help="Where the rendered job scripts are kept.")
@click.option("--dry-run", is_flag=True,
              help="Print the job script and the sbatch call; submit nothing.")
@click.option("--status", "status_job", type=int, metavar="JOBID", default=None,
              help="Submit nothing: print the status row of JOBID (as `shockslurm status`) and, "
                   "with --db, its recent events and the daemon's recent intents.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def main(command: tuple[str, ...], script: str | None, script_dir: str, dry_run: bool,
         batch_sizes: str | None, db_url: str | None, cluster: str, status_job: int | None,
         **options: Any) -> None:
    """Submit a training job: shocksub [OPTIONS] -- COMMAND [ARGS]...  (or --script FILE)."""
    if status_job is not None:
        _print_status(status_job, db_url, cluster)
        return
    for name in ("model", "epochs"):  # required for a submission only (not for --status)
        if options.get(name) is None:
            raise click.MissingParameter(param_hint=f"'--{name}'", param_type="option")
    # The job's report secret: in the job script only; the store gets the derived key.
    secret = None if dry_run else new_report_secret()
    directory = Path(os.path.expanduser(script_dir))
    try:
        # what reaches the sbatch call (the script's path) or the store besides the request
        for field, value in (("script_dir", str(directory)), ("cluster", cluster),
                             ("db", db_url)):
            if value is not None:
                require_utf8(field, value)
        req = build_request(command=command, script=script, batch_sizes=_ladder(batch_sizes),
                            **options)
        text = render_script(req, load_template(req.template), secret,
                             spool=_site_spool())
    except InputError as exc:
        raise click.BadParameter(exc.message, param_hint=f"'{_option_of(exc.field)}'") from None
    if not dry_run:
        if script is not None and not os.path.isfile(script):    # a dry run may preview it
            raise click.BadParameter(f"File {script!r} does not exist.",
                                     param_hint="'--script'")
        _check_cluster(req)
    store = _registry(db_url, dry_run)
    if dry_run:
        placeholder = directory / f"{req.job_name}-XXXXXXXX.sbatch"
        click.echo(text, nl=False)
        click.echo("# sbatch call:")
        click.echo(shlex.join(sbatch_argv(req, str(placeholder))))
        return
    try:
        path = _write_script(directory, req.job_name, text)
        job_id = submit(sbatch_argv(req, path), echo=lambda msg: click.echo(msg, err=True))
        submitted_at = time.time()
    except (OSError, UnicodeError, ShockslurmError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(job_id)
    if store is not None:
        try:
            register(store, cluster, job_id, submitted_at, req, report_secret=secret)
        except ShockslurmError as exc:
            # The job is in Slurm and carries its spec in the comment: warn, do not fail.
            click.echo(f"shocksub: job {job_id} submitted but not registered in the store: {exc}",
                       err=True)
        finally:
            store.dispose()


def _registry(db_url: str | None, dry_run: bool) -> Any:
    """The store the job is registered in (`--db`), opened (created or upgraded) before
    anything is submitted: a store that cannot be used stops shocksub with nothing in Slurm
    (until 2026-12-02 the job was submitted first, exit 0, and its report key never stored, so
    the daemon refused its reports). A dry run creates nothing: it checks the URL only."""
    if db_url is None:
        return None
    from ..store import open_store
    from ..store.database import make_engine

    try:
        if dry_run:
            make_engine(db_url).dispose()
            return None
        return open_store(db_url, create=True)
    except ShockslurmError as exc:
        raise click.BadParameter(str(exc), param_hint="'--db'") from None


def _write_script(directory: Path, job_name: str, text: str) -> str:
    """Write the job script whole or not at all and return its path: a file that could not be
    written in full (disk full, quota, ...) is removed, so sbatch never gets an empty or cut one.
    mkstemp creates the file 0600: the report secret in it stays the user's."""
    data = text.encode("utf-8")         # before any file exists (the text is validated UTF-8)
    directory.mkdir(parents=True, exist_ok=True)
    fd, path = tempfile.mkstemp(prefix=f"{job_name}-", suffix=".sbatch", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), 0o600)
            fh.write(data)
    except BaseException:
        os.unlink(path)
        raise
    return path


def _site_spool() -> str | None:
    """The site's report spool for the job script (`[daemon] spool_dir` of the configuration
    the daemon reads). A configuration that cannot be used is said on stderr, not fatal: the
    job then reports only where its environment names a spool or store."""
    try:
        return report_spool(os.environ).path
    except ConfigError as exc:
        click.echo(f"shocksub: no report spool for the job: {exc}", err=True)
        return None


def _check_cluster(req) -> None:
    """Refuse GPU counts no node can hold (one `sinfo --json`); without Slurm, sbatch decides."""
    try:
        nodes = CliBackend().nodes()
    except ShockslurmError as exc:
        click.echo(f"shocksub: cannot check the request against the cluster: {exc}", err=True)
        return
    if not nodes:      # sinfo answered with errors only (a controller that is down): no list
        click.echo("shocksub: cannot check the request against the cluster: sinfo listed no "
                   "nodes", err=True)
        return
    try:
        check_fits(req, nodes)
    except InputError as exc:
        raise click.BadParameter(exc.message, param_hint=f"'{_option_of(exc.field)}'") from None


def _print_status(job_id: int, db_url: str | None, cluster: str) -> None:
    from .status import describe_job

    try:
        click.echo(describe_job(job_id, db_url, cluster))
    except LookupError as exc:
        raise click.ClickException(str(exc.args[0])) from None
    except ShockslurmError as exc:
        raise click.ClickException(str(exc)) from None


def register(engine: Any, cluster: str, job_id: int, submit_s: float, req: JobRequest, *,
             report_secret: str | None = None) -> None:
    """Record the submitted job's spec in the store (`engine`, `_registry`'s; the daemon's
    fallback when a comment is lost or edited) and the key its reports must be signed with
    (derived from the secret; the secret itself is never stored)."""
    from sqlalchemy.exc import SQLAlchemyError
    from sqlalchemy.orm import Session

    from ..store import repository as repo
    from ..store.database import StoreError, store_failure
    from ..train.records import derive_key

    try:
        with Session(engine) as session, session.begin():
            repo.register_submitted_job(
                session, cluster, job_id=job_id, submit_s=submit_s, model=req.model,
                epochs=req.epochs, samples_per_epoch=req.samples_per_epoch,
                batch_sizes=req.batch_sizes, gang_size=req.gpus * req.nodes,
                owner=os.environ.get("USER") or None,
                report_key=derive_key(report_secret) if report_secret else None)
    except SQLAlchemyError as exc:
        raise StoreError(store_failure(exc)) from None


if __name__ == "__main__":
    main(prog_name="shocksub")
