"""The data side of `ShockTrainer`: batch-size schedules, the helper's own epochs over tensors
(`epochs()`), and loops over the user's own DataLoader (`sampler()`, `epoch_range()`,
`batches()`). `EpochLoops` is a mixin: the position it moves (epoch, step in epoch, batch size)
and the reporter are the trainer's.
"""

from __future__ import annotations

import logging
import math
import numbers
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import torch

from . import _env
from .data import (ResumableSampler, SamplerSeeds, batch_len, epoch_generator, permutation,
                   resumable_sampler, seed_sampler)
from .reports import Reporter
from .state import rng_state, set_rng_state
from .window import ThroughputWindow

log = logging.getLogger("shockslurm.train")

Schedule = int | Sequence[int] | Mapping[int, int] | Callable[[int], int]


def batch_size_for(schedule: Schedule, epoch: int) -> int:
    """The batch size a schedule gives an epoch (ValueError saying what is wrong with either)."""
    size: Any
    if callable(schedule):
        size = schedule(epoch)
    elif whole_number(schedule):
        size = schedule
    elif isinstance(schedule, Mapping):
        starts = sorted(k for k in schedule if k <= epoch)
        if not starts:
            raise ValueError(f"batch-size schedule has no entry at or before epoch {epoch}")
        size = schedule[starts[-1]]
    elif isinstance(schedule, Iterable) and not isinstance(schedule, (str, bytes)):
        seq = list(schedule)
        if not seq:
            raise ValueError("empty batch-size schedule")
        size = seq[min(epoch, len(seq) - 1)]
    else:
        raise ValueError(f"batch-size schedule must be a whole number, a list, a dict "
                         f"{{first epoch: size}} or a function of the epoch, got {schedule!r}")
    if not whole_number(size) or size < 1:
        raise ValueError(f"batch size for epoch {epoch} must be a positive int, got {size!r}")
    return int(size)


