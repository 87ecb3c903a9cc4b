"""Your own DataLoader (workers included) under `st.epoch_range` / `st.batches`: stopped anywhere
and resumed, it trains on the same samples in the same order and ends bit-identical; the sampler
shards by rank and skips without loading."""

from __future__ import annotations

import logging
import random
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")  # CI installs torch (tests/run.sh); never skipped there

from torch.utils.data import DataLoader, Dataset  # noqa: E402

from shockslurm.train import ResumableSampler, SeededDataset, ShockTrainer  # noqa: E402
from shockslurm.train.lease import Lease  # noqa: E402
from shockslurm.train.reports import Reporter  # noqa: E402

SCHEDULE = {0: 8, 2: 16}      # the user's own: one DataLoader per batch size


class Indexed(Dataset):
    """Samples that say which they are, and how often they were loaded; with `augment`, each
    sample is perturbed by noise drawn from torch's RNG as it is loaded (an augmentation)."""

    def __init__(self, n: int = 96, augment: bool = False) -> None:
        gen = torch.Generator().manual_seed(3)
        self.x, self.y = torch.randn(n, 4, generator=gen), torch.randint(0, 2, (n,), generator=gen)
        self.loads, self.augment = 0, augment

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        self.loads += 1
        x = self.x[i] + 0.1 * torch.randn(4) if self.augment else self.x[i]
        return x, self.y[i], i


def _train(ckpt: Path, stop_at: int | None, *, workers: int = 0, epochs: int = 4,
           own_sampler: bool = True, augment: bool = False, seeded: bool = False,
           persistent: bool = False):
    torch.manual_seed(0)
    random.seed(0)
    data: Dataset = Indexed(augment=augment)
    if seeded:
        data = SeededDataset(data)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.2),
                                torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    seen: list[int] = []
    with ShockTrainer(model, opt, ckpt_dir=ckpt, every_steps=5, seed=11,
                      reporter=Reporter(None), lease=Lease(stop_file=False)) as st:
        sampler = st.sampler(data) if own_sampler else None
        loaders = {bs: DataLoader(data, batch_size=bs, sampler=sampler, num_workers=workers,
                                  pin_memory=False, persistent_workers=persistent)
                   for bs in set(SCHEDULE.values())}
        for epoch in st.epoch_range(epochs):
            size = SCHEDULE[max(k for k in SCHEDULE if k <= epoch)]
            for _, (xb, yb, idx) in st.batches(loaders[size]):
                seen.extend(idx.tolist())
                xb = xb + 0.1 * torch.randn_like(xb) if random.random() < 0.5 else xb
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(xb), yb).backward()
                opt.step()
                if stop_at is not None and st.global_step + 1 == stop_at:
                    st.request_stop("test")
                if st.step():
                    break
            if st.should_stop:
                break
    return model.state_dict(), st, seen, data.loads


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_stopped_anywhere_resumes_exactly(tmp_path):
    # 96 samples: epochs of 12, 12, 6, 6 steps (batch sizes 8, 8, 16, 16)
    ref, ref_st, ref_seen, _ = _train(tmp_path / "ref", None)
    assert ref_st.global_step == 36 and len(ref_seen) == 4 * 96
    assert [(c["step"], c["old"], c["new"]) for c in ref_st.batch_size_changes] == [(24, 8, 16)]
    for stop_at in (3, 12, 13, 24, 25, 30):
        ckpt = tmp_path / f"ck-{stop_at}"
        _, st, seen, _ = _train(ckpt, stop_at)
        assert st.should_stop and st.global_step == stop_at
        final, st2, seen2, loads = _train(ckpt, None)
        assert st2.resumed_from is not None and st2.global_step == 36
        _same(ref, final)
        assert seen + seen2 == ref_seen, stop_at            # the same samples, same order
        assert loads == len(seen2)                          # nothing loaded only to be skipped


