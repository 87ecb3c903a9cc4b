"""shockslurm.train.checkpoint: round trip of every state kind, corruption, rotation, rank 0, the
standard format (`torch.load(weights_only=True)`, sidecar checksum, unwrapped keys), format 1."""

from __future__ import annotations

import logging
import os
import random

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # CI installs torch (tests/run.sh); never skipped there

from shockslurm.train.checkpoint import (CheckpointManager, CorruptCheckpoint,  # noqa: E402
                                         decode_legacy, encode_legacy, read_checkpoint,
                                         sidecar_path, sidecar_text)
from shockslurm.train.state import capture, restore  # noqa: E402


def _objects(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8),
                                torch.nn.Linear(8, 2))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=3)
    return model, opt, sched, scaler


def _train_a_bit(model, opt, sched, scaler, steps: int = 3) -> None:
    for _ in range(steps):
        x = torch.randn(16, 4)
        opt.zero_grad()
        scaler.scale(model(x).pow(2).mean()).backward()
        scaler.step(opt)
        scaler.update()
        sched.step()


def _assert_same_state(a, b) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _assert_same_state(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same_state(x, y)
    else:
        assert a == b


def test_round_trip_every_state_kind(tmp_path):
    model, opt, sched, scaler = _objects()
    _train_a_bit(model, opt, sched, scaler)
    random.seed(5)
    np.random.seed(6)
    torch.manual_seed(7)
    state = capture(model, opt, scheduler=sched, scaler=scaler,
                    data={"epoch": 3, "step_in_epoch": 11, "seed": 9}, batch_size=64, step=42,
                    extras={"best_loss": 0.25, "note": "hi"})
    mgr = CheckpointManager(tmp_path, is_writer=True)
    path = mgr.save(state, 42)
    assert path is not None and path.name == "ckpt-000000000042.pt"
    expected = (random.random(), float(np.random.rand()), torch.rand(3))

    model2, opt2, sched2, scaler2 = _objects(seed=99)
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    found = CheckpointManager(tmp_path).load_latest()
    assert found is not None and found[0] == path
    loaded = found[1]
    restore(loaded, model2, opt2, scheduler=sched2, scaler=scaler2)
    _assert_same_state(model.state_dict(), model2.state_dict())
    _assert_same_state(opt.state_dict(), opt2.state_dict())
    assert sched.state_dict() == sched2.state_dict()
    assert scaler.state_dict() == scaler2.state_dict()
    assert scaler2.get_scale() == scaler.get_scale()
    assert loaded["data"] == {"epoch": 3, "step_in_epoch": 11, "seed": 9}
    assert loaded["batch_size"] == 64 and loaded["step"] == 42
    assert loaded["extras"] == {"best_loss": 0.25, "note": "hi"}
    # the RNG streams continue where they were at capture time
    got = (random.random(), float(np.random.rand()), torch.rand(3))
    assert got[0] == expected[0] and got[1] == expected[1] and torch.equal(got[2], expected[2])
    # and training continues identically
    _train_a_bit(model, opt, sched, scaler)
    random.seed(5)
    np.random.seed(6)
    torch.manual_seed(7)
    restore(loaded, model2, opt2, scheduler=sched2, scaler=scaler2)
    random.random(), np.random.rand(), torch.rand(3)
    _train_a_bit(model2, opt2, sched2, scaler2)
    _assert_same_state(model.state_dict(), model2.state_dict())


def _three(tmp_path):
    mgr = CheckpointManager(tmp_path, is_writer=True, keep=5)
    for step in (10, 20, 30):
        mgr.save({"format": 1, "step": step, "payload": torch.full((1000,), float(step))}, step)
    return mgr


def _corrupt_flip(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _corrupt_truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _corrupt_torn(path):
    # a torn write: the tail of the file is zeros (blocks never written)
    data = bytearray(path.read_bytes())
    data[len(data) - 4096:] = bytes(4096)
    path.write_bytes(bytes(data))


def _corrupt_header(path):
    path.write_bytes(b"\0" * 20)


def _corrupt_empty(path):
    path.write_bytes(b"")


def _corrupt_bad_pickle_good_sum(path):
    payload = b"not a pickle at all"
    path.write_bytes(payload)
    sidecar_path(path).write_text(sidecar_text(payload, path.name))


def _corrupt_no_sidecar(path):
    sidecar_path(path).unlink()


def _corrupt_sidecar(path):
    sidecar_path(path).write_text("0" * 10)


@pytest.mark.parametrize("damage", [_corrupt_flip, _corrupt_truncate, _corrupt_torn,
                                    _corrupt_header, _corrupt_empty,
                                    _corrupt_bad_pickle_good_sum, _corrupt_no_sidecar,
                                    _corrupt_sidecar])
def test_bad_newest_falls_back_to_previous_with_warning(tmp_path, caplog, damage):
    mgr = _three(tmp_path)
    newest = mgr.path_for(30)
    damage(newest)
    with caplog.at_level(logging.WARNING, logger="shockslurm.train"):
        found = CheckpointManager(tmp_path).load_latest()
    assert found is not None
    path, state = found
    assert path == mgr.path_for(20) and state["step"] == 20
    assert torch.equal(state["payload"], torch.full((1000,), 20.0))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and str(newest) in warnings[0]


def test_two_bad_then_good_and_all_bad(tmp_path, caplog):
    mgr = _three(tmp_path)
    _corrupt_flip(mgr.path_for(30))
    _corrupt_truncate(mgr.path_for(20))
    with caplog.at_level(logging.WARNING, logger="shockslurm.train"):
        path, state = CheckpointManager(tmp_path).load_latest()
    assert state["step"] == 10
    assert sum(r.levelno == logging.WARNING for r in caplog.records) == 2
    _corrupt_header(mgr.path_for(10))
    assert CheckpointManager(tmp_path).load_latest() is None


def test_read_reasons(tmp_path):
    mgr = CheckpointManager(tmp_path, is_writer=True)
    path = mgr.save({"format": 2, "x": 1}, 1)
    assert read_checkpoint(path)["x"] == 1
    assert sidecar_path(path).read_text().split() == [
        __import__("hashlib").sha256(path.read_bytes()).hexdigest(), path.name]
    data = path.read_bytes()
    path.write_bytes(data[:-1])
    with pytest.raises(CorruptCheckpoint, match="sha256 differs"):
        read_checkpoint(path)
    path.write_bytes(data)
    sidecar_path(path).unlink()
    with pytest.raises(CorruptCheckpoint, match="no checksum file"):
        read_checkpoint(path)


def test_legacy_decode_reasons():
    data = encode_legacy({"format": 1, "x": 1})
    assert decode_legacy(data)["x"] == 1
    with pytest.raises(CorruptCheckpoint, match="truncated"):
        decode_legacy(data[:-1])
    with pytest.raises(CorruptCheckpoint, match="magic"):
        decode_legacy(b"X" + data[1:])
    with pytest.raises(CorruptCheckpoint, match="sha256"):
        decode_legacy(data[:-1] + bytes([data[-1] ^ 1]))


def test_keep_last_k_and_stale_tmp_swept(tmp_path):
    (tmp_path / ".ckpt-000000000001.pt.abc.tmp").write_bytes(b"half")
    mgr = CheckpointManager(tmp_path, keep=3, is_writer=True)
    for step in range(1, 8):
        mgr.save({"format": 1, "step": step}, step)
    assert [s for s, _ in mgr.checkpoints()] == [5, 6, 7]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"ckpt-00000000000{k}.pt{suffix}" for k in (5, 6, 7) for suffix in ("", ".sha256")]
    # a sidecar whose checkpoint never landed (a save that died between the two) is swept
    (tmp_path / "ckpt-000000000009.pt.sha256").write_text("x")
    mgr.save({"format": 1, "step": 8}, 8)
    assert not (tmp_path / "ckpt-000000000009.pt.sha256").exists()
    with pytest.raises(ValueError):
        CheckpointManager(tmp_path, keep=0)


def test_empty_or_missing_directory(tmp_path):
    assert CheckpointManager(tmp_path / "nope").load_latest() is None
    assert CheckpointManager(tmp_path).load_latest() is None


@pytest.mark.parametrize("var", ["RANK", "SLURM_PROCID"])
def test_only_rank_zero_writes_every_rank_reads(tmp_path, monkeypatch, var):
    for v in ("RANK", "SLURM_PROCID"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv(var, "1")
    other = CheckpointManager(tmp_path)
    assert not other.is_writer
    assert other.save({"format": 1, "step": 1}, 1) is None
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv(var, "0")
    writer = CheckpointManager(tmp_path)
    assert writer.is_writer
    assert writer.save({"format": 1, "step": 2}, 2) is not None
    monkeypatch.setenv(var, "1")
    path, state = CheckpointManager(tmp_path).load_latest()
    assert state["step"] == 2


def test_torch_distributed_rank_wins_over_env(tmp_path, monkeypatch):
    import torch.distributed as dist
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 3)
    assert not CheckpointManager(tmp_path).is_writer


def test_atomic_write_leaves_no_temporary(tmp_path):
    mgr = CheckpointManager(tmp_path, is_writer=True)
    mgr.save({"format": 1, "step": 1}, 1)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert os.stat(mgr.path_for(1)).st_size > 0
    assert sidecar_path(mgr.path_for(1)).exists()


# ---------------------------------------------------------------- the standard format

def test_torch_load_weights_only_reads_the_whole_state(tmp_path, caplog):
    model, opt, sched, scaler = _objects()
    _train_a_bit(model, opt, sched, scaler)
    state = capture(model, opt, scheduler=sched, scaler=scaler, data={"epoch": 1}, step=3,
                    batch_size=16, extras={"best": 0.5, "tags": ["a", "b"]})
    with caplog.at_level(logging.WARNING, logger="shockslurm.train"):
        path = CheckpointManager(tmp_path, is_writer=True).save(state, 3)
        loaded = torch.load(path, weights_only=True)
        assert CheckpointManager(tmp_path).load_latest()[1]["step"] == 3
    assert not caplog.records                          # no fallback to a full pickle
    assert loaded["format"] == 2 and loaded["step"] == 3 and loaded["batch_size"] == 16
    fresh = _objects(seed=99)
    fresh[0].load_state_dict(loaded["model"])          # a plain load_state_dict takes it
    _assert_same_state(model.state_dict(), fresh[0].state_dict())
    restore(loaded, *fresh[:2], scheduler=fresh[2], scaler=fresh[3])
    _assert_same_state(opt.state_dict(), fresh[1].state_dict())
    assert isinstance(loaded["rng"]["numpy"]["keys"], torch.Tensor)


def test_ddp_keys_are_unwrapped_and_restore_into_either(tmp_path):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0,
                            world_size=1)
    try:
        model = _objects()[0]
        ddp = DistributedDataParallel(model)
        assert all(k.startswith("module.") for k in ddp.state_dict())
        path = CheckpointManager(tmp_path / "ck").save(capture(ddp, step=1), 1)
        saved = torch.load(path, weights_only=True)["model"]
        assert list(saved) == list(model.state_dict())           # no "module." prefix
        plain = _objects(seed=5)[0]
        plain.load_state_dict(saved)
        other = DistributedDataParallel(_objects(seed=6)[0])
        restore(read_checkpoint(path), other, rng=False)
        _assert_same_state(model.state_dict(), other.module.state_dict())
    finally:
        dist.destroy_process_group()


