"""A short smoke of `shockslurm bench live` on the real test cluster: five 8-GPU stand-in jobs
(40 GPUs asked of 32, 24 s each alone, arriving over 8 s; the last may run on gpu02 only), arms `native` (plain sbatch on the
unmanaged `urgent` partition) and `shockwave` (the real daemon as a subprocess, jobs through
shocksub, reports through the signed spool), each run twice (`--repeat 2`). Each arm takes
about a minute. Every run must complete every job, the JSON must carry every field the README's
table is made of, and the medians and paired ratios must be those of the runs."""

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


LIMITED_JOB, LIMITED_TO = 4, "gpu02"     # the last arrival may run on gpu02 only


def _tiny_workload(path: Path) -> None:
    jobs = [replace(_reshaped(j, 24.0), gang_size=8, arrival_s=2.0 * k, job_id=k,
                    allowed_nodes=frozenset({LIMITED_TO}) if k == LIMITED_JOB else None)
            for k, j in enumerate(default_workload(32)[:5])]
    write_jobs(jobs, path)


def _nodes_of_starts(out_dir: Path, name: str) -> list[str]:
    """The nodes each run of the job named `name` started on (the stand-in's start lines)."""
    return [line.rsplit(" on ", 1)[1] for out in sorted(out_dir.glob(f"{name}-*.out"))
            for line in out.read_text().splitlines() if line.startswith("start restart=")]


def test_bench_live_smoke(tmp_path: Path, slurm_cluster):
    workload = tmp_path / "tiny.jsonl"
    _tiny_workload(workload)
    out = tmp_path / "live.json"
    argv = [sys.executable, "-m", "shockslurm.cli.main", "bench", "live", "--workload",
            str(workload), "--arms", "native,shockwave", "--time-scale", "1",
            "--round-seconds", "6", "--grace-seconds", "5", "--arm-timeout", "150",
            "--workdir", str(tmp_path / "work"), "--json", str(out),
            "--plot", str(tmp_path / "plots"), "--repeat", "2"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=840)
    assert result.returncode == 0, result.stderr[-3000:]
    doc = json.loads(out.read_text())
    # interleaved: every arm once, then every arm again
    assert [(a["arm"], a["repeat"]) for a in doc["arms"]] == [
        ("native", 1), ("shockwave", 1), ("native", 2), ("shockwave", 2)]
    for run in doc["arms"]:
        name, arm = run["arm"], run
        assert not arm["timed_out"] and not arm["failed_jobs"], (name, arm)
        assert arm["completed"] == arm["jobs"] == 5, (name, arm)
        assert all(field in arm for field in ARM_FIELDS), (name, sorted(arm))
        # five 24 s jobs, at most four at once: nobody finishes before 2 x 24 s
        # no schedule beats the work bound: 5 jobs x 8 GPUs x 24 s over 32 GPUs
        assert 30 <= arm["makespan_s"] < 150, (name, arm["makespan_s"])
        assert 0 < arm["utilization"] <= 1
        assert arm["simulated"]["makespan_s"] > 0
    native_runs = [a for a in doc["arms"] if a["arm"] == "native"]
    shock_runs = [a for a in doc["arms"] if a["arm"] == "shockwave"]
    assert native_runs[0]["simulated"]["policy"] == "fifo"
    medians = {m["arm"]: m for m in doc["medians"]}
    for name, runs in (("native", native_runs), ("shockwave", shock_runs)):
        low, high = sorted(r["makespan_s"] for r in runs)
        assert medians[name]["runs"] == 2
        assert medians[name]["makespan_s"] == round((low + high) / 2, 4)
        assert medians[name]["range"]["makespan_s"]["min"] == low
    ratio = doc["ratios"]["shockwave"]["avg_jct_s"]
    pairs = sorted(s["avg_jct_s"] / n["avg_jct_s"] for n, s in zip(native_runs, shock_runs))
    assert ratio["n"] == 2 and ratio["min"] == round(pairs[0], 4)
    assert "Medians over 2 runs of each arm" in result.stdout
    assert "| shockwave | " in result.stdout        # the paired ratio table
    managed = shock_runs[-1]
    assert all(field in managed for field in DAEMON_FIELDS), sorted(managed)
    assert managed["releases"] >= 5 and managed["daemon_rounds"] >= 5
    # the job limited to one node (`nodes` in the workload, --exclude of the others) ran there
    for run in doc["arms"]:
        out_dir = tmp_path / "work" / f"repeat-{run['repeat']}" / run["arm"] / "out"
        starts = _nodes_of_starts(out_dir, f"{run['prefix']}{LIMITED_JOB}")
        assert starts and set(starts) == {LIMITED_TO}, (run["arm"], starts)
    # every stand-in reported through the signed spool: the daemon stored its reports
    arm_dir = tmp_path / "work" / "repeat-2" / "shockwave"
    rejected = arm_dir / "spool.rejected"
    assert not rejected.exists() or not any(rejected.iterdir())
    with sqlite3.connect(arm_dir / "store.db") as db:
        (reporting,) = db.execute("SELECT COUNT(DISTINCT job_pk) FROM throughput_samples")\
            .fetchone()
        (epochs,) = db.execute("SELECT COUNT(*) FROM job_events WHERE kind = 'epoch_done'")\
            .fetchone()
    assert reporting == 5 and epochs > 0
    assert "| makespan s, live (sim) |" in result.stdout
    assert (tmp_path / "plots" / "rho-by-policy.png").exists()
    assert (tmp_path / "plots" / "run-2-shockwave-timeline.png").exists()
    # nothing of either arm is left in Slurm
    left = subprocess.run(["squeue", "-h", "-o", "%j %T"], capture_output=True, text=True,
                          timeout=30).stdout
    prefixes = [a["prefix"] for a in doc["arms"]]
    assert not [ln for ln in left.splitlines() if ln.split()[0].startswith(tuple(prefixes))
                and ln.split()[1] not in ("COMPLETED", "CANCELLED")]