def whole_number(value: Any) -> bool:
    """An int or numpy integer, not a bool (True is no batch size)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def fetch(dataset: Any, indices: torch.Tensor) -> Any:
    """A batch: tensors / tuples of tensors are indexed at once, other datasets item by item."""
    if isinstance(dataset, torch.Tensor):
        return dataset[indices]
    if isinstance(dataset, (tuple, list)) and dataset and all(
            isinstance(t, torch.Tensor) for t in dataset):
        return type(dataset)(t[indices] for t in dataset)
    getitems = getattr(dataset, "__getitems__", None)
    items = getitems(indices.tolist()) if getitems else [dataset[i] for i in indices.tolist()]
    return torch.utils.data.default_collate(items)


def _samples_left(sampler: Any, dropped: int) -> int | None:
    """This rank's samples left in the epoch once `dropped` are loaded and dropped (a
    `ResumableSampler` counts from where it starts); None when the sampler has no length (an
    IterableDataset)."""
    try:
        return max(0, len(sampler) - dropped)
    except TypeError:
        return None


def _length(dataset: Any) -> int:
    if isinstance(dataset, (tuple, list)) and dataset and all(
            isinstance(t, torch.Tensor) for t in dataset):
        return len(dataset[0])
    return len(dataset)


class EpochLoops:
    """Epoch and batch iteration for `ShockTrainer` (which provides these attributes)."""

    seed: int
    epoch: int
    step_in_epoch: int
    steps_per_epoch: int
    global_step: int
    num_epochs: int | None
    batch_size: int | None
    stopped: bool
    batch_size_changes: list[dict[str, int]]
    reporter: Reporter
    checkpoint_epochs: bool
    _resume_pending: bool
    _last_batch_len: int
    _window: ThroughputWindow       # samples/s over training time (`window`)
    _samplers: SamplerSeeds         # the samplers `sampler()` made
    _batch_position: int | None     # batches of the epoch taken from our loops (None: none)
    _pending_samples: int           # their samples not yet counted by a step

    def start(self) -> None:            # the trainer's: resume once
        raise NotImplementedError

    def save(self) -> Any:              # the trainer's: checkpoint now
        raise NotImplementedError

    # ------------------------------------------------------------------ data
    def epochs(self, dataset: Any, batch_size_schedule: Schedule, num_epochs: int | None = None,
               *, shuffle: bool = True) -> Iterator[tuple[int, int, Iterator[tuple[int, Any]]]]:
        """Yield (epoch, batch size, batches) from the current position on; `batches` yields
        (step in epoch, batch). After a resume, the interrupted epoch comes first with only its
        remaining batches (possibly none, so that per-epoch code after the inner loop runs)."""
        if num_epochs is None:
            if isinstance(batch_size_schedule, Sequence):
                num_epochs = len(batch_size_schedule)
            else:
                raise ValueError("give num_epochs (the schedule does not say how many)")
        self.num_epochs = num_epochs
        self.start()
        if _env.world_size() > 1:
            log.warning("shockslurm.train: epochs() gives every one of the %d ranks the same "
                        "batches (no data parallelism); shard with a DataLoader over "
                        "st.sampler(dataset) and st.batches()", _env.world_size())
        n = _length(dataset)
        resumed = self._resume_pending
        self._resume_pending = False
        epoch = self.epoch
        while epoch < num_epochs:
            if resumed and epoch == self.epoch and self.step_in_epoch > 0 and (
                    self.batch_size is not None):
                size = int(self.batch_size)           # the interrupted epoch keeps its size
                start = self.step_in_epoch
            else:
                size = batch_size_for(batch_size_schedule, epoch)
                start = 0
                self._note_batch_size(epoch, size)
            resumed = False
            self.epoch, self.step_in_epoch, self.batch_size = epoch, start, size
            self._batch_position = None
            self.steps_per_epoch = math.ceil(n / size)
            self._window.idle()                   # the loop's own code since the last step
            yield epoch, size, self._batches(dataset, n, size, start, shuffle)
            if self.stopped:
                return
            epoch = self._end_epoch(epoch, num_epochs, size)
        self.epoch, self.step_in_epoch = num_epochs, 0

    def _end_epoch(self, epoch: int, num_epochs: int, batch_size: int) -> int:
        """Report epoch `epoch` done and checkpoint where due; returns the next epoch. The saved
        position is "start of the next epoch", taken after the user's per-epoch code, so a
        restart after the end (or from an epoch checkpoint) does not run it twice."""
        self.reporter.epoch_done(epoch, self.global_step, batch_size=batch_size,
                                 epochs=num_epochs)
        epoch += 1
        self._batch_position = None
        if epoch >= num_epochs or self.checkpoint_epochs:
            self.epoch, self.step_in_epoch = epoch, 0
            self.save()
        return epoch

    def _note_batch_size(self, epoch: int, size: int) -> None:
        """Report a batch size that differs from the previous epoch's."""
        if self.batch_size is not None and size != self.batch_size:
            self._window.reset()                  # a rate is of one batch size
            change = {"step": self.global_step, "epoch": epoch, "old": int(self.batch_size),
                      "new": size}
            self.batch_size_changes.append(change)
            self.reporter.batch_size_change(change["old"], size, epoch=epoch,
                                            step=self.global_step)
            log.info("shockslurm.train: batch size %d -> %d at epoch %d (step %d)",
                     change["old"], size, epoch, self.global_step)

    # ------------------------------------------------------------------ your own DataLoader
    def sampler(self, data: Any, *, shuffle: bool = True, drop_last: bool = False,
                num_replicas: int | None = None, rank: int | None = None) -> ResumableSampler:
        """A sampler for your DataLoader that `batches()` resumes exactly (see `data`): the
        trainer's seed, sharded over the ranks (torch.distributed / RANK, WORLD_SIZE) unless
        told otherwise."""
        return self._samplers.made(ResumableSampler(
            data, seed=self.seed, shuffle=shuffle, drop_last=drop_last,
            num_replicas=num_replicas, rank=rank))

    def epoch_range(self, num_epochs: int) -> Iterator[int]:
        """The epochs from the current position on (for loops over your own DataLoader). After
        each epoch's body: the epoch is reported, and the end of training (and each epoch with
        checkpoint_epochs) is checkpointed; after a stop, no further epoch."""
        self.num_epochs = num_epochs
        self.start()
        epoch = self.epoch
        while epoch < num_epochs:
            if epoch != self.epoch:
                self.epoch, self.step_in_epoch = epoch, 0
            yield epoch
            if self.stopped:
                return
            epoch = self._end_epoch(epoch, num_epochs, self.batch_size or 0)
        self.epoch, self.step_in_epoch = num_epochs, 0

    def batches(self, loader: Any) -> Iterator[tuple[int, Any]]:
        """One epoch of your DataLoader from the current position: yields (step in epoch,
        batch). The epoch's batch size is the loader's times the ranks its sampler shards over
        (what is reported; a change is reported too). After a resume the interrupted epoch
        continues after the batches already trained on: skipped in the sampler with
        `st.sampler()`, else loaded and dropped (a warning says so)."""
        self.start()
        batcher = getattr(loader, "batch_sampler", None)
        per_rank = getattr(loader, "batch_size", None) or getattr(batcher, "batch_size", None)
        if per_rank is None and batcher is None:
            raise ValueError("shockslurm.train: batches() needs a DataLoader with a batch_size "
                             "or a batch_sampler (one DataLoader per batch size of your "
                             "schedule)")
        # a batch_sampler= of batches of their own sizes (bucketing by length): each batch's
        # samples are counted as they come, and a resume loads and drops the batches trained
        sampler = resumable_sampler(loader) if per_rank is not None else None
        inner: Any = sampler if sampler is not None else (
            getattr(batcher, "sampler", None) or getattr(loader, "sampler", None))
        replicas = int(getattr(inner, "num_replicas", 1))
        size = None if per_rank is None else per_rank * replicas
        resuming = self._resume_pending and self.step_in_epoch > 0
        self._resume_pending = False
        if resuming and size is not None and self.batch_size not in (None, size):
            raise ValueError(f"shockslurm.train: the checkpoint is {self.step_in_epoch} batches "
                             f"of {self.batch_size} into epoch {self.epoch}; this DataLoader's "
                             f"batch size is {size}: an epoch resumes with its own batch size")
        if not resuming:
            self.step_in_epoch = 0
            if size is not None:
                self._note_batch_size(self.epoch, size)
        self.batch_size = size
        skip = self.step_in_epoch
        if hasattr(inner, "set_epoch"):
            inner.set_epoch(self.epoch)           # ours, or a DistributedSampler
        if sampler is not None and per_rank is not None:
            sampler.start_at(skip * per_rank)
            skip = 0
        elif skip:
            log.warning("shockslurm.train: resuming by loading and dropping %d batches (give the "
                        "DataLoader sampler=st.sampler(dataset) to skip them without loading)",
                        skip)
        loader.generator = epoch_generator(self.seed, self.epoch)
        if sampler is None:      # `shuffle=True`, SubsetRandomSampler, ...: from (seed, epoch)
            seed_sampler(inner, self.seed, self.epoch)
        try:
            self.steps_per_epoch = self.step_in_epoch + len(loader) - skip
        except TypeError:                         # an IterableDataset without __len__
            self.steps_per_epoch = 0
        left = None if per_rank is None else _samples_left(inner, skip * per_rank)
        self._window.idle()                       # the loop's own code since the last step
        self._batch_position = None
        step = self.step_in_epoch
        # The batches dropped may draw from the RNG (an augmentation in the dataset): the
        # resumed states go back before the first batch trained on is loaded.
        resumed_rng = rng_state() if skip else None
        for i, batch in enumerate(loader):
            if i < skip:
                if i == skip - 1 and resumed_rng is not None:
                    set_rng_state(resumed_rng)
                continue
            if self.stopped:
                return
            if per_rank is None:
                taken = batch_len(batch)
            else:
                taken = per_rank if left is None else min(per_rank, left)   # the last: short
            left = None if left is None else left - taken
            self._took_batch(step, taken * replicas)
            yield step, batch
            step += 1

    def _batches(self, dataset: Any, n: int, size: int, start: int,
                 shuffle: bool) -> Iterator[tuple[int, Any]]:
        order = permutation(self.seed, self.epoch, n) if shuffle else torch.arange(n)
        steps = math.ceil(n / size)
        for k in range(start, steps):
            if self.stopped:
                return
            idx = order[k * size:(k + 1) * size]
            self._took_batch(k, len(idx))
            yield k, fetch(dataset, idx)

    def _took_batch(self, index: int, samples: int) -> None:
        """Batch `index` of the epoch is handed out: the position a step after it saves is
        past it, however many batches a step takes (gradient accumulation: a resume continues
        after the last batch trained on, not after as many batches as optimizer steps)."""
        self._last_batch_len = samples
        self._pending_samples += samples
        self._batch_position = index + 1
