"""job_submit.lua on the real cluster: GPU jobs of managed partitions are tagged and held, users
cannot release or resize them but can cancel them, and everything else is untouched."""

from __future__ import annotations

import subprocess
import time

import pytest

pytestmark = pytest.mark.slurm


def _sbatch(*args: str, user: str | None = None) -> tuple[int, str]:
    argv = ["sbatch", "--parsable", "-o", "/dev/null", *args]
    if user:
        argv = ["setpriv", f"--reuid={user}", "--regid=nogroup", "--clear-groups", *argv]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30, cwd="/tmp")
    assert out.returncode == 0, out.stderr
    return int(out.stdout.strip().split(";")[0]), out.stderr


def _show(job_id: int) -> dict[str, str]:
    line = subprocess.run(["scontrol", "-o", "show", "job", str(job_id)], capture_output=True,
                          text=True, timeout=10).stdout
    fields = {}
    for token in line.split():
        if "=" in token:
            key, value = token.split("=", 1)
            fields.setdefault(key, value)
    return fields


@pytest.fixture
def jobs():
    ids: list[int] = []
    yield ids
    if ids:
        subprocess.run(["scancel", *map(str, ids)], capture_output=True, timeout=30)


def test_gpu_job_is_tagged_and_held(slurm_cluster, jobs) -> None:
    job, stderr = _sbatch("--gres=gpu:2", "--comment=team-a", "--wrap", "sleep 30")
    jobs.append(job)
    info = _show(job)
    assert "shockslurm: job tagged and held" in stderr
    assert info["Comment"] == "team-a;shock:managed"
    assert info["AdminComment"] == "shock:req=gres:gpu:2"
    assert info["Priority"] == "0" and info["JobState"] == "PENDING"


def test_cpu_jobs_and_unmanaged_partitions_are_untouched(slurm_cluster, jobs) -> None:
    cpu, _ = _sbatch("--wrap", "sleep 1")
    urgent, _ = _sbatch("-p", "urgent", "--gres=gpu:1", "--wrap", "sleep 1")
    jobs += [cpu, urgent]
    for job in (cpu, urgent):
        info = _show(job)
        assert "shock:managed" not in info.get("Comment", "")
        assert info["Priority"] != "0"


def test_users_cannot_release_or_resize_but_can_cancel(slurm_cluster, jobs) -> None:
    job, _ = _sbatch("--gres=gpu:1", "--wrap", "sleep 30", user="nobody")
    jobs.append(job)
    as_nobody = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
    release = subprocess.run([*as_nobody, "scontrol", "release", str(job)], capture_output=True,
                             text=True, timeout=30)
    resize = subprocess.run([*as_nobody, "scontrol", "update", f"JobId={job}", "Gres=gpu:4"],
                            capture_output=True, text=True, timeout=30)
    assert release.returncode != 0 and resize.returncode != 0
    info = _show(job)
    assert info["Priority"] == "0" and info["TresPerNode"] == "gres:gpu:1"
    cancel = subprocess.run([*as_nobody, "scancel", str(job)], capture_output=True, text=True,
                            timeout=30)
    assert cancel.returncode == 0, cancel.stderr
    for _ in range(50):
        if _show(job).get("JobState") == "CANCELLED":
            break
        time.sleep(0.1)
    assert _show(job)["JobState"] == "CANCELLED"


def test_operator_can_release(slurm_cluster, jobs) -> None:
    job, _ = _sbatch("--gres=gpu:1", "--wrap", "sleep 1")
    jobs.append(job)
    assert subprocess.run(["scontrol", "release", str(job)], capture_output=True,
                          timeout=30).returncode == 0
    assert _show(job)["Priority"] != "0"
