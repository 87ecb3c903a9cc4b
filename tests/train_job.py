"""What the training-helper tests' job scripts share (tests/test_train_api.py, the early-signal
live test): the training loop after torch is imported, and the job's environment."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

# Appended to a script that has imported `shockslurm.train` (argv: checkpoint dir, output):
# torch, a small seeded model, three epochs through ShockTrainer, a stop when asked.
TRAIN_LOOP = r"""
import torch
from shockslurm.train import ShockTrainer
torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
gen = torch.Generator().manual_seed(1)
x, y = torch.randn(64, 4, generator=gen), torch.randint(0, 2, (64,), generator=gen)
with ShockTrainer(model, opt, ckpt_dir=sys.argv[1], every_steps=None, every_seconds=None) as st:
    print("resumed at", st.global_step, flush=True)
    for _, _, batches in st.epochs((x, y), 8, 3):
        for _, (xb, yb) in batches:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
            if st.step():
                print("stopped at", st.global_step, st.stop_reason, flush=True)
                st.save_and_exit()
    torch.save(model.state_dict(), sys.argv[2])
print("finished", st.global_step, flush=True)
"""


def job_env(**more: str) -> dict[str, str]:
    """This process's environment without Slurm's, ours and torchrun's variables (a job's
    starts clean), one OpenMP thread, and `more`."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "SHOCKSLURM_", "TORCHELASTIC_"))
           and k not in ("RANK", "WORLD_SIZE")}
    env.update(OMP_NUM_THREADS="1", **more)
    return env


def signal_rank_once_running(cmd: list[str], pids: Path, rank: int, env: dict[str, str],
                             after_s: float = 2.0) -> tuple[int, str]:
    """Run `cmd` (examples/train_ddp.py under torchrun with `--pid-dir pids`), send SIGUSR1 to
    `rank` `after_s` seconds after it wrote its pid (well into training); (rc, output)."""
    pids.mkdir(exist_ok=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)
    try:
        deadline = time.monotonic() + 120
        while not (pids / f"rank{rank}.pid").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
            time.sleep(0.1)
        time.sleep(after_s)
        os.kill(int((pids / f"rank{rank}.pid").read_text()), signal.SIGUSR1)
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, output
