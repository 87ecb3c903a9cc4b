"""DDP acceptance on the real Slurm test cluster (CPU torch, gloo): `examples/train_ddp.py`, two
ranks launched by `srun` in one job, each with its own `DataLoader(num_workers=2)` over
`st.sampler(dataset)`, is stopped three times mid-training and requeued, and ends with weights
bit-identical to an uninterrupted `torchrun` run; every sample index a rank loaded (its
DataLoader workers log them, `--shard-log`) lies in that rank's shard.

How it is preempted, as the daemon does it: `scancel --signal=USR1` (every task of the job's
steps gets it: both ranks), the ranks agree on the stop, rank 0 checkpoints, all exit 0 and the
job completes; `scontrol requeue` (and `StartTime=now`, sparing Slurm's 2-minute requeue delay) then starts it again (SLURM_RESTART_COUNT 1, 2, 3) and it
resumes from the newest good checkpoint. The job runs in the unmanaged partition `urgent` (no
daemon here: the stop/requeue cycle is what is tested). A stop is sent only after the run has
checkpointed past where it resumed, so each life trains.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")  # CI installs CPU torch (tests/run.sh); never skipped there

from .helpers import wait_for  # noqa: E402

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train_ddp.py"
EPOCHS = 3                  # 64 + 64 + 32 = 160 steps
STOPS = 3
TIMEOUT_S = 170
CKPT_RE = re.compile(r"^ckpt-(\d{12})\.pt$")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SHOCKSLURM_", "SLURM_")) and k not in ("RANK", "WORLD_SIZE")}
    env.update(OMP_NUM_THREADS="1", SHOCKSLURM_CONFIG="/nonexistent/shockslurm.toml")
    return env


def _state(job_id: int) -> str:
    """The job's state as the controller holds it (finished jobs too: MinJobAge)."""
    out = subprocess.run(["scontrol", "show", "job", "-o", str(job_id)], capture_output=True,
                         text=True, timeout=30).stdout
    found = re.search(r"\bJobState=(\w+)", out)
    return found.group(1) if found else "UNKNOWN"


def _newest(ckpt: Path) -> int:
    steps = [int(m.group(1)) for p in ckpt.glob("ckpt-*.pt") if (m := CKPT_RE.match(p.name))]
    return max(steps, default=0)


def _wait(what, timeout_s: float, why: str):
    return wait_for(what, timeout_s, why, every_s=0.5)


def test_ddp_two_ranks_survive_three_preemptions_bit_identical(tmp_path: Path, slurm_cluster):
    common = ["--epochs", str(EPOCHS), "--seed", "5", "--workers", "2", "--every-seconds", "1"]
    ref = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(EXAMPLE), "--ckpt-dir", str(tmp_path / "ref-ck"), "--out", str(tmp_path / "ref.pt"),
         *common], capture_output=True, text=True, timeout=TIMEOUT_S, env=_env())
    assert ref.returncode == 0, ref.stdout[-2000:] + ref.stderr[-3000:]

    ckpt, logs = tmp_path / "ck", tmp_path / "shards"
    logs.mkdir()
    script = tmp_path / "ddp.sbatch"
    script.write_text(
        "#!/bin/bash\n"
        "export MASTER_ADDR=127.0.0.1\n"
        "export MASTER_PORT=$((20000 + (SLURM_JOB_ID * 7 + ${SLURM_RESTART_COUNT:-0}) % 20000))\n"
        "srun --ntasks=2 --kill-on-bad-exit=1 bash -c 'RANK=$SLURM_PROCID "
        "LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS exec "
        f"{sys.executable} {EXAMPLE} --ckpt-dir {ckpt} --out {tmp_path / 'final.pt'} "
        f"--sleep 0.08 --shard-log {logs} {' '.join(common)}'\n")
    out = subprocess.run(["sbatch", "--parsable", "--partition", "urgent", "--nodes", "1",
                          "--ntasks", "2", "--cpus-per-task", "1", "--requeue",
                          "--job-name", "shockddp", "--output", str(tmp_path / "%x-%j.out"),
                          "--open-mode", "append", str(script)],
                         capture_output=True, text=True, timeout=60, env=_env(), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    job_id = int(out.stdout.strip().split(";")[0])
    try:
        resumed_at = 0
        stopped_at = []
        for n in range(STOPS):
            _wait(lambda: _state(job_id) == "RUNNING", 60, f"run {n} to start")
            _wait(lambda: _newest(ckpt) > resumed_at + 8, 90, f"run {n} to train and checkpoint")
            subprocess.run(["scancel", "--signal=USR1", str(job_id)], check=True, timeout=30)
            _wait(lambda: _state(job_id) in ("COMPLETED", "FAILED", "CANCELLED"), 60,
                  f"run {n} to stop")
            assert _state(job_id) == "COMPLETED", _state(job_id)
            resumed_at = _newest(ckpt)
            stopped_at.append(resumed_at)
            assert not (tmp_path / "final.pt").exists(), "finished before the stop"
            # Started again on its node within the second it ended there, the job would fail
            # at launch (credential revoked: shockslurm/live/credentials.py); the daemon waits
            # for the next second too
            time.sleep(math.floor(time.time()) + 1.02 - time.time())
            subprocess.run(["scontrol", "requeue", str(job_id)], check=True, timeout=30)
            # Slurm delays a requeued job's start by about 2 minutes (BeginTime); the daemon's
            # release does not wait that long either
            subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"],
                           check=True, timeout=30)
            _wait(lambda: _state(job_id) != "COMPLETED", 30, f"requeue {n}")
        _wait(lambda: _state(job_id) in ("COMPLETED", "FAILED", "CANCELLED")
              and (tmp_path / "final.pt").exists() or _state(job_id) in ("FAILED", "CANCELLED"),
              TIMEOUT_S, "the last run to finish")
        [log] = tmp_path.glob(f"shockddp-{job_id}.out")
        output = log.read_text()
        assert _state(job_id) == "COMPLETED", output[-3000:]
        print("stopped at steps", stopped_at)
        assert len(set(stopped_at)) == STOPS and max(stopped_at) < 160, stopped_at
        assert output.count("resumed ckpt-") == 2 * STOPS, output[-3000:]   # both ranks, 3x
        assert output.count("finished step 160") == 2, output[-3000:]

        want = torch.load(tmp_path / "ref.pt", weights_only=True)
        got = torch.load(tmp_path / "final.pt", weights_only=True)
        assert want.keys() == got.keys()
        assert all(torch.equal(want[k], got[k]) for k in want), "not bit-identical"

        from shockslurm.train.data import ResumableSampler
        shards = {r: set() for r in (0, 1)}
        for epoch in range(EPOCHS):
            for r in (0, 1):
                s = ResumableSampler(2048, seed=5, num_replicas=2, rank=r)
                s.set_epoch(epoch)
                shards[r] |= {(epoch, i) for i in s.indices()}
        for r in (0, 1):
            read = {tuple(int(v) for v in line.split())
                    for line in (logs / f"rank{r}.idx").read_text().splitlines()}
            assert {e for e, _ in read} == set(range(EPOCHS)), sorted(read)[:5]
            assert read <= shards[r], f"rank {r} read outside its shard: {sorted(read - shards[r])[:5]}"
        for e in range(EPOCHS):     # the two ranks' shards of an epoch are disjoint
            assert not {i for x, i in shards[0] if x == e} & {i for x, i in shards[1] if x == e}
    finally:
        subprocess.run(["scancel", str(job_id)], capture_output=True, timeout=30)
