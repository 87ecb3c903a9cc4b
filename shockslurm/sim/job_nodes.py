"""The nodes each simulated job may use, checked against the cluster before a run: the jobs
limited to some nodes (`JobSpec.allowed_nodes`, the workload's `nodes`) and the jobs that ask
for several nodes (`JobSpec.node_count`). A job no node set of the cluster can ever hold is a
ValueError naming it, before anything runs.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from ..model import JobSpec, Node


def limited_jobs(jobs: Sequence[JobSpec], nodes: Sequence[Node]) -> dict[int, frozenset[str]]:
    """The jobs limited to some nodes (`JobSpec.allowed_nodes`), by id. A ValueError names a job
    whose nodes the cluster lacks or cannot hold its gang, or any limited job on one pool."""
    limited = {j.job_id: j for j in jobs if j.allowed_nodes is not None}
    if not limited:
        return {}
    if _is_pool(nodes):
        raise ValueError(f"job {min(limited)} is limited to nodes, but the cluster is one pool "
                         "of GPUs: give its nodes (--cluster)")
    gpus = {n.name: n.gpus for n in nodes}
    for job_id, job in sorted(limited.items()):
        assert job.allowed_nodes is not None
        unknown = sorted(job.allowed_nodes - set(gpus))
        if unknown or not job.allowed_nodes:
            raise ValueError(f"job {job_id} is limited to nodes the cluster does not have: "
                             f"{_names(unknown) or 'none named'} (the cluster's: "
                             f"{_names([n.name for n in nodes])})")
        room = sum(gpus[n] for n in job.allowed_nodes)
        if room < job.gang_size:
            raise ValueError(f"job {job_id} needs {job.gang_size} GPUs, more than its nodes "
                             f"hold ({room})")
    # every node named is no limit (as the daemon reads it: NodeLimits.allowed)
    return {j: frozenset(job.allowed_nodes or ()) for j, job in limited.items()
            if len(job.allowed_nodes or ()) < len(gpus)}


def _names(names: Sequence[str], shown: int = 5) -> str:
    """The first `shown` names, comma-separated, "..." after them when there are more."""
    return ", ".join(names[:shown]) + (", ..." if len(names) > shown else "")


def node_counts(jobs: Sequence[JobSpec], nodes: Sequence[Node],
                limited: Mapping[int, frozenset[str]] | None = None) -> dict[int, int]:
    """The jobs that ask for several nodes (`JobSpec.node_count` > 1), by id. A ValueError
    names a job on one pool, one whose GPUs do not split evenly, or one whose nodes (of
    `limited`, when it is limited) have too few that hold its part (`gang_size / node_count`
    GPUs each)."""
    spread = {j.job_id: j for j in jobs if j.node_count > 1}
    if not spread:
        return {}
    if _is_pool(nodes):
        raise ValueError(f"job {min(spread)} asks for {spread[min(spread)].node_count} nodes, but "
                         "the cluster is one pool of GPUs: give its nodes (--cluster)")
    for job_id, job in sorted(spread.items()):
        if job.gang_size % job.node_count:
            raise ValueError(f"job {job_id}'s {job.gang_size} GPUs do not split evenly over "
                             f"{job.node_count} nodes")
        part = job.gang_size // job.node_count
        may = (limited or {}).get(job_id)
        holding = [n.name for n in nodes if n.gpus >= part and (may is None or n.name in may)]
        if len(holding) < job.node_count:
            raise ValueError(f"job {job_id} asks for {job.node_count} nodes of {part} GPUs, but "
                             f"only {len(holding)} of the nodes it may run on hold {part}")
    return {j: job.node_count for j, job in spread.items()}


def _is_pool(nodes: Sequence[Node]) -> bool:
    """Whether `nodes` is one pool of GPUs (`model.pool`), not a cluster's nodes."""
    return [n.name for n in nodes] == ["pool"]
