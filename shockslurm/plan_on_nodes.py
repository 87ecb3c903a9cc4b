"""A round's plan on the snapshot's nodes (the node rules themselves are `placement`'s):

- `place_plan`: the round loop's placement step, for every policy (`engine`);
- `place_around`: the plan placed again once the churn bounds kept a job it stops or moves, the
  same in the daemon (`live.phases`) and the simulator (`sim.cluster`): the jobs they keep stay
  where they run, the running jobs they let move may move;
- `free_after` and `fit_on_nodes`: free GPUs per node once some jobs hold theirs, and the
  starts whose planned nodes lack them.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

from .model import Node, NodeShares, RoundPlan, Snapshot
from .node_book import NodeBook, holds_whole_in, stay_order
from .placement import Placement, moved_jobs, place


def place_plan(plan: RoundPlan, snapshot: Snapshot) -> RoundPlan:
    """The round loop's placement step: `plan` on the snapshot's nodes (one pool when it names
    none). The result runs only placed jobs and carries their `placement`; `info` gains
    `unplaced`, `kept` and `moved` (job ids) when placement changed anything. A plan with
    `moves_allowed` False (a non-preemptive policy's) moves no running job; a plan the policy
    placed itself (every job of `run` in its `placement`) is kept when it fits the nodes."""
    if not snapshot.cluster_nodes:     # no GPUs at all (every node down or drained)
        info = {**plan.info, "unplaced": sorted(plan.run)} if plan.run else dict(plan.info)
        return RoundPlan(frozenset(), info, {})
    gang = {v.job_id: v.gang_size for v in snapshot.jobs}
    running = {j: s for j, s in snapshot.placements.items() if j in gang}
    if plan.run and set(plan.placement) == set(plan.run) and _fits(plan, snapshot, gang):
        info = dict(plan.info)
        shares = {j: tuple(s) for j, s in plan.placement.items()}
        moved = moved_jobs(shares, running)
        if moved:
            info["moved"] = list(moved)
        return RoundPlan(plan.run, info, shares)
    result = place(snapshot.cluster_nodes, {j: gang[j] for j in plan.run}, running,
                   snapshot.reserved, moves=plan.moves_allowed, pinned=snapshot.pinned,
                   allowed=snapshot.allowed_nodes, node_counts=snapshot.node_counts)
    return RoundPlan(result.jobs, _noted(plan, result), dict(result.shares))


def _fits(plan: RoundPlan, snapshot: Snapshot, gang: Mapping[int, int]) -> bool:
    """Whether the policy's own placement of `plan` holds every gang whole on the snapshot's
    nodes, none over its free GPUs, each on nodes it may run on, in the parts it asks for."""
    book = NodeBook(snapshot.cluster_nodes, snapshot.reserved)
    allowed = snapshot.allowed_nodes
    return all(sum(g for _, g in plan.placement[j]) == gang[j]
               and (j not in allowed or all(n in allowed[j] for n, _ in plan.placement[j]))
               and (snapshot.parts(j) == 1 or _in_parts(plan.placement[j], snapshot.parts(j)))
               and book.take_at(tuple(plan.placement[j]),
                                holds_whole_in(book, snapshot, j, plan.placement[j]))
               for j in stay_order(book, gang, plan.run))


def _in_parts(shares: NodeShares, parts: int) -> bool:
    """Whether `shares` are `parts` equal parts (one per node)."""
    return len(shares) == parts and len({g for _, g in shares}) == 1


def _noted(plan: RoundPlan, result: Placement) -> dict[str, object]:
    """`plan.info` with what placement changed (`unplaced`, `kept`, `moved` job ids) added."""
    info = dict(plan.info)
    for key in ("unplaced", "kept", "moved"):
        if getattr(result, key):
            info[key] = sorted(plan.info_ids(key) | set(getattr(result, key)))
    return info


def place_around(plan: RoundPlan, snapshot: Snapshot, movable: Iterable[int] = ()) -> RoundPlan:
    """`plan` placed again after the churn bounds changed it, in the daemon and the simulator
    alike: its running jobs stay where they run (held GPUs) unless `movable` (the running jobs
    the bounds let the round move); starts and moves go around them (a gang planned onto a kept
    job's node takes a node with room, moving movable jobs when that places more, or is
    `unplaced`); `info["replaced"]`: starts on other nodes."""
    if not snapshot.cluster_nodes:
        return plan
    gang = {v.job_id: v.gang_size for v in snapshot.jobs}
    allowed = set(movable)
    fixed = {j: tuple(s) for j, s in snapshot.placements.items()
             if j in plan.run and j not in allowed}
    free = free_after(snapshot.cluster_nodes, snapshot.reserved, fixed)
    others = {j: s for j, s in snapshot.placements.items() if j in gang and j not in fixed}
    result = place(snapshot.cluster_nodes, {j: gang[j] for j in plan.run if j not in fixed},
                   others, {n.name: n.gpus - free[n.name] for n in snapshot.cluster_nodes},
                   pinned=snapshot.pinned, allowed=snapshot.allowed_nodes,
                   node_counts=snapshot.node_counts)
    shares = {**result.shares, **fixed}
    info = _noted(plan, result)
    replaced = sorted(j for j, s in result.shares.items()
                      if j in plan.placement and tuple(plan.placement[j]) != s)
    if replaced:
        info["replaced"] = replaced
    return RoundPlan(frozenset(shares), info, shares)


def free_after(nodes: Sequence[Node], reserved: Mapping[str, int],
               placement: Mapping[int, NodeShares]) -> dict[str, int]:
    """Free GPUs per node once the `reserved` GPUs and every job's shares in `placement` are
    taken (below 0 where they overfill a node; shares on unknown nodes are ignored)."""
    free = {n.name: n.gpus - reserved.get(n.name, 0) for n in nodes}
    for shares in placement.values():
        for name, gpus in shares:
            if name in free:
                free[name] -= gpus
    return free


def fit_on_nodes(starts: Sequence[int], placement: Mapping[int, NodeShares],
                 free: Mapping[str, int]) -> tuple[int, ...]:
    """The jobs of `starts` (in that order) whose planned nodes no longer have their GPUs,
    given `free` GPUs per node once the jobs that keep running are counted; a job that fits
    takes its GPUs before the next is tried. Jobs without a placement are not judged."""
    left = dict(free)
    dropped = []
    for job_id in starts:
        shares = placement.get(job_id)
        if not shares:
            continue
        if all(left.get(n, 0) >= g for n, g in shares):
            for n, g in shares:
                left[n] -= g
        else:
            dropped.append(job_id)
    return tuple(dropped)
