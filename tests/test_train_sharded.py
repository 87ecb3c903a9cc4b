"""Sharded checkpoints (`shockslurm.train.sharded`, torch.distributed.checkpoint): two CPU ranks
(gloo) train an FSDP2 (`fully_shard`) model; a save / restore round trip into a freshly built
model and optimizer continues bit-identically (model, Adam state, RNG); a corrupt newest
checkpoint is skipped for the older one; only `keep` are kept."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")  # CI installs CPU torch (tests/run.sh): never skipped there
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from .gloo_ranks import leave_together, spawn_ranks  # noqa: E402


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _build(seed: int):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Dropout(0.2), torch.nn.ReLU(),
                                torch.nn.Linear(32, 4))
    # A CPU mesh: without one, FSDP2 builds its mesh on the GPU where one is present (two ranks
    # on one GPU over gloo crashed on the GPU machine).
    mesh = init_device_mesh("cpu", (2,))
    for layer in (model[0], model[3]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def _train(model, opt, steps: int) -> None:
    for _ in range(steps):
        x = torch.randn(16, 8)                 # the global RNG: restored per rank
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()


def _full(model, opt) -> dict:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    m, o = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True,
                                                               cpu_offload=False))
    return {"model": {k: v.clone() for k, v in m.items()},
            "optim": {k: {n: t.clone() for n, t in v.items() if torch.is_tensor(t)}
                      for k, v in o["state"].items()}}


def _rank_main(rank: int, port: int, d: str, results: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE="2")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        from shockslurm.train.sharded import ShardedCheckpointManager

        mgr = ShardedCheckpointManager(d, keep=2)
        torch.manual_seed(100 + rank)
        model, opt = _build(0)
        _train(model, opt, 3)
        mgr.save(model, opt, 3, extras={"note": "x"})
        _train(model, opt, 2)
        mgr.save(model, opt, 5)
        _train(model, opt, 3)
        reference = _full(model, opt)
        mgr.save(model, opt, 8)                   # keep=2: step 3 is deleted

        model2, opt2 = _build(1)                  # other weights, no optimizer state yet
        found = ShardedCheckpointManager(d).load_latest(model2, opt2)
        assert found is not None and found[1] == 8
        same_at_8 = _full(model2, opt2)
        model3, opt3 = _build(2)
        if rank == 0:                             # tear the newest: the older one is used
            shard = next(p for p in Path(d, "dcp-000000000008").iterdir()
                         if p.suffix == ".distcp")
            shard.write_bytes(shard.read_bytes()[:-7])
        dist.barrier()
        mgr2 = ShardedCheckpointManager(d)
        found = mgr2.load_latest(model3, opt3)
        assert found is not None and found[1] == 5
        _train(model3, opt3, 3)
        resumed = _full(model3, opt3)
        at8 = _full(model, opt)                   # (collective: every rank gathers)
        if rank == 0:
            results["kept"] = sorted(p.name for p in Path(d).iterdir())
            results["at8"] = all(torch.equal(v, same_at_8["model"][k])
                                 for k, v in at8["model"].items())
            results["model"] = all(torch.equal(v, resumed["model"][k])
                                   for k, v in reference["model"].items())
            results["optim"] = all(torch.equal(t, resumed["optim"][k][n])
                                   for k, v in reference["optim"].items() for n, t in v.items())
    except BaseException:
        dist.destroy_process_group()     # (no barrier: the other rank may never reach it)
        raise
    leave_together()


def test_fsdp_two_ranks_sharded_round_trip_is_exact(tmp_path: Path):
    with mp.Manager() as manager:
        results = manager.dict()
        spawn_ranks(_rank_main, lambda attempt: (_port(), str(tmp_path / f"ck{attempt}"),
                                                 results))
        got = dict(results)
    assert got["kept"] == ["dcp-000000000005", "dcp-000000000008"], got["kept"]
    assert got["at8"], "the restored model differs from the saved one"
    assert got["model"] and got["optim"], got       # resumed from 5: bit-identical at 8


def test_a_same_step_save_never_leaves_that_step_without_a_checkpoint(tmp_path: Path):
    """Saving a step already on disk renames the old directory aside before the new one goes
    in, and removes it after. A kill between the two renames (simulated: the old one aside,
    nothing in its place) loses nothing: the next load puts it back. Before, the old directory
    was deleted first, and with keep=1 no checkpoint was left at all."""
    import warnings

    from shockslurm.train.sharded import ShardedCheckpointManager

    warnings.filterwarnings("ignore", category=UserWarning)     # DCP without a process group
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mgr = ShardedCheckpointManager(tmp_path, keep=1)
    mgr.save(model, opt, 5, extras={"run": 1})
    mgr.save(model, opt, 5, extras={"run": 2})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dcp-000000000005"]
    aside = tmp_path / ".dcp-000000000005.old"
    (tmp_path / "dcp-000000000005").rename(aside)             # killed between the renames
    fresh = ShardedCheckpointManager(tmp_path, keep=1)
    found = fresh.load_latest(torch.nn.Linear(3, 2), None)
    assert found is not None and found[1] == 5 and fresh.extras == {"run": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dcp-000000000005"]


def _rank_fails_main(rank: int, port: int, d: str, results: dict) -> None:
    """Rank 0 fails in the part of a save, then of a load, it does alone; the process group's
    timeout is 60 s, so a rank left waiting for it would take a minute to learn of it."""
    import datetime
    import time

    from shockslurm.train import sharded

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE="2")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    model, opt = _build(0)
    mgr = sharded.ShardedCheckpointManager(d)

    def full_disk(directory: Path) -> None:
        raise OSError(28, "No space left on device")

    def unreadable() -> None:
        raise PermissionError(13, "Permission denied", d)

    if rank == 0:
        sharded.write_manifest = full_disk           # type: ignore[assignment]
        mgr._choose = unreadable                     # type: ignore[method-assign]
    for what, call in (("save", lambda: mgr.save(model, opt, 1)),
                       ("load", lambda: mgr.load_latest(model, opt))):
        began = time.monotonic()
        try:
            call()
            results[f"{what}{rank}"] = ("no error", 0.0)
        except Exception as exc:                     # noqa: BLE001 - what each rank saw
            results[f"{what}{rank}"] = (f"{type(exc).__name__}: {exc}", time.monotonic() - began)
    leave_together()


def test_rank_zero_failing_alone_fails_every_rank_at_once(tmp_path: Path):
    """Before, rank 0's error in its own part of a save (checksums, rename, rotation) or a load
    (choosing the checkpoint) left rank 1 in the next barrier or broadcast until the process
    group's timeout (NCCL's 10 minutes; here 60 s, then a gloo timeout error on rank 1 alone)."""
    with mp.Manager() as manager:
        results = manager.dict()
        spawn_ranks(_rank_fails_main, lambda attempt: (_port(), str(tmp_path / f"ck{attempt}"),
                                                       results))
        got = dict(results)
    assert got["save0"][0] == "OSError: [Errno 28] No space left on device", got
    assert got["save1"][0] == ("RankFailed: shockslurm.train: rank 0 failed: "
                               "OSError: [Errno 28] No space left on device"), got
    assert got["load0"][0].startswith("PermissionError: [Errno 13] Permission denied"), got
    assert got["load1"][0].startswith("RankFailed: shockslurm.train: rank 0 failed: "
                                      "PermissionError: [Errno 13]"), got
    assert got["save1"][1] < 30 and got["load1"][1] < 30, got


def _trainer_rank(rank: int, port: int, d: str, results: dict) -> None:
    """ShockTrainer around an FSDP2 model: 8 steps at once, against 5 steps, a stop (its
    checkpoint), a fresh process's model and trainer resumed, 3 steps more."""
    from shockslurm.train import ShockTrainer
    from shockslurm.train.lease import Lease
    from shockslurm.train.reports import Reporter

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE="2")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")

    def run(directory: str, steps: int, seed: int, stop_at: int | None = None):
        torch.manual_seed(100 + rank)
        model, opt = _build(seed)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
        st = ShockTrainer(model, opt, scheduler=sched, ckpt_dir=directory, every_seconds=None,
                          reporter=Reporter(None), lease=Lease(stop_file=False),
                          extras={"note": "mine"})
        st.start()
        while st.global_step < steps:
            _train(model, opt, 1)
            sched.step()
            if st.global_step + 1 == stop_at:
                st.request_stop("test")
            if st.step(samples=16):
                break
        st.close()
        return model, opt, st

    model, opt, _ = run(os.path.join(d, "ref"), 8, 0)
    reference = _full(model, opt)
    _, _, stopped = run(os.path.join(d, "run"), 8, 0, stop_at=5)
    model, opt, resumed = run(os.path.join(d, "run"), 8, 1)     # other weights until resumed
    got = _full(model, opt)
    if rank == 0:
        results["stopped_at"] = stopped.global_step
        results["resumed_from"] = resumed.resumed_from.name if resumed.resumed_from else None
        results["lr"] = opt.param_groups[0]["lr"]
        results["extras"] = dict(resumed.extras)
        results["model"] = all(torch.equal(v, got["model"][k])
                               for k, v in reference["model"].items())
        results["optim"] = all(torch.equal(t, got["optim"][k][n])
                               for k, v in reference["optim"].items() for n, t in v.items())
    leave_together()


def test_shocktrainer_checkpoints_an_fsdp_model_sharded_and_resumes_it_exactly(tmp_path: Path):
    """A model no rank holds whole (FSDP2) under ShockTrainer: every rank writes its shards
    (DCP), and a resumed run ends bit-identical to an uninterrupted one, the LR scheduler and
    the extras with it. Before, rank 0 saved its own shards as the whole model, and every rank
    resumed from them: rank 1's weights were rank 0's, in silence."""
    with mp.Manager() as manager:
        results = manager.dict()
        spawn_ranks(_trainer_rank, lambda attempt: (_port(), str(tmp_path / f"t{attempt}"),
                                                    results))
        got = dict(results)
    assert got["stopped_at"] == 5 and got["resumed_from"] == "dcp-000000000005", got
    assert got["extras"] == {"note": "mine"} and got["lr"] == pytest.approx(0.01 * 0.5 ** 4), got
    assert got["model"] and got["optim"], got
