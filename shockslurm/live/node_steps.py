"""Phase 1's steps on nodes (`live.phases`): the plan placed again around the jobs the churn
bounds keep, the starts whose planned nodes are still held, and the stops whose GPUs no start
takes. Pure but for their log lines and the round's `EnactStats`."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Callable, Collection, Mapping, Sequence

from ..churn_rules import idle_stops
from ..model import NodeShares, RoundPlan, Snapshot
from ..placement import moved_jobs
from ..plan_on_nodes import free_after, place_around
from ..slurm.types import JobState, SlurmJob
from . import enact as en
from .journaling import EnactStats

log = logging.getLogger("shockslurm.live.cluster")


def place_around_kept(plan: RoundPlan, snapshot: Snapshot, kept: Collection[int],
                      movable: Callable[[], set[int]], moved: set[int]
                      ) -> tuple[RoundPlan, set[int]]:
    """When the churn bounds `kept` a job the plan stops or moves, the plan placed again around
    the jobs they keep, as in the simulator (`plan_on_nodes.place_around`), with the running
    jobs they let move (`movable`, read only then) free to move (a gang planned onto a kept
    job's GPUs may take another node that moves make room on); and the moves of the result
    (else `moved`)."""
    if not (snapshot.nodes and plan.placement and kept):
        return plan, moved
    placed = place_around(plan, snapshot, movable() - set(kept))
    now_moved = set(moved_jobs(placed.placement, snapshot.placements))
    if placed.info_ids("replaced") or placed.run != plan.run or now_moved != moved:
        log.info("placed the plan again around the jobs kept running: starts on other "
                 "nodes %s, moves %s, not placed %s", sorted(placed.info_ids("replaced")),
                 sorted(now_moved), sorted(set(plan.run) - set(placed.run)))
    return placed, now_moved


def fit_nodes(plan: RoundPlan, snapshot: Snapshot, ours: Sequence[SlurmJob],
              moved: set[int], stats: EnactStats,
              unseen: Mapping[int, NodeShares] | None = None,
              closed: Collection[str] = ()) -> RoundPlan:
    """The plan without the starts whose planned nodes lack GPUs once the jobs that keep
    running are counted (`enact.fit_on_nodes`): planned running jobs that are not moved,
    running jobs the churn bounds or a failed signal keep (they are in `plan.run`), and
    `unseen`: the shares (job id -> GPUs per node) of jobs that hold GPUs now although the
    snapshot did not see them running. Nothing starts on a `closed` node (drained, down, in
    maintenance: the snapshot keeps one while jobs of ours run there, and a plan that stops or
    moves them would otherwise start another job there, pinned to a node that takes none)."""
    if not snapshot.nodes or not plan.placement:
        return plan
    by_id = {j.job_id: j for j in ours}
    holding = {j for j in plan.run if j in snapshot.placements and j not in moved}
    free = free_after(snapshot.nodes, snapshot.reserved,
                      {**{j: snapshot.placements[j] for j in holding}, **(unseen or {})})
    for name in set(closed) & set(free):
        free[name] = min(free[name], 0)
    starts = sorted((j for j in plan.run if j in by_id and j not in holding),
                    key=lambda j: (by_id[j].submit_time, j))
    dropped = en.fit_on_nodes(starts, plan.placement, free)
    if not dropped:
        return plan
    log.info("not starting %s this round: their planned nodes are still held by jobs "
             "that keep running", list(dropped))
    stats.dropped = tuple(sorted(set(stats.dropped) | set(dropped)))
    return replace(plan, run=plan.run - frozenset(dropped),
                   info={**plan.info, "node_dropped": list(dropped)})


def keep_idle_stops(plan: RoundPlan, snapshot: Snapshot, ours: Sequence[SlurmJob],
                    moved: set[int], resumed: set[int], remaining: Mapping[int, float],
                    stats: EnactStats) -> RoundPlan:
    """The plan with the running jobs it stops but whose GPUs no job of the round takes
    kept where they run (`churn_rules.idle_stops`, the job nearest its end first); stops
    begun earlier go on."""
    if not snapshot.nodes:
        return plan
    stopping = sorted((j.job_id for j in ours if j.state is JobState.RUNNING
                       and j.job_id not in plan.run and j.job_id not in resumed
                       and j.job_id in snapshot.placements),
                      key=lambda j: (remaining.get(j, float("inf")), j))
    if not stopping:
        return plan
    holding = {j for j in plan.run if j in snapshot.placements and j not in moved}
    where = {**{j: plan.placement.get(j, ()) for j in plan.run - holding},
             **{j: snapshot.placements[j] for j in holding}}
    free = free_after(snapshot.nodes, snapshot.reserved, where)
    kept = idle_stops(stopping, snapshot.placements, free)
    if not kept:
        return plan
    log.info("keeping %s running: no job of this round takes their GPUs", list(kept))
    stats.kept = {**stats.kept, **dict.fromkeys(kept, "idle")}
    return replace(plan, run=plan.run | frozenset(kept),
                   placement={**plan.placement,
                              **{j: snapshot.placements[j] for j in kept}})