def test_workers_resume_exactly(tmp_path):
    ref, _, ref_seen, _ = _train(tmp_path / "ref", None, workers=2, epochs=2)
    _, _, seen, _ = _train(tmp_path / "ck", 17, workers=2, epochs=2)
    final, st, seen2, _ = _train(tmp_path / "ck", None, workers=2, epochs=2)
    _same(ref, final)
    assert seen + seen2 == ref_seen and st.global_step == 24


def test_a_loader_without_our_sampler_is_resumed_by_skipping(tmp_path, caplog):
    ref, _, ref_seen, _ = _train(tmp_path / "ref", None, own_sampler=False, epochs=2)
    _, _, seen, _ = _train(tmp_path / "ck", 7, own_sampler=False, epochs=2)
    with caplog.at_level(logging.WARNING, logger="shockslurm.train"):
        final, _, seen2, loads = _train(tmp_path / "ck", None, own_sampler=False, epochs=2)
    _same(ref, final)
    assert seen + seen2 == ref_seen
    assert loads == len(seen2) + 7 * 8                      # the first 7 batches loaded again
    assert any("loading and dropping 7 batches" in r.getMessage() for r in caplog.records)


def test_batches_loaded_and_dropped_leave_the_rng_as_the_stop_left_it(tmp_path):
    """Resumed by loading and dropping, the dropped batches' augmentation drew from the RNG
    the checkpoint had just restored, so the rest of the epoch trained on other noise and
    dropout masks than the run without a stop (weights differed); now the restored states
    go back before the first batch trained on is loaded."""
    ref, _, ref_seen, _ = _train(tmp_path / "ref", None, own_sampler=False, epochs=2,
                                 augment=True)
    _, _, seen, _ = _train(tmp_path / "ck", 7, own_sampler=False, epochs=2, augment=True)
    final, _, seen2, _ = _train(tmp_path / "ck", None, own_sampler=False, epochs=2, augment=True)
    assert seen + seen2 == ref_seen
    _same(ref, final)


@pytest.mark.parametrize("persistent", [False, True], ids=["workers", "persistent workers"])
def test_an_augmentation_in_workers_resumes_exactly_with_seeded_samples(tmp_path, persistent):
    """Noise drawn in 2 workers as each sample loads: with `SeededDataset` a run stopped mid-
    epoch and resumed ends bit-identical to the run without a stop. Without it the resumed
    workers drew the rest of the epoch's noise from the epoch's start again (weights differ)."""
    kw = dict(workers=2, epochs=2, augment=True, persistent=persistent)
    ref, _, ref_seen, _ = _train(tmp_path / "ref", None, seeded=True, **kw)
    for stop_at in (7, 17):
        _, _, seen, _ = _train(tmp_path / f"ck{stop_at}", stop_at, seeded=True, **kw)
        final, st, seen2, _ = _train(tmp_path / f"ck{stop_at}", None, seeded=True, **kw)
        assert seen + seen2 == ref_seen and st.global_step == 24
        _same(ref, final)
    plain, _, _, _ = _train(tmp_path / "plain-ref", None, **kw)
    _train(tmp_path / "plain", 7, **kw)
    resumed, _, _, _ = _train(tmp_path / "plain", None, **kw)
    assert not all(torch.equal(plain[k], resumed[k]) for k in plain)


def test_seeded_samples_differ_by_epoch_and_leave_the_rng_alone():
    """A sample's noise is its own per epoch (another epoch, other noise; the same on every
    load), and loading it leaves the main process's RNGs as they were."""
    data = SeededDataset(Indexed(augment=True))
    sampler = ResumableSampler(data, seed=5)
    keys = list(sampler)
    torch.manual_seed(1)
    random.seed(1)
    before = (torch.get_rng_state(), random.getstate())
    first = [data[k][0] for k in keys[:4]]
    assert torch.equal(before[0], torch.get_rng_state()) and before[1] == random.getstate()
    assert all(torch.equal(a, data[k][0]) for a, k in zip(first, keys[:4]))
    sampler.set_epoch(1)
    other = {k.sample: data[k][0] for k in sampler}
    assert all(not torch.equal(a, other[k.sample]) for a, k in zip(first, keys[:4]))
    assert len(data) == 96 and data.augment is True          # the dataset's own attributes


