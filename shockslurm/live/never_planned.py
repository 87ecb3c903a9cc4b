"""The jobs of ours the live cluster never plans, and why (`NeverPlanned`, `SlurmCluster`'s):

- impossible requests: a pending job no node of the managed partitions, in any state, can ever
  hold, or none it may run on (`job_nodes.never_fits`: its partition's, GPU type, its user's
  limits), flagged once; a job only drained or down nodes could hold waits for them, unflagged;
- bad specs: a job whose spec (comment or registration) is not valid (`specs.BadSpec`), flagged
  once and scheduled with the defaults never (it is journalled with them, so the store can
  record it).

Each verdict is logged and queued for the store (`_flags_new`) once per job (id and submit
time: a requeued job keeps both, a new job with a reused id does not).
"""

from __future__ import annotations

import logging
from typing import Mapping, Sequence

from ..slurm.types import JobState, SlurmJob, SlurmNode
from .job_nodes import NodeLimits, never_fits
from .layout import impossible_reason
from .specs import DEFAULT_EPOCH_SECONDS, DEFAULT_SPEC, BadSpec, LiveSpec, job_spec

log = logging.getLogger("shockslurm.live.cluster")


class NeverPlanned:
    """The never-planned verdicts of `SlurmCluster` (module docstring)."""

    partitions: tuple[str, ...]
    impossible: dict[tuple[int, float], str]     # never planned: the reason
    bad_specs: dict[tuple[int, float], str]      # never planned: the reason
    _flags_new: list[tuple[SlurmJob, str]]       # flagged, not yet in the store

    def _spec(self, job: SlurmJob, registered: Mapping[int, Mapping[str, object]]) -> LiveSpec:
        """The job's spec; for a bad one (`BadSpec`) the defaults, and the job is recorded in
        `bad_specs` (never planned) and queued to be flagged, once per job."""
        try:
            spec = job_spec(job.comment, registered.get(job.job_id))
        except BadSpec as exc:
            self._flag_once(self.bad_specs, job, f"bad spec: {exc}")
            return DEFAULT_SPEC
        if spec.source == "default":
            log.warning("job %s carries no shock:spec and is not registered; using defaults "
                        "(%s s per epoch)", job.job_id, DEFAULT_EPOCH_SECONDS)
        return spec

    def _flag_once(self, where: dict[tuple[int, float], str], job: SlurmJob,
                   reason: str) -> None:
        """Record a job that is never planned (`where`), log and queue its flag, once."""
        key = (job.job_id, job.submit_time)
        if key not in where:
            where[key] = reason
            self._flags_new.append((job, reason))
            log.warning("job %s is never scheduled: %s; it stays held", job.job_id, reason)

    def _impossible(self, active: Sequence[SlurmJob], nodes: Sequence[SlurmNode]) -> set[int]:
        """Pending jobs of ours no usable node can hold now (more GPUs per node than any, or
        than all): not planned this round. Those that no node of the managed partitions in any
        state can ever hold, or none they may run on (`job_nodes.never_fits`: their partition's,
        GPU type, user's limits), are flagged once as well; the others wait for drained or down
        nodes to come back."""
        ours = [n for n in nodes if set(n.partitions) & set(self.partitions) and n.gpus > 0]
        usable = [n.gpus for n in ours if n.usable]
        if not usable:       # nothing usable now: no verdict (capacity is 0 anyway)
            return set()
        every = [n.gpus for n in ours]
        limits = NodeLimits(ours)
        out = set()
        for job in active:
            if job.state is not JobState.PENDING:
                continue
            never = impossible_reason(job, every) or never_fits(job, limits)
            if never is not None:
                self._flag_once(self.impossible, job, never)
            if never is not None or impossible_reason(job, usable):
                out.add(job.job_id)
        return out

    def _never(self) -> set[int]:
        """Jobs never planned (impossible requests, bad specs)."""
        return {j for j, _ in self.impossible} | {j for j, _ in self.bad_specs}
