"""The Lightning callback's throughput reports leave out the time outside training batches, as
`ShockTrainer`'s do: validation, and the loop's own code between epochs (here a slow
`on_train_epoch_end`). The callback's window runs on the test's clock, which only the module's
steps move: each rate reported is exactly the steps' own."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")        # CI installs both (tests/run.sh): never skipped
pl = pytest.importorskip("lightning.pytorch")

from torch.utils.data import DataLoader  # noqa: E402

from shockslurm.train.lease import Lease  # noqa: E402
from shockslurm.train.lightning import ShockwaveCallback  # noqa: E402
from shockslurm.train.reports import Reporter  # noqa: E402

from .test_train_throughput import VirtualClock, _data, _Sink, on_clock  # noqa: E402

STEP_S = 0.01        # each training step's "training": 10 of them an epoch


class Paced(pl.LightningModule):
    """Training steps of STEP_S; validation batches of `val_s`, an epoch end of `epoch_end_s`."""

    def __init__(self, clock: VirtualClock, val_s: float = 0.0, epoch_end_s: float = 0.0) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)
        self.clock, self.val_s, self.epoch_end_s = clock, val_s, epoch_end_s

    def training_step(self, batch, batch_idx):
        self.clock.advance(STEP_S)
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        self.clock.advance(self.val_s)

    def on_train_epoch_end(self) -> None:
        self.clock.advance(self.epoch_end_s)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _rates(ckpt: Path, val_s: float = 0.0, epoch_end_s: float = 0.0) -> list[float]:
    sink, clock = _Sink(), VirtualClock()
    cb = ShockwaveCallback(ckpt, every_steps=None, every_seconds=None, exit_on_stop=False,
                           report_interval_s=0.05,
                           reporter=Reporter(sink, job_id=1, min_interval_s=0.0),
                           lease=Lease(stop_file=False))
    on_clock(cb._window, clock)
    trainer = pl.Trainer(max_epochs=5, callbacks=[cb], accelerator="cpu", devices=1,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0)
    val = DataLoader(_data(24), batch_size=8) if val_s else None
    try:
        trainer.fit(Paced(clock, val_s, epoch_end_s), DataLoader(_data(80), batch_size=8), val)
    finally:
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    cb.reporter.close()
    return sink.rates()


# Per epoch: 0.1 s of training; 3 validation batches of 0.1 s, or an epoch end of 0.3 s.
# Counted as training time, they cut the rate reported to about a quarter of the true one.
@pytest.mark.parametrize("slow", [{}, {"val_s": 0.1}, {"epoch_end_s": 0.3}],
                         ids=["alone", "validation", "epoch end"])
def test_lightning_time_outside_training_batches_is_not_training_time(tmp_path: Path,
                                                                      slow: dict):
    rates = _rates(tmp_path, **slow)
    assert len(rates) >= 4, rates
    assert rates == pytest.approx([8 / STEP_S] * len(rates)), rates
