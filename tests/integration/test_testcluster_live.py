"""The test cluster after a run that was killed, not stopped (`testcluster.sh start`).

slurmctld saves its jobs and recovers them when it starts again. A test run killed mid-way
(its session cut, the machine's processes killed) left its jobs in the saved state; the next
run's cluster started them again, to take the GPUs of that run's first tests and preempt
their jobs (what three CI failures on 2026-12-03 looked like). The test kills the
running cluster with SIGKILL while it holds a running and a held job, starts it again with the
script, and asks for an empty queue, no job script left running and every node ready.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
from pathlib import Path

import pytest

from .conftest import SCRIPT, SlurmTestCluster
from .helpers import wait_for

pytestmark = pytest.mark.slurm

STATE_DIR = Path(os.environ.get("SHOCK_SLURM_DIR", "/tmp/shockslurm-cluster"))


def _sbatch(*args: str) -> int:
    out = subprocess.run(["sbatch", "--parsable", "-o", "/dev/null", *args], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.strip().split(";")[0])


def _squeue(*args: str) -> str:
    return subprocess.run(["squeue", "-h", *args], capture_output=True, text=True,
                          timeout=30).stdout


def _kill_cluster() -> None:
    """SIGKILL slurmctld, every slurmd and every slurmstepd: nothing gets to clean up."""
    for pid_file in [STATE_DIR / "slurmctld.pid", *STATE_DIR.glob("slurmd-*.pid")]:
        subprocess.run(["kill", "-9", pid_file.read_text().strip()], capture_output=True)
    subprocess.run(["pkill", "-9", "-x", "slurmstepd"], capture_output=True)


def test_a_killed_clusters_jobs_do_not_come_back(slurm_cluster: SlurmTestCluster) -> None:
    name = "killed-" + secrets.token_hex(4)
    seconds = str(6000 + secrets.randbelow(999))             # names the job's process
    running = _sbatch("-J", f"{name}-run", "-p", "urgent", "--gres=gpu:8", "--wrap", f"sleep {seconds}")
    held = _sbatch("-J", f"{name}-held", "-p", "urgent", "--gres=gpu:8", "--hold", "--wrap", "sleep 1")
    wait_for(lambda: _squeue("-j", str(running), "-o", "%T").strip() == "RUNNING", 60,
             "the job to run")
    job_state = STATE_DIR / "state" / "job_state"
    def saved() -> bool:
        try:                      # slurmctld replaces the file: it may be missing a moment
            data = job_state.read_bytes()
        except FileNotFoundError:
            return False
        return all(f"{name}-{j}".encode() in data for j in ("run", "held"))
    wait_for(saved, 60,
             "slurmctld to save both jobs")
    _kill_cluster()
    try:
        started = subprocess.run(["bash", str(SCRIPT), "start"], capture_output=True,
                                 text=True, timeout=600)
    finally:
        subprocess.run(["scancel", str(running), str(held)], capture_output=True, timeout=30)
    assert started.returncode == 0, started.stdout + started.stderr
    cancelled = re.search(r"cancelling jobs ([\d ]+),", started.stdout)
    assert cancelled and {running, held} <= set(map(int, cancelled.group(1).split())), \
        started.stdout
    assert _squeue("-o", "%i %T %j").strip() == "", _squeue("-o", "%i %T %j")
    leftover = subprocess.run(["pgrep", "-f", f"sleep {seconds}"], capture_output=True,
                              text=True)
    assert leftover.stdout == "", "the killed job's script still runs"
    wait_for(lambda: len(set(subprocess.run(
        ["sinfo", "-h", "-N", "-t", "idle", "-o", "%N"], capture_output=True, text=True,
        timeout=30).stdout.split())) == slurm_cluster.nodes, 30, "every node to be idle")