def test_a_seeded_subset_loads_through_the_seeds():
    """A `Subset` has `__getitems__`, which the DataLoader calls where a dataset has one: it was
    passed on from the wrapped dataset, and got the keys, not the indices."""
    data = SeededDataset(torch.utils.data.Subset(Indexed(augment=True), range(8, 40)))
    loader = DataLoader(data, batch_size=8, sampler=ResumableSampler(data, seed=5))
    (x, _, idx), *_ = list(loader)
    assert len(idx) == 8 and all(8 <= i < 40 for i in idx.tolist())
    assert torch.equal(x, torch.stack([data[k][0] for k in list(loader.sampler)[:8]]))


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_seeded_samples_are_the_same_in_workers_of_any_start_method(context):
    """The wrapper pickles into spawned workers (its attribute lookup passed on to the dataset
    must not recurse while it is rebuilt there), and 2 workers load what the main process
    loads."""
    data = SeededDataset(Indexed(augment=True))

    def batches(workers: int, **kw) -> list:
        loader = DataLoader(data, batch_size=8, sampler=ResumableSampler(data, seed=5),
                            num_workers=workers, **kw)
        return [x for x, _, _ in loader]
    alone = batches(0)
    in_workers = batches(2, multiprocessing_context=context)
    assert len(alone) == 12 and all(torch.equal(a, b) for a, b in zip(alone, in_workers))


def test_a_seeded_dataset_without_our_sampler_is_refused_clearly():
    wrapped = SeededDataset(Indexed())
    for loader in (DataLoader(wrapped, batch_size=4),
                   DataLoader(torch.utils.data.Subset(wrapped, range(8)), batch_size=4,
                              sampler=ResumableSampler(8, seed=1))):
        with pytest.raises(TypeError, match=r"own dataset \(not inside a Subset"):
            next(iter(loader))
    with pytest.raises(TypeError, match="map-style"):
        SeededDataset(iter(range(3)))

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(3))

        def __len__(self) -> int:
            return 3
    with pytest.raises(TypeError, match="map-style"):
        SeededDataset(Stream())


def test_a_seeded_datasets_attributes_are_set_on_the_dataset():
    """`loader.dataset.augment = False` (a transform changed between epochs) reaches the
    dataset; it was set on the wrapper, which then said one thing while loading another."""
    inner = Indexed(augment=True)
    data = SeededDataset(inner)
    data.augment = False
    assert inner.augment is False and data.augment is False
    key = next(iter(ResumableSampler(data, seed=5)))
    assert torch.equal(data[key][0], inner.x[key.sample])


def test_the_sampler_draws_a_dataset_that_grows_whole():
    """A dataset that grows between epochs (curriculum or active learning adding samples) was
    drawn at the length it had when the sampler was made: 100 of 150, then of 200 samples; a
    resumed process, made later, drew another order than the run without a stop."""
    class Growing(Dataset):
        def __init__(self) -> None:
            self.n = 100

        def __len__(self) -> int:
            return self.n

        def __getitem__(self, i: int) -> int:
            return i

    data = Growing()
    sampler = ResumableSampler(data, seed=1)
    drawn = []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        order = list(sampler)
        drawn.append((len(sampler), sorted(order) == list(range(data.n))))
        data.n += 50
    assert drawn == [(100, True), (150, True), (200, True)]
    late = ResumableSampler(data, seed=1)           # a resumed process's, made at 250
    late.set_epoch(2)
    data.n = 200
    sampler.set_epoch(2)
    assert list(late) == list(sampler)


