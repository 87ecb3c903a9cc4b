"""Each job's per-epoch profile as the reference's batch-size rules make it when it runs alone.

A reference TSV trace says only *that* a job adapts (`gns`, `accordion`); its profile file says
*how*, epoch by epoch. The reference's published profiles are what its own rules
(`reference_rules`) do with the job alone: on the 120-job trace (`../shared/data/shockwave-120`)
110 of the 116 adaptive jobs run alone under the rules within 10 % of their profile's time
(median 0.99x). A trace with no profile file (the reference-like workloads of `shockslurm trace
generate --like reference`, the quality benchmark's) gets its profiles the same way here: the
job is run alone under the rules in the reference's rounds (`REFERENCE_ROUND_S`, the rules'
one-run lag included), and the batch size of each epoch is recorded, its duration then the
profiled one at that batch size (`JobSpec.epoch_duration_at`). Without this step such a job
declares our generic pattern (`workload.adaptation`: doublings at 50 % and 90 % of the epochs),
which the rules follow only by chance (0.36-1.38x the run time alone on the 120-job trace), and
a forecaster reading the profile is then wrong by as much.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Sequence

from ..model import JobSpec
from ..workload.reference import load_reference_workload
from .jobs import SimJob

REFERENCE_ROUND_S = 120.0     # the reference simulator's round


def solo_schedule(spec: JobSpec, round_s: float = REFERENCE_ROUND_S) -> tuple[int, ...]:
    """The batch size of each of `spec`'s epochs when it runs alone, every round of `round_s`,
    under the reference's rules (without the reference's 1.5x run-time safety net, which is
    measured against the profile this computes). A job too slow to finish one iteration in a
    round keeps the batch size it has for its remaining epochs."""
    job = SimJob(spec, adaptation="reference", safety_net=False)
    epochs: list[int] = []
    clock = 0.0
    while not job.done:
        before = job.batch_size
        seen = len(job.observed_batch_sizes)
        run = job.plan_run(round_s)
        if sum(n for _, n in run.segments) <= 0:    # not one iteration in a round: no pace
            break
        clock += round_s
        job.record_run(run, run.seconds, clock)
        epochs.extend(job.observed_batch_sizes[seen:])
        # a change at the end of the run counts the epoch in progress as complete: at the
        # batch size it ran at
        epochs.extend([before] * (min(int(job.epochs_done), spec.num_epochs) - len(epochs)))
        job.update_flags()
    epochs.extend([job.batch_size] * (spec.num_epochs - len(epochs)))
    return tuple(epochs[:spec.num_epochs])


def with_reference_profile(spec: JobSpec, round_s: float = REFERENCE_ROUND_S) -> JobSpec:
    """`spec` with the profile its run alone under the reference's rules gives (`solo_schedule`);
    a static job as it is."""
    if spec.mode == "static":
        return spec
    schedule = solo_schedule(spec, round_s)
    return replace(spec, batch_sizes=schedule,
                   epoch_durations=tuple(spec.epoch_duration_at(b) for b in schedule))


def with_reference_profiles(jobs: Sequence[JobSpec]) -> list[JobSpec]:
    """Every job of `jobs` with its reference profile (`with_reference_profile`)."""
    return [with_reference_profile(j) for j in jobs]


def load_reference_trace(trace: str | Path, throughputs: str | Path,
                         profiles: str | Path | None = None) -> list[JobSpec]:
    """A reference TSV trace's jobs (`workload.reference.load_reference_workload`), each with
    the profile of its `profiles` file, or without one the reference profile its rules give
    it (`with_reference_profiles`)."""
    jobs = load_reference_workload(trace, throughputs, profiles)
    return jobs if profiles is not None else with_reference_profiles(jobs)
