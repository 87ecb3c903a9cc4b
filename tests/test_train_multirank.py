"""The training helper under torchrun with two ranks (CPU, gloo): `examples/train_ddp.py`.

Only rank 1 is signalled; both ranks stop at the same step, rank 0's checkpoint holds both
ranks' RNG states (they are seeded apart), and the resumed run ends with weights bit-identical
to an uninterrupted one. Time-based checkpoints (`every_seconds`, each rank's own clock) run
throughout: were they not agreed between the ranks, the collectives would mismatch and hang.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")  # CI installs CPU torch (tests/run.sh)

from shockslurm.train.checkpoint import CheckpointManager  # noqa: E402

from .gloo_ranks import leave_together, spawn_ranks  # noqa: E402
from .train_job import job_env, signal_rank_once_running  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_ddp.py"
STOP_RE = re.compile(r"stopping at step (\d+) \((.*)\)")


def _torchrun(tmp: Path, ckpt: str, out: str, *more: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
            "2", str(EXAMPLE), "--ckpt-dir", str(tmp / ckpt), "--out", str(tmp / out),
            "--every-seconds", "0.3", "--sleep", "0.02", "--device", "cpu", *more]


def test_two_ranks_stop_together_and_resume_bit_identical(tmp_path: Path):
    ref = subprocess.run(_torchrun(tmp_path, "ref-ck", "ref.pt"), capture_output=True, text=True,
                         timeout=180, env=job_env())
    assert ref.returncode == 0, ref.stderr[-3000:]
    reference = torch.load(tmp_path / "ref.pt")

    pids = tmp_path / "pids"
    rc, output = signal_rank_once_running(
        _torchrun(tmp_path, "ck", "final.pt", "--pid-dir", str(pids)), pids, 1, job_env())
    assert rc == 0, output[-3000:]
    stops = STOP_RE.findall(output)
    assert len(stops) == 2, output[-3000:]
    steps = {int(s) for s, _ in stops}
    assert len(steps) == 1 and 0 < steps.pop() < 160, stops          # the same step, mid-run
    reasons = sorted(r for _, r in stops)
    assert reasons == ["another rank stopped", "signal SIGUSR1"], reasons
    assert "finished step" not in output

    found = CheckpointManager(tmp_path / "ck").load_latest()
    assert found is not None
    ranks = found[1]["rng_ranks"]
    assert len(ranks) == 2 and not torch.equal(ranks[0]["torch"], ranks[1]["torch"])
    # a standard file: torch.load reads it without unpickling code, keys of the unwrapped model
    plain = torch.load(found[0], weights_only=True)
    assert plain["model"].keys() == reference.keys()

    again = subprocess.run(_torchrun(tmp_path, "ck", "final.pt"), capture_output=True, text=True,
                           timeout=180, env=job_env())
    assert again.returncode == 0, again.stderr[-3000:]
    resumed = re.findall(r"rank (\d) resumed \S+ step (\d+)", again.stdout)
    assert sorted(r for r, _ in resumed) == ["0", "1"] and len({s for _, s in resumed}) == 1
    assert again.stdout.count("finished step 160") == 2, again.stdout
    final = torch.load(tmp_path / "final.pt")
    assert final.keys() == reference.keys()
    for name in reference:
        assert torch.equal(final[name], reference[name]), f"{name} differs"


def _trainer(directory: Path):
    from shockslurm.train import ShockTrainer
    from shockslurm.train.lease import Lease
    from shockslurm.train.reports import Reporter

    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    return ShockTrainer(model, torch.optim.SGD(model.parameters(), lr=0.1), ckpt_dir=directory,
                        every_seconds=None, reporter=Reporter(None), lease=Lease(stop_file=False))


def _apart_rank(rank: int, base: str) -> None:
    """Each rank resumes from its own directory; what it was told goes to rank<N>.txt."""
    import torch.distributed as dist
    from shockslurm.train.checkpoint import CheckpointMismatch

    dist.init_process_group("gloo", init_method="file://" + str(Path(base, "init")), rank=rank,
                            world_size=2)
    st = _trainer(Path(base, f"rank{rank}"))
    try:
        st.resume()
        said = f"resumed at {st.global_step}"
    except CheckpointMismatch as exc:
        said = f"refused: {exc}"
    Path(base, f"rank{rank}.txt").write_text(said)
    leave_together()


def _apart(base: Path) -> tuple[str]:
    """A fresh directory for one attempt, rank 0's part of it holding a checkpoint."""
    base.mkdir()
    first = _trainer(base / "rank0")                    # rank 0's directory has step 1
    first.step()
    first.save()
    first.close()
    return (str(base),)


def test_ranks_that_find_different_checkpoints_refuse_to_resume(tmp_path: Path):
    """Ranks reading different checkpoint directories (one per node, a stale listing) resumed
    at different steps in silence; now every rank raises, naming what each found."""
    spawn_ranks(_apart_rank, lambda attempt: _apart(tmp_path / f"try{attempt}"))
    base = sorted(tmp_path.glob("try*"))[-1]               # the attempt that ran to the end
    for rank in (0, 1):
        said = (base / f"rank{rank}.txt").read_text()
        assert said.startswith("refused: the ranks found different checkpoints"), said
        assert "rank 0: step 1, rank 1: none" in said, said


def _unpicklable_rank(rank: int, base: str) -> None:
    """Rank 0 (the writer) is given an extras value no checkpoint can hold after the trainer
    was built; every rank saves. What each was told, and how long it took, to rank<N>.txt."""
    import datetime
    import time

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="file://" + str(Path(base, "init")), rank=rank,
                            world_size=2, timeout=datetime.timedelta(seconds=60))
    st = _trainer(Path(base, "ck"))
    st.step()
    if rank == 0:
        st.extras["hook"] = lambda: None
    began = time.monotonic()
    try:
        st.save()
        said = "saved"
    except Exception as exc:                       # noqa: BLE001 - what this rank was told
        said = f"{type(exc).__name__}: {exc}"
    Path(base, f"rank{rank}.txt").write_text(f"{time.monotonic() - began:.1f} {said}")
    leave_together()


def _fresh(base: Path) -> tuple[str]:
    base.mkdir()
    return (str(base),)


def test_a_writer_that_fails_to_save_fails_every_rank_at_once(tmp_path: Path):
    """An error of the writer's other than an OSError (here: a lambda put into `extras`, which
    pickle refuses) raised on rank 0 alone, and rank 1, in the save's barrier, learnt of it only
    from the process group's timeout (NCCL's 10 minutes) or a lost connection (here: rank 0's
    next barrier released it as if saved, then gloo's "Connection closed by peer"). Now rank 1
    raises RankFailed naming rank 0's error at once."""
    spawn_ranks(_unpicklable_rank, lambda attempt: _fresh(tmp_path / f"try{attempt}"))
    base = sorted(tmp_path.glob("try*"))[-1]
    took0, said0 = (base / "rank0.txt").read_text().split(" ", 1)
    took1, said1 = (base / "rank1.txt").read_text().split(" ", 1)
    assert "pickle" in said0.lower() or "lambda" in said0, said0
    assert said1.startswith("RankFailed: shockslurm.train: rank 0 failed: "), said1
    assert said0.split(": ", 1)[0] in said1, (said0, said1)
    assert float(took1) < 30, took1
