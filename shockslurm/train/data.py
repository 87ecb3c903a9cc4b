"""Your own DataLoader, resumed exactly: a sampler that starts where the checkpoint says.

    loader = DataLoader(dataset, batch_size=64, sampler=st.sampler(dataset), num_workers=2,
                        pin_memory=True)
    for epoch in st.epoch_range(10):
        for step, batch in st.batches(loader):
            ...
            if st.step():
                st.save_and_exit()

`ResumableSampler` yields a seeded permutation per epoch (the same as `ShockTrainer.epochs`),
sharded by rank like `DistributedSampler` (each rank reads only its own shard, padded so every
rank gets as many samples), from a start position: on resume, the interrupted epoch starts after
the samples already trained on, without loading them. Workers, pinned memory, collate functions
and the batch size (the user's schedule: one DataLoader per batch size) stay the user's.

Exactness also needs the DataLoader not to draw from the global torch RNG: `ShockTrainer.batches`
gives it a generator seeded from (seed, epoch) before each epoch, from which the workers' seeds
come, and one to a sampler not ours that draws its order from a generator (`seed_sampler`:
`shuffle=True`, SubsetRandomSampler, WeightedRandomSampler, ...). Randomness inside the dataset's `__getitem__` in worker processes continues from those
seeds, so it resumes exactly only when it is seeded per sample: `SeededDataset` does that.
"""

from __future__ import annotations

import logging
import math
import weakref
from typing import Any, Iterator, Sized, Union, cast

import torch

from . import _env
from .sample_seeds import SampleKey, SeededDataset

log = logging.getLogger("shockslurm.train")


def epoch_seed(seed: int, epoch: int) -> int:
    """The seed of an epoch's sample order (and of its DataLoader generator)."""
    return (int(seed) * 1_000_003 + int(epoch)) % (2 ** 63)


def permutation(seed: int, epoch: int, n: int) -> torch.Tensor:
    """The epoch's sample order: independent of every global RNG, so resuming cannot shift it."""
    gen = torch.Generator()
    gen.manual_seed(epoch_seed(seed, epoch))
    return torch.randperm(n, generator=gen)


class SamplerGenerator(torch.Generator):
    """The generator `ShockTrainer.batches` gives a sampler not its own for an epoch (so a
    sampler holding one gets the next epoch's too)."""


def epoch_generator(seed: int, epoch: int, kind: type[torch.Generator] = torch.Generator
                    ) -> torch.Generator:
    """A generator for a DataLoader's epoch (its workers' base seed, and a sampler's order not
    ours: `kind` SamplerGenerator), apart from the order's."""
    gen = kind()
    gen.manual_seed(epoch_seed(seed, epoch) ^ 0x5EED)
    return gen


# torch's samplers that draw their order from `.generator` when an epoch's iterator is made
_TORCH_RANDOM_SAMPLERS = (torch.utils.data.RandomSampler, torch.utils.data.SubsetRandomSampler,
                          torch.utils.data.WeightedRandomSampler)


def seed_sampler(sampler: Any, seed: int, epoch: int) -> None:
    """Give a sampler that is not a `ResumableSampler` a generator seeded from (seed, epoch),
    the DataLoader's own, when it draws its order from one: torch's random samplers
    (`shuffle=True`'s RandomSampler, SubsetRandomSampler, WeightedRandomSampler; a generator
    they were built with is replaced, no checkpoint holds its state) and any other sampler
    whose `generator` attribute is None (it would draw from the global RNG, which a resume puts
    back as it was at the stop) or one given here before. So a resumed epoch loads and drops
    the same batches it trained on, and the global RNG is left alone."""
    current = getattr(sampler, "generator", ())
    if isinstance(sampler, _TORCH_RANDOM_SAMPLERS) or current is None or isinstance(
            current, SamplerGenerator):
        sampler.generator = epoch_generator(seed, epoch, SamplerGenerator)


