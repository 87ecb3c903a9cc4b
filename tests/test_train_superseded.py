"""shockslurm.train.superseded: checkpoints of later steps than a run's own are set aside, each
batch in a new folder of its own under superseded/ (never onto an existing name), a file always
beside its sidecar, for both checkpoint managers."""

from __future__ import annotations

import datetime as dt
import os
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")  # CI installs torch (tests/run.sh); never skipped there

from shockslurm.train import superseded  # noqa: E402
from shockslurm.train.checkpoint import CheckpointManager, read_checkpoint, rotate  # noqa: E402
from shockslurm.train.sharded import ShardedCheckpointManager, check_manifest  # noqa: E402

SINGLE_PROCESS_DCP = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
STAMP = "20250301T101502Z"


@pytest.fixture
def frozen_clock(monkeypatch):
    """Every batch set aside in the same second (the name a second batch must not reuse)."""
    class Frozen(dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return dt.datetime(2025, 3, 1, 10, 15, 2, tzinfo=dt.timezone.utc)
    monkeypatch.setattr(superseded, "datetime", Frozen)


def _batches(directory: Path) -> list[Path]:
    return sorted((directory / "superseded").iterdir())


def test_each_runs_set_aside_checkpoints_keep_a_folder_of_their_own(tmp_path, frozen_clock):
    """Two fresh runs after a first in one directory: the second's set-aside checkpoints were
    moved onto the first's names in superseded/, overwriting them (run A's were lost)."""
    mgr = CheckpointManager(tmp_path, keep=2, is_writer=True)
    for run in "AB":
        for step in (10, 20, 30, 40, 50):
            mgr.save({"format": 2, "step": step, "run": run}, step)
    mgr.save({"format": 2, "step": 10, "run": "C"}, 10)
    assert mgr.load_latest()[1]["run"] == "C"
    batches = _batches(tmp_path)
    assert [b.name for b in batches] == [f"{STAMP}-before-step-10", f"{STAMP}-before-step-10-2"]
    for batch, run in zip(batches, "AB"):
        assert sorted(p.name for p in batch.iterdir()) == [
            f"ckpt-0000000000{k}0.pt{suffix}" for k in "45" for suffix in ("", ".sha256")]
        assert {read_checkpoint(p)["run"] for p in batch.glob("*.pt")} == {run}


@SINGLE_PROCESS_DCP
def test_each_runs_set_aside_sharded_checkpoints_keep_a_folder_of_their_own(tmp_path,
                                                                           frozen_clock):
    """The sharded manager's second set-aside of dcp-<step> failed (ENOTEMPTY: the first's was
    there) and left it in place, so a resume took the stale run's checkpoint."""
    model = torch.nn.Linear(2, 1)
    mgr = ShardedCheckpointManager(tmp_path, keep=1)
    for run in "AB":
        for step in (10, 20):
            mgr.save(model, None, step, extras={"run": run})
    mgr.save(model, None, 10, extras={"run": "C"})
    resumed = ShardedCheckpointManager(tmp_path)
    found = resumed.load_latest(torch.nn.Linear(2, 1))
    assert found is not None and found[1] == 10 and resumed.extras == {"run": "C"}
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("dcp-")] == [
        "dcp-000000000010"]
    batches = _batches(tmp_path)
    assert [b.name for b in batches] == [f"{STAMP}-before-step-10", f"{STAMP}-before-step-10-2"]
    for batch, run in zip(batches, "AB"):
        kept = batch / "dcp-000000000020"
        assert check_manifest(kept) is None
        assert torch.load(kept / "rng.pt", weights_only=True)["extras"] == {"run": run}


class Killed(BaseException):
    """The process killed at a rename (not an OSError: nothing may catch it)."""


def test_a_kill_at_any_rename_leaves_each_checkpoint_beside_its_sidecar(tmp_path, monkeypatch):
    """The file was moved first and its sidecar after: killed between, the kept copy had no
    checksum (and the sidecar left behind was swept as an orphan by the next save)."""
    original = tmp_path / "original"
    old = CheckpointManager(original, keep=2, is_writer=True)
    for step in (40, 50):
        old.save({"format": 2, "step": step, "run": "old"}, step)
    real_replace = os.replace
    kill_at = 0
    while True:
        kill_at += 1
        work = tmp_path / f"kill-{kill_at}"
        shutil.copytree(original, work)
        calls = 0

        def replace(src, dst, kill_at=kill_at):
            nonlocal calls
            calls += 1
            if calls == kill_at:
                raise Killed
            real_replace(src, dst)

        monkeypatch.setattr(os, "replace", replace)
        try:
            rotate(work, CheckpointManager(work).checkpoints(), 10, 2)
            finished = True
        except Killed:
            finished = False
        monkeypatch.setattr(os, "replace", real_replace)
        kept = sorted(work.rglob("ckpt-*.pt"))
        assert sorted(p.name for p in kept) == ["ckpt-000000000040.pt", "ckpt-000000000050.pt"]
        for path in kept:      # beside its own sidecar, wherever it is: read_checkpoint checks
            assert read_checkpoint(path)["step"] in (40, 50), (kill_at, path)
        if finished:
            break
    assert kill_at > 3 and not list(work.glob("ckpt-*"))
