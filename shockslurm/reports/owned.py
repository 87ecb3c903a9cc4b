"""Reports of plain `sbatch` jobs: accepted by who wrote the file, as Slurm says who owns the job.

A job submitted with plain `sbatch` (tagged managed by job_submit.lua) has no report secret and no
registration: its reports arrive unsigned and name only its Slurm job id. The daemon accepts one
such report when all of these hold:
- it is unsigned (a signature means a key was meant: only `records.check_report` judges those);
- the job it names was active in the last 10 minutes (`RecentOwners`: its last reports come as
  it ends), under this daemon's cluster name, and Slurm says which user runs it (`SlurmJob.user`, its uid from `raw["user_id"]` else the passwd database);
- the spool file's owner uid (`lstat` of the entry, `spool_read.Read.owner`) is that user's. A
  user can create files in the spool only as themself (mode 1733: no chown, and the sticky bit
  keeps others' names), so a file owned by uid U was written by U (or root): no user can report
  for another user's job;
- the job has no registration with a report key (a `shocksub` job must sign its reports), and
  the report is no replay of a stored one.
The first such report registers the job in the store (the registry run, `owner` = Slurm's user,
no key, the spec from its comment or the defaults), so the daemon's view uses its reports from
then on. The file is still read as its owner (`spool_read`). No torch import.
"""

from __future__ import annotations

import pwd
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from sqlalchemy.orm import Session

from ..slurm.types import SlurmJob
from ..store import repository as repo
from ..train import records


@dataclass(frozen=True)
class SlurmOwner:
    """Who runs an active Slurm job, as Slurm says (the daemon's squeue read of this round)."""

    uid: int
    user: str
    submit_s: float
    comment: str
    gpus: int


def slurm_owners(jobs: Sequence[SlurmJob]) -> dict[int, SlurmOwner]:
    """{job id: owner} for the jobs whose user's uid is known."""
    out = {}
    for job in jobs:
        uid = job.raw.get("user_id") if isinstance(job.raw, Mapping) else None
        if not isinstance(uid, int) or isinstance(uid, bool):
            try:
                uid = pwd.getpwnam(job.user).pw_uid
            except KeyError:
                continue
        out[job.job_id] = SlurmOwner(uid, job.user, job.submit_time, job.comment, max(1, job.gpus))
    return out


class RecentOwners:
    """The owners of the jobs seen active in the last `memory_s` seconds: a job's last reports
    (its final epoch and checkpoint) reach the spool as it ends, and are ingested after it left
    the active set."""

    def __init__(self, memory_s: float = 600.0) -> None:
        self.memory_s = memory_s
        self._seen: dict[int, tuple[SlurmOwner, float]] = {}

    def update(self, active: Mapping[int, SlurmOwner], now: float) -> dict[int, SlurmOwner]:
        """Note this round's active jobs; returns every owner still remembered."""
        for job_id, owner in active.items():
            self._seen[job_id] = (owner, now)
        self._seen = {j: (o, t) for j, (o, t) in self._seen.items() if now - t <= self.memory_s}
        return {j: o for j, (o, _) in self._seen.items()}


def _spec(comment: str) -> Any:
    from ..live.specs import DEFAULT_SPEC, BadSpec, spec_from_comment, spec_from_mapping

    try:
        raw = spec_from_comment(comment)
        return spec_from_mapping(raw, "comment") if raw is not None else DEFAULT_SPEC
    except BadSpec:
        return DEFAULT_SPEC


def accept_owned(session: Session, report: Any, file_uid: int | None, cluster: str,
                 owners: Mapping[int, SlurmOwner]) -> int | None:
    """The store key of the job an unsigned report is accepted for by its file's owner (see the
    module), registering the job on its first report; None when the rule does not apply."""
    if not isinstance(report, dict) or records.SIG_FIELD in report or file_uid is None:
        return None
    job_id = report.get("job_id")
    if (type(job_id) is not int or report.get("job_pk") is not None
            or (report.get("cluster") or "slurm") != cluster):
        return None
    owner = owners.get(job_id)
    if owner is None or owner.uid != file_uid:
        return None
    records.validate(report)                     # raises BadReport for a malformed one
    found = repo.registered_jobs(session, cluster, {job_id: owner.submit_s}).get(job_id)
    if found is not None and (found.report_key is not None or found.owner != owner.user):
        return None                              # a shocksub job: its reports must be signed
    if found is None:
        spec = _spec(owner.comment)
        found = repo.register_submitted_job(
            session, cluster, job_id=job_id, submit_s=owner.submit_s, model=spec.model,
            epochs=spec.epochs, samples_per_epoch=spec.samples_per_epoch,
            batch_sizes=spec.batch_sizes, gang_size=owner.gpus, owner=owner.user)
        session.flush()
    if records.already_stored(session, report, found.id):
        raise records.BadReport(f"replayed report for job_id {job_id}: stored already")
    return int(found.id)
