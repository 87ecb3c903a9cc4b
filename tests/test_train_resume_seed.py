"""A sampler made by `st.sampler()` before the resume (a DataLoader built before the first
`epoch_range()` or `batches()`, without the `with` form) follows the seed the trainer takes from
the checkpoint: the rerun continues on the interrupted run's order."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")  # CI installs torch (tests/run.sh); never skipped there

from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from shockslurm.train import ShockTrainer  # noqa: E402
from shockslurm.train.lease import Lease  # noqa: E402
from shockslurm.train.reports import Reporter  # noqa: E402


def _train(ckpt: Path, seed: int, stop_at: int | None = None) -> tuple[torch.nn.Module, int]:
    """Two epochs of 8 batches; a stop asked at step `stop_at`. (model, the trainer's seed)."""
    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
    data = TensorDataset(x, x.sum(1, keepdim=True))
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    st = ShockTrainer(model, opt, ckpt_dir=ckpt, seed=seed, every_steps=None,
                      every_seconds=None, reporter=Reporter(None), lease=Lease(stop_file=False))
    loader = DataLoader(data, batch_size=8, sampler=st.sampler(data))    # before the resume
    for _ in st.epoch_range(2):
        for _, (xb, yb) in st.batches(loader):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(xb), yb).backward()
            opt.step()
            if st.global_step + 1 == stop_at:
                st.request_stop()
            if st.step():
                st.close()
                return model, st.seed
    st.close()
    return model, st.seed


def test_a_sampler_made_before_the_resume_takes_the_checkpoints_seed(tmp_path: Path):
    """Stopped at step 5 (of 16) with seed 1, rerun with seed 2 (drawn anew each run, say): the
    trainer takes the checkpoint's seed, 1, and so does the sampler made before the resume; the
    run ends bit-identical to an uninterrupted one of seed 1. The sampler kept seed 2."""
    reference, _ = _train(tmp_path / "ref", seed=1)
    _train(tmp_path / "run", seed=1, stop_at=5)
    resumed, seed = _train(tmp_path / "run", seed=2)
    assert seed == 1
    assert torch.equal(reference.weight, resumed.weight)
    assert torch.equal(reference.bias, resumed.bias)
