"""A Slurm job's first submit time, kept across its requeues.

Slurm 22.05 sets a job's `SubmitTime` anew when it is requeued (`scontrol requeuehold`, a
preemption, a node failure; verified on the test cluster: 04:16:33 -> 04:16:40 at requeuehold,
`Restarts` 0 -> 1). The live scheduler keys a job by (job id, submit time): its run time so far,
its spec, its training reports (a registration is found within minutes of the submit time),
its stops, its rows in the store, and the arrival the policy sees. Taken as Slurm gives it, a
job requeued more than the registry's tolerance after its submission would lose its reports,
start again from no run time, count as a newly arrived job (behind the jobs submitted after it
under FIFO) and escape the churn bounds on its stops.

`FirstSubmitTimes.canonical` hands back each job of ours with the submit time it had when this
daemon first saw it, as long as the job id is seen again with a larger restart count (a
requeue of the same job); a job id seen with another submit time and no more restarts is a new
job (Slurm reuses ids after a controller reset). A daemon that starts seeds it from the store
(`seed`, with what earlier daemons recorded each requeued job under, or for a job requeued while
no daemon ran, its latest registration's time), so that its reconciliation, its resumed stops
and its rows find the jobs of the daemon before it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable

from ..slurm.types import SlurmJob


@dataclass(frozen=True)
class _Seen:
    first_submit: float      # the submit time the job had when first seen
    submit: float            # the submit time Slurm gave it at its latest sighting
    restarts: int            # its restart count then


class FirstSubmitTimes:
    """Each job id's first submit time, for as long as Slurm lists the job."""

    def __init__(self) -> None:
        self._seen: dict[int, _Seen] = {}

    def canonical(self, job: SlurmJob) -> SlurmJob:
        """`job` with the submit time it had when first seen, if Slurm requeued it since."""
        seen = self._seen.get(job.job_id)
        requeued = (seen is not None and job.submit_time > seen.submit
                    and job.restart_count > seen.restarts)
        if seen is not None and (requeued or job.submit_time == seen.submit):
            if requeued:
                self._seen[job.job_id] = replace(seen, submit=job.submit_time,
                                                 restarts=job.restart_count)
            if seen.first_submit == job.submit_time:
                return job
            return replace(job, submit_time=seen.first_submit)
        self._seen[job.job_id] = _Seen(job.submit_time, job.submit_time, job.restart_count)
        return job

    def seed(self, job: SlurmJob, first_submit: float) -> None:
        """Take `first_submit` as the submit time `job` (as Slurm lists it now) was first seen
        with."""
        self._seen[job.job_id] = _Seen(first_submit, job.submit_time, job.restart_count)

    def forget_others(self, listed: Iterable[int]) -> None:
        """Drop the job ids Slurm no longer lists (a full read of the queue)."""
        keep = set(listed)
        self._seen = {j: s for j, s in self._seen.items() if j in keep}
