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


def test_the_cheap_change_check_reads_only_the_partitions_asked(own_jobs):
    """`active_job_states`: the text read honours -p (22.05's --json ignores it), names each
    active job of the partitions with its state, and a job that leaves changes the set."""
    work = tempfile.mkdtemp(prefix="shockslurm-it-")
    urgent = _sbatch(work, "-p", "urgent", "--job-name=it-urgent")
    own_jobs.append(urgent)
    gpu = _sbatch(work, "-p", "gpu", "--gres=gpu:1", "--job-name=it-gpu2")
    own_jobs.append(gpu)
    b = CliBackend()
    deadline = time.monotonic() + 30
    while (str(urgent), "RUNNING") not in b.active_job_states(["urgent"]):
        assert time.monotonic() < deadline, b.active_job_states(["urgent"])
        time.sleep(0.5)
    in_gpu = dict(b.active_job_states(["gpu"]))
    assert in_gpu.get(str(gpu)) == "PENDING" and str(urgent) not in in_gpu   # held by the plugin
    assert str(gpu) in dict(b.active_job_states(["urgent", "gpu"]))
    before = b.active_job_states(["urgent"])
    subprocess.run(["scancel", str(urgent)], check=True, timeout=30)
    deadline = time.monotonic() + 30
    while (after := b.active_job_states(["urgent"])) and str(urgent) in dict(after) \
            and dict(after)[str(urgent)] != "COMPLETING":
        assert time.monotonic() < deadline, after
        time.sleep(0.5)
    assert after != before
