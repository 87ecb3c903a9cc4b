"""`shockslurm status` and `shocksub --status` on the real Slurm test cluster: two held managed
jobs submitted with `shocksub --db` appear with their GPUs and state (pending, held by the
plugin), and with "-" progress (they never ran, so they never reported). Only this test's jobs
are checked and cancelled: the cluster is shared with other tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm


def _shocksub(tmp: Path, db: str, k: int, gpus: int) -> int:
    argv = [sys.executable, "-m", "shockslurm.cli.shocksub", "--gpus", str(gpus),
            "--partition", "gpu", "--job-name", f"shockstatus-{k}", "--model", "ResNet-18",
            "--epochs", "3", "--epoch-seconds", "5", "--output", str(tmp / "%x-%j.out"),
            "--script-dir", str(tmp / "scripts"), "--db", db, "--", "sleep", "30"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=tmp)
    assert out.returncode == 0, out.stderr
    assert "held for the meta-scheduler" in out.stderr
    return int(out.stdout.strip().splitlines()[-1])


def test_status_lists_held_managed_jobs(tmp_path: Path, slurm_cluster) -> None:
    db = str(tmp_path / "store.db")
    ours: list[int] = []
    try:
        for k, gpus in enumerate((2, 3)):
            ours.append(_shocksub(tmp_path, db, k, gpus))
        out = subprocess.run([sys.executable, "-m", "shockslurm.cli.main", "status", "--db", db,
                              "--json"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        rows = {r["job_id"]: r for r in json.loads(out.stdout)}
        for job_id, gpus in zip(ours, (2, 3)):
            row = rows[job_id]
            assert row["gpus"] == gpus and row["state"] == "PENDING", row
            assert row["reason"] == "JobHeldUser" or row["reason"].startswith("JobHeld"), row
            assert row["epochs"] == 3 and row["epochs_done"] is None and row["rho"] is None
            assert row["preempted"] == 0 and row["spec_source"] == "comment"
        table = subprocess.run([sys.executable, "-m", "shockslurm.cli.main", "status", "--db",
                                db], capture_output=True, text=True, timeout=60)
        assert table.returncode == 0, table.stderr
        lines = {line.split()[0]: line.split() for line in table.stdout.splitlines()[1:]}
        for job_id, gpus in zip(ours, (2, 3)):
            cells = lines[str(job_id)]
            assert cells[1] == f"shockstatus-{job_id - ours[0]}"
            assert cells[3] == "PENDING" and cells[5] == str(gpus) and cells[6] == "-"
        one = subprocess.run([sys.executable, "-m", "shockslurm.cli.shocksub", "--status",
                              str(ours[1]), "--db", db], capture_output=True, text=True,
                             timeout=60)
        assert one.returncode == 0, one.stderr
        head, row = one.stdout.splitlines()[:2]
        assert head.split()[0] == "JOBID" and row.split()[0] == str(ours[1])
        assert row.split()[5] == "3"
        assert "recent events: none" in one.stdout and "recent intents: none" in one.stdout
    finally:
        if ours:
            subprocess.run(["scancel", *map(str, ours)], capture_output=True, timeout=30)
