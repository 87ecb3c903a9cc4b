"""`ShockTrainer`: a few lines around a user's loop for checkpoint, stop-on-signal, exact resume
and reports.

    import shockslurm.train                     # first: stop signals are kept from here on
    import torch
    from shockslurm.train import ShockTrainer

    with ShockTrainer(model, optimizer, scheduler=sched, ckpt_dir=d, every_steps=50) as st:
        for epoch, batch_size, batches in st.epochs(dataset, [32, 32, 64, 128]):
            for step, (x, y) in batches:
                ...forward, backward, optimizer.step()...
                if st.step():                   # a stop was asked: checkpoint written
                    st.save_and_exit()          # exit 0: Slurm requeues, the rerun resumes
            sched.step()

The stop outcome is explicit: `step()` returns True once a stop was asked (SIGUSR1/SIGTERM, the
stop file, `request_stop`) and agreed by every rank; by then the current step is checkpointed and
`st.should_stop` stays True. The loop decides what to do: `st.save_and_exit()` (exit code 0, so
the job is requeued and resumes), or `break` and its own cleanup (e.g. tearing down
torch.distributed) before exiting 0. `epochs()` yields no further batch after a stop. Nothing is
raised from `step()` unless `exit_on_stop=True` (then `step()` calls `save_and_exit()` itself).

Signals are handled from the moment the trainer is built (and, inside a Slurm job or torchrun,
from `import shockslurm.train`: see `lease`); a signal that came earlier is honoured at the first
`step()`. The `with` form resumes on entry and puts the previous signal handlers back on exit;
without it, the trainer resumes at the first `epochs()` (or an explicit `resume()`), and `close()`
ends it.

A `ckpt_dir` that cannot be written is refused when the trainer is built (OSError naming it),
before any training is lost. A checkpoint that fails later (a full disk, a lost mount) is logged
as an error saying where a rerun would resume from, and training goes on; a stop whose checkpoint
fails says so and still ends the run with exit 0, so Slurm requeues it and the rerun resumes
from the newest good checkpoint (a file in `ckpt_dir` that is not this helper's is skipped with a
warning; a good checkpoint of another model raises `CheckpointMismatch` naming it).

A model no rank holds whole (FSDP2's `fully_shard`, FSDP1, tensor parallel: `sharded.sharded_model`)
is checkpointed by every rank through `torch.distributed.checkpoint` (`ShardedCheckpointManager`:
`ckpt_dir/dcp-<step>/`, the scheduler, GradScaler, data position and extras beside the shards);
the rest is the same. (Until 2026-12-02 rank 0 saved its own shards as the whole model, and a
resume gave every rank rank 0's shards, in silence.)

When it starts again (SLURM_RESTART_COUNT > 0 or a checkpoint in `ckpt_dir`) it loads the newest
good checkpoint and continues with the same batches in the same order and the same RNG streams,
so the final weights are bit-identical to an uninterrupted run (given deterministic kernels and
the same number of threads/devices).

Your own DataLoader (workers, pinned memory, collate, one DataLoader per batch size of your
schedule) instead of `epochs()`:

    loaders = {bs: DataLoader(ds, batch_size=bs, sampler=st.sampler(ds), num_workers=2)
               for bs in (32, 64)}
    for epoch in st.epoch_range(10):
        for step, (x, y) in st.batches(loaders[32 if epoch < 5 else 64]):
            ...
            if st.step():
                st.save_and_exit()

`st.sampler()` is a `data.ResumableSampler` (sharded by rank, like DistributedSampler), so an
interrupted epoch resumes after the samples already trained on without loading them.

The data order is a seeded permutation per epoch (`torch.randperm` with a generator seeded from
`(seed, epoch)`) cut into batches of that epoch's size; the data position saved is
(epoch, step in epoch, batch size), the sampler state is the seed. The batch size is fixed within
an epoch and may change between epochs (`batch_size_schedule`: an int, a list indexed by epoch,
a dict {first epoch: size}, or a callable epoch -> size); each change is reported.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import torch

from . import _env
from .checkpoint import CheckpointManager, CheckpointMismatch
from .saves import SaveRecord, agree_on_resume
from .epochs import EpochLoops, Schedule, whole_number, batch_size_for, fetch
from .checked import module_arg, picklable_dict_arg, seconds_arg, whole_arg
from .lease import Lease
from .reports import Reporter, reporter_from_env
from .collective import RankFailed, gathered
from .sharded import ShardedCheckpointManager, sharded_model
from .state import (LOOP_KEYS, Optimizers, capture, check_format, each, loop_state, restore,
                    restore_parts, restored_into)
from .data import SamplerSeeds
from .window import ThroughputWindow

log = logging.getLogger("shockslurm.train")
WHO = "ShockTrainer"           # names the bad argument's owner in its ValueError

__all__ = ["ShockTrainer", "Schedule", "batch_size_for", "fetch"]


class ShockTrainer(EpochLoops):
    """Checkpoint / lease / report helper around a training loop (best used as a context manager).

    model, optimizer, scheduler, scaler: what is checkpointed (optimizer and scheduler may be
    several, a list or a dict of them: a GAN's two; a DDP / DataParallel / compiled
    model is saved by its inner module's keys). ckpt_dir: where checkpoints go (`keep` newest are
    kept). every_steps / every_seconds: checkpoint cadence. seed: the data order's seed.
    check_every: poll the stop flag every that many steps (always at the first). exit_on_stop:
    `step()` exits the process itself on a stop (default: it returns True). resume: load the
    newest checkpoint on entry. reporter / lease: injected instead of the ones built from the
    environment. extras: a dict of your own saved with every checkpoint (`st.extras`)."""

    def __init__(self, model: torch.nn.Module, optimizer: Optimizers | None = None,
                 *, ckpt_dir: str | os.PathLike[str], scheduler: Any = None, scaler: Any = None,
                 every_steps: int | None = None, every_seconds: float | None = 600.0,
                 keep: int = 3, seed: int = 0, check_every: int = 1,
                 checkpoint_epochs: bool = False, exit_on_stop: bool = False, resume: bool = True,
                 report_interval_s: float = 10.0, reporter: Reporter | None = None,
                 lease: Lease | None = None, extras: dict[str, Any] | None = None) -> None:
        self.model, self.optimizer = module_arg(WHO, "model", model), optimizer
        self.scheduler, self.scaler = scheduler, scaler
        self.ckpt = CheckpointManager(ckpt_dir, keep=whole_arg(WHO, "keep", keep))
        self.saves = SaveRecord(self.ckpt)
        # a model no rank holds whole (FSDP) is checkpointed by every rank through DCP
        self.sharded = ShardedCheckpointManager(ckpt_dir, keep=keep) if sharded_model(model) \
            else None
        self.every_steps = whole_arg(WHO, "every_steps", every_steps, optional=True)
        self.every_seconds = seconds_arg(WHO, "every_seconds", every_seconds, optional=True)
        self.seed = whole_arg(WHO, "seed", seed, least=None)
        self.check_every = whole_arg(WHO, "check_every", check_every)
        self.checkpoint_epochs = checkpoint_epochs
        self.exit_on_stop = exit_on_stop
        self.resume_enabled = resume
        self.report_interval_s = seconds_arg(WHO, "report_interval_s", report_interval_s)
        self.extras: dict[str, Any] = picklable_dict_arg(WHO, "extras", extras)
        if self.ckpt.is_writer:
            self.ckpt.check_writable()  # before training: a job that cannot checkpoint loses work
        self.reporter = reporter if reporter is not None else reporter_from_env(
            min_interval_s=report_interval_s)
        self.lease = lease if lease is not None else Lease()
        # position
        self.global_step = 0
        self.epoch = 0
        self.step_in_epoch = 0
        self.steps_per_epoch = 0
        self.num_epochs: int | None = None
        self.batch_size: int | None = None
        self.resumed_from: Path | None = None
        self.stopped = False
        self.stop_reason: str | None = None
        self.batch_size_changes: list[dict[str, int]] = []   # this process's, in order
        # bookkeeping
        self._last_save_step = -1      # the last step a save was attempted at (every rank)
        self._last_save_time = time.monotonic()
        self._last_batch_len = 0
        self._batch_position: int | None = None
        self._pending_samples = 0
        # samples/s over training time, from the first step or epoch on (not the start-up's)
        self._window = ThroughputWindow(self.report_interval_s, begin_at_first_step=True)
        self._samplers = SamplerSeeds()     # made by sampler(): a resume gives them its seed
        self._until_poll = 1            # the first step always polls: an early signal stops it
        self._started = False
        self._resume_pending = False    # a checkpoint was loaded: the next epoch continues it
        self._stop_logged = False
        self.lease.install()            # from construction on, with or without `with`

    # ------------------------------------------------------------------ context
    def __enter__(self) -> "ShockTrainer":
        self.start()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.close()

    def start(self) -> None:
        """Resume from the newest good checkpoint (once; `with` and `epochs()` call this)."""
        if self._started:
            return
        self._started = True
        if self.resume_enabled:
            self.resume()

    def close(self) -> None:
        """Put the previous signal handlers back and flush the reports."""
        self.lease.close()
        self.reporter.close()

    @property
    def should_stop(self) -> bool:
        """True once a stop was asked and agreed at a step: the checkpoint of that step is written
        and the loop should end (`save_and_exit()`, or its own cleanup, then exit 0)."""
        return self.stopped

    def save_and_exit(self, code: int = 0) -> None:
        """End the process for Slurm to requeue it: checkpoint the current step unless that is
        done, close the trainer, exit with `code` (0: the rerun resumes from the checkpoint)."""
        if self._last_save_step != self.global_step:
            self.save()
        log.warning("shockslurm.train: exiting %d at step %d for Slurm to requeue", code,
                    self.global_step)
        self.close()
        raise SystemExit(code)

    # ------------------------------------------------------------------ checkpoint
    def state(self) -> dict[str, Any]:
        """The whole-file checkpoint dict (collective under torch.distributed: every rank's RNG
        states are gathered, since ranks seeded apart draw different dropout masks and noise;
        a sharded model's checkpoint is no one dict, `save` writes it)."""
        state = capture(self.model, self.optimizer, scheduler=self.scheduler, scaler=self.scaler,
                        data=self._position(), batch_size=self.batch_size, step=self.global_step,
                        extras=self.extras)
        if _env.distributed():
            state["rng_ranks"] = gathered(state["rng"])
        return state

    def save(self) -> Path | None:
        """Checkpoint now (rank 0 writes; other ranks wait for it when torch.distributed is up;
        a sharded model's shards are written by every rank, `sharded`).
        A write that fails (full disk, lost mount) is logged and training goes on: the newest
        good checkpoint stays, and the next save tries again. Its time is left out of the
        throughput reported. Other ranks wait for the writer's word, which fails after the
        process group's timeout (`init_process_group(timeout=...)`; NCCL's default is 10
        minutes): a write that may take longer needs a longer timeout. Any other error of the
        writer's (a value in `extras` that cannot be pickled) is raised there and as
        `collective.RankFailed` on every other rank at once."""
        with self._window.excluding():
            if self.sharded is not None:
                path, ok = self._save_sharded()
            else:
                path, ok = self.saves.save(self.state(), self.global_step)
            self._last_save_step = self.global_step
            self._last_save_time = time.monotonic()
            if self.ckpt.is_writer:
                where = path or (self.sharded or self.ckpt).path_for(self.global_step)
                self.reporter.checkpoint(str(where), self.global_step, ok)
        return path

    def _loop_state(self) -> dict[str, Any]:
        """What a sharded checkpoint holds besides the model, optimizer and RNG states."""
        return loop_state(scheduler=self.scheduler, scaler=self.scaler, data=self._position(),
                          batch_size=self.batch_size, step=self.global_step, extras=self.extras)

    def _position(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "step_in_epoch": self.step_in_epoch,
                "global_step": self.global_step, "sampler": "seeded-permutation",
                "seed": self.seed, "num_epochs": self.num_epochs}

    def _save_sharded(self) -> tuple[Path | None, bool]:
        """Every rank writes its shards (collective). A write that fails (OSError, or DCP's
        CheckpointException on every rank) is logged and training goes on, as for a whole
        file (`SaveRecord`)."""
        from torch.distributed.checkpoint.api import CheckpointException

        assert self.sharded is not None
        step = self.global_step
        try:
            path = self.sharded.save(self.model, self.optimizer, step, extras=self._loop_state())
        except (OSError, CheckpointException, RankFailed) as exc:
            if isinstance(exc, RankFailed) and not exc.os_error:
                raise
            log.error("shockslurm.train: sharded checkpoint at step %d failed: %s; %s", step,
                      exc, self.saves.fallback())
            return None, False
        self.saves.good_step = step
        return path, True

    def resume(self) -> bool:
        """Load the newest good checkpoint, if any; True when one was loaded."""
        self._started = True
        found = self._load_sharded() if self.sharded is not None else self._load_whole()
        if found is None:
            if _env.restart_count() > 0:
                log.warning("shockslurm.train: SLURM_RESTART_COUNT=%d but no good checkpoint in "
                            "%s; starting from scratch", _env.restart_count(), self.ckpt.directory)
            return False
        path, state = found
        data = state["data"]
        self.global_step = int(state["step"])
        self.epoch = int(data["epoch"])
        self.step_in_epoch = int(data["step_in_epoch"])
        self.batch_size = state.get("batch_size")
        if data.get("seed") is not None and data["seed"] != self.seed:
            # also for a DataLoader built before this resume
            self.seed = self._samplers.take(int(data["seed"]), self.seed)
        for key, value in (state.get("extras") or {}).items():   # the same dict and tensors:
            self.extras[key] = restored_into(self.extras.get(key), value)   # references stay live
        for optimizer in each(self.optimizer) if self.global_step > 0 else ():
            # The optimizer did step in the previous life: spare the scheduler's "step() before
            # optimizer.step()" warning when the resumed epoch has no batches left.
            optimizer._opt_called = True
        self.resumed_from = path
        self._last_save_step = self.saves.good_step = self.global_step
        self._resume_pending = True
        log.info("shockslurm.train: resumed from %s (step %d, epoch %d, step in epoch %d, batch "
                 "size %s)", path, self.global_step, self.epoch, self.step_in_epoch,
                 self.batch_size)
        return True

    def _load_whole(self) -> tuple[Path, dict[str, Any]] | None:
        """The newest good whole-file checkpoint, loaded into the live objects (RNG last), and
        its state; every rank agrees on it."""
        found = self.ckpt.load_latest(check=check_format)
        agree_on_resume(-1 if found is None else int(found[1]["step"]), self.ckpt.directory)
        if found is None:
            return None
        path, state = found
        try:
            restore(state, self.model, self.optimizer, scheduler=self.scheduler,
                    scaler=self.scaler, rng_rank=_env.rank(), world_size=_env.world_size())
        except CheckpointMismatch as exc:
            raise CheckpointMismatch(f"{path}: {exc}; is ckpt_dir this run's own?") from exc
        return path, state

    def _load_sharded(self) -> tuple[Path, dict[str, Any]] | None:
        """The newest good sharded checkpoint (rank 0 chooses it for every rank), loaded into
        the model, optimizer and each rank's RNG, then the scheduler and GradScaler."""
        assert self.sharded is not None
        found = self.sharded.load_latest(self.model, self.optimizer)
        if found is None:
            return None
        path, state = found[0], self.sharded.extras
        check_format(state, str(path), required=LOOP_KEYS)
        try:
            restore_parts(state, scheduler=self.scheduler, scaler=self.scaler)
        except CheckpointMismatch as exc:
            raise CheckpointMismatch(f"{path}: {exc}; is ckpt_dir this run's own?") from exc
        return path, state

    # ------------------------------------------------------------------ per step
    def step(self, samples: int | None = None) -> bool:
        """Call after each optimizer step (with gradient accumulation, after the step that
        ends the accumulated batches: the saved position is after the last batch `epochs()` or
        `batches()` handed out, and its samples all count). Checkpoints on schedule. Returns
        True when the loop must stop (a stop was asked; this step is checkpointed;
        `should_stop` is True from now on), else False. With exit_on_stop=True it exits the process instead of returning True.
        `samples`: this step's sample count when not the batch `epochs()` gave."""
        self.global_step += 1
        # in batches of the epoch (a step may take several: gradient accumulation)
        self.step_in_epoch = (self.step_in_epoch + 1 if self._batch_position is None
                              else self._batch_position)
        rate = self._window.add(self._pending_samples if samples is None else int(samples))
        self._pending_samples = 0
        if rate is not None:
            self._report_throughput(rate, samples)
        step_due = self.every_steps is not None and self.global_step % self.every_steps == 0
        time_due = (self.every_seconds is not None
                    and time.monotonic() - self._last_save_time >= self.every_seconds)
        stop = False
        self._until_poll -= 1
        if self._until_poll <= 0:
            self._until_poll = self.check_every
            stop, time_due = self.lease.poll(time_due)   # one collective under torch.distributed
        elif _env.distributed():
            time_due = False     # each rank's clock differs: decided at the next agreed poll
        if step_due or time_due:
            self.save()
        if stop:
            return self._stop()
        return False

    def _report_throughput(self, samples_per_s: float, samples: int | None) -> None:
        """One throughput report. A plain loop (`step(samples=N)` without `epochs()`) has no
        batch size of its own: a step's samples are its batch. The position within the epoch
        goes only with a known epoch length (an IterableDataset has none: `step_in_epoch`
        counted every step, and a progress of thousands of epochs was reported)."""
        size = self.batch_size or (int(samples) if samples is not None else self._last_batch_len)
        if size <= 0:
            return                      # nothing says what a batch is: the report is refused
        where: dict[str, Any] = {"epoch": self.epoch, "step": self.global_step}
        if self.num_epochs is not None:
            where["epochs"] = self.num_epochs
        if self.steps_per_epoch > 0:
            where.update(step_in_epoch=self.step_in_epoch, steps_per_epoch=self.steps_per_epoch,
                         epoch_progress=self.epoch + self.step_in_epoch / self.steps_per_epoch)
        self.reporter.throughput(samples_per_s, int(size), **where)

    def request_stop(self, reason: str = "requested") -> None:
        self.lease.request_stop(reason)

    def _stop(self) -> bool:
        self.stop_reason = self.lease.reason or "stop requested"
        if self._last_save_step != self.global_step:
            self.save()
        self.lease.consume_stop_file()
        self.stopped = True
        if not self._stop_logged:
            self._stop_logged = True
            log.warning("shockslurm.train: stopping at step %d (%s); %s", self.global_step,
                        self.stop_reason, self.saves.stop_outcome(self.global_step))
        if self.exit_on_stop:
            self.save_and_exit(0)
        return True

