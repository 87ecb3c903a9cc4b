"""Where GPUs are on the live cluster: nodes, where our jobs sit, what others hold (pure).

Read from the round's two Slurm reads (`sinfo --json` nodes, `squeue --json` jobs) and handed to
the policy's snapshot (`Snapshot.nodes`, `placements`, `reserved`), so the round loop places
every plan on the real nodes:

- nodes: the usable nodes of the managed partitions that have GPUs (`Node(name, gpus,
  gpu_type)`: the type when all its GPUs are of one named type; a job asking for a type is
  placed only on nodes with it, `allowed`). A node that is not usable (drained, down) but still
  runs jobs of ours is kept, its other GPUs reserved, so those jobs are not moved and nothing
  new goes there.
- placements: where each of our RUNNING or SUSPENDED jobs holds its GPUs ((node, GPUs) per node,
  from `squeue`'s node list and per-node `gres_detail`, `slurm.gres.gpus_per_allocated_node`).
- reserved: GPUs per node held by jobs the daemon does not schedule, and by ours that are
  COMPLETING (they hold GPUs but never run again).
- pinned: where each of our released jobs that Slurm has not started yet is to start (its
  `ReqNodeList=`, the job's GPUs split evenly over the listed nodes). Slurm may be starting it
  as the round reads (measured: released 0.6 s before an early round, which placed it
  elsewhere; the re-pin failed, "Invalid node name specified", and it started where it was
  pinned, on the GPUs that round had given a third job, which then waited 11 s), so placement
  keeps it there while the plan leaves those nodes room. It holds no GPUs: not in `free`.
- allowed: the nodes each job of ours that may not run on every one of them may run on (its
  partition's, less what its user's limits rule out: `job_nodes`).
- node_counts: the jobs of ours that ask for GPUs per node on several nodes (`-N 2
  --gres=gpu:4`, `SlurmJob.node_parts`), placed in that many equal parts.

When Slurm's answer does not say where a job that holds GPUs sits, `read_layout` returns None
and the snapshot is one pool, as before placement.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Collection, Mapping, Sequence

from ..model import Node, NodeShares
from ..plan_on_nodes import free_after
from ..slurm.gres import gpus_per_allocated_node, required_node_names
from ..slurm.types import JobState, SlurmJob, SlurmNode
from .job_nodes import NodeLimits, limited_jobs, too_few_nodes

PLACED_STATES = (JobState.RUNNING, JobState.SUSPENDED)


@dataclass(frozen=True)
class Layout:
    nodes: tuple[Node, ...]
    placements: Mapping[int, NodeShares] = field(default_factory=dict)
    reserved: Mapping[str, int] = field(default_factory=dict)
    pinned: Mapping[int, NodeShares] = field(default_factory=dict)
    allowed: Mapping[int, frozenset[str]] = field(default_factory=dict)
    node_counts: Mapping[int, int] = field(default_factory=dict)

    @property
    def gpus(self) -> int:
        """GPUs the policy may hand out: the nodes' less the reserved ones."""
        return sum(n.gpus for n in self.nodes) - sum(self.reserved.values())

    def free(self, holding: Collection[int] | None = None) -> dict[str, int]:
        """Free GPUs per node once the reserved GPUs and those of our placed jobs (`holding`,
        default all of them) are taken."""
        placed = {j: shares for j, shares in self.placements.items()
                  if holding is None or j in holding}
        return free_after(self.nodes, self.reserved, placed)


