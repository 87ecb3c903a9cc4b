"""Several optimizers and schedulers (a GAN's generator and discriminator, each with its own
Adam and LR schedule) under ShockTrainer: given as a dict or a list, each is saved and restored
as its own, and a run stopped mid-epoch resumes bit-identical; a checkpoint with another number
of them is refused, naming both."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")  # CI installs torch (tests/run.sh); never skipped there

from shockslurm.train import CheckpointMismatch, ShockTrainer  # noqa: E402
from shockslurm.train.lease import Lease  # noqa: E402
from shockslurm.train.reports import Reporter  # noqa: E402


def _gan(ckpt: Path, stop_at: int | None = None, steps: int = 12, seed: int = 0):
    """A generator and a discriminator trained in turns (2 epochs of 6 steps); `stop_at`: the
    step whose end asks for a stop."""
    torch.manual_seed(seed)
    nets = torch.nn.ModuleDict({"g": torch.nn.Linear(3, 4), "d": torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 1))})
    opts = {"g": torch.optim.Adam(nets["g"].parameters(), lr=0.01),
            "d": torch.optim.Adam(nets["d"].parameters(), lr=0.02)}
    scheds = [torch.optim.lr_scheduler.StepLR(opts["g"], step_size=4, gamma=0.5),
              torch.optim.lr_scheduler.ExponentialLR(opts["d"], gamma=0.9)]
    real = torch.randn(48, 4, generator=torch.Generator().manual_seed(3))
    torch.manual_seed(1)
    with ShockTrainer(nets, opts, scheduler=scheds, ckpt_dir=ckpt, every_seconds=None,
                      reporter=Reporter(None), lease=Lease(stop_file=False)) as st:
        for _, _, batches in st.epochs((real,), 8, 2):
            for _, (batch,) in batches:
                fake = nets["g"](torch.randn(8, 3))
                opts["d"].zero_grad()
                loss_d = (nets["d"](fake.detach()).mean() - nets["d"](batch).mean())
                loss_d.backward()
                opts["d"].step()
                opts["g"].zero_grad()
                (-nets["d"](fake).mean()).backward()
                opts["g"].step()
                for sched in scheds:
                    sched.step()
                if st.global_step + 1 == stop_at:
                    st.request_stop("test")
                if st.step():
                    break
    return nets, opts, st


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_gan_with_two_optimizers_and_two_schedulers_resumes_bit_identical(tmp_path: Path):
    """Before, `optimizer` took one optimizer and `scheduler` one scheduler: a dict or a list
    of them failed at the first save (no `state_dict`)."""
    nets, opts, _ = _gan(tmp_path / "ref")
    _, _, stopped = _gan(tmp_path / "run", stop_at=9)
    assert stopped.should_stop and stopped.global_step == 9
    again, again_opts, resumed = _gan(tmp_path / "run", seed=5)    # other weights until resumed
    assert resumed.resumed_from is not None and resumed.global_step == 12
    assert _same(nets.state_dict(), again.state_dict())
    for name in ("g", "d"):
        want, got = opts[name].state_dict(), again_opts[name].state_dict()
        assert want["param_groups"] == got["param_groups"]         # the schedules' LRs too
        assert all(_same(want["state"][i], got["state"][i]) for i in want["state"])


def test_a_checkpoint_with_other_optimizers_is_refused_naming_both(tmp_path: Path):
    _gan(tmp_path / "run", stop_at=3)
    model = torch.nn.ModuleDict({"g": torch.nn.Linear(3, 4), "d": torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 1))})
    only_g = {"g": torch.optim.Adam(model["g"].parameters())}
    st = ShockTrainer(model, only_g, ckpt_dir=tmp_path / "run", every_seconds=None,
                      reporter=Reporter(None), lease=Lease(stop_file=False))
    with pytest.raises(CheckpointMismatch, match="holds a dict of 'd', 'g' optimizer states, "
                                                 "this run has a dict of 'g'"):
        st.resume()
    st.close()
