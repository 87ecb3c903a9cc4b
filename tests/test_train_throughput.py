"""Throughput reports, the samples/s the scheduler takes as the job's speed: an epoch's partial
last batch counts its own samples, the time a checkpoint takes to write is no training time, and
epochs shorter than the report interval are reported too."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")  # CI installs torch (tests/run.sh); never skipped there

from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from shockslurm.train import ShockTrainer  # noqa: E402
from shockslurm.train.lease import Lease  # noqa: E402
from shockslurm.train.reports import Reporter  # noqa: E402

from .test_train_lightning import _Sink as RecordingSink  # noqa: E402

SAVE_S = 0.15        # each checkpoint's write
STEP_S = 0.002       # each step's "training"


class _Sink(RecordingSink):
    def rates(self) -> list[float]:
        return [r["samples_per_s"] for r in self.items if r["kind"] == "throughput"]


class VirtualClock:
    """A clock the test moves: the throughput window runs on it, so its rates are exact on an
    idle or a loaded machine alike (a real clock made these tests fail under load)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def on_clock(window, clock: VirtualClock) -> VirtualClock:
    """Put a trainer's or a callback's throughput window on `clock` from now."""
    window.clock = clock
    window.start = window.last = clock()
    return clock


class SlowToSave:
    """A value whose pickling takes SAVE_S on `clock`: a checkpoint as slow to write as a big
    model's."""

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock

    def __reduce__(self):
        self.clock.advance(SAVE_S)
        return (int, ())


def _trainer(tmp_path: Path, sink: _Sink, **kwargs) -> ShockTrainer:
    model = torch.nn.Linear(4, 1)
    return ShockTrainer(model, torch.optim.SGD(model.parameters(), lr=0.01),
                        ckpt_dir=tmp_path / "ckpt", every_seconds=None,
                        reporter=Reporter(sink, job_id=1, min_interval_s=0.0),
                        lease=Lease(stop_file=False), **kwargs)


def _data(n: int) -> TensorDataset:
    x = torch.randn(n, 4, generator=torch.Generator().manual_seed(0))
    return TensorDataset(x, x.sum(1, keepdim=True))


@pytest.mark.parametrize("replicas", [1, 2])
def test_an_epochs_partial_last_batch_counts_its_own_samples(tmp_path: Path, replicas: int):
    """100 samples in batches of 32 over all ranks: 32, 32, 32, then 4, as `epochs()` counts
    them. `batches()` counted the loader's batch size, 32, for the last one too."""
    st = _trainer(tmp_path, _Sink(), every_steps=None, report_interval_s=3600.0)
    data = _data(100)
    loader = DataLoader(data, batch_size=32 // replicas,
                        sampler=st.sampler(data, num_replicas=replicas, rank=0))
    counted = []
    for _ in st.epoch_range(1):
        for _, _batch in st.batches(loader):
            counted.append(st._pending_samples)      # what this step() counts
            st.step()
    st.close()
    assert counted == [32, 32, 32, 4]


def test_a_checkpoints_write_is_not_counted_as_training_time(tmp_path: Path):
    """60 steps of 2 ms with a checkpoint every 10 that takes 0.15 s to write: each report is
    the rate of the steps, 32 / 0.002 = 16,000 samples/s. The window after each save took the
    save in, and reported about 200."""
    sink, clock = _Sink(), VirtualClock()
    st = _trainer(tmp_path, sink, every_steps=10, report_interval_s=0.02,
                  extras={"slow": SlowToSave(clock)})
    on_clock(st._window, clock)
    for _ in range(60):
        clock.advance(STEP_S)
        st.step(samples=32)
    st.close()
    rates = sink.rates()
    assert len(rates) >= 4, sink.items
    assert rates == pytest.approx([32 / STEP_S] * len(rates)), rates


@pytest.mark.parametrize("loop", ["epochs", "batches"])
def test_epochs_shorter_than_the_report_interval_are_reported(tmp_path: Path, loop: str):
    """40 epochs of 4 steps of 5 ms (16 samples each), reports every 0.2 s: the window runs on
    over epochs. It started again at every epoch, so a job whose epochs were shorter than
    `report_interval_s` (10 s by default) never reported its throughput."""
    sink = _Sink()
    st = _trainer(tmp_path, sink, every_steps=None, report_interval_s=0.2)
    data = _data(64)
    if loop == "epochs":
        batches = (b for _, _, epoch in st.epochs(data.tensors, 16, num_epochs=40)
                   for b in epoch)
    else:
        loader = DataLoader(data, batch_size=16, sampler=st.sampler(data))
        batches = (b for _ in st.epoch_range(40) for b in st.batches(loader))
    for _ in batches:
        time.sleep(0.005)
        st.step()
    st.close()
    rates = sink.rates()
    assert len(rates) >= 2, sink.items
    assert max(rates) <= 16 / 0.005 * 1.02       # no step's time was left out