def test_format_1_checkpoints_still_restore(tmp_path):
    """A checkpoint of the earlier format: header + pickle, numpy RNG as numpy's tuple, DDP keys
    with the `module.` prefix."""
    model, opt, sched, scaler = _objects()
    np.random.seed(11)
    old = capture(model, opt, step=5)
    old.update(format=1, model={f"module.{k}": v for k, v in model.state_dict().items()})
    old["rng"]["numpy"] = np.random.get_state()
    expected = float(np.random.rand())
    (tmp_path / "ckpt-000000000005.pt").write_bytes(encode_legacy(old))
    np.random.seed(0)
    path, state = CheckpointManager(tmp_path).load_latest()
    fresh = _objects(seed=3)
    restore(state, fresh[0], fresh[1])
    _assert_same_state(model.state_dict(), fresh[0].state_dict())
    assert float(np.random.rand()) == expected
    with pytest.raises(CorruptCheckpoint, match="unknown checkpoint format 7"):
        restore({**state, "format": 7}, fresh[0])


def test_extras_weights_only_refuses_still_load_with_a_warning(tmp_path, caplog):
    from fractions import Fraction
    mgr = CheckpointManager(tmp_path, is_writer=True)
    path = mgr.save({"format": 2, "step": 1, "extras": {"ratio": Fraction(1, 3)}}, 1)
    with pytest.raises(Exception):
        torch.load(path, weights_only=True)
    with caplog.at_level(logging.WARNING, logger="shockslurm.train"):
        _, state = CheckpointManager(tmp_path).load_latest()
    assert state["extras"]["ratio"] == Fraction(1, 3)
    assert "weights_only" in caplog.records[0].getMessage()


