"""`ShockwaveCallback`: the training helper for loops that are Lightning's (`shockslurm[lightning]`).

    import shockslurm.train                         # first: stop signals are kept from here on
    import lightning as L
    from shockslurm.train.lightning import ShockwaveCallback

    trainer = L.Trainer(max_epochs=10, callbacks=[ShockwaveCallback("ckpt", every_steps=200)])
    trainer.fit(model, train_loader)                # resumes by itself; exits 0 after a stop

What it does, as `ShockTrainer` does for a plain loop:
- **Checkpoints**: Lightning's own checkpoint dict (model, optimizers, schedulers, loops, other
  callbacks) plus every RNG state, written by `CheckpointManager` (atomic, sha256 sidecar, the
  newest `keep` kept), every `every_steps` steps / `every_seconds`, and at the step a stop is
  honoured. The files are plain `torch.save` dicts: `torch.load(path, weights_only=False)` or
  `Trainer.fit(ckpt_path=path)` read them too. As with `ShockTrainer`, a `ckpt_dir` that
  cannot be written is refused when the callback is built, and a save that fails later is
  logged with where a rerun would resume from, while training goes on.
- **Resume**: when `fit` is given no `ckpt_path`, the newest good checkpoint in `ckpt_dir` is
  loaded (a corrupt or torn one, or a file that is not this callback's, is skipped with a
  warning), loops included, and RNG states are
  put back just before training continues. Give the DataLoader `sampler=cb.sampler(dataset)`
  (a `ResumableSampler`): an interrupted epoch then continues after the batches already trained
  on, so the run ends bit-identical to an uninterrupted one.
- **Stop**: USR1/TERM, the stop file or `request_stop()` stops training after the current step
  (agreed by every rank; asked at an epoch's last batch, after the next step, and at the last
  epoch's, when training ends), checkpointed; then, after `fit` has unwound, the process exits 0
  (`exit_on_stop=False`: `fit` just returns and `cb.should_stop` is True).
- **Reports**: throughput, batch size, epoch ends and checkpoints, as `ShockTrainer` sends them;
  the samples/s over training batches only (validation, checkpoint writes and the loop between
  epochs left out).

Lightning's own SLURM auto-requeue (`SLURMEnvironment(auto_requeue=True)`, its default on
Slurm) handles SIGUSR1 by saving an `hpc_ckpt_*.ckpt` and calling `scontrol requeue` itself, and
its SIGTERM handler raises in the training loop: both would fight the daemon and this helper. The
callback turns auto-requeue off at `setup` and takes SIGUSR1/SIGTERM back from Lightning when
training starts; passing `plugins=[SLURMEnvironment(auto_requeue=False)]` says the same
explicitly. Requeueing is the daemon's (or Slurm's `--requeue`), never the job's.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.plugins.environments import SLURMEnvironment

from . import _env
from .checked import seconds_arg, whole_arg
from .checkpoint import CheckpointManager, CorruptCheckpoint
from .saves import SaveRecord, agree_on_resume
from .data import ResumableSampler, SamplerSeeds, batch_len, resumable_sampler
from .lease import Lease
from .reports import Reporter, reporter_from_env
from .collective import gathered
from .state import own_rng, rng_state, set_rng_state
from .window import ThroughputWindow

log = logging.getLogger("shockslurm.train")

__all__ = ["ShockwaveCallback"]

STATE_KEY = "shockslurm"
WHO = "ShockwaveCallback"      # names the bad argument's owner in its ValueError


class ShockwaveCallback(pl.Callback):
    """Checkpoints, exact resume, cooperative stop and reports for a Lightning `Trainer`."""

    def __init__(self, ckpt_dir: str | os.PathLike[str], *, every_steps: int | None = None,
                 every_seconds: float | None = 600.0, keep: int = 3, seed: int = 0,
                 exit_on_stop: bool = True, resume: bool = True, report_interval_s: float = 10.0,
                 reporter: Reporter | None = None, lease: Lease | None = None) -> None:
        self.ckpt = CheckpointManager(ckpt_dir, keep=whole_arg(WHO, "keep", keep))
        self.saves = SaveRecord(self.ckpt)
        if self.ckpt.is_writer:
            self.ckpt.check_writable()  # before training: a job that cannot checkpoint loses work
        self.every_steps = whole_arg(WHO, "every_steps", every_steps, optional=True)
        self.every_seconds = seconds_arg(WHO, "every_seconds", every_seconds, optional=True)
        self.seed = whole_arg(WHO, "seed", seed, least=None)
        self.exit_on_stop, self.resume_enabled = exit_on_stop, resume
        self.report_interval_s = seconds_arg(WHO, "report_interval_s", report_interval_s)
        self.reporter = reporter if reporter is not None else reporter_from_env(
            min_interval_s=report_interval_s)
        self.lease = lease if lease is not None else Lease()
        self.lease.install()
        self.stopped = False
        self.resumed_from: Path | None = None
        self._rng: dict[str, Any] | None = None      # restored last, at on_train_start
        self._skip = 0                               # batches of the epoch already trained on
        self._last_save_step = -1
        self._last_save_time = time.monotonic()
        self._window = ThroughputWindow(report_interval_s)   # samples/s over training time
        self._batch_size = 0
        self._save_due = False
        self._seen_step = 0                          # global step at the last batch's end
        self._samplers = SamplerSeeds()
        self._val_batches: int | float | None = None  # limit_val_batches while a stop ends fit

    @property
    def should_stop(self) -> bool:
        return self.stopped

    def request_stop(self, reason: str = "requested") -> None:
        self.lease.request_stop(reason)

    def sampler(self, data: Any, *, shuffle: bool = True, drop_last: bool = False) -> ResumableSampler:
        """The DataLoader sampler this callback resumes mid-epoch (seeded, sharded by rank)."""
        return self._samplers.made(ResumableSampler(
            data, seed=self.seed, shuffle=shuffle, drop_last=drop_last,
            num_replicas=None, rank=None))

    # ------------------------------------------------------------------ setup and resume
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        refuse_sharding_strategy(trainer.strategy)
        env = trainer._accelerator_connector.cluster_environment
        if isinstance(env, SLURMEnvironment) and env.auto_requeue:
            env.auto_requeue = False       # the daemon requeues; Lightning must not (see above)
            log.info("shockslurm.train: Lightning's SLURM auto-requeue turned off")
        if stage != "fit" or not self.resume_enabled or trainer.ckpt_path:
            return
        found = self.ckpt.load_latest(check=_check_lightning)
        agree_on_resume(-1 if found is None else int(found[1].get("global_step", 0)),
                        self.ckpt.directory)
        if found is None:
            return
        path, state = found
        self.saves.good_step = int(state["global_step"])
        # Lightning picks its checkpoint before `setup`; hand it the verified dict instead of a
        # path (its restore reads `_loaded_checkpoint`, `resume_end` clears it).
        trainer._checkpoint_connector._loaded_checkpoint = state
        self.resumed_from = path
        log.info("shockslurm.train: resuming from %s (step %s)", path, state.get("global_step"))

    def state_dict(self) -> dict[str, Any]:
        return {}

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        loop = trainer.fit_loop.epoch_loop
        mine = rng_state()
        # every rank's (collective: Lightning dumps a checkpoint on every rank): ranks seeded
        # apart draw different dropout masks, and each resumes with its own
        checkpoint[STATE_KEY] = {"rng": mine, "rng_ranks": gathered(mine), "seed": self.seed,
                                 "batches_in_epoch": int(loop.batch_progress.current.ready),
                                 "batch_size": self._batch_size}

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        mine = checkpoint.get(STATE_KEY) or {}
        self._rng = None if mine.get("rng") is None else own_rng(
            mine.get("rng_ranks"), mine["rng"], _env.rank(), _env.world_size())
        self._skip = int(mine.get("batches_in_epoch", 0))
        # the batch size before the stop: a partial last batch first after the resume is none
        self._batch_size = int(mine.get("batch_size", 0))
        # the samplers made already too: the DataLoader is built before `fit` loads this
        self.seed = self._samplers.take(int(mine.get("seed", self.seed)), self.seed)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Lightning registered its own SIGUSR1/SIGTERM handlers just before: take them back.
        self.lease.close()
        self.lease.install()
        self._skip_done(trainer)
        if self._rng is not None:
            set_rng_state(self._rng)
            self._rng = None
        self._last_save_step = trainer.global_step if self.resumed_from else -1
        self._seen_step = trainer.global_step
        self._window.reset()

    def _skip_done(self, trainer: pl.Trainer) -> None:
        """Continue an interrupted epoch after the batches already trained on (its iterator was
        made already: make it again from the sampler started at the right sample)."""
        if not self._skip:
            return
        loader = trainer.train_dataloader
        sampler = resumable_sampler(loader)
        if sampler is None:
            log.warning("shockslurm.train: resuming mid-epoch without cb.sampler(dataset): the "
                        "epoch does not continue exactly where it stopped")
            return
        if self._skip >= trainer.num_training_batches:
            self._skip = 0                    # stopped at the epoch's last batch: nothing to skip
            return
        sampler.set_epoch(trainer.current_epoch)
        sampler.start_at(self._skip * int(getattr(loader, "batch_size", 1) or 1))
        fetcher = trainer.fit_loop._data_fetcher
        if fetcher is None:
            return
        iter(fetcher)                         # the epoch's iterator, from the sampler's start
        fetcher.fetched -= self._skip         # Lightning adds the batches done back (its count)
        self._skip = 0

    # ------------------------------------------------------------------ per step
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        self._report(trainer, batch)
        if not self._stepped(trainer):
            # Gradients accumulated (accumulate_grad_batches > 1): they are in no checkpoint,
            # and a resume starts after this batch. Save and stop after the optimizer step.
            return
        step = trainer.global_step
        step_due = self.every_steps is not None and step % self.every_steps == 0
        time_due = (self.every_seconds is not None
                    and time.monotonic() - self._last_save_time >= self.every_seconds)
        stop, time_due = self.lease.poll(time_due)
        self._save_due = self._save_due or step_due or time_due
        if trainer.fit_loop.epoch_loop.batch_progress.is_last_batch:
            # Lightning has yet to end the epoch (LR schedulers, loop counters): a checkpoint
            # taken now would resume into a half-ended epoch. Save (and stop) at the next step,
            # or when training ends.
            return
        if self._save_due or stop:
            self.save(trainer)
        if stop and not self.stopped:
            self._take_stop(trainer)

    def _take_stop(self, trainer: pl.Trainer) -> None:
        """The stop is taken (its checkpoint written): no further step; `teardown` exits 0."""
        self.stopped = True
        trainer.should_stop = True
        self._no_validation_for_the_stop(trainer)
        self.lease.consume_stop_file()
        step = trainer.global_step
        log.warning("shockslurm.train: stopping at step %d (%s); %s", step,
                    self.lease.reason or "stop requested", self.saves.stop_outcome(step))

    def _no_validation_for_the_stop(self, trainer: pl.Trainer) -> None:
        """Lightning validates at once when a loop is asked to stop (`should_stop`, meant for
        early stopping): here that pass ran in the grace time before the job's successor could
        start, and it was a validation the uninterrupted run never had (another point for
        `EarlyStopping`'s patience, another `ModelCheckpoint` save). It is left out unless it was
        due at this batch anyway (then it runs: the resume starts after this batch). Validation
        comes back at `teardown`."""
        loop = trainer.fit_loop.epoch_loop
        check, fetcher = getattr(loop, "_should_check_val_fx", None), trainer.fit_loop._data_fetcher
        if check is None or fetcher is None or self._val_batches is not None:
            return
        trainer.should_stop = False
        try:
            due = bool(check(fetcher))
        finally:
            trainer.should_stop = True
        if not due:
            self._val_batches = trainer.limit_val_batches
            trainer.limit_val_batches = 0

    def _stepped(self, trainer: pl.Trainer) -> bool:
        """Whether the optimizer stepped in the batch just trained (each batch, or the last of
        each `accumulate_grad_batches`): the global step moved since the previous batch."""
        stepped = trainer.global_step != self._seen_step
        self._seen_step = trainer.global_step
        return stepped

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # A stop asked at the last batch of the last epoch (deferred to the next step, which
        # never came) is taken here, as any other: saved, the stop file removed, exit 0.
        stop = not self.stopped and self.lease.poll()[0]
        if self._save_due or stop:
            self.save(trainer)
        if stop:
            self._take_stop(trainer)

    def _report(self, trainer: pl.Trainer, batch: Any) -> None:
        size = batch_len(batch) * _env.world_size()
        # an epoch's partial last batch (100 samples in batches of 32: 32, 32, 32, 4) is no
        # change of batch size
        partial = size < self._batch_size and _is_last_batch(trainer)
        if size != self._batch_size and self._batch_size and not partial:
            self.reporter.batch_size_change(self._batch_size, size, epoch=trainer.current_epoch,
                                            step=trainer.global_step)
            self._window.reset()                 # a rate is of one batch size
        if not partial:
            self._batch_size = size
        rate = self._window.add(size)
        if rate is not None:
            self.reporter.throughput(rate, self._batch_size, epoch=trainer.current_epoch,
                                     epochs=trainer.max_epochs, step=trainer.global_step)

    # Time outside training batches is no training time (window.py, as `ShockTrainer` leaves
    # it out): validation, and the loop's own code between epochs (epoch-end hooks, LR
    # schedulers), up to the next epoch's start.
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._window.idle()

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._window.idle()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._window.idle()

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.reporter.epoch_done(trainer.current_epoch, trainer.global_step,
                                 batch_size=self._batch_size, epochs=trainer.max_epochs)

    def save(self, trainer: pl.Trainer) -> Path | None:
        """Checkpoint now (collective: every rank calls it; rank 0 writes, the others wait for
        its word, bounded by the process group's timeout, and raise `collective.RankFailed`
        should its write fail otherwise than with an OSError, as `ShockTrainer.save` says). Its
        time is left out of the throughput reported."""
        step = trainer.global_step
        if step == self._last_save_step:
            self._save_due = False           # this step's checkpoint is written already
            return None
        with self._window.excluding():
            state = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
            path, ok = self.saves.save(state, step)
            trainer.strategy.barrier("shockslurm-checkpoint")
            self._last_save_step, self._last_save_time = step, time.monotonic()
            self._save_due = False
            if self.ckpt.is_writer:
                self.reporter.checkpoint(str(path or self.ckpt.path_for(step)), step, ok)
        return path

    # ------------------------------------------------------------------ the end
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._val_batches is not None:
            trainer.limit_val_batches, self._val_batches = self._val_batches, None
        self.lease.close()
        self.reporter.close()
        if stage == "fit" and self.stopped and self.exit_on_stop:
            log.warning("shockslurm.train: exiting 0 at step %d for Slurm to requeue",
                        trainer.global_step)
            raise SystemExit(0)


# Strategies that shard the states and load them in their own `load_checkpoint` (their
# `load_model_state_dict` does nothing), which the callback's resume does not go through
SHARDING_STRATEGIES = ("FSDPStrategy", "ModelParallelStrategy", "DeepSpeedStrategy")


def refuse_sharding_strategy(strategy: Any) -> None:
    """A ValueError for a strategy the callback cannot checkpoint: it writes Lightning's
    checkpoint dict from rank 0 and resumes by handing that dict to Lightning, so under FSDP,
    model parallelism or DeepSpeed the file would hold rank 0's shards at most and a resume would
    go on from untrained weights (those strategies load the weights in `load_checkpoint`; read
    from Lightning 2.6's source, not run: Lightning's FSDP needs a GPU)."""
    names = {cls.__name__ for cls in type(strategy).__mro__}
    found = next((n for n in SHARDING_STRATEGIES if n in names), None)
    if found is not None:
        raise ValueError(f"{WHO}: strategy {found} shards the model's states, which this "
                         "callback does not checkpoint (it would resume from untrained "
                         "weights); use strategy='ddp', or ShockTrainer, which checkpoints an "
                         "FSDP model shard by shard")


def _check_lightning(state: dict[str, Any], name: str) -> None:
    """Refuse (CorruptCheckpoint) a file in the checkpoint directory that is not a Lightning
    checkpoint this callback wrote."""
    missing = [k for k in ("state_dict", "global_step", STATE_KEY) if k not in state]
    if missing:
        raise CorruptCheckpoint(f"{name}: not a checkpoint of this callback (no "
                                f"{', '.join(missing)})")


def _is_last_batch(trainer: Any) -> bool:
    """Whether the batch just trained is its epoch's last (Lightning's batch progress)."""
    try:
        return bool(trainer.fit_loop.epoch_loop.batch_progress.is_last_batch)
    except AttributeError:
        return False