class ResumableSampler(torch.utils.data.DistributedSampler[int]):
    """Seeded, sharded sample order that can start mid-epoch (`set_epoch`, `start_at`).

    A `DistributedSampler` by type (not by its `__init__`, which needs a process group), since
    it is already sharded by rank: Lightning (`use_distributed_sampler`, on by default) wraps
    any other sampler in a DistributedSampler of its own, which sharded ours a second time
    (each of 2 ranks trained on a quarter of the data, and a resume lost its place)."""

    def __init__(self, data: Sized | int, *, seed: int = 0, shuffle: bool = True,
                 num_replicas: int | None = 1, rank: int | None = 0,
                 drop_last: bool = False) -> None:
        """`num_replicas` / `rank` None: the process group's, read when an epoch is drawn or
        its length asked (torch.distributed once it is up, else RANK and WORLD_SIZE, else
        SLURM_PROCID and SLURM_NTASKS): a DataLoader built before the group is up (Lightning
        starts it in `fit`, and sets WORLD_SIZE only then) is sharded as the ranks run."""
        self.dataset = data  # type: ignore[assignment]     # (DistributedSampler's names)
        self._replicas, self._rank = num_replicas, rank
        if num_replicas is not None and rank is not None:
            self._shard()                                    # a bad pair is refused at once
        self.seed, self.shuffle, self.drop_last = int(seed), shuffle, drop_last
        self.epoch = 0
        self.start = 0

    def _shard(self) -> tuple[int, int]:
        """(replicas, rank) now: those given, the rest from the process group."""
        replicas = _env.world_size() if self._replicas is None else self._replicas
        rank = _env.rank() if self._rank is None else self._rank
        if replicas < 1 or not 0 <= rank < replicas:
            raise ValueError(f"ResumableSampler: rank {rank} of {replicas} replicas")
        return replicas, rank

    @property
    def num_replicas(self) -> int:         # type: ignore[override]
        return self._shard()[0]

    @property
    def rank(self) -> int:                 # type: ignore[override]
        return self._shard()[1]

    @property
    def n(self) -> int:
        """The dataset's length now (read at each epoch: a dataset that grows between epochs,
        as in curriculum or active learning, is drawn whole; until 2026-12-02 the length when
        the sampler was made was kept, and a resumed process, made later, drew another order)."""
        data = cast(Union[Sized, int], self.dataset)
        return data if isinstance(data, int) else len(data)

    def _per_rank(self, replicas: int, n: int) -> int:
        return n // replicas if self.drop_last else math.ceil(n / replicas)

    @property
    def samples_per_rank(self) -> int:
        return self._per_rank(self.num_replicas, self.n)

    @property
    def num_samples(self) -> int:          # type: ignore[override]
        return self.samples_per_rank

    @property
    def total_size(self) -> int:           # type: ignore[override]
        replicas = self.num_replicas
        return self._per_rank(replicas, self.n) * replicas

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def start_at(self, samples: int) -> None:
        """Skip this rank's first `samples` of the epoch (once: the next epoch starts at 0)."""
        self.start = max(0, int(samples))

    def indices(self) -> list[int]:
        """This rank's whole epoch, in order."""
        n = self.n
        order = permutation(self.seed, self.epoch, n) if self.shuffle else torch.arange(n)
        replicas, rank = self._shard()                       # read once for the epoch
        total = self._per_rank(replicas, n) * replicas
        if total > n:                                        # pad by wrapping around
            order = torch.cat([order, order.repeat(math.ceil(total / n))[:total - n]])
        return order[:total][rank::replicas].tolist()

    def __iter__(self) -> Iterator[Any]:
        """This rank's epoch from `start` on: the indices, or for a `SeededDataset` each
        index's `SampleKey` (the index with this epoch's seed)."""
        start, self.start = self.start, 0
        indices = self.indices()[start:]
        if isinstance(self.dataset, SeededDataset):
            seed, epoch = self.seed, self.epoch      # the epoch's, as the iterator is made
            return (SampleKey(i, seed, epoch) for i in indices)
        return iter(indices)

    def __len__(self) -> int:
        return max(0, self.samples_per_rank - self.start)


def resumable_sampler(loader: Any) -> ResumableSampler | None:
    """The loader's ResumableSampler (as its sampler or inside its batch sampler), if any."""
    for candidate in (getattr(loader, "sampler", None),
                      getattr(getattr(loader, "batch_sampler", None), "sampler", None)):
        if isinstance(candidate, ResumableSampler):
            return candidate
    return None


class SamplerSeeds:
    """The samplers a trainer or callback made (`sampler()`), so that the seed a resume takes
    from its checkpoint reaches them too: a DataLoader built before the checkpoint is loaded
    (always so with Lightning) kept the seed its sampler was made with, and the resumed run
    trained on another order than the interrupted one."""

    def __init__(self) -> None:
        self._made: weakref.WeakSet[ResumableSampler] = weakref.WeakSet()

    def made(self, sampler: ResumableSampler) -> ResumableSampler:
        """`sampler`, remembered (weakly) for `reseed`."""
        self._made.add(sampler)
        return sampler

    def take(self, saved: int, current: int) -> int:
        """The checkpoint's data-order seed `saved`, given to every sampler made so far; a
        warning when it differs from the `current` one. Returns it."""
        if saved != current:
            log.warning("shockslurm.train: checkpoint seed %s differs from seed %s; using the "
                        "checkpoint's", saved, current)
        for sampler in self._made:
            sampler.seed = int(saved)
        return int(saved)


def batch_len(batch: Any) -> int:
    """Samples in a batch: the first dimension of its first tensor (0: not found)."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, (list, tuple)) and batch:
        return batch_len(batch[0])
    if isinstance(batch, dict) and batch:
        return batch_len(next(iter(batch.values())))
    return 0
