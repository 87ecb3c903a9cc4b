"""Rank and job identity from the environment (srun, torchrun, or torch.distributed).

No torch import at module level: `rank()` asks torch.distributed only when torch is already
imported and a process group is up.
"""

from __future__ import annotations

import os
import sys
from typing import Any


def _int_env(*names: str) -> int | None:
    for name in names:
        value = os.environ.get(name)
        if value not in (None, ""):
            try:
                return int(value)
            except ValueError:
                continue
    return None


def _group() -> Any:
    """torch.distributed when torch is imported and a process group is up, else None."""
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None) if torch is not None else None
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return dist
    except Exception:  # pragma: no cover - defensive: a half-initialised group
        pass
    return None


def rank() -> int:
    """This process's global rank: torch.distributed when initialised, else RANK (torchrun),
    else SLURM_PROCID (srun), else 0."""
    dist = _group()
    if dist is not None:
        return int(dist.get_rank())
    found = _int_env("RANK", "SLURM_PROCID")
    return 0 if found is None else found


def world_size() -> int:
    dist = _group()
    if dist is not None:
        return int(dist.get_world_size())
    found = _int_env("WORLD_SIZE", "SLURM_NTASKS")
    return 1 if found is None else max(1, found)


def distributed() -> bool:
    """Whether torch.distributed is up with more than one rank (collectives are needed)."""
    dist = _group()
    return dist is not None and int(dist.get_world_size()) > 1


def job_gpus() -> int:
    """GPUs of the whole job, for throughput reports: SHOCKSLURM_GPUS_ON_NODE (set by the job
    templates from CUDA_VISIBLE_DEVICES) times SLURM_NNODES, else the world size."""
    per_node = _int_env("SHOCKSLURM_GPUS_ON_NODE")
    if per_node is not None and per_node > 0:
        return per_node * max(1, _int_env("SLURM_NNODES", "SLURM_JOB_NUM_NODES") or 1)
    return world_size()


def restart_count() -> int:
    """SLURM_RESTART_COUNT: unset on the first run, then 1, 2, ... after each requeue."""
    return _int_env("SLURM_RESTART_COUNT") or 0


def slurm_job_id() -> int | None:
    return _int_env("SLURM_JOB_ID", "SLURM_JOBID")
