"""Hostile specs on the real Slurm test cluster: jobs submitted with plain `sbatch --comment`
carrying the issue's specs (epochs 1e400, NaN, 1e9; samples_per_epoch 1e300; nested too deep)
beside a normal job. Through three daemon rounds the normal job is released and runs, every
hostile job stays held and is flagged once in the store, and no round ends in an outage.

Only the jobs this test submits are scheduled (`job_filter`); they are cancelled at the end.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from shockslurm.daemon import DaemonRunner, build_daemon, parse_config
from shockslurm.slurm.cli_backend import CliBackend
from shockslurm.slurm.types import JobState
from shockslurm.store import open_store
from shockslurm.store.models import Job, JobEvent

from .helpers import wait_for

pytestmark = pytest.mark.slurm

HOSTILE = ['{"epochs":1e400,"model":"LM"}', '{"epochs":NaN}', '{"epochs":1e9}',
           '{"samples_per_epoch":1e300}', "[" * 500]   # 22.05 refuses a comment of 2000


def _sbatch(tmp: Path, name: str, spec: str, seconds: int) -> int:
    out = subprocess.run(["sbatch", "--parsable", "--partition=gpu", "--gres=gpu:1",
                          f"--job-name={name}", f"--comment=shock:spec={spec}",
                          "-o", str(tmp / f"{name}-%j.out"), "--wrap", f"sleep {seconds}"],
                         capture_output=True, text=True, timeout=30, cwd=tmp)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.strip().split(";")[0])


def test_hostile_specs_stay_held_and_flagged_while_a_normal_job_runs(tmp_path: Path,
                                                                      slurm_cluster):
    ours: list[int] = []
    try:
        normal = _sbatch(tmp_path, "shockval-ok", '{"epochs":1,"epoch_seconds":2}', 2)
        ours.append(normal)
        hostile: list[int] = []
        for k, spec in enumerate(HOSTILE):
            hostile.append(_sbatch(tmp_path, f"shockval-bad{k}", spec, 60))
            ours.append(hostile[-1])             # cancelled at the end, even on a failure
        db = str(tmp_path / "store.db")
        cfg = parse_config({"daemon": {"round_seconds": 2, "grace_seconds": 1,
                                       "partitions": ["gpu"], "db": db}})
        engine = open_store(db, create=True)
        daemon = build_daemon(cfg, CliBackend(), engine=engine,
                              job_filter=lambda j: j.job_id in ours, emit=lambda _line: None)
        runner = DaemonRunner(daemon)
        for _ in range(3):
            assert runner.attempt() is None                 # a round, never an outage
            time.sleep(2)
        assert runner.outages == {"slurm": 0, "store": 0}

        def started() -> bool:      # released by a round; Slurm's pass may come a moment later
            ok = {j.job_id: j for j in CliBackend().jobs()}.get(normal)
            return ok is None or ok.state in (JobState.RUNNING, JobState.COMPLETING,
                                              JobState.COMPLETED)
        wait_for(started, 30, f"the normal job {normal} to start")
        jobs = {j.job_id: j for j in CliBackend().jobs() if j.job_id in ours}
        for jid in hostile:
            assert jobs[jid].managed and jobs[jid].held, jobs[jid]   # tagged by the plugin
        with Session(engine) as s:
            flagged = s.execute(select(Job.job_id, JobEvent.detail).join(
                JobEvent, JobEvent.job_pk == Job.id).where(JobEvent.kind == "flagged")).all()
        assert sorted(j for j, _ in flagged) == sorted(hostile)      # once each
        assert all(json.loads(d)["reason"].startswith("bad spec: comment, field ")
                   for _, d in flagged)
        engine.dispose()
    finally:
        if ours:
            subprocess.run(["scancel", *map(str, ours)], capture_output=True, timeout=30)
