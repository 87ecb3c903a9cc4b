"""`shockslurm bench round` on the live cluster: interrupted while it submits, it leaves no job
behind (its jobs are cancelled in a `finally` that SIGTERM reaches too)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.slurm


def _shockbench_jobs() -> list[str]:
    out = subprocess.run(["squeue", "-h", "-n", "shockbench", "-u", str(os.getuid()), "-o",
                          "%i %T"], capture_output=True, text=True, timeout=30, check=True)
    return [line for line in out.stdout.splitlines() if line.strip()]


def test_interrupted_bench_round_cancels_its_jobs(slurm_cluster):
    assert _shockbench_jobs() == []
    proc = subprocess.Popen([sys.executable, "-m", "shockslurm.cli.main", "bench", "round",
                             "--jobs", "400", "--yes"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while len(_shockbench_jobs()) < 5 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert proc.poll() is None, "the benchmark ended before it could be interrupted"
        submitted = len(_shockbench_jobs())
        assert submitted >= 5
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            subprocess.run(["scancel", "-n", "shockbench", "-u", str(os.getuid())], timeout=60)
    assert proc.returncode != 0
    left = _shockbench_jobs()
    # scancel is asynchronous for held jobs only briefly: allow a moment for the queue to drain
    for _ in range(50):
        if not [j for j in left if not j.endswith(("CANCELLED", "COMPLETING"))]:
            break
        time.sleep(0.2)
        left = _shockbench_jobs()
    assert [j for j in left if not j.endswith(("CANCELLED", "COMPLETING"))] == []
