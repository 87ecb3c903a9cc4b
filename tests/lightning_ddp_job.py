"""A Lightning DDP job on CPU ranks (gloo) for tests/test_train_lightning_ddp.py, run by torchrun:
`python -m torch.distributed.run --standalone --nproc-per-node 2 tests/lightning_ddp_job.py
CKPT_DIR OUT STOP_AT`. Each rank seeds its own RNG apart (its dropout masks differ), the
training data go through `cb.sampler(dataset)`; rank 0 signals itself (SIGUSR1, as Slurm does)
in its training step STOP_AT (0: never). Rank 0 saves the final weights to OUT after an
uninterrupted end; every rank prints its step, whether it stopped, and where it resumed from,
and writes that line to OUT.rank<N> (its own file: the ranks share one stdout)."""

from __future__ import annotations

import os
import signal
import sys

import shockslurm.train  # noqa: F401  (first: stop signals are kept from here on)
import lightning.pytorch as pl
import torch

from shockslurm.train.lease import Lease
from shockslurm.train.lightning import ShockwaveCallback
from shockslurm.train.reports import Reporter


class Dropped(pl.LightningModule):
    def __init__(self, stop_at: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Dropout(0.5),
                                       torch.nn.Linear(16, 1))
        self.stop_at, self.trained = stop_at, 0

    def setup(self, stage: str) -> None:
        torch.manual_seed(1000 + self.global_rank)

    def training_step(self, batch, batch_idx):
        self.trained += 1
        if self.trained == self.stop_at and self.global_rank == 0:
            os.kill(os.getpid(), signal.SIGUSR1)
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def main(ckpt: str, out: str, stop_at: int) -> None:
    torch.set_num_threads(1)
    x = torch.randn(160, 4, generator=torch.Generator().manual_seed(1))
    data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))
    cb = ShockwaveCallback(ckpt, every_steps=None, every_seconds=None, exit_on_stop=False,
                           reporter=Reporter(None), lease=Lease(stop_file=False))
    model = Dropped(stop_at)
    trainer = pl.Trainer(max_epochs=2, callbacks=[cb], accelerator="cpu", devices=2,
                         strategy="ddp", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=8, sampler=cb.sampler(data)))
    if trainer.global_rank == 0 and not cb.should_stop:
        torch.save(model.state_dict(), out)
    said = (f"rank {trainer.global_rank} step {trainer.global_step} stopped {cb.should_stop} "
            f"resumed {cb.resumed_from.name if cb.resumed_from else None}")
    print(said, flush=True)
    with open(f"{out}.rank{trainer.global_rank}", "w") as fh:   # (the ranks share one stdout)
        fh.write(said + "\n")
    torch.distributed.barrier()          # ranks leave together (tests/gloo_ranks.py says why)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
