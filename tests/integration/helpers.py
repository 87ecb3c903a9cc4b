"""What several live tests share: is slurmctld up, waiting for a condition, a CLI backend that
stamps its commands, a daemon built in-process run until a job has come and gone, a daemon
subprocess ended when a test finishes, the training job's shocksub command line and its
registration in the store."""

from __future__ import annotations

import math
import subprocess
import sys
import threading
import time
from pathlib import Path
from dataclasses import replace
from typing import IO, Any, Callable, Sequence

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from shockslurm.forecast import ForecastState, forecast
from shockslurm.model import JobView
from shockslurm.slurm.cli_backend import CliBackend
from shockslurm.slurm.types import CommandResult, JobState
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


def wait_for(what: Callable[[], Any], timeout_s: float, why: str, every_s: float = 0.2) -> Any:
    """Poll `what` every `every_s` until it returns something true, and return that; fail the
    test after `timeout_s`, naming `why`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(every_s)
    pytest.fail(f"timed out after {timeout_s:g} s waiting for {why}")


class StampedBackend(CliBackend):
    """The CLI backend, remembering when each command it ran started and returned, in wall time
    (`time.time()`, the clock the tests' squeue watchers stamp with). A test measures a latency
    from the command that caused it, not from a clock read taken before the round's own reads
    (which a loaded machine stretches)."""

    def __init__(self) -> None:
        super().__init__()
        self.stamps: list[tuple[float, float, tuple[str, ...], bool]] = []

    def run(self, argv: Sequence[str], *, timeout: float | None = None) -> CommandResult:
        started = time.time()
        result = super().run(argv, timeout=timeout)
        self.stamps.append((started, time.time(), tuple(str(a) for a in argv), result.ok))
        return result

    def sent(self, job_id: int, *command: str) -> tuple[float, float]:
        """(started, returned) of the first successful command beginning with `command` whose
        last argument, a comma-separated job id list, names `job_id`."""
        for started, returned, argv, ok in self.stamps:
            if (ok and argv[:len(command)] == command
                    and str(job_id) in argv[-1].split(",")):
                return started, returned
        raise AssertionError(f"no {' '.join(command)} for job {job_id}: "
                             f"{[a for _, _, a, _ in self.stamps]}")


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


def store_rows(engine: Any, pk: int) -> tuple[list, list]:
    """A job's throughput samples (time, samples/s, batch size) and batch-size changes (time,
    old, new) in the store, oldest first."""
    from shockslurm.store.models import BatchSizeChange, ThroughputSample

    with Session(engine) as s:
        samples = [(x.time_s, x.samples_per_s, x.batch_size) for x in s.scalars(
            select(ThroughputSample).where(ThroughputSample.job_pk == pk)
            .order_by(ThroughputSample.time_s))]
        changes = [(c.time_s, c.old_batch_size, c.new_batch_size) for c in s.scalars(
            select(BatchSizeChange).where(BatchSizeChange.job_pk == pk)
            .order_by(BatchSizeChange.time_s))]
    return samples, changes


class RoundRecorder:
    """A round observer for a live report test: per round its start and end, the job's view
    and progress, and the store's rows of it (`pk()`: the job's store key, or None while it
    has none); `extra(view, changes)`, when given, is recorded as "status"."""

    def __init__(self, engine: Any, cluster: Any, job_id: int, pk: Any, extra: Any = None):
        self.engine, self.cluster, self.job_id = engine, cluster, job_id
        self.pk, self.extra = pk, extra
        self.rounds: list[dict] = []

    def on_round(self, snapshot: Any, plan: Any, solve_s: float) -> None:
        live = self.cluster.jobs.get(self.job_id)
        view = next((v for v in snapshot.jobs if v.job_id == self.job_id), None)
        pk = self.pk()
        samples, changes = store_rows(self.engine, pk) if pk is not None else ([], [])
        self.rounds.append({"start": snapshot.now, "end": time.time(), "view": view,
                            "progress": live.progress if live is not None else None,
                            "samples": samples, "changes": changes,
                            "status": self.extra(view, changes) if self.extra else None})

    def report_waits(self, samples: list, changes: list) -> list[float]:
        """Seconds from each report's time to the end of the first round that started after
        it and had it in the store: a report's way to the store (the report is stamped before
        the trainer's thread writes it, so a round may start in between and not have it)."""
        def wait(when_written: float, present: Any) -> float:
            later = [r for r in self.rounds if r["start"] >= when_written]
            assert later, (when_written, [r["start"] for r in self.rounds])
            had = next((r for r in later if present(r)), None)
            assert had is not None, (when_written, later[-1])
            return had["end"] - when_written

        waits = [wait(t, lambda r, t=t: any(c[0] == t for c in r["changes"]))
                 for t, _, _ in changes]
        return waits + [wait(t, lambda r, t=t: any(x[0] == t for x in r["samples"]))
                        for t, _, _ in samples if any(r["start"] >= t for r in self.rounds)]


def run_to_completion(daemon: Any, backend: Any, job_id: int, log_dir: Path, log_glob: str,
                      timeout_s: float, lines: list[str]) -> str:
    """Run an in-process daemon until job `job_id` has come and gone, take in what it reported
    after the last round, assert Slurm says COMPLETED; returns the job's output file's text
    (`log_dir`/`log_glob`). `lines`: the daemon's emitted log, printed."""
    run_until_gone(daemon, job_id, timeout_s)
    daemon.progress.ingest()      # what the job reported after the last round
    state = {j.job_id: j.state for j in backend.jobs()}.get(job_id)
    [log] = log_dir.glob(log_glob)
    output = log.read_text()
    print("\n".join(lines))
    assert state is JobState.COMPLETED, \
        f"{state}\n" + "\n".join(lines) + output[-3000:]
    return output
