"""Where a live job's progress comes from: the `ProgressSource` protocol and its default, an
estimate from the run time the daemon observed (the training helper's reports replace it, see
`shockslurm.reports.reported_progress`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, Sequence

from ..model import EpochProfile, JobView, RunLength
from .specs import LiveSpec
from ..slurm.types import JobState, SlurmJob


@dataclass(frozen=True)
class Progress:
    """A job's progress as a `ProgressSource` sees it. `observed_batch_sizes` (the batch size of
    every completed epoch) and `iterations_per_s` (measured, whole gang, at `batch_size`) are
    None when the source does not know them; the view then assumes the current batch size for
    every completed epoch and the spec's throughput."""

    epochs_done: float
    batch_size: int
    observed_batch_sizes: Sequence[int] | None = None   # a tuple, or a RunLength
    iterations_per_s: float | None = None
    source: str = "runtime"


class ProgressSource(Protocol):
    """Where a job's progress comes from. The default estimates it from observed run time; the
    daemon reads the training helper's reports from the store instead."""

    def refresh(self, jobs: Sequence[SlurmJob], now: float | None = None) -> None:
        """Called once per round, before `progress`, with every active job (batch reads) and
        the round's time (Unix seconds, as Slurm's times; None: unknown)."""

    def progress(self, job: SlurmJob, spec: LiveSpec, run_time_s: float,
                 epoch_s: float) -> Progress: ...


def progress_ceiling(spec: LiveSpec, batch_size: int) -> float:
    """The most epochs a running job is said to have done: one iteration short of the end (a job
    is done when Slurm says it finished, not when an estimate or a report says so)."""
    iters = math.ceil(spec.samples_per_epoch / max(1, batch_size))
    return spec.epochs - 1.0 / max(1, iters)


class RunTimeProgress:
    """Epochs done = run time observed by the daemon / exclusive epoch time, kept just short of
    the end."""

    def refresh(self, jobs: Sequence[SlurmJob], now: float | None = None) -> None:
        pass

    def progress(self, job: SlurmJob, spec: LiveSpec, run_time_s: float,
                 epoch_s: float) -> Progress:
        done = run_time_s / epoch_s if epoch_s > 0 else 0.0
        ceiling = progress_ceiling(spec, spec.batch_size)
        return Progress(epochs_done=max(0.0, min(done, ceiling)), batch_size=spec.batch_size)


def job_view(job: SlurmJob, spec: LiveSpec, prog: Progress, epoch_s: float,
             run_time_s: float) -> JobView:
    """What the policy sees of a live job: its spec, its progress and its time so far."""
    gang = max(1, job.gpus)
    iters_per_epoch = math.ceil(spec.samples_per_epoch / prog.batch_size)
    remaining = max(1.0, (spec.epochs - prog.epochs_done) * iters_per_epoch)
    ips = (prog.iterations_per_s if prog.iterations_per_s is not None
           and prog.iterations_per_s > 0 else iters_per_epoch / epoch_s)
    observed = (prog.observed_batch_sizes if prog.observed_batch_sizes is not None
                else RunLength.repeat(prog.batch_size, int(prog.epochs_done)))
    declared = EpochProfile.declared(spec.batch_size, epoch_s, spec.epochs)
    return JobView(
        job_id=job.job_id, gang_size=gang, arrival_s=job.submit_time,
        num_epochs=spec.epochs, epochs_done=prog.epochs_done, batch_size=prog.batch_size,
        iterations_per_s=ips, remaining_iterations=remaining,
        iterations_per_epoch=iters_per_epoch,
        observed_batch_sizes=observed,
        profile_batch_sizes=declared.batch_sizes, profile_epoch_durations=declared.epoch_durations,
        exclusive_runtime_s=declared.exclusive_runtime_s, run_time_s=run_time_s,
        ran_last_round=job.state is JobState.RUNNING)