def test_load_checkpoint_file_or_directory(tmp_path):
    from shockslurm.train import load_checkpoint
    with pytest.raises(FileNotFoundError, match="no good checkpoint"):
        load_checkpoint(tmp_path)
    mgr = _three(tmp_path)
    assert load_checkpoint(tmp_path)["step"] == 30
    assert load_checkpoint(mgr.path_for(20))["step"] == 20


def test_a_save_that_fails_midway_leaves_nothing_behind(tmp_path):
    # torch.save streams into a temporary file: a state it cannot pickle (a lambda) fails
    # part-way through, and neither the temporary, a sidecar nor a checkpoint may remain.
    mgr = CheckpointManager(tmp_path, is_writer=True)
    mgr.save({"format": 2, "x": 1}, 1)
    with pytest.raises(Exception):
        mgr.save({"format": 2, "w": torch.zeros(1000), "bad": lambda: None}, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-000000000001.pt",
                                                          "ckpt-000000000001.pt.sha256"]
    assert read_checkpoint(tmp_path / "ckpt-000000000001.pt")["x"] == 1


def test_later_steps_than_a_runs_own_are_set_aside_not_rotated_in(tmp_path, caplog):
    """A fresh run in a directory holding an earlier run's checkpoints of later steps (or a
    bad newest file skipped at resume): rotating by step deleted the new checkpoints as soon
    as they were written, and a resume took the old run's. They are moved to superseded/."""
    old = CheckpointManager(tmp_path, keep=3, is_writer=True)
    for step in (800, 900, 1000):
        old.save({"format": 2, "step": step, "run": "old"}, step)
    mgr = CheckpointManager(tmp_path, keep=2, is_writer=True)
    with caplog.at_level(logging.WARNING, logger="shockslurm.train"):
        for step in (100, 200, 300):
            mgr.save({"format": 2, "step": step, "run": "new"}, step)
    assert [s for s, _ in mgr.checkpoints()] == [200, 300]
    assert mgr.load_latest()[1]["run"] == "new"
    [batch] = (tmp_path / "superseded").iterdir()      # one folder for the batch set aside
    assert batch.name.endswith("Z-before-step-100")
    assert sorted(p.name for p in batch.iterdir()) == [
        f"ckpt-00000000{k}.pt{suffix}" for k in ("0800", "0900", "1000")
        for suffix in ("", ".sha256")]
    assert read_checkpoint(batch / "ckpt-000000001000.pt")["run"] == "old"
    assert "not its own" in caplog.text and "superseded" in caplog.text


