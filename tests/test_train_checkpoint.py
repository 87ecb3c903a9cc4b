"""shockslurm.train.checkpoint: round trip of every state kind, corruption, rotation, rank 0."""

from __future__ import annotations

import logging
import os
import random

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # CI installs torch (tests/run.sh); never skipped there

from shockslurm.train.checkpoint import (HEADER_SIZE, CheckpointManager, CorruptCheckpoint,  # noqa: E402
                                         capture, decode, encode, restore)


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
    data[HEADER_SIZE + len(data[HEADER_SIZE:]) // 2] ^= 0xFF
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
    import hashlib
    import struct
    payload = b"not a pickle at all"
    path.write_bytes(struct.pack(">8sQ32s", b"SHCKPT01", len(payload),
                                 hashlib.sha256(payload).digest()) + payload)


@pytest.mark.parametrize("damage", [_corrupt_flip, _corrupt_truncate, _corrupt_torn,
                                    _corrupt_header, _corrupt_empty,
                                    _corrupt_bad_pickle_good_sum])
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


def test_decode_reasons():
    data = encode({"format": 1, "x": 1})
    assert decode(data)["x"] == 1
    with pytest.raises(CorruptCheckpoint, match="truncated"):
        decode(data[:-1])
    with pytest.raises(CorruptCheckpoint, match="magic"):
        decode(b"X" + data[1:])
    with pytest.raises(CorruptCheckpoint, match="sha256"):
        decode(data[:-1] + bytes([data[-1] ^ 1]))


def test_keep_last_k_and_stale_tmp_swept(tmp_path):
    (tmp_path / ".ckpt-000000000001.pt.abc.tmp").write_bytes(b"half")
    mgr = CheckpointManager(tmp_path, keep=3, is_writer=True)
    for step in range(1, 8):
        mgr.save({"format": 1, "step": step}, step)
    assert [s for s, _ in mgr.checkpoints()] == [5, 6, 7]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ckpt-000000000005.pt", "ckpt-000000000006.pt", "ckpt-000000000007.pt"]
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
    assert os.stat(mgr.path_for(1)).st_size > HEADER_SIZE
