"""Events that start a round before its time (pure; `SlurmCluster.wants_early_round` reads
Slurm once and asks here).

- A completion: a job of the last enacted plan has finished (its GPUs are free) while a job of
  ours outside the plan waits.
- An arrival: a job of ours that was not there at the last round is pending and its gang fits
  the GPUs idle now, node by node (`placement.NodeBook`), so it can start at once, as plain Slurm
  would start it, instead of waiting up to a round. Only new jobs count: a job the policy chose
  to leave waiting does not restart the round every poll.
"""

from __future__ import annotations

from typing import Callable, Collection, Sequence

from ..model import pool
from ..placement import NodeBook
from ..slurm.types import JobState, SlurmJob
from .layout import PLACED_STATES, Layout


def arrivals_that_fit(layout: Layout, pending: Sequence[SlurmJob],
                      known: Collection[int]) -> list[int]:
    """Ids of the `pending` jobs not in `known` whose GPUs some free node(s) can hold now."""
    new = [j for j in pending if j.job_id not in known and j.gpus > 0]
    if not new or not layout.nodes:
        return []
    free = layout.free()
    book = NodeBook(layout.nodes, {n.name: n.gpus - max(0, free[n.name]) for n in layout.nodes})
    return sorted(j.job_id for j in new if book.can_take(j.gpus))


def completions_with_waiting(jobs: Sequence[SlurmJob], planned: Collection[int],
                             ours: Callable[[SlurmJob], bool],
                             never: Collection[int]) -> tuple[list[int], list[int]]:
    """(freed, waiting): the jobs of the last plan that have finished (a final state, or gone
    from the queue; COMPLETING still holds its GPUs) and, when any has, our pending jobs outside
    the plan that may be planned (not in `never`)."""
    state = {j.job_id: j.state for j in jobs}
    freed = sorted(j for j in planned if j not in state or state[j].finished)
    if not freed:
        return [], []
    waiting = sorted(j.job_id for j in jobs if j.state is JobState.PENDING and ours(j)
                     and j.job_id not in planned and j.job_id not in never)
    return freed, waiting


def pool_layout(capacity: int, jobs: Sequence[SlurmJob],
                ours: Callable[[SlurmJob], bool]) -> Layout:
    """When Slurm does not say where jobs sit: one pool of `capacity` GPUs (as the round plans),
    our placed jobs' GPUs taken."""
    one = pool(capacity)
    held = sum(j.gpus for j in jobs if ours(j) and j.state in PLACED_STATES)
    return Layout(one, reserved={n.name: held for n in one})
