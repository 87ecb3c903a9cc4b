"""The training helper when things go wrong: a checkpoint that cannot be written (refused up
front, or failing mid-run with the disk full, also at a stop), a file in the checkpoint
directory that is not the helper's, a checkpoint of another model, bad arguments and batch-size
schedules, bad report settings, sharded checkpoints' extras and a garbage manifest, and the
helper's benchmarks' arguments. Each gets an error naming the place, never a traceback from deep
inside torch, and the newest good checkpoint survives."""

from __future__ import annotations

import logging
import math
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")  # CI installs torch (tests/run.sh); never skipped there

from shockslurm.train import CheckpointManager, ShardedCheckpointManager, ShockTrainer  # noqa
from shockslurm.train import reports  # noqa: E402
from shockslurm.train.checkpoint import CheckpointMismatch, sidecar_text  # noqa: E402
from shockslurm.train.epochs import batch_size_for  # noqa: E402
from shockslurm.train.reports import Reporter, SpoolSink  # noqa: E402

from .train_job import job_env  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def _trainer(ckpt: Path, **kw) -> ShockTrainer:
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    kw.setdefault("every_seconds", None)
    return ShockTrainer(model, opt, ckpt_dir=ckpt, reporter=Reporter(None), **kw)


# A job whose checkpoints hit the file size limit (EFBIG, as a full disk gives ENOSPC) after
# its first one, then is asked to stop: the limit is real (setrlimit), so this runs as root too.
FULL_DISK_JOB = r"""
import logging, resource, signal, sys
import torch
from shockslurm.train import ShockTrainer
from shockslurm.train.reports import Reporter
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
model = torch.nn.Linear(64, 64)
st = ShockTrainer(model, torch.optim.SGD(model.parameters(), lr=0.1), ckpt_dir=sys.argv[1],
                  every_steps=1, every_seconds=None, reporter=Reporter(None))
st.step()                                            # checkpoint of step 1: written
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)        # a write past the limit fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
st.step()                                            # step 2: its checkpoint fails
st.request_stop("test")
if st.step():                                        # step 3: the stop, its checkpoint fails
    st.save_and_exit()
print("not reached")
"""


def test_checkpoints_failing_mid_run_and_at_the_stop_are_said_and_the_good_one_stays(
        tmp_path: Path):
    ckpt = tmp_path / "ckpt"
    res = subprocess.run([sys.executable, "-c", FULL_DISK_JOB, str(ckpt)], capture_output=True,
                         text=True, timeout=120, env=job_env(), cwd=REPO)
    assert res.returncode == 0, res.stderr[-3000:]           # Slurm requeues the job
    assert "Traceback" not in res.stderr and "not reached" not in res.stdout
    assert "checkpoint at step 2 failed: [Errno 27] File too large; a rerun resumes from " \
        "step 1, the newest good checkpoint" in res.stderr
    assert "stopping at step 3 (test); its checkpoint FAILED: a rerun resumes from step 1" \
        in res.stderr
    assert "checkpoint written" not in res.stderr
    found = CheckpointManager(ckpt).load_latest()
    assert found is not None and found[1]["step"] == 1
    assert sorted(p.name for p in ckpt.iterdir()) == ["ckpt-000000000001.pt",
                                                       "ckpt-000000000001.pt.sha256"]


