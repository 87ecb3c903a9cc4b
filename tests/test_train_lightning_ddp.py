"""The Lightning callback under DDP with two CPU ranks (gloo), started by torchrun or by
Lightning itself (tests/lightning_ddp_job.py): each rank trains on its own half of the data, and
a run stopped by SIGUSR1 on rank 0 and resumed ends bit-identical to an uninterrupted one."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")        # CI installs both (tests/run.sh): never skipped
pytest.importorskip("lightning.pytorch")

from .train_job import job_env  # noqa: E402

JOB = Path(__file__).resolve().parent / "lightning_ddp_job.py"
LINE_RE = re.compile(r"^rank (\d) step (\d+) stopped (\w+) resumed (\S+)$", re.M)


LAUNCHERS = {"torchrun": [sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node", "2"],
             "lightning": [sys.executable]}      # Lightning starts rank 1 itself, in `fit`


def _run_with(launcher: str, ckpt: Path, out: Path, stop_at: int) -> list[tuple[str, ...]]:
    done = subprocess.run([*LAUNCHERS[launcher], str(JOB), str(ckpt), str(out), str(stop_at)],
                          capture_output=True, text=True, timeout=300, env=job_env())
    shown = f"rc {done.returncode}\nstdout:\n{done.stdout[-2000:]}\nstderr:\n{done.stderr[-3000:]}"
    assert done.returncode == 0, shown
    said = "".join(Path(f"{out}.rank{rank}").read_text() if Path(f"{out}.rank{rank}").exists()
                   else "" for rank in (0, 1))
    lines = sorted(LINE_RE.findall(said))
    assert len(lines) == 2, shown
    return lines


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_two_lightning_ranks_resume_bit_identical(tmp_path: Path, launcher: str):
    """160 samples in batches of 8 on 2 ranks: 10 steps an epoch, 20 in two. Under torchrun
    Lightning wrapped `cb.sampler()` in a DistributedSampler of its own and sharded it again
    (10 steps in all, each rank on a quarter of the data); and the checkpoint held rank 0's RNG
    states alone, so after a resume rank 1 drew rank 0's dropout masks and the weights differed
    at the end. Started by Lightning, the sampler was made before any rank knew the world size
    (rank 0 unsharded, rank 1 as rank 0 of 2): with Lightning's own sharding on top the
    ranks had 10 and 5 batches an epoch, and the run hung."""
    def _run(ckpt: Path, out: Path, stop_at: int) -> list[tuple[str, ...]]:
        return _run_with(launcher, ckpt, out, stop_at)

    reference = _run(tmp_path / "ref", tmp_path / "ref.pt", 0)
    assert reference == [("0", "20", "False", "None"), ("1", "20", "False", "None")], reference
    stopped = _run(tmp_path / "ck", tmp_path / "unused.pt", 5)
    assert stopped == [("0", "5", "True", "None"), ("1", "5", "True", "None")], stopped
    resumed = _run(tmp_path / "ck", tmp_path / "resumed.pt", 0)
    name = "ckpt-000000000005.pt"
    assert resumed == [("0", "20", "False", name), ("1", "20", "False", name)], resumed
    want, got = torch.load(tmp_path / "ref.pt"), torch.load(tmp_path / "resumed.pt")
    assert want.keys() == got.keys()
    assert all(torch.equal(want[k], got[k]) for k in want), "resumed weights differ"
