"""The Lightning callback (`shockslurm.train.lightning`): a tiny model on CPU, stopped by SIGUSR1
mid-epoch, checkpoints, exits 0, resumes and ends bit-identical to an uninterrupted run; Lightning's
SLURM auto-requeue is turned off and does not take SIGUSR1."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")        # CI installs both (tests/run.sh): never skipped
pl = pytest.importorskip("lightning.pytorch")

from shockslurm.train.checkpoint import read_checkpoint  # noqa: E402
from shockslurm.train.lightning import ShockwaveCallback  # noqa: E402


class Tiny(pl.LightningModule):
    def __init__(self, stop_at: int | None = None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Dropout(0.3),
                                       torch.nn.ReLU(), torch.nn.Linear(16, 1))
        self.stop_at = stop_at

    def training_step(self, batch, batch_idx):
        x, y = batch
        if self.stop_at is not None and self.global_step == self.stop_at:
            os.kill(os.getpid(), signal.SIGUSR1)          # as Slurm / the daemon sends it
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)]


def _data():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(80, 4, generator=g)
    return torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))


def _fit(ckpt: Path, stop_at: int | None = None) -> tuple[Tiny, ShockwaveCallback]:
    cb = ShockwaveCallback(ckpt, every_steps=7, every_seconds=None, seed=3, report_interval_s=0.0)
    model = Tiny(stop_at)
    data = _data()
    loader = torch.utils.data.DataLoader(data, batch_size=8, sampler=cb.sampler(data))
    trainer = pl.Trainer(max_epochs=3, callbacks=[cb], accelerator="cpu", devices=1,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, deterministic=True)
    try:
        trainer.fit(model, loader)
    finally:
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    return model, cb


# 10 batches an epoch, 3 epochs. 13: mid-epoch 1, stopped at step 14. 9: the signal comes at
# epoch 0's last batch, which Lightning has yet to end: the stop is honoured one step later.
# 29: at the last epoch's last batch, honoured when training ends (it was dropped: no exit 0).
@pytest.mark.parametrize(("signal_at", "stopped_at"), [(13, 14), (9, 11), (29, 30)])
def test_usr1_mid_training_saves_exits_0_and_resumes_bit_identical(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, signal_at: int, stopped_at: int):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")             # Lightning thinks it runs on Slurm
    monkeypatch.setenv("SLURM_NTASKS", "1")
    monkeypatch.setenv("SLURM_JOB_NAME", "train")          # not "bash": Slurm manages it
    monkeypatch.delenv("SHOCKSLURM_SPOOL", raising=False)
    monkeypatch.setenv("SHOCKSLURM_CONFIG", str(tmp_path / "none.toml"))
    reference, _ = _fit(tmp_path / "ref")                  # 10 batches x 3 epochs
    with pytest.raises(SystemExit) as ended:
        _fit(tmp_path / "run", stop_at=signal_at)
    assert ended.value.code == 0
    saved = sorted(p.name for p in (tmp_path / "run").glob("ckpt-*.pt"))
    assert saved[-1] == f"ckpt-{stopped_at:012d}.pt", saved   # the step the stop was honoured at
    assert read_checkpoint(tmp_path / "run" / saved[-1])["global_step"] == stopped_at
    assert not list(tmp_path.rglob("hpc_ckpt_*.ckpt"))     # Lightning's requeue did not run
    resumed, cb = _fit(tmp_path / "run")
    assert cb.resumed_from is not None and not cb.should_stop
    for a, b in zip(reference.state_dict().values(), resumed.state_dict().values()):
        assert torch.equal(a, b)
    ref_w = reference.net[0].weight
    assert not torch.equal(ref_w, Tiny().net[0].weight)    # it did train


class _Sink:
    def __init__(self) -> None:
        self.items: list[dict] = []

    def send(self, record: dict) -> None:
        self.items.append(record)

    def close(self) -> None:
        pass


# 84 samples in batches of 8: 10 of 8, then one of 4. None: a whole run. 9: stopped after the
# epoch's 10th batch (step 10), the resumed run begins with the partial one.
@pytest.mark.parametrize("stop_at", [None, 9])
def test_an_epochs_partial_last_batch_is_no_batch_size_change(tmp_path: Path,
                                                              stop_at: int | None):
    """Each epoch ends with a batch of 4, which is not a change of batch size (it was reported
    as 8 -> 4 and 4 -> 8 every epoch, and epochs as done at 4). After a resume the batch size
    before the stop was not known: the partial batch was taken as it, 4, then 4 -> 8 reported."""
    from shockslurm.train.lease import Lease
    from shockslurm.train.reports import Reporter

    def fit(stop_at: int | None) -> tuple[ShockwaveCallback, _Sink]:
        sink = _Sink()
        cb = ShockwaveCallback(tmp_path / "ckpt", every_steps=None, every_seconds=None,
                               report_interval_s=0.0, reporter=Reporter(sink, job_id=1),
                               lease=Lease(stop_file=False), exit_on_stop=False)
        g = torch.Generator().manual_seed(1)
        x = torch.randn(84, 4, generator=g)
        data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))
        loader = torch.utils.data.DataLoader(data, batch_size=8, sampler=cb.sampler(data))
        trainer = pl.Trainer(max_epochs=2, callbacks=[cb], accelerator="cpu", devices=1,
                             logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False)
        try:
            trainer.fit(Tiny(stop_at), loader)
        finally:
            signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        cb.reporter.close()
        return cb, sink

    if stop_at is not None:
        assert fit(stop_at)[0].should_stop
    cb, sink = fit(None)
    assert (cb.resumed_from is not None) == (stop_at is not None)
    kinds = [r["kind"] for r in sink.items]
    assert "batch_size_change" not in kinds, [r for r in sink.items
                                              if r["kind"] == "batch_size_change"]
    done = [r for r in sink.items if r["kind"] == "epoch_done"]
    assert len(done) == 2 and all(r["batch_size"] == 8 for r in done), done
    assert all(r["batch_size"] == 8 for r in sink.items if r["kind"] == "throughput")


@pytest.mark.parametrize("bad, says", [
    ({"every_steps": 0}, "ShockwaveCallback: every_steps must be a whole number >= 1 or None"),
    ({"every_seconds": -1.0}, "ShockwaveCallback: every_seconds must be a finite number"),
    ({"keep": 0}, "ShockwaveCallback: keep must be a whole number >= 1"),
    ({"report_interval_s": float("nan")}, "ShockwaveCallback: report_interval_s must be"),
])
def test_a_bad_argument_is_refused_when_the_callback_is_made(tmp_path: Path, bad, says):
    """Before: `every_steps=0` raised ZeroDivisionError at the first training step."""
    with pytest.raises(ValueError) as err:
        ShockwaveCallback(tmp_path / "ckpt", **bad)
    assert str(err.value).startswith(says)


def test_a_strategy_that_shards_the_states_is_refused():
    """FSDP, model parallelism (and DeepSpeed) load the weights in their own `load_checkpoint`,
    which the callback's resume does not go through: it resumed from untrained weights (and under
    FSDP's sharded state dicts wrote rank 0's shards only), in silence. Refused when `fit`
    sets the callback up; DDP is not."""
    from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy, ModelParallelStrategy

    from shockslurm.train.lightning import refuse_sharding_strategy

    for strategy in (FSDPStrategy(), FSDPStrategy(state_dict_type="sharded"),
                     ModelParallelStrategy()):
        with pytest.raises(ValueError, match=f"{type(strategy).__name__} shards the model"):
            refuse_sharding_strategy(strategy)
    refuse_sharding_strategy(DDPStrategy())
