"""Events that start a round before its time (pure; `SlurmCluster.wants_early_round` reads
Slurm once and asks here).

- A completion: a job of the last enacted plan has finished (its GPUs are free) while a job of
  ours outside the plan waits.
- A departure of another's job: a job the daemon does not schedule (another partition's on
  shared nodes, an unmanaged one) held GPUs on our nodes at the last round and holds none now,
  and a waiting job of ours fits the GPUs idle now: the round's capacity left those GPUs out, so
  without an event they would idle until the next round.
- An arrival: a job of ours that was not there at the last round is pending and its gang fits
  the GPUs idle now, node by node (`node_book.NodeBook`), so it can start at once, as plain Slurm
  would start it, instead of waiting up to a round. Only new jobs count: a job the policy chose
  to leave waiting does not restart the round every poll.
"""

from __future__ import annotations

from typing import Callable, Collection, Sequence

from ..model import pool
from ..node_book import NodeBook
from ..slurm.gres import host_set
from ..slurm.types import JobState, SlurmJob, SlurmNode
from .layout import PLACED_STATES, Layout


def arrivals_that_fit(layout: Layout, pending: Sequence[SlurmJob],
                      known: Collection[int]) -> list[int]:
    """Ids of the `pending` jobs not in `known` whose GPUs some free node(s) they may run on
    can hold now (arrivals: `known` is the jobs seen at the last round; departures: nothing)."""
    new = [j for j in pending if j.job_id not in known and j.gpus > 0]
    if not new or not layout.nodes:
        return []
    free = layout.free()
    book = NodeBook(layout.nodes, {n.name: n.gpus - max(0, free[n.name]) for n in layout.nodes})
    return sorted(j.job_id for j in new
                  if book.can_take(j.gpus, layout.allowed.get(j.job_id), j.node_parts))


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


def others_holding(jobs: Sequence[SlurmJob], ours: Callable[[SlurmJob], bool],
                   nodes: Collection[str] | None) -> frozenset[int]:
    """Jobs that hold GPUs the policy cannot hand out: others' jobs (not `ours`) holding GPUs
    on `nodes` (on any node when `nodes` is None, or when Slurm does not say where a job sits),
    and ours that hold GPUs but never run again or are in a state we do not know (COMPLETING,
    UNKNOWN with nodes: `SlurmJob.holds_gpus`)."""
    out = set()
    for j in jobs:
        if not j.holds_gpus or j.gpus <= 0:
            continue
        if ours(j):
            if j.state not in PLACED_STATES:      # COMPLETING, or a state we do not know
                out.add(j.job_id)
            continue
        if nodes is None or not j.node_list or _on(j.node_list, nodes):
            out.add(j.job_id)
    return frozenset(out)


def _on(node_list: str, nodes: Collection[str]) -> bool:
    names = host_set(node_list)
    return names is None or bool(names & set(nodes))   # unreadable: count it as on our nodes


def departures_with_waiting(jobs: Sequence[SlurmJob], holding: Collection[int],
                            ours: Callable[[SlurmJob], bool],
                            never: Collection[int]) -> tuple[list[int], list[int]]:
    """(gone, waiting): the jobs of `holding` (`others_holding` at the last round) that hold no
    GPUs now and, when any, our pending jobs that may be planned (not in `never`)."""
    still = {j.job_id for j in jobs if j.holds_gpus}
    gone = sorted(j for j in holding if j not in still)
    if not gone:
        return [], []
    waiting = sorted(j.job_id for j in jobs if j.state is JobState.PENDING and ours(j)
                     and j.job_id not in never)
    return gone, waiting


def watched_partitions(nodes: Sequence[SlurmNode], partitions: Sequence[str]) -> tuple[str, ...]:
    """`partitions` and every other partition with a node among theirs (sorted after them):
    the partitions whose jobs can hold GPUs the daemon plans around."""
    ours = set(partitions)
    shared = {p for n in nodes if set(n.partitions) & ours for p in n.partitions} - ours
    return tuple(partitions) + tuple(sorted(shared))


def pool_layout(capacity: int, jobs: Sequence[SlurmJob],
                ours: Callable[[SlurmJob], bool]) -> Layout:
    """When Slurm does not say where jobs sit: one pool of `capacity` GPUs (as the round plans),
    our placed jobs' GPUs taken."""
    one = pool(capacity)
    held = sum(j.gpus for j in jobs if ours(j) and j.state in PLACED_STATES)
    return Layout(one, reserved={n.name: held for n in one})
