"""A short smoke of `shockslurm bench live` on the real test cluster: five 8-GPU stand-in jobs
(40 GPUs asked of 32, 24 s each alone, arriving over 8 s), arms `native` (plain sbatch on the
unmanaged `urgent` partition) and `shockwave` (the real daemon as a subprocess, jobs through
shocksub, reports through the signed spool). Each arm takes about a minute. Both arms must
complete every job and the JSON must carry every field the README's table is made of."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from shockslurm.livebench.workload import _reshaped, default_workload
from shockslurm.workload.jsonl import write_jobs

pytestmark = pytest.mark.slurm

ARM_FIELDS = ("makespan_s", "avg_jct_s", "p99_jct_s", "worst_rho", "median_rho", "utilization",
              "stops", "idle_gpu_s", "simulated", "completed", "jobs", "series")
DAEMON_FIELDS = ("signals", "releases", "daemon_rounds", "switch_usr1_to_exit_s",
                 "switch_usr1_to_successor_running_s", "release_to_running_s",
                 "released_wait_gpu_s", "released_wait_share")


def _tiny_workload(path: Path) -> None:
    jobs = [replace(_reshaped(j, 24.0), gang_size=8, arrival_s=2.0 * k, job_id=k)
            for k, j in enumerate(default_workload(32)[:5])]
    write_jobs(jobs, path)


def test_bench_live_smoke(tmp_path: Path, slurm_cluster):
    workload = tmp_path / "tiny.jsonl"
    _tiny_workload(workload)
    out = tmp_path / "live.json"
    argv = [sys.executable, "-m", "shockslurm.cli.main", "bench", "live", "--workload",
            str(workload), "--arms", "native,shockwave", "--time-scale", "1",
            "--round-seconds", "6", "--grace-seconds", "5", "--arm-timeout", "150",
            "--workdir", str(tmp_path / "work"), "--json", str(out),
            "--plot", str(tmp_path / "plots")]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=420)
    assert result.returncode == 0, result.stderr[-3000:]
    doc = json.loads(out.read_text())
    arms = {a["arm"]: a for a in doc["arms"]}
    assert set(arms) == {"native", "shockwave"}
    for name, arm in arms.items():
        assert not arm["timed_out"] and not arm["failed_jobs"], (name, arm)
        assert arm["completed"] == arm["jobs"] == 5, (name, arm)
        assert all(field in arm for field in ARM_FIELDS), (name, sorted(arm))
        # five 24 s jobs, at most four at once: nobody finishes before 2 x 24 s
        assert 48 <= arm["makespan_s"] < 150, (name, arm["makespan_s"])
        assert 0 < arm["utilization"] <= 1
        assert arm["simulated"]["makespan_s"] > 0
    assert arms["native"]["simulated"]["policy"] == "fifo"
    managed = arms["shockwave"]
    assert all(field in managed for field in DAEMON_FIELDS), sorted(managed)
    assert managed["releases"] >= 5 and managed["daemon_rounds"] >= 5
    # every stand-in reported through the signed spool: the daemon stored its reports
    rejected = tmp_path / "work" / "shockwave" / "spool.rejected"
    assert not rejected.exists() or not any(rejected.iterdir())
    with sqlite3.connect(tmp_path / "work" / "shockwave" / "store.db") as db:
        (reporting,) = db.execute("SELECT COUNT(DISTINCT job_pk) FROM throughput_samples")\
            .fetchone()
        (epochs,) = db.execute("SELECT COUNT(*) FROM job_events WHERE kind = 'epoch_done'")\
            .fetchone()
    assert reporting == 5 and epochs > 0
    assert "| makespan s, live (sim) |" in result.stdout
    assert (tmp_path / "plots" / "rho-by-policy.png").exists()
    # nothing of either arm is left in Slurm
    left = subprocess.run(["squeue", "-h", "-o", "%j %T"], capture_output=True, text=True,
                          timeout=30).stdout
    prefixes = [a["prefix"] for a in doc["arms"]]
    assert not [ln for ln in left.splitlines() if ln.split()[0].startswith(tuple(prefixes))
                and ln.split()[1] not in ("COMPLETED", "CANCELLED")]
