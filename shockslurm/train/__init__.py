"""The PyTorch helper that runs inside users' training jobs (torch is imported only here).

    from shockslurm.train import ShockTrainer

- `checkpoint`: atomic, checksummed, rotated checkpoints of model/optimizer/scheduler/scaler/RNG/
  data position; only rank 0 writes.
- `lease`: SIGUSR1/SIGTERM and a stop file ask the loop to finish its step, checkpoint and exit 0
  (Slurm requeues the job; the helper never calls scontrol).
- `reports`: samples/s, batch size, epoch progress and batch-size changes, to the store
  ($SHOCKSLURM_DB) or a spool directory ($SHOCKSLURM_SPOOL) that the daemon ingests
  (`shockslurm.reports`, the daemon's side).
"""

from __future__ import annotations

from typing import Any

__all__ = ["ShockTrainer", "CheckpointManager", "Lease", "Reporter"]


def __getattr__(name: str) -> Any:
    # Lazy: `shockslurm.train.records` (imported by the daemon) must import without torch.
    if name == "ShockTrainer":
        from .trainer import ShockTrainer
        return ShockTrainer
    if name == "CheckpointManager":
        from .checkpoint import CheckpointManager
        return CheckpointManager
    if name == "Lease":
        from .lease import Lease
        return Lease
    if name == "Reporter":
        from .reports import Reporter
        return Reporter
    raise AttributeError(f"module 'shockslurm.train' has no attribute {name!r}")
