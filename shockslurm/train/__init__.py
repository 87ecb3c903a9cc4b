"""The PyTorch helper that runs inside users' training jobs (torch is imported only here).

Import it first, before torch, so that a stop signal arriving while torch loads is kept:

    import shockslurm.train                      # stop signals are recorded from here on
    import torch
    from shockslurm.train import ShockTrainer

    with ShockTrainer(model, opt, ckpt_dir="ckpt", every_steps=200) as st:
        for epoch, batch_size, batches in st.epochs((x, y), [32, 64, 128]):
            for _, (xb, yb) in batches:
                opt.zero_grad()
                loss_fn(model(xb), yb).backward()
                opt.step()
                if st.step():                    # True: a stop was asked, checkpoint written
                    st.save_and_exit()           # exit 0; Slurm requeues, the rerun resumes

Public names (`__all__`, all lazily imported, so `import shockslurm.train` does not load torch):
- `ShockTrainer`: checkpoint on a schedule, stop cleanly on SIGUSR1/SIGTERM or the stop file,
  resume exactly, report progress (see `trainer`).
- `CheckpointManager`, `load_checkpoint`, `CorruptCheckpoint`, `CheckpointMismatch` (a good
  checkpoint of another model): the checkpoint files, plain
  `torch.save` dicts that `torch.load(path, weights_only=True)` reads, each with a sha256 sidecar
  (see `checkpoint`).
- `ShardedCheckpointManager`: sharded (FSDP) model and optimizer states through
  torch.distributed.checkpoint, each rank writing its shards, atomic, checksummed, rotated (see
  `sharded`; `ShockTrainer` takes it by itself for a model no rank holds whole).
- `ResumableSampler`: your own DataLoader's sampler, resumed mid-epoch without loading what was
  already trained on (`st.sampler(dataset)`, `st.epoch_range(n)`, `st.batches(loader)`; see `data`).
- `SeededDataset`: a dataset each of whose samples is loaded under its own seed (the trainer's,
  the epoch, the index), so a random augmentation in DataLoader workers resumes exactly too
  (see `sample_seeds`).
- `Lease`: the stop flag on its own, for loops that want only that (see `lease`).
- `Reporter`: progress reports to the store or the daemon's spool (see `reports`; the
  daemon's side is `shockslurm.reports`).
- `install_signal_handlers`: record SIGUSR1/SIGTERM from now on, for the first trainer to honour.
  Importing this package does it inside a Slurm job or a torchrun worker ($SHOCKSLURM_EARLY_SIGNALS
  = 1 / 0 forces it on / off); elsewhere the trainer installs its handlers when it is built.
"""

from __future__ import annotations

import importlib as _importlib

from . import lease as _lease

# public name -> the submodule that defines it
_EXPORTS = {
    "ShockTrainer": "trainer",
    "CheckpointManager": "checkpoint",
    "CorruptCheckpoint": "checkpoint",
    "CheckpointMismatch": "checkpoint",
    "load_checkpoint": "checkpoint",
    "Lease": "lease",
    "Reporter": "reports",
    "ResumableSampler": "data",
    "SeededDataset": "sample_seeds",
    "ShardedCheckpointManager": "sharded",
    "install_signal_handlers": "lease",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> object:
    # Lazy: torch loads only when a name that needs it is used.
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'shockslurm.train' has no attribute {name!r}")
    return getattr(_importlib.import_module(f"{__name__}.{module}"), name)


def __dir__() -> list[str]:
    return list(__all__)


if _lease.early_signals_wanted():
    _lease.install_signal_handlers()
