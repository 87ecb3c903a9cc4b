"""Slurm-like gang FIFO with EASY backfill on nodes: the baseline an HPC center runs today.

Non-preemptive: a job that ran last round keeps its gang, where it runs, until it finishes.
Waiting jobs start in arrival order while their gang fits on the nodes around the running jobs
(one pool under `--gpus N`). When the head of the queue does not fit, it gets a reservation, as
Slurm's backfill gives it: the earliest time its gang fits on nodes as the running jobs end (from
their remaining run time at their current speed, standing in for Slurm's time limits), on the
nodes it would take then. A later job may start now only if it fits and either ends before that
time or leaves the head's reserved GPUs free (it fits, at that time, beside the head).

The plan places itself (`RoundPlan.placement`: the running jobs where they run, each start where
the backfill put it, on the node it was released to when that has room: `Snapshot.pinned`) and
allows no moves (`moves_allowed` False), so the round loop keeps it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection

from ..model import JobView, NodeShares, RoundPlan, Snapshot
from ..node_book import NodeBook, holds_whole_in, stay_order


@dataclass
class _Reservation:
    start_at: float          # when the head's gang fits (inf: never, as far as is known)
    later: NodeBook | None   # the nodes then: the jobs still running, the head, the backfill


class Fifo:
    name = "fifo"

    def allocate(self, snapshot: Snapshot) -> RoundPlan:
        running = [j for j in snapshot.jobs if j.ran_last_round]
        now, where = _book_with(snapshot, running)
        queue = sorted((j for j in snapshot.jobs if not j.ran_last_round),
                       key=lambda j: (j.arrival_s, j.job_id))
        ends = {j.job_id: j.remaining_time_at_current_rate for j in running}
        reservation: _Reservation | None = None
        for job in queue:
            gang, left = job.gang_size, job.remaining_time_at_current_rate
            pinned = snapshot.pinned.get(job.job_id)    # released already: where it starts
            within = snapshot.allowed_nodes.get(job.job_id)
            parts = snapshot.parts(job.job_id)
            if reservation is None:
                got = now.take(gang, prefer=pinned, within=within, spread=parts)
                if got is None:
                    reservation = _reserve(snapshot, gang, within, parts, where, ends)
                    continue
            elif reservation.later is None or left <= reservation.start_at:
                # gone before the head starts
                got = now.take(gang, prefer=pinned, within=within, spread=parts)
            else:
                got = _take_in_both(now, reservation.later, gang, within, parts)
            if got is not None:
                where[job.job_id] = got
                ends[job.job_id] = left
        return RoundPlan(frozenset(where), placement=where, moves_allowed=False)


def _book_with(snapshot: Snapshot, running: list[JobView]
               ) -> tuple[NodeBook, dict[int, NodeShares]]:
    """The snapshot's nodes with the running jobs' GPUs taken where they run (by best fit for a
    running job whose nodes the snapshot does not name), and where each one runs."""
    book = NodeBook(snapshot.cluster_nodes, snapshot.reserved)
    gang = {j.job_id: j.gang_size for j in running}
    where: dict[int, NodeShares] = {}
    unplaced = []
    for job_id in stay_order(book, gang, gang):
        shares = snapshot.placements.get(job_id)
        if shares and book.take_at(tuple(shares)):
            where[job_id] = tuple(shares)
        else:
            unplaced.append(job_id)
    for job_id in unplaced:
        got = book.take(gang[job_id], within=snapshot.allowed_nodes.get(job_id),
                        spread=snapshot.parts(job_id))
        if got is not None:
            where[job_id] = got
    return book, where


def _reserve(snapshot: Snapshot, gang: int, within: Collection[str] | None, parts: int,
             where: dict[int, NodeShares], ends: dict[int, float]) -> _Reservation:
    """The head's reservation: the planned jobs end in order of their remaining time until the
    head's gang fits on nodes (of `within`, the nodes it may run on, when given; in `parts`
    equal parts on as many nodes, when above 1); it takes them then."""
    later = NodeBook(snapshot.cluster_nodes, snapshot.reserved)
    whole = {j: holds_whole_in(later, snapshot, j, shares) for j, shares in where.items()}
    for job_id, shares in where.items():
        later.take_at(shares, whole[job_id])
    for job_id in sorted(where, key=lambda j: (ends[j], _gpus(where[j]), j)):
        later.release(where[job_id], whole[job_id])
        if later.can_take(gang, within, parts):
            later.take(gang, within=within, spread=parts)
            return _Reservation(ends[job_id], later)
    return _Reservation(float("inf"), None)


def _take_in_both(now: NodeBook, later: NodeBook, gang: int,
                  within: Collection[str] | None, parts: int = 1) -> NodeShares | None:
    """A gang that runs past the head's start: on nodes (of `within` when given) with room now
    and beside the head then (best fit now; whole nodes, in both books, for a multi-node
    gang; in `parts` equal parts, each on a node with room for it in both, when above 1)."""
    spans = parts == 1 and now.spans(gang, within)
    need = gang // parts
    room = {n.name for n in later.nodes if later.free_on(n.name) >= (n.gpus if spans else need)
            and (within is None or n.name in within)}
    got = now.take(gang, within=room, spread=parts)
    whole = now.holds_whole(gang, parts)
    if got is not None and not later.take_at(got, whole):
        now.release(got, whole)
        return None
    return got


def _gpus(shares: NodeShares) -> int:
    return sum(g for _, g in shares)