def read_layout(nodes: Sequence[SlurmNode], jobs: Sequence[SlurmJob],
                partitions: Collection[str], ours: Callable[[SlurmJob], bool]) -> Layout | None:
    """The layout of the managed partitions' nodes; None when a job holding GPUs there cannot be
    located (see the module)."""
    managed = {n.name: n for n in nodes if set(n.partitions) & set(partitions) and n.gpus > 0}
    placements: dict[int, NodeShares] = {}
    reserved: dict[str, int] = {}
    pinned: dict[int, NodeShares] = {}
    for job in jobs:
        if job.state is JobState.PENDING and not job.held and ours(job):
            if (shares := pinned_shares(job)) is not None:
                pinned[job.job_id] = shares
            continue
        if not job.holds_gpus or job.gpus <= 0:
            continue
        where = gpus_per_allocated_node(job)
        if where is None:
            return None
        shares = tuple((n, g) for n, g in where if n in managed)
        if ours(job) and job.state in PLACED_STATES:
            placements[job.job_id] = shares
        else:
            for name, gpus in shares:
                reserved[name] = reserved.get(name, 0) + gpus
    ours_on: dict[str, int] = {}
    for shares in placements.values():
        for name, gpus in shares:
            ours_on[name] = ours_on.get(name, 0) + gpus
    kept = []
    for node in managed.values():
        if node.usable:
            kept.append(node)
        elif node.name in ours_on:        # draining: our jobs stay, nothing new goes there
            kept.append(node)
            reserved[node.name] = node.gpus
    names = {n.name for n in kept}
    out: dict[str, int] = {}
    for node in kept:
        held = reserved.get(node.name, 0)
        room = node.gpus - ours_on.get(node.name, 0)
        if held > 0:
            out[node.name] = max(0, min(held, room))
    placements = {j: kept_shares for j, shares in placements.items()
                  if (kept_shares := tuple(s for s in shares if s[0] in names))}
    pinned = {j: shares for j, shares in pinned.items()
              if all(n in names for n, _ in shares)}
    active = [j for j in jobs if ours(j) and not j.state.finished]
    return Layout(tuple(Node(n.name, n.gpus, _one_type(n)) for n in kept), placements, out,
                  pinned, limited_jobs(NodeLimits(kept), active), node_counts(active))


def node_counts(jobs: Sequence[SlurmJob]) -> dict[int, int]:
    """The jobs of `jobs` whose GPUs come in equal parts on several nodes, and how many."""
    return {j.job_id: j.node_parts for j in jobs if j.node_parts > 1}


def _one_type(node: SlurmNode) -> str | None:
    """The node's GPU type when its GPUs are all of one named type, else None."""
    return next(iter(node.gpu_types)) if len(node.gpu_types) == 1 else None


def pinned_shares(job: SlurmJob) -> NodeShares | None:
    """The GPUs per node of a pending job on its required nodes (`ReqNodeList=`, set when the
    daemon released it), or None: no list, an unreadable one, more nodes than GPUs, or a job
    asking GPUs per node whose GPUs do not split evenly over them. A `--gpus` job's split is
    Slurm's to choose when it starts: its shares split the GPUs as evenly as they go (a
    multi-node gang that does not run yet holds its nodes whole, `NodeBook.holds_whole`)."""
    names = required_node_names(job)
    if not names or job.gpus < len(names) or (not job.gpus_per_job and job.gpus % len(names)):
        return None
    each, extra = divmod(job.gpus, len(names))
    return tuple((name, each + (i < extra)) for i, name in enumerate(names))


RESOURCES_REASON = "Resources"   # squeue state_reason of a job waiting for its nodes (22.05+)


def unplaceable_idle_gpu_s(jobs: Sequence[SlurmJob], free_gpus: int,
                           waited_s: Mapping[int, float]) -> float:
    """Idle GPU-seconds while released jobs wait for a node: each job of `waited_s` (our
    released jobs, with how long each has waited since it was last seen or released) that
    Slurm shows PENDING, released and in Reason=Resources while `free_gpus` GPUs are free
    counts min(its GPUs, the free GPUs not yet counted) x its wait (longest waits first)."""
    waiting = sorted((j for j in jobs if j.job_id in waited_s and j.state is JobState.PENDING
                      and not j.held and j.reason == RESOURCES_REASON),
                     key=lambda j: (-waited_s[j.job_id], j.job_id))
    left, idle = max(0, free_gpus), 0.0
    for job in waiting:
        gpus = min(job.gpus, left)
        idle += gpus * max(0.0, waited_s[job.job_id])
        left -= gpus
    return idle


def impossible_reason(job: SlurmJob, caps: Sequence[int]) -> str | None:
    """Why no nodes of some (`caps`: the GPUs of each) can hold `job` (more GPUs per node than
    the largest, more GPUs than all, or fewer nodes that hold its part than it asks for), else
    None."""
    biggest, total = max(caps), sum(caps)
    if job.gpus_per_node > biggest:
        return (f"impossible request: {job.gpus_per_node} GPUs per node, the largest node of "
                f"the managed partitions has {biggest}")
    if job.gpus > total:
        return f"impossible request: {job.gpus} GPUs, the managed partitions have {total}"
    return too_few_nodes(job, caps, "the managed partitions have")