class Buckets(torch.utils.data.Sampler[list[int]]):
    """A batch sampler of batches of their own sizes (3, 5 and 8 samples, as bucketing by
    length makes), in an order of the epoch's (`set_epoch`); it has no `batch_size`."""

    def __init__(self, n: int) -> None:
        self.n, self.epoch = n, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _batches(self) -> list[list[int]]:
        order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.epoch))
        out, at, sizes = [], 0, (3, 5, 8)
        while at < self.n:
            size = sizes[len(out) % 3]
            out.append(order[at:at + size].tolist())
            at += size
        return out

    def __iter__(self):
        return iter(self._batches())

    def __len__(self) -> int:
        return len(self._batches())


def test_a_batch_sampler_of_its_own_sizes_is_trained_and_resumed(tmp_path):
    """`DataLoader(batch_sampler=...)` (bucketing by length, common for text and speech) was
    refused: "batches() needs a DataLoader with a batch_size". Now each batch's samples are
    counted as they come, and a resume loads and drops the batches trained on, exactly."""
    def run(ckpt: Path, stop_at: int | None = None) -> tuple[dict, list[int], ShockTrainer]:
        torch.manual_seed(0)
        data = Indexed(48)
        loader = DataLoader(data, batch_sampler=Buckets(48))
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.2),
                                    torch.nn.Linear(8, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        seen: list[int] = []
        with ShockTrainer(model, opt, ckpt_dir=ckpt, every_seconds=None, reporter=Reporter(None),
                          lease=Lease(stop_file=False)) as st:
            for _ in st.epoch_range(2):
                for _, (xb, yb, idx) in st.batches(loader):
                    seen += idx.tolist()
                    opt.zero_grad()
                    torch.nn.functional.cross_entropy(model(xb), yb).backward()
                    opt.step()
                    if st.global_step + 1 == stop_at:
                        st.request_stop("test")
                    if st.step():
                        return model.state_dict(), seen, st
        return model.state_dict(), seen, st

    ref, ref_seen, ref_st = run(tmp_path / "ref")
    assert ref_st.global_step == 2 * 9 and sorted(ref_seen) == sorted(2 * list(range(48)))
    _, first, _ = run(tmp_path / "ck", stop_at=4)
    final, rest, _ = run(tmp_path / "ck")
    assert first + rest == ref_seen and len(first) == 3 + 5 + 8 + 3
    _same(ref, final)


def test_sampler_shards_and_starts_mid_epoch():
    shards = [ResumableSampler(10, seed=1, num_replicas=3, rank=r) for r in range(3)]
    for s in shards:
        s.set_epoch(2)
    got = [list(s) for s in shards]
    assert all(len(g) == 4 for g in got)                    # padded: 12 = 3 x 4
    assert set().union(*got) == set(range(10))
    order = ResumableSampler(10, seed=1)
    order.set_epoch(2)
    assert [i for k in range(4) for i in (got[0][k], got[1][k], got[2][k])] == \
        (list(order) + list(order)[:2])
    shards[1].start_at(3)
    assert len(shards[1]) == 1 and list(shards[1]) == got[1][3:]
    assert list(shards[1]) == got[1]                        # the next epoch starts at 0 again
    with pytest.raises(ValueError, match="rank 3 of 3"):
        ResumableSampler(10, num_replicas=3, rank=3)


def test_batches_refuses_another_batch_size_mid_epoch(tmp_path):
    _train(tmp_path / "ck", 5)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.2),
                                torch.nn.Linear(8, 2))
    st = ShockTrainer(model, None, ckpt_dir=tmp_path / "ck", seed=11, reporter=Reporter(None),
                      lease=Lease(stop_file=False))
    loader = DataLoader(Indexed(), batch_size=16, sampler=st.sampler(96))
    with pytest.raises(ValueError, match="5 batches of 8 into epoch 0"):
        for _ in st.epoch_range(4):
            next(st.batches(loader))
    st.close()