def test_a_checkpoint_directory_that_cannot_be_written_is_refused_before_training(
        tmp_path: Path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(OSError, match=f"checkpoint directory {blocker / 'ckpt'} is not writable"):
        _trainer(blocker / "ckpt")


def test_a_stop_whose_checkpoint_fails_says_so(tmp_path: Path, caplog):
    ckpt = tmp_path / "ckpt"
    st = _trainer(ckpt)
    ckpt.rmdir()
    ckpt.write_text("the directory is gone, a file is in its way")
    st.request_stop("test")
    with caplog.at_level(logging.WARNING, logger="shockslurm.train"):
        assert st.step() is True
    said = [r.getMessage() for r in caplog.records]
    assert any("checkpoint at step 1 failed" in m and "a rerun starts from scratch" in m
               for m in said), said
    assert any("its checkpoint FAILED: no good checkpoint yet" in m for m in said), said
    assert not any("checkpoint written" in m for m in said)
    with pytest.raises(SystemExit) as exit_:
        st.save_and_exit()
    assert exit_.value.code == 0


def test_a_file_that_is_not_the_helpers_is_skipped_for_the_older_checkpoint(
        tmp_path: Path, caplog):
    st = _trainer(tmp_path, every_steps=1)
    for _ in range(3):
        st.step()
    foreign = tmp_path / "ckpt-000000000099.pt"
    torch.save({"a": torch.zeros(1)}, foreign)
    foreign.with_name(foreign.name + ".sha256").write_text(
        sidecar_text(foreign.read_bytes(), foreign.name))
    again = _trainer(tmp_path)
    with caplog.at_level(logging.WARNING, logger="shockslurm.train"):
        assert again.resume() is True
    assert again.global_step == 3 and again.resumed_from == tmp_path / "ckpt-000000000003.pt"
    assert any(str(foreign) in r.getMessage() and "unknown checkpoint format None" in
               r.getMessage() for r in caplog.records)


def test_a_checkpoint_of_another_model_is_named(tmp_path: Path):
    st = _trainer(tmp_path, every_steps=1)
    st.step()
    other = torch.nn.Linear(8, 8)
    wrong = ShockTrainer(other, torch.optim.SGD(other.parameters(), lr=0.1), ckpt_dir=tmp_path,
                         reporter=Reporter(None))
    with pytest.raises(CheckpointMismatch, match="ckpt-000000000001.pt: the checkpoint.s model "
                       "state does not fit this run.s model"):
        wrong.resume()


def test_several_models_are_refused_naming_the_module_dict(tmp_path: Path):
    """A list or dict of models (a GAN's two, as `optimizer=` takes) failed deep inside the
    trainer (AttributeError: 'list' object has no attribute 'parameters'); now a TypeError
    saying to put them in one ModuleDict, which checkpoints and resumes both."""
    g, d = torch.nn.Linear(2, 2), torch.nn.Linear(2, 1)
    for models in ([g, d], {"g": g, "d": d}):
        with pytest.raises(TypeError, match=r"ShockTrainer: model must be a torch.nn.Module, "
                           r"got (list|dict) \(several models: put them in one "
                           r"torch.nn.ModuleDict"):
            ShockTrainer(models, None, ckpt_dir=tmp_path, reporter=Reporter(None))
    both = torch.nn.ModuleDict({"g": g, "d": d})
    ShockTrainer(both, {"g": torch.optim.SGD(g.parameters(), lr=0.1),
                        "d": torch.optim.SGD(d.parameters(), lr=0.1)},
                 ckpt_dir=tmp_path, reporter=Reporter(None)).close()


@pytest.mark.parametrize("later", ["SGD", "AdamW"])
def test_a_checkpoint_of_another_optimizer_class_is_named(tmp_path: Path, later: str):
    """Adam's state loaded into an SGD with momentum (which then failed inside torch at its
    first step: KeyError 'momentum'), and into an AdamW in silence (Adam's settings, no
    decoupled weight decay); now a CheckpointMismatch naming both classes."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    with ShockTrainer(model, torch.optim.Adam(model.parameters()), ckpt_dir=tmp_path,
                      every_steps=1, every_seconds=None, reporter=Reporter(None)) as st:
        model(torch.ones(1, 4)).sum().backward()
        st.optimizer.step()
        st.step()
    fresh = torch.nn.Linear(4, 4)
    opt = (torch.optim.SGD(fresh.parameters(), lr=0.1, momentum=0.9) if later == "SGD"
           else torch.optim.AdamW(fresh.parameters(), weight_decay=0.1))
    again = ShockTrainer(fresh, opt, ckpt_dir=tmp_path, reporter=Reporter(None))
    with pytest.raises(CheckpointMismatch, match=f"ckpt-000000000001.pt: the checkpoint's "
                       f"optimizer is Adam, this run's is {later}"):
        again.resume()
    same = ShockTrainer(fresh, torch.optim.Adam(fresh.parameters()), ckpt_dir=tmp_path,
                        reporter=Reporter(None))
    assert same.resume() is True and same.global_step == 1


@pytest.mark.parametrize("name, value", [
    ("every_steps", 0), ("every_steps", -2), ("every_steps", 2.5), ("every_steps", True),
    ("keep", 0), ("keep", math.nan), ("check_every", 0), ("check_every", math.nan),
    ("seed", math.nan), ("seed", "1"), ("every_seconds", -1.0), ("every_seconds", math.inf),
    ("report_interval_s", math.nan)])
def test_bad_arguments_are_refused_by_name(tmp_path: Path, name: str, value: object):
    with pytest.raises(ValueError, match=f"ShockTrainer: {name} must be"):
        _trainer(tmp_path, **{name: value})


def test_extras_that_no_checkpoint_could_hold_are_refused_at_once(tmp_path: Path):
    with pytest.raises(ValueError, match="extras must be picklable"):
        _trainer(tmp_path, extras={"f": lambda: 1})


def test_extras_are_the_callers_dict_before_and_after_a_resume(tmp_path: Path):
    """What the caller changes in the dict it passed is saved, and a reference to `st.extras`
    taken before the resume stays the one saved (both were copies, silently not saved)."""
    from shockslurm.train import load_checkpoint

    extras = {"best": 0.0}
    st = _trainer(tmp_path, extras=extras, every_steps=1)
    with st:
        extras["best"] = 0.9
        st.step()
    assert load_checkpoint(tmp_path)["extras"] == {"best": 0.9}
    again = _trainer(tmp_path, extras={"best": 0.0}, every_steps=1)
    mine = again.extras
    again.resume()
    assert mine is again.extras and mine == {"best": 0.9}
    mine["best"] = 0.95
    again.step()
    again.close()
    assert load_checkpoint(tmp_path)["extras"] == {"best": 0.95}
    with pytest.raises(ValueError, match="extras must be a dict"):
        _trainer(tmp_path, extras=[1, 2])


def _ema_run(ckpt: Path, stop_at: int | None, steps: int = 12) -> dict[str, torch.Tensor]:
    """One life of a job that keeps an EMA of its model in `extras` (its `state_dict()`, whose
    tensors are the EMA's own), as EMA code does; stops after step `stop_at`; the EMA's state."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    ema = torch.nn.Linear(4, 2).requires_grad_(False)
    ema.load_state_dict(model.state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    st = ShockTrainer(model, opt, ckpt_dir=ckpt, reporter=Reporter(None), every_seconds=None,
                      extras={"ema": ema.state_dict(), "seen": [torch.zeros(1)]})
    with st:
        if st.resumed_from:
            ema.load_state_dict(st.extras["ema"])
        x = torch.arange(8.0).reshape(2, 4)
        while st.global_step < steps:
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
            with torch.no_grad():
                for e, p in zip(ema.parameters(), model.parameters()):
                    e.mul_(0.5).add_(p, alpha=0.5)
                st.extras["seen"][0] += 1
            if st.global_step + 1 == stop_at:
                st.request_stop()
            if st.step():
                break
    return {**{k: v.clone() for k, v in ema.state_dict().items()},
            "seen": st.extras["seen"][0].clone()}


def test_tensors_in_extras_stay_the_runs_own_through_several_resumes(tmp_path: Path):
    """A resume put the loaded tensors into `extras` in place of the run's: an EMA kept there
    (`ema.state_dict()`) was saved as it was at the first resume by every later checkpoint, so
    after a second stop and resume it had lost the updates in between. Now the loaded values
    are copied into the run's own tensors: two stops end as the run without any."""
    whole = _ema_run(tmp_path / "whole", None)
    for stop_at in (3, 7, None):
        stopped = _ema_run(tmp_path / "stopped", stop_at)
    assert stopped.keys() == whole.keys()
    for key in whole:
        assert torch.equal(stopped[key], whole[key]), key
    assert stopped["seen"].item() == 12


@pytest.mark.parametrize("schedule", [math.nan, 4.5, True, "32", None])
def test_bad_batch_size_schedules_are_refused(schedule: object):
    with pytest.raises(ValueError, match="batch-size schedule must be|batch size for epoch"):
        batch_size_for(schedule, 0)  # type: ignore[arg-type]


def test_numpy_batch_sizes_are_whole_numbers():
    np = pytest.importorskip("numpy")
    assert batch_size_for(np.int64(4), 0) == 4
    assert batch_size_for([np.int32(8), np.int64(16)], 5) == 16
    with pytest.raises(ValueError, match="got True"):
        batch_size_for([True], 0)


@pytest.mark.parametrize("variable, value, said", [
    ("SHOCKSLURM_REPORT_SECRET", "ed25519:short", "the report secret"),
    ("SHOCKSLURM_JOB_PK", "abc", "$SHOCKSLURM_JOB_PK is not a whole number: 'abc'")])
def test_bad_report_settings_turn_reports_off_and_training_goes_on(
        tmp_path: Path, monkeypatch, caplog, variable: str, value: str, said: str):
    monkeypatch.setattr(reports, "_said", set())
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv(variable, value)
    with caplog.at_level(logging.WARNING, logger="shockslurm.train"):
        rep = Reporter(SpoolSink(str(tmp_path / "spool"), create=True))
    assert rep.sink is None
    assert rep.throughput(10.0, 4) is False                 # nothing queued, nothing raised
    rep.close()
    assert any("progress reports are off" in r.getMessage() and said in r.getMessage()
               for r in caplog.records)


SINGLE_PROCESS_DCP = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


@SINGLE_PROCESS_DCP
def test_sharded_checkpoints_keep_their_extras(tmp_path: Path):
    model = torch.nn.Linear(5, 2)
    ShardedCheckpointManager(tmp_path).save(model, None, 10, extras={"best": 0.9, "epoch": 4})
    again = ShardedCheckpointManager(tmp_path)
    found = again.load_latest(torch.nn.Linear(5, 2))
    assert found is not None and found[1] == 10
    assert again.extras == {"best": 0.9, "epoch": 4}


@SINGLE_PROCESS_DCP
def test_sharded_checkpoints_of_later_steps_are_set_aside_not_rotated_in(tmp_path: Path):
    """The sharded manager rotated as the file one did: a fresh run in a directory holding an
    earlier run's later steps deleted its own new checkpoints at once."""
    model = torch.nn.Linear(5, 2)
    old = ShardedCheckpointManager(tmp_path, keep=2)
    for step in (800, 900):
        old.save(model, None, step, extras={"run": "old"})
    new = ShardedCheckpointManager(tmp_path, keep=2)
    for step in (100, 200, 300):
        new.save(model, None, step, extras={"run": "new"})
    assert [s for s, _ in new.checkpoints()] == [200, 300]
    found = new.load_latest(torch.nn.Linear(5, 2))
    assert found is not None and found[1] == 300 and new.extras == {"run": "new"}
    [batch] = (tmp_path / "superseded").iterdir()
    assert batch.name.endswith("Z-before-step-100")
    assert sorted(p.name for p in batch.iterdir()) == ["dcp-000000000800", "dcp-000000000900"]


@SINGLE_PROCESS_DCP
@pytest.mark.parametrize("manifest", [bytes(range(128, 256)), b"00  ../../etc/passwd\n"])
def test_a_garbage_manifest_is_skipped_for_the_older_sharded_checkpoint(
        tmp_path: Path, caplog, manifest: bytes):
    mgr = ShardedCheckpointManager(tmp_path, keep=3)
    model = torch.nn.Linear(5, 2)
    mgr.save(model, None, 2)
    mgr.save(model, None, 3)
    (tmp_path / "dcp-000000000003" / "MANIFEST.sha256").write_bytes(manifest)
    with caplog.at_level(logging.WARNING, logger="shockslurm.train"):
        found = mgr.load_latest(torch.nn.Linear(5, 2))
    assert found is not None and found[1] == 2
    assert any("skipping bad sharded checkpoint" in r.getMessage() for r in caplog.records)


def test_the_lightning_callback_refuses_an_unwritable_directory_and_foreign_files(
        tmp_path: Path, caplog):
    lightning = pytest.importorskip("shockslurm.train.lightning")  # CI installs lightning
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(OSError, match="is not writable"):
        lightning.ShockwaveCallback(blocker / "ckpt", reporter=Reporter(None))
    cb = lightning.ShockwaveCallback(tmp_path / "ckpt", reporter=Reporter(None))
    cb.lease.close()
    cb.ckpt.save({"format": 2, "step": 1, "model": {}, "data": {}}, 1)   # ShockTrainer's
    with caplog.at_level(logging.WARNING, logger="shockslurm.train"):
        assert cb.ckpt.load_latest(check=lightning._check_lightning) is None
    assert any("not a checkpoint of this callback" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("argv, said", [
    (["shockslurm.train.bench", "--batch-size", "0"], "--batch-size: must be at least 1"),
    (["shockslurm.train.bench", "--steps", "x"], "--steps: not a whole number"),
    (["shockslurm.train.restart_bench", "--repeats", "0"], "--repeats: must be at least 1"),
    (["shockslurm.train.restart_bench", "--tmp-dir", "/nonexistent/x"],
     "--tmp-dir: not a directory")])
def test_the_helpers_benchmarks_refuse_bad_arguments(argv: list[str], said: str):
    res = subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True,
                         timeout=120, env=job_env(), cwd=REPO)
    assert res.returncode == 2 and said in res.stderr and "Traceback" not in res.stderr


def test_checkpoints_are_their_owners_alone(tmp_path: Path):
    st = _trainer(tmp_path, every_steps=1)
    st.step()
    for name in ("ckpt-000000000001.pt", "ckpt-000000000001.pt.sha256"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o600, name
