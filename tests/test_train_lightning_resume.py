"""The Lightning callback's checkpoints and resume beyond tests/test_train_lightning.py: with
gradient accumulation a checkpoint is taken only after an optimizer step (never at step 0, never
with gradients of batches half accumulated, never twice for one due step), so a stop at any
micro-batch resumes bit-identical; and a sampler built before the resume follows the
checkpoint's seed."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")        # CI installs both (tests/run.sh): never skipped
pl = pytest.importorskip("lightning.pytorch")

from shockslurm.train.checkpoint import read_checkpoint  # noqa: E402
from shockslurm.train.lease import Lease  # noqa: E402
from shockslurm.train.lightning import ShockwaveCallback  # noqa: E402
from shockslurm.train.reports import Reporter  # noqa: E402
from shockslurm.train.sample_seeds import SeededDataset  # noqa: E402

from .test_train_lightning import Tiny as LightningTiny  # noqa: E402

ACCUMULATE = 2       # 10 batches of 8 an epoch: 5 optimizer steps an epoch, 3 epochs


class Tiny(LightningTiny):
    """Sends itself SIGUSR1 (as Slurm does; or creates `stop_file`) in the training step of
    micro-batch `stop_at` (counted from 1 over the whole run, not optimizer steps), one SGD
    optimizer."""

    def __init__(self, stop_at: int | None = None, stop_file: Path | None = None) -> None:
        super().__init__(None)
        self.stop_at_micro = stop_at
        self.stop_file = stop_file
        self.micro_batches = 0

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.micro_batches += 1
        if self.micro_batches == self.stop_at_micro and self.stop_file is not None:
            self.stop_file.touch()
        elif self.micro_batches == self.stop_at_micro:
            os.kill(os.getpid(), signal.SIGUSR1)
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def _data():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(80, 4, generator=g)
    return torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))


class Noisy(torch.utils.data.Dataset):
    """`_data()` with noise drawn from torch's RNG as each sample loads (an augmentation)."""

    def __init__(self) -> None:
        self.data = _data()

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int):
        x, y = self.data[i]
        return x + 0.1 * torch.randn(4), y


def _fit(ckpt: Path, *, stop_at: int | None = None, seed: int = 3, every_steps: int = 3,
         accumulate: int = ACCUMULATE, stop_file: Path | None = None, workers: int = 0
         ) -> tuple[Tiny, ShockwaveCallback]:
    """`workers` > 0: a `SeededDataset` of `Noisy` samples loaded by that many workers."""
    cb = ShockwaveCallback(ckpt, keep=100, every_steps=every_steps, every_seconds=None,
                           seed=seed, exit_on_stop=False, reporter=Reporter(None),
                           lease=Lease(stop_file=stop_file or False, file_poll_s=0.0))
    model = Tiny(stop_at, stop_file)
    data = SeededDataset(Noisy()) if workers else _data()
    loader = torch.utils.data.DataLoader(data, batch_size=8, sampler=cb.sampler(data),
                                         num_workers=workers)
    trainer = pl.Trainer(max_epochs=3, callbacks=[cb], accelerator="cpu", devices=1,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, deterministic=True,
                         accumulate_grad_batches=accumulate)
    try:
        trainer.fit(model, loader)
    finally:
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    return model, cb


def _saved(ckpt: Path) -> list[tuple[int, int]]:
    """(global step, batches of its epoch trained on) of every checkpoint, in order."""
    out = []
    for path in sorted(ckpt.glob("ckpt-*.pt")):
        state = read_checkpoint(path)
        out.append((state["global_step"], state["shockslurm"]["batches_in_epoch"]))
    return out


def _same_weights(a: Tiny, b: Tiny) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(),
                                                 b.state_dict().values()))


def test_with_accumulation_checkpoints_follow_optimizer_steps(tmp_path: Path):
    """every_steps=3 with 2 micro-batches a step: steps 3, 6, 9, 12 and the end (15), each
    after a whole accumulation (an even number of batches into its epoch). It saved at step 0
    after the first micro-batch, at step 10 half-way through an accumulation, and a second time
    one step after each due step (4, 7, 13): the due flag of a step seen again at its next
    micro-batch was left set."""
    _fit(tmp_path / "ckpt")
    assert _saved(tmp_path / "ckpt") == [(3, 6), (6, 2), (9, 8), (12, 4), (15, 10)]


# Micro-batch 11 is epoch 1's first: its gradients were accumulated, not yet stepped, when the
# checkpoint (step 5, one batch into the epoch) was taken, so a resume skipped that batch and
# lost them. 7 is mid-accumulation in epoch 0, 8 ends one.
@pytest.mark.parametrize("stop_at", [7, 8, 11])
def test_with_accumulation_a_stop_at_any_micro_batch_resumes_bit_identical(
        tmp_path: Path, stop_at: int):
    reference, _ = _fit(tmp_path / "ref")
    _, stopped = _fit(tmp_path / "run", stop_at=stop_at)
    assert stopped.should_stop
    assert all(batches % ACCUMULATE == 0 for _, batches in _saved(tmp_path / "run"))
    resumed, cb = _fit(tmp_path / "run")
    assert cb.resumed_from is not None
    assert _same_weights(reference, resumed)