def test_a_crash_while_a_step_is_saved_again_keeps_a_good_checkpoint(tmp_path, monkeypatch):
    """The epoch's end saves again the step its last batch saved: killed between the sidecar's
    rename and the file's, the step's checkpoint must still check out (old or new)."""
    import shockslurm.atomic as atomic

    mgr = CheckpointManager(tmp_path, keep=1, is_writer=True)
    mgr.save({"format": 2, "step": 2, "at": "last batch"}, 2)
    real = os.replace

    class Killed(BaseException):
        pass

    def replace(src, dst):
        if str(dst).endswith(".pt") and os.path.exists(dst):
            raise Killed()
        return real(src, dst)

    monkeypatch.setattr(atomic.os, "replace", replace)
    with pytest.raises(Killed):
        mgr.save({"format": 2, "step": 2, "at": "epoch end"}, 2)
    monkeypatch.setattr(atomic.os, "replace", real)
    assert mgr.load_latest()[1]["at"] == "last batch"
    mgr.save({"format": 2, "step": 2, "at": "epoch end"}, 2)
    assert mgr.load_latest()[1]["at"] == "epoch end"
    assert len(sidecar_path(tmp_path / "ckpt-000000000002.pt").read_text().splitlines()) == 1


def test_a_resumed_optimizer_holds_no_tensor_of_the_checkpoint_file(tmp_path):
    """Checkpoints load memory-mapped; Adam kept the moments it was given, still backed by the
    file (its disk space held after rotation deleted it)."""
    model, opt, sched, scaler = _objects()
    _train_a_bit(model, opt, sched, scaler)
    mgr = CheckpointManager(tmp_path, is_writer=True)
    mgr.save(capture(model, opt, scheduler=sched, scaler=scaler), 3)
    model2, opt2, sched2, scaler2 = _objects(1)
    restore(read_checkpoint(tmp_path / "ckpt-000000000003.pt"), model2, opt2, scheduler=sched2,
            scaler=scaler2)
    _assert_same_state(opt.state_dict(), opt2.state_dict())
    mapped = [open(f"/proc/{os.getpid()}/maps").read().count(str(tmp_path))]
    import gc
    gc.collect()
    mapped.append(open(f"/proc/{os.getpid()}/maps").read().count(str(tmp_path)))
    assert mapped[-1] == 0, mapped