def test_lightning_checkpoint_writes_are_not_counted_as_training_time(tmp_path: Path):
    """The same with the Lightning callback: 60 steps of 2 ms, a checkpoint every 10 that takes
    0.15 s to write (the module adds a slow value to it); Lightning's own code takes no time on
    the test's clock. Every report is 8 / 0.002 = 4,000 samples/s."""
    pl = pytest.importorskip("lightning.pytorch")
    from shockslurm.train.lightning import ShockwaveCallback

    clock = VirtualClock()

    class Slow(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            clock.advance(STEP_S)
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def on_save_checkpoint(self, checkpoint: dict) -> None:
            checkpoint["slow"] = SlowToSave(clock)

    sink = _Sink()
    cb = ShockwaveCallback(tmp_path / "ckpt", every_steps=10, every_seconds=None,
                           exit_on_stop=False, report_interval_s=0.02,
                           reporter=Reporter(sink, job_id=1, min_interval_s=0.0),
                           lease=Lease(stop_file=False))
    on_clock(cb._window, clock)
    trainer = pl.Trainer(max_epochs=1, callbacks=[cb], accelerator="cpu", devices=1,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(Slow(), DataLoader(_data(480), batch_size=8))
    cb.reporter.close()
    rates = sink.rates()
    assert len(rates) >= 4, sink.items
    assert rates == pytest.approx([8 / STEP_S] * len(rates)), rates


def test_the_window_leaves_out_what_is_not_training():
    """With a hand-driven clock: a write excluded after a step, the gap to the next epoch left
    out once (not the write a second time), a new window on `reset`."""
    from shockslurm.train.window import ThroughputWindow

    now = [0.0]
    window = ThroughputWindow(10.0, clock=lambda: now[0])
    now[0] = 4.0
    assert window.add(40) is None                # 4 s of training: no rate yet
    now[0] = 7.0
    window.exclude(3.0)                          # a checkpoint written from 4 to 7
    now[0] = 9.0
    window.idle()                                # between epochs from 7 to 9
    now[0] = 15.0
    assert window.add(60) == pytest.approx(100 / 10)     # 4 + 6 s of training, 100 samples
    now[0] = 20.0
    window.reset()
    now[0] = 30.0
    assert window.add(50) == pytest.approx(5.0)


def test_a_plain_loops_start_up_is_not_counted_as_training_time(tmp_path: Path):
    """A plain loop (`step(samples=N)` only): 0.5 s of start-up after the trainer is built (the
    model and data set up, a checkpoint loaded), then 40 steps of 10 ms reported every 0.1 s.
    The window began when the trainer was built, so its first rate took the start-up in (about
    500 samples/s against 3,200)."""
    sink, clock = _Sink(), VirtualClock()
    st = _trainer(tmp_path, sink, every_steps=None, report_interval_s=0.1)
    on_clock(st._window, clock)
    clock.advance(0.5)
    for _ in range(40):
        clock.advance(0.01)
        st.step(samples=32)
    st.close()
    rates = sink.rates()
    assert len(rates) >= 3, sink.items
    assert rates == pytest.approx([32 / 0.01] * len(rates)), rates


def test_a_window_may_begin_at_its_first_step():
    from shockslurm.train.window import ThroughputWindow

    now = [0.0]
    window = ThroughputWindow(10.0, clock=lambda: now[0], begin_at_first_step=True)
    now[0] = 30.0
    assert window.add(99) is None                # the first step: begins the window
    now[0] = 40.0
    assert window.add(50) == pytest.approx(5.0)  # 50 samples in 10 s
    idle_first = ThroughputWindow(10.0, clock=lambda: now[0], begin_at_first_step=True)
    now[0] = 45.0
    idle_first.idle()                            # an epoch begins: the window with it
    now[0] = 55.0
    assert idle_first.add(20) == pytest.approx(2.0)
