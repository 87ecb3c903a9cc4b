"""Idle GPU-seconds by cause, from the squeue reads the live cluster makes anyway (each round's
observe and the event polls between rounds); no extra read.

- `switch`: the GPUs a round's stops freed, from the moment the daemon saw them free (the poll
  of its stop wait, every 0.5 s) until the jobs released in their place are RUNNING (Slurm's
  start time, 1 s resolution) or, for one still pending, until the next read (after that it
  counts as `unplaceable` or `waiting`). Counted GPUs: the freed GPUs, at most the successors'
  GPUs beyond those that were already free at the round's observe.
- `waiting`: at each read, the free GPUs of the managed nodes (less those counted for released
  jobs waiting in Reason=Resources) that held pending jobs of ours could use (each asks no more
  GPUs than are free; jobs never planned excluded): min(free, their GPUs), counted until the
  next read, or until the end of the round that read, which counts on from there without the
  GPUs of the jobs it released. It is what waits for a round: the next boundary, or the
  round's own stops.
- `unplaceable` is measured by the cluster at each observe (`layout.unplaceable_idle_gpu_s`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Collection, Mapping, Sequence

from ..slurm.types import JobState, SlurmJob
from .layout import RESOURCES_REASON

CAUSES = ("switch", "unplaceable", "waiting")


def waiting_gpus(jobs: Sequence[SlurmJob], free: int, ours: Collection[int],
                 never: Collection[int]) -> int:
    """GPUs idle at one read that held pending jobs of ours (`ours`, less `never`) could use."""
    unplaceable = sum(j.gpus for j in jobs if j.job_id in ours and j.state is JobState.PENDING
                      and not j.held and j.reason == RESOURCES_REASON)
    left = max(0, free - unplaceable)
    asked = sum(j.gpus for j in jobs if j.job_id in ours and j.job_id not in never
                and j.state is JobState.PENDING and j.held and 0 < j.gpus <= left)
    return min(left, asked)


@dataclass
class _Switch:
    freed_at: float                      # wall time the stopped jobs' GPUs were seen free
    gpus: int                            # GPUs counted
    successors: dict[int, int]           # job id -> GPUs, released in its place


@dataclass
class SwitchClock:
    """Accumulates `switch` and `waiting` idle GPU-seconds between rounds (see the module)."""

    switch_gpu_s: float = 0.0            # since the last `take_switch`
    waiting_gpu_s: float = 0.0           # since the last `take_waiting`
    totals: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CAUSES, 0.0))
    _open: list[_Switch] = field(default_factory=list)
    _last: tuple[float, int] | None = None   # (time of the last read, waiting GPUs then)

    def begin(self, freed_at: float, freed_gpus: int, successors: Mapping[int, int],
              free_before: int = 0) -> None:
        """A round's stops freed `freed_gpus` at `freed_at`; `successors` were released."""
        gpus = min(freed_gpus, max(0, sum(successors.values()) - free_before))
        if gpus > 0 and successors:
            self._open.append(_Switch(freed_at, gpus, dict(successors)))

    def read(self, now: float, jobs: Sequence[SlurmJob], waiting: int) -> None:
        """One squeue read at `now`: close the switches whose successors run, count the
        waiting GPUs of the previous read up to now."""
        if self._last is not None:
            t, gpus = self._last
            self._add("waiting", gpus * max(0.0, now - t))
        self._last = (now, waiting)
        by_id = {j.job_id: j for j in jobs}
        for sw in self._open:
            ends = []
            for job_id in sw.successors:
                job = by_id.get(job_id)
                started = job.start_time if job is not None and job.state is not \
                    JobState.PENDING and job.start_time is not None else None
                ends.append(now if started is None else min(now, started))
            self._add("switch", sw.gpus * max(0.0, max(ends, default=now) - sw.freed_at))
        self._open = []

    def round_done(self, now: float, started_gpus: int) -> None:
        """A round ended at `now` having released jobs of `started_gpus`: the waiting GPUs of
        the last read are counted up to now, and from now on less those the releases took
        (until the next read says more)."""
        if self._last is None:
            return
        t, gpus = self._last
        self._add("waiting", gpus * max(0.0, now - t))
        self._last = (now, max(0, gpus - started_gpus))

    def _add(self, cause: str, gpu_s: float) -> None:
        self.totals[cause] += gpu_s
        if cause == "switch":
            self.switch_gpu_s += gpu_s
        else:
            self.waiting_gpu_s += gpu_s

    def take_switch(self) -> float:
        out, self.switch_gpu_s = self.switch_gpu_s, 0.0
        return out

    def take_waiting(self) -> float:
        out, self.waiting_gpu_s = self.waiting_gpu_s, 0.0
        return out
