"""The nodes each job of ours may run on (pure), for placement (`Snapshot.allowed_nodes`).

A job may run on the nodes of its partition (a pending job may name several) that have the GPU
type it asks for, if any (`--gres=gpu:a100:2`: nodes whose gres names a100 GPUs), less those its
user's own limits rule out: `--exclude`, `-w` (as job_submit.lua recorded it:
`SlurmJob.user_nodes`; `constraints.limiting_nodelist`: a list of fewer nodes than the job's
is no limit) and `--constraint` (`slurm.constraints`: the forms the daemon reads).
The plan then places each job where Slurm will let it start, and the daemon's pin
(`ReqNodeList=`, `enact.pin_nodes`) stays within those nodes; a job whose limits it cannot read
in full is released unpinned (`pins_allowed`), Slurm applying them alone.
"""

from __future__ import annotations

from typing import Collection, Mapping, Sequence

from ..slurm.constraints import feature_test, limiting_nodelist, node_rules
from ..slurm.gres import host_set
from ..slurm.types import SlurmJob, SlurmNode


def pins_allowed(job: SlurmJob) -> bool:
    """Whether pinning the job (`ReqNodeList=`) to nodes it may run on keeps its user's limits:
    not with `-w` (a pin replaces that list) nor with an `--exclude` or `--constraint` the
    daemon cannot read (a pin could contradict it)."""
    if job.user_nodes:
        return False
    if job.excluded_nodes and host_set(job.excluded_nodes) is None:
        return False
    return not job.features or feature_test(job.features) is not None


class NodeLimits:
    """The nodes of one round's read (`nodes`: the nodes placement plans on) and what each job
    may use of them."""

    def __init__(self, nodes: Sequence[SlurmNode]) -> None:
        self.nodes: Mapping[str, SlurmNode] = {n.name: n for n in nodes}
        self._by_partitions: dict[frozenset[str], frozenset[str]] = {}
        self._answers: dict[tuple[object, ...], frozenset[str] | None] = {}

    def allowed(self, job: SlurmJob) -> frozenset[str] | None:
        """The names of the nodes the job may run on; None when it may run on every one.
        Jobs with the same limits share one answer (read once a round, however many jobs)."""
        listed = limiting_nodelist(job.user_nodes, job.nodes)
        key = (job.partition, job.gpu_types, job.excluded_nodes, listed, job.features)
        if key not in self._answers:
            names = self._of_partitions(frozenset(p for p in job.partition.split(",") if p))
            for _, keep in node_rules(gpu_types=job.gpu_types, exclude=job.excluded_nodes,
                                      nodelist=listed, constraint=job.features):
                names = frozenset(n for n in names if keep(self.nodes[n]))
            self._answers[key] = None if len(names) == len(self.nodes) else names
        return self._answers[key]

    def _of_partitions(self, partitions: frozenset[str]) -> frozenset[str]:
        """The nodes in any of `partitions` (every node when the job names none)."""
        if partitions not in self._by_partitions:
            self._by_partitions[partitions] = frozenset(
                name for name, node in self.nodes.items()
                if not partitions or partitions & set(node.partitions))
        return self._by_partitions[partitions]


def limited_jobs(limits: NodeLimits, jobs: Collection[SlurmJob]) -> dict[int, frozenset[str]]:
    """The jobs of `jobs` that may run on some of the nodes only, and those nodes."""
    return {job.job_id: names for job in jobs if (names := limits.allowed(job)) is not None}


def never_fits(job: SlurmJob, limits: NodeLimits) -> str | None:
    """Why none of the nodes the job may run on (`limits`: the managed partitions' nodes in
    any state) can ever hold it, or None: a job of another partition's nodes, or one whose GPU
    type, `--exclude`, `-w` or `--constraint` leaves it too few or too small ones."""
    allowed = limits.allowed(job)
    if allowed is None:
        return None
    caps = sorted(limits.nodes[n].gpus for n in allowed)
    if not caps:
        return f"impossible request: no node of the managed partitions is one it may run on " \
               f"({_limits_text(job)})"
    if job.gpus_per_node > caps[-1] or job.gpus > sum(caps):
        per_node = f" ({job.gpus_per_node} per node)" if job.gpus_per_node else ""
        return (f"impossible request: {job.gpus} GPUs{per_node}, the nodes it may run on "
                f"({_limits_text(job)}) have {caps[-1]} at most, {sum(caps)} in all")
    return too_few_nodes(job, caps, f"the nodes it may run on ({_limits_text(job)}) include")


def too_few_nodes(job: SlurmJob, caps: Sequence[int], have: str) -> str | None:
    """Why too few of some nodes (`caps`: the GPUs of each) hold a part of a job that asks for
    GPUs on several nodes (`SlurmJob.node_parts`), else None; `have` says whose nodes."""
    parts = job.node_parts
    if parts <= 1:
        return None
    part = job.gpus // parts
    holding = sum(1 for c in caps if c >= part)
    if holding >= parts:
        return None
    return (f"impossible request: {parts} nodes of {part} GPUs, {have} {holding} such "
            f"node{'s' if holding != 1 else ''}")


def _limits_text(job: SlurmJob) -> str:
    """The job's limits in words: "partition gpu, --exclude gpu01"."""
    given = (("partition", job.partition), ("GPU type", ",".join(sorted(job.gpu_types))),
             ("-w", job.user_nodes), ("--exclude", job.excluded_nodes),
             ("--constraint", job.features))
    return ", ".join(f"{name} {value}" for name, value in given if value)
