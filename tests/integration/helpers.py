"""What several live tests share: is slurmctld up, a daemon built in-process run until a job
has come and gone, a daemon subprocess ended when a test finishes, the training job's shocksub
command line and its registration in the store."""

from __future__ import annotations

import math
import subprocess
import sys
import threading
import time
from pathlib import Path
from dataclasses import replace
from typing import IO, Any, Sequence

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from shockslurm.forecast import ForecastState, forecast
from shockslurm.model import JobView
from shockslurm.store import repository as repo
from shockslurm.store.models import Job


def controller_up(timeout_s: float = 10) -> bool:
    """slurmctld answers `scontrol ping`."""
    try:
        out = subprocess.run(["scontrol", "ping"], capture_output=True, text=True,
                             timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "is UP" in out.stdout


def run_until_gone(daemon: Any, job_id: int, timeout_s: float) -> None:
    """Run an in-process daemon's round loop (`daemon.build_daemon`) until the job `job_id`
    has been seen and has left the queue, or `timeout_s` passed."""
    cluster = daemon.cluster
    seen = [False]
    deadline = time.monotonic() + timeout_s

    def finished() -> bool:
        present = job_id in cluster.jobs
        seen[0] = seen[0] or present
        return (seen[0] and not present) or time.monotonic() > deadline

    cluster.finished = finished
    daemon.loop.run()


def end_daemon(daemon: subprocess.Popen | None, stop: threading.Event, log: IO[bytes]) -> None:
    """A test's end: its watcher threads told to stop (`stop`), its daemon subprocess killed
    if still running, the daemon's log closed."""
    stop.set()
    if daemon is not None and daemon.poll() is None:
        daemon.kill()
        daemon.wait(timeout=10)
    log.close()


def shocksub_training(tmp: Path, db: str, *, gpus: int, name: str, epochs: int,
                      epoch_seconds: float, command: Sequence[str]) -> list[str]:
    """The shocksub command line of the live tests' training job (mnist-like, 2048 samples an
    epoch, batch sizes 32/64/128 from 32), its output and script in `tmp`, registered in `db`."""
    return [sys.executable, "-m", "shockslurm.cli.shocksub", "--gpus", str(gpus),
            "--partition", "gpu", "--job-name", name, "--model", "mnist-like",
            "--epochs", str(epochs), "--samples-per-epoch", "2048",
            "--batch-sizes", "32,64,128", "--batch-size", "32",
            "--epoch-seconds", str(epoch_seconds), "--output", str(tmp / "%x-%j.out"),
            "--script-dir", str(tmp / "scripts"), "--db", db, "--", *command]


def registration_pk(session: Session, job_id: int) -> int | None:
    """The store key of the Slurm job's registration (shocksub's), None when there is none."""
    return session.scalar(select(Job.id).where(Job.job_id == job_id)
                          .join(Job.run).where(repo.Run.kind == repo.REGISTRY_KIND))


def assert_view_from_reports(v: JobView, job_id: int, *, epochs: int,
                             epoch_seconds: float) -> None:
    """The daemon's view `v` of the training job (grown past batch size 32) was built from its
    reports: per-epoch sizes, current size and measured speed, and its forecast moved with
    them."""
    schedule = [32, 32, 64] + [128] * epochs
    assert v.observed_batch_sizes == tuple(schedule[:int(v.epochs_done)]), v
    # the size of the epoch under way; on an epoch boundary (a stop on an epoch's last step,
    # or a round between the epoch's end and the next size's report) either neighbour's
    assert v.batch_size in {schedule[int(v.epochs_done)],
                            schedule[max(0, math.ceil(v.epochs_done) - 1)]}, v
    spec_ips = 64 / epoch_seconds                  # what the spec alone would say
    # the measured speed, not the spec's: samples/s (the view's iterations/s are the latest
    # sample's samples/s over the current batch size, which may have grown since it was taken)
    assert v.iterations_per_s * v.batch_size > 3 * spec_ips * 32, (v, spec_ips)
    # and the forecast moves with them: the same view with the spec's batch size / speed and
    # no history (what the run-time estimate gives) forecasts something else
    blind = replace(v, batch_size=32, iterations_per_epoch=64,
                    observed_batch_sizes=(32,) * int(v.epochs_done), iterations_per_s=spec_ips)
    got, without = forecast(v, ForecastState(job_id)), forecast(blind, ForecastState(0))
    assert got.remaining_s != pytest.approx(without.remaining_s), (got, without)
