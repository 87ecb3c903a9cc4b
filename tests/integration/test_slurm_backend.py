"""CliBackend against the real Slurm test cluster (22.05 in CI): reads, actions, failures."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time

import pytest

from shockslurm.slurm.cli_backend import CliBackend
from shockslurm.slurm.types import JobState

pytestmark = pytest.mark.slurm

SCRIPT = "#!/bin/bash\nsleep 300 & wait $!\n"


def _sbatch(workdir: str, *opts: str) -> int:
    path = os.path.join(workdir, "job.sh")
    with open(path, "w") as fh:
        fh.write(SCRIPT)
    res = subprocess.run(["sbatch", "--parsable", "-o", os.path.join(workdir, "%j.out"),
                          *opts, path], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return int(res.stdout.strip().split(";")[0])


@pytest.fixture
def own_jobs(slurm_cluster):
    """Job ids this test submitted; all cancelled afterwards (never anyone else's)."""
    ids: list[int] = []
    yield ids
    if ids:
        subprocess.run(["scancel", *map(str, ids)], capture_output=True, timeout=60)


def _by_id(backend: CliBackend):
    return {j.job_id: j for j in backend.jobs()}


def test_read_resize_release_and_failures(own_jobs):
    work = tempfile.mkdtemp(prefix="shockslurm-it-")
    gpu = _sbatch(work, "--gres=gpu:2", "--job-name=it-gpu", "--comment=shock:spec=it")
    own_jobs.append(gpu)
    cpu = _sbatch(work, "--job-name=it-cpu")
    own_jobs.append(cpu)

    b = CliBackend()
    jobs = _by_id(b)
    assert b.calls["squeue"] == 1
    assert b.version().major_minor >= (22, 5)
    nodes = b.nodes()
    assert b.calls["sinfo"] == 2                      # one for version(), one for nodes()
    assert sum(n.gpus for n in nodes) > 0

    g = jobs[gpu]
    assert g.managed and g.held and g.state is JobState.PENDING
    assert g.gpus_per_node == 2 and g.comment.startswith("shock:spec=it")
    c = jobs[cpu]
    assert not c.managed and c.gpus == 0

    upd = b.run(["scontrol", "update", f"JobId={gpu}", "Gres=gpu:3", "StartTime=now"])
    assert upd.ok, upd.stderr
    rel = b.run(["scontrol", "release", str(gpu)])
    assert rel.ok, rel.stderr
    assert b.calls["scontrol"] == 2

    deadline = time.monotonic() + 60
    job = None
    while time.monotonic() < deadline:
        job = _by_id(b).get(gpu)
        if job and job.state is JobState.RUNNING:
            break
        time.sleep(0.5)
    assert job is not None and job.state is JobState.RUNNING, job
    assert job.gpus_per_node == 3
    assert len(job.gres_detail) == 1 and job.gres_detail[0].startswith("gpu:3(IDX:")
    detail = b.show_job(gpu)
    assert detail["JobState"] == "RUNNING" and detail["GRES"].startswith("gpu:3(IDX:")

    bad = b.run(["scontrol", "release", "999999"])
    assert not bad.ok and bad.returncode != 0
    assert "Invalid job id" in bad.stderr
    assert bad.seconds >= 0 and bad.argv == ("scontrol", "release", "999999")