def test_a_sampler_built_before_the_resume_takes_the_checkpoints_seed(tmp_path: Path):
    """The DataLoader (and its `cb.sampler()`) is built before `fit` loads the checkpoint: a
    rerun given another seed takes the checkpoint's (3), its sampler too, and ends
    bit-identical to an uninterrupted run of seed 3. The sampler kept seed 4, silently."""
    reference, _ = _fit(tmp_path / "ref", accumulate=1)
    _fit(tmp_path / "run", stop_at=8, accumulate=1)
    resumed, cb = _fit(tmp_path / "run", seed=4, accumulate=1)
    assert cb.resumed_from is not None and cb.seed == 3
    assert _same_weights(reference, resumed)


def test_an_augmentation_in_workers_resumes_bit_identical_with_seeded_samples(tmp_path: Path):
    """Noise drawn in 2 DataLoader workers as each sample loads, the samples a `SeededDataset`:
    stopped mid-epoch and resumed (with another seed given: the checkpoint's reaches the
    samples' keys too), the weights end bit-identical to the run without a stop."""
    reference, _ = _fit(tmp_path / "ref", accumulate=1, workers=2)
    _fit(tmp_path / "run", stop_at=14, accumulate=1, workers=2)
    resumed, cb = _fit(tmp_path / "run", seed=4, accumulate=1, workers=2)
    assert cb.resumed_from is not None and cb.seed == 3
    assert _same_weights(reference, resumed)


def test_a_stop_asked_at_the_last_batch_of_the_last_epoch_is_taken(tmp_path: Path):
    """At an epoch's last batch the stop waits for the next step (Lightning has yet to end the
    epoch); after the last epoch's there is none: the stop was dropped (no checkpoint of it,
    should_stop False, no exit 0) and its stop file left to stop the requeued job at once.
    Now taken when training ends: saved, stopped, the file removed."""
    stop = tmp_path / ".shockslurm-stop-1"
    _, cb = _fit(tmp_path / "run", stop_at=30, every_steps=7, accumulate=1, stop_file=stop)
    assert cb.should_stop and cb.lease.reason == f"stop file {stop}"
    assert not stop.exists()
    assert [step for step, _ in _saved(tmp_path / "run")] == [7, 14, 21, 28, 30]
    _, again = _fit(tmp_path / "run", every_steps=7, accumulate=1, stop_file=stop)
    assert again.resumed_from == tmp_path / "run" / "ckpt-000000000030.pt"
    assert not again.should_stop


class Validated(Tiny):
    """Notes (epoch, batch of the epoch) at each validation pass's start."""

    def __init__(self, stop_at: int | None = None) -> None:
        super().__init__(stop_at)
        self.validated: list[tuple[int, int]] = []

    def validation_step(self, batch, batch_idx):
        if batch_idx == 0:
            loop = self.trainer.fit_loop.epoch_loop
            self.validated.append((self.trainer.current_epoch, loop.batch_idx))


def _fit_validated(ckpt: Path, stop_at: int | None = None) -> tuple[Validated, pl.Trainer]:
    cb = ShockwaveCallback(ckpt, every_steps=3, every_seconds=None, exit_on_stop=False,
                           reporter=Reporter(None), lease=Lease(stop_file=False))
    model, data = Validated(stop_at), _data()
    trainer = pl.Trainer(max_epochs=2, callbacks=[cb], accelerator="cpu", devices=1,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, val_check_interval=4,
                         num_sanity_val_steps=0)
    try:
        trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=8,
                                                       sampler=cb.sampler(data)),
                    torch.utils.data.DataLoader(data, batch_size=40))
    finally:
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    return model, trainer


# A stop at batch 6 (between two validations every 4 batches), at batch 4 (where one is due).
@pytest.mark.parametrize("stop_at", [6, 4])
def test_a_stop_adds_no_validation_and_loses_none(tmp_path: Path, stop_at: int):
    """Lightning validates when a loop is asked to stop (for early stopping): a stop at batch 6
    ran a validation the uninterrupted run never has, in the grace time before the successor
    could start (and for EarlyStopping one more check). Now the stopped and the resumed run
    validate where the uninterrupted one does, at batches 4 and 8 of each epoch, and the
    trainer validates again after the stop."""
    reference, _ = _fit_validated(tmp_path / "ref")
    assert reference.validated == [(0, 3), (0, 7), (1, 3), (1, 7)]
    stopped, trainer = _fit_validated(tmp_path / "run", stop_at=stop_at)
    assert trainer.limit_val_batches == 1.0          # given back at teardown
    resumed, _ = _fit_validated(tmp_path / "run")
    assert stopped.validated + resumed.validated == reference.validated, (
        stopped.validated, resumed.validated)
