"""kill -9 at random moments while checkpoints are being written: a fresh loader always finds a
good checkpoint, and the next writer resumes from it.

To keep 60 trials well under a minute, one server process imports torch once and forks a writer
per trial; the test SIGKILLs the writer at a seeded random moment, then loads the directory itself.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")  # CI installs torch (tests/run.sh); never skipped there

from shockslurm.train.checkpoint import CheckpointManager, read_checkpoint  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TRIALS = 60
SEED = 20240917

SERVER = r"""
import os, sys
import torch
from shockslurm.train.checkpoint import CheckpointManager

ckdir = sys.argv[1]
os.write(1, b"ready\n")
for line in sys.stdin:
    if line.strip() != "go":
        break
    pid = os.fork()
    if pid == 0:
        try:
            found = CheckpointManager(ckdir).load_latest()
            step = 0
            if found is not None:
                state = found[1]
                step = state["step"]
                assert torch.equal(state["w"], torch.full((300_000,), float(step)))
            mgr = CheckpointManager(ckdir, keep=3, is_writer=True)
            os.write(1, f"resumed {step}\n".encode())
            while True:
                step += 1
                mgr.save({"format": 1, "step": step, "w": torch.full((300_000,), float(step))},
                         step)
                os.write(1, f"saved {step}\n".encode())
        finally:
            os._exit(3)
    # one write each: under PYTHONUNBUFFERED print() writes the newline separately, and the
    # child's lines could land in between
    os.write(1, f"child {pid}\n".encode())
    _, status = os.waitpid(pid, 0)
    os.write(1, f"reaped {status}\n".encode())
"""


def _readline(proc) -> str:
    line = proc.stdout.readline()
    assert line, "checkpoint server died"
    return line.strip()


def test_kill9_while_checkpointing_always_leaves_a_good_checkpoint(tmp_path):
    rng = random.Random(SEED)
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1")
    env.pop("RANK", None)
    env.pop("SLURM_PROCID", None)
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(tmp_path)], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
    t_start = time.monotonic()
    try:
        assert _readline(proc) == "ready"
        good_step = 0
        torn_tmp = 0
        for trial in range(TRIALS):
            proc.stdin.write("go\n")
            proc.stdin.flush()
            pid = int(_readline(proc).split()[1])
            resumed = _readline(proc)
            assert resumed == f"resumed {good_step}", f"trial {trial}: {resumed}"
            if trial == 0:          # make sure there is something to protect from then on
                while not CheckpointManager(tmp_path).checkpoints():
                    time.sleep(0.001)
            time.sleep(rng.uniform(0.0, 0.12))
            os.kill(pid, signal.SIGKILL)
            # read the writer's lines up to the reaping (the server waits for it)
            while True:
                line = _readline(proc)
                if line.startswith("reaped"):
                    break
            assert os.WIFSIGNALED(int(line.split()[1])), line
            torn_tmp += any(p.name.endswith(".tmp") for p in tmp_path.iterdir())
            found = CheckpointManager(tmp_path).load_latest()      # a fresh loader
            assert found is not None, f"trial {trial}: no good checkpoint"
            path, state = found
            assert state["step"] >= good_step
            assert torch.equal(state["w"], torch.full((300_000,), float(state["step"])))
            assert path.name == f"ckpt-{state['step']:012d}.pt"
            # every checkpoint file present is whole (tmp files are never renamed in half), and
            # has its checksum sidecar (written before it)
            for _, p in CheckpointManager(tmp_path).checkpoints():
                read_checkpoint(p)
            good_step = state["step"]
        assert good_step > TRIALS       # it made progress across the kills
        print(f"{TRIALS} kill -9 trials, final step {good_step}, killed mid-write (tmp left) "
              f"{torn_tmp} times, {time.monotonic() - t_start:.1f} s")
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
    assert time.monotonic() - t_start < 90
