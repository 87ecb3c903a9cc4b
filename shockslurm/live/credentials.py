"""The one-second rule for starting a stopped job again.

When a job ends on a node, that node's slurmd revokes the job's credential, stamped with the
wall-clock second it did so; a later launch of the same job id there is refused when its new
credential was created in or before that second (22.05.8: slurmctld logs "Killing non-startable
batch JobId=N: Job credential revoked" and the job ends FAILED, exit code 1, RunTime 0: the
user's job is lost). Slurm's own requeue delay (BeginTime, about 2 minutes) keeps clear of this;
`StartTime=now`, which the daemon sends to spare that delay, does not. Measured on the test
cluster: a batch job requeued and started again on the same node within the second it ended
failed this way in 1 of 4 tries.

So the daemon records when each job it requeued was seen off its nodes (`left`), and before a
release that starts such a job again within that same second on a node it may use again (no
pin, or a pin that shares a node with where it ran), it waits for the next second
(`wait_s`, at most 1 s, counted as switch time).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping

MARGIN_S = 0.02     # past the second boundary, for clocks read a moment apart


@dataclass(frozen=True)
class _Left:
    at: float                       # wall time the job was seen holding no GPUs
    nodes: frozenset[str]           # where it ran (empty: unknown)


class RecentDepartures:
    """Jobs the daemon stopped, until the second they left their nodes has passed."""

    def __init__(self) -> None:
        self._left: dict[int, _Left] = {}

    def left(self, nodes_by_job: Mapping[int, Iterable[str]], at: float) -> None:
        """The jobs of `nodes_by_job` were seen off their nodes at wall time `at`."""
        self._forget_before(at)           # only the current second's departures matter
        for job_id, nodes in nodes_by_job.items():
            self._left[job_id] = _Left(at, frozenset(nodes))

    def wait_s(self, starts: Iterable[int], pins: Mapping[int, Iterable[str]],
               now: float) -> float:
        """How long to wait at wall time `now` before releasing `starts` (pinned by `pins`):
        until the second after the last departure of a job among them that may land on a node
        it left in the current second; 0 when none may."""
        self._forget_before(now)
        wait = 0.0
        for job_id in starts:
            left = self._left.get(job_id)
            if left is None or not _may_reuse(left, frozenset(pins.get(job_id, ()))):
                continue
            wait = max(wait, math.floor(left.at) + 1 + MARGIN_S - now)
        return min(max(wait, 0.0), 1.0 + MARGIN_S)

    def _forget_before(self, now: float) -> None:
        second = math.floor(now)
        self._left = {j: v for j, v in self._left.items() if math.floor(v.at) >= second}


def _may_reuse(left: _Left, pinned: frozenset[str]) -> bool:
    """Whether a job started with pin `pinned` may run on a node it `left`."""
    return not pinned or not left.nodes or bool(pinned & left.nodes)