class Drawn(torch.utils.data.Sampler[int]):
    """A sampler of the user's own that draws its order from `generator` (None: the global
    RNG), as torch's random samplers do."""

    def __init__(self, n: int) -> None:
        self.n, self.generator = n, None

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        return iter(torch.randperm(self.n, generator=self.generator).tolist())


LOADERS = {
    "shuffle=True": lambda data: DataLoader(data, batch_size=4, shuffle=True),
    "SubsetRandomSampler": lambda data: DataLoader(
        data, batch_size=4, sampler=torch.utils.data.SubsetRandomSampler(range(32))),
    "WeightedRandomSampler": lambda data: DataLoader(
        data, batch_size=4,
        sampler=torch.utils.data.WeightedRandomSampler(torch.ones(32), 32, replacement=False)),
    "own sampler, generator None": lambda data: DataLoader(data, batch_size=4,
                                                           sampler=Drawn(32)),
}


@pytest.mark.parametrize("stop_at", [3, 11])        # in the first epoch, in the second
@pytest.mark.parametrize("kind", sorted(LOADERS))
def test_a_shuffling_loader_resumes_on_the_same_order(tmp_path, kind: str, stop_at: int):
    """`DataLoader(shuffle=True)` without our sampler: its order came from the global RNG when
    the epoch began, which a resume restores to the stop's state: the resumed epoch dropped the
    wrong batches (25 distinct samples of 32). Now from (seed, epoch), and exact; so too for
    SubsetRandomSampler, WeightedRandomSampler and any sampler whose `generator` is None, which
    still drew from the global RNG (23 and 25 distinct samples of 32)."""
    data = torch.utils.data.TensorDataset(torch.arange(32))

    def run(ckpt: Path, stop_at: int | None = None) -> list[int]:
        torch.manual_seed(0)
        loader = LOADERS[kind](data)
        seen: list[int] = []
        with ShockTrainer(torch.nn.Linear(1, 1), None, ckpt_dir=ckpt, every_seconds=None,
                          lease=Lease(stop_file=False), reporter=Reporter(None)) as st:
            for _ in st.epoch_range(2):
                for _k, (idx,) in st.batches(loader):
                    seen += idx.tolist()
                    if st.global_step + 1 == stop_at:
                        st.request_stop("test")
                    if st.step():
                        return seen
        return seen

    ref = run(tmp_path / "ref")
    assert sorted(ref[:32]) == sorted(ref[32:]) == list(range(32)) and ref[:32] != ref[32:]
    first = run(tmp_path / "ck", stop_at=stop_at)
    assert len(first) == 4 * stop_at and first + run(tmp_path / "ck") == ref


def test_epochs_says_that_every_rank_gets_the_same_batches(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    x = torch.arange(8.0).reshape(8, 1)
    with ShockTrainer(torch.nn.Linear(1, 1), None, ckpt_dir=tmp_path, every_seconds=None,
                      lease=Lease(stop_file=False), reporter=Reporter(None)) as st:
        with caplog.at_level(logging.WARNING, logger="shockslurm.train"):
            for _epoch, _size, batches in st.epochs((x,), [4], num_epochs=1):
                for _ in batches:
                    st.step()
    assert "epochs() gives every one of the 2 ranks the same batches" in caplog.text


def test_a_sampler_made_before_the_ranks_are_known_shards_as_they_run(monkeypatch):
    """`st.sampler()` (num_replicas / rank None) takes the world size and rank when an epoch is
    drawn: a DataLoader built before Lightning starts the ranks (it sets WORLD_SIZE and starts
    rank 1 only in `fit`) was unsharded on rank 0 and rank 0 of 2 on rank 1."""
    from shockslurm.train.data import ResumableSampler

    for name in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)
    early = ResumableSampler(10, seed=1, num_replicas=None, rank=None)
    assert len(early) == 10
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert len(early) == 5 and early.num_replicas == 2 and early.rank == 1
    assert list(early) == ResumableSampler(10, seed=1, num_replicas=2, rank=1).indices()
