"""Random augmentation that resumes exactly, in DataLoader workers too: seeds per sample.

A random transform in a dataset's `__getitem__` draws from the RNGs of the process that loads
the sample: a worker's, seeded once per epoch. After a mid-epoch resume the workers start the
epoch's streams again at the first batch left, so those samples got other augmentations than
in the run without a stop. Wrapped in `SeededDataset`, each sample is loaded with the global
RNGs (torch's CPU generator, Python's `random`, NumPy's legacy `np.random`) seeded from (the
trainer's seed, the epoch, the sample's index): a sample's augmentation depends on nothing
else, so a resumed run loads exactly what the run without a stop loaded, whatever the workers
(count, persistence, which worker loads which batch). Loaded in the main process (no workers),
the RNGs are put back as they were afterwards, so training draws the same dropout masks as
without the wrapper; a worker's streams are the samples' alone.

    data = SeededDataset(dataset)
    loader = DataLoader(data, batch_size=64, sampler=st.sampler(data), num_workers=4)

The sampler (`st.sampler`, or the Lightning callback's `cb.sampler`) hands the wrapper each
sample's key (`SampleKey`: its index, the seed, the epoch) in place of the index, so the epoch
reaches persistent workers too, and a seed taken from a checkpoint on resume reaches every
sample; a batch sampler of your own over it reads the index as `key.sample`. The wrapper is
the DataLoader's own dataset: inside a `Subset` or a `ConcatDataset`, or under a sampler not
ours, it gets plain indices and refuses them with a message saying so (`st.epochs` does not
take one either). Not covered: a transform drawing from a generator of its own
(`np.random.default_rng()`, a `torch.Generator`) or from CUDA's, and loading from several
threads at once (the global RNGs are the process's: a thread pool's samples would draw from
each other's seeds).
"""

from __future__ import annotations

import hashlib
import random
import sys
from contextlib import contextmanager
from typing import Any, Iterator, NamedTuple

import torch


class SampleKey(NamedTuple):
    """What `ResumableSampler` yields for a `SeededDataset`: which sample, seeded how."""

    sample: int          # the index into the dataset
    seed: int
    epoch: int


def sample_seed(key: SampleKey) -> int:
    """The sample's own seed: a hash of (seed, epoch, index), 63 bits."""
    digest = hashlib.blake2b(f"{key.seed}:{key.epoch}:{key.sample}".encode(),
                             digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class SeededDataset(torch.utils.data.Dataset):
    """`dataset`, each sample loaded under its own seed (see the module). Its other attributes
    are the dataset's, read and set (`loader.dataset.transform = ...` reaches it)."""

    def __init__(self, dataset: Any) -> None:
        if (isinstance(dataset, torch.utils.data.IterableDataset)
                or not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__")):
            raise TypeError("shockslurm.train: SeededDataset wraps a dataset with __getitem__ "
                            f"and __len__ (a map-style dataset), not {type(dataset).__name__}")
        object.__setattr__(self, "dataset", dataset)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: SampleKey) -> Any:
        if not isinstance(key, SampleKey):
            raise TypeError("shockslurm.train: a SeededDataset takes its samples' keys from "
                            "its sampler, and was given the index "
                            f"{key!r}: make it the DataLoader's own dataset (not inside a "
                            "Subset or ConcatDataset) with sampler=st.sampler(data) "
                            "(cb.sampler(data) with Lightning); st.epochs() does not take one")
        with _seeded(sample_seed(key)):
            return self.dataset[key.sample]

    def __getattr__(self, name: str) -> Any:
        # not `dataset` (not set yet while a worker unpickles it), nor a special name: the
        # DataLoader loads through a dataset's `__getitems__` where it has one (a `Subset`
        # does), and the wrapped one's would be handed the keys, unseeded
        if name == "dataset" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.dataset, name, value)


@contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """Seed the global RNGs for one sample. In the main process (no workers) they are put back
    as they were afterwards, so training draws what it would have drawn; a worker's are the
    samples' alone, and not put back (NumPy's state takes some 60 us to read and set again, a
    sample's seeds some 7 us)."""
    numpy = sys.modules.get("numpy")             # seeded only when the dataset may use it
    saved = None
    if torch.utils.data.get_worker_info() is None:
        saved = (torch.get_rng_state(), random.getstate(),
                 None if numpy is None else numpy.random.get_state())
    torch.default_generator.manual_seed(seed)    # the CPU's alone: not CUDA's
    random.seed(seed)
    if numpy is not None:
        numpy.random.seed([seed & 0xFFFFFFFF, seed >> 32])      # all 63 bits
    try:
        yield
    finally:
        if saved is not None:
            torch.set_rng_state(saved[0])
            random.setstate(saved[1])
            if numpy is not None:
                numpy.random.set_state(saved[2])
