"""job_submit.lua on the real cluster (Slurm 22.05), run as an unprivileged user created for the
module: GPU jobs of managed partitions are tagged and held; users cannot release, resize or
re-comment them but can cancel them; every way of turning an untagged job into a GPU job of a
managed partition (`scontrol update` of Gres, TresPerNode, TresPerJob, TresPerSocket,
TresPerTask, Partition, Comment, and release) is refused, so the job never runs untagged with
GPUs there; tag text on a job the plugin does not hold is refused; and the plugin's tag rule
agrees with the daemon's (`SlurmJob.managed`) on the comment Slurm stores.
"""

from __future__ import annotations

import os
import subprocess
import time
from typing import Iterator

import pytest

from shockslurm.live.job_nodes import pins_allowed
from shockslurm.slurm.parse import parse_squeue
from shockslurm.slurm.types import JobState, SlurmJob

pytestmark = pytest.mark.slurm

MANAGED_PARTITIONS = {"gpu"}            # as in the plugin's MANAGED_PARTITIONS ("" = default = gpu)
TRES_FIELDS = ("tres_per_node", "tres_per_job", "tres_per_socket", "tres_per_task")


@pytest.fixture(scope="module")
def user(slurm_cluster) -> Iterator[str]:
    """A throwaway unprivileged login-less user (same host = the nodes, so it resolves there)."""
    name = f"shockplug{os.getpid() % 100000}"
    subprocess.run(["useradd", "-M", "-s", "/usr/sbin/nologin", name], check=True,
                   capture_output=True, timeout=30)
    try:
        yield name
    finally:
        subprocess.run(["scancel", "-u", name], capture_output=True, timeout=30)
        for _ in range(50):             # userdel refuses while the user's job steps still run
            if not subprocess.run(["squeue", "-h", "-u", name, "-t", "R,CG"], capture_output=True,
                                  text=True, timeout=10).stdout.strip():
                break
            time.sleep(0.2)
        subprocess.run(["userdel", name], capture_output=True, timeout=30)


def _run(argv: list[str], user: str | None = None) -> subprocess.CompletedProcess[str]:
    if user:
        argv = ["runuser", "-u", user, "--", *argv]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, cwd="/tmp")


def _try_sbatch(*args: str, user: str | None = None) -> subprocess.CompletedProcess[str]:
    return _run(["sbatch", "--parsable", "-o", "/dev/null", *args], user)


def _sbatch(*args: str, user: str | None = None) -> tuple[int, str]:
    out = _try_sbatch(*args, user=user)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.strip().split(";")[0]), out.stderr


def _update(job_id: int, *fields: str, user: str | None = None) -> int:
    return _run(["scontrol", "update", f"JobId={job_id}", *fields], user).returncode


def _tres(job: SlurmJob, field: str = "tres_per_node") -> str:
    """A tres_per_* field in 22.05's spelling (24.11+ write "gres/gpu:N" for "gres:gpu:N")."""
    return str(job.raw.get(field) or "").replace("gres/", "gres:")


def _update_partition(job_id: int, partition: str) -> int:
    """An operator's partition change. 26.05.5 answers some with "Resource temporarily
    unavailable" (rc 1) and applies the same update when it is sent again."""
    for _ in range(5):
        if (rc := _update(job_id, f"Partition={partition}")) == 0:
            return rc
        time.sleep(0.5)
    return rc


def _job(job_id: int) -> SlurmJob:
    """The job as the daemon reads it (squeue --json, parsed by shockslurm)."""
    out = _run(["squeue", "--json", "--states=all"])   # 24.11+ leave finished jobs out otherwise
    assert out.returncode == 0, out.stderr
    found = [j for j in parse_squeue(out.stdout) if j.job_id == job_id]
    assert found, f"job {job_id} not in squeue --json"
    return found[0]


def _asks_gpus(job: SlurmJob) -> bool:
    return any("gpu" in str(job.raw.get(name) or "") for name in TRES_FIELDS)


def _in_managed_partition(job: SlurmJob) -> bool:
    return bool(set(job.partition.split(",")) & MANAGED_PARTITIONS)


def _assert_not_bypassed(job_id: int, seconds: float = 3.0) -> SlurmJob:
    """For `seconds` (long enough for the scheduler to start a released job): in a managed
    partition, a tagged job stays held and an untagged one neither asks for nor holds GPUs."""
    deadline = time.monotonic() + seconds
    while True:
        job = _job(job_id)
        if _in_managed_partition(job):
            if job.managed:
                assert job.held, f"tagged job {job_id} released by a user: {job}"
            else:
                assert not _asks_gpus(job), f"untagged GPU job in {job.partition}: {job}"
                assert not job.gres_detail, f"job {job_id} runs with GPUs: {job.gres_detail}"
        if job.state is not JobState.PENDING or time.monotonic() > deadline:
            return job
        time.sleep(0.2)


@pytest.fixture
def jobs() -> Iterator[list[int]]:
    ids: list[int] = []
    yield ids
    if ids:
        subprocess.run(["scancel", *map(str, ids)], capture_output=True, timeout=30)


# --- submit -------------------------------------------------------------------------------------

def test_gpu_job_is_tagged_and_held(slurm_cluster, user, jobs) -> None:
    job_id, stderr = _sbatch("--gres=gpu:2", "--comment=team-a", "--wrap", "sleep 30", user=user)
    jobs.append(job_id)
    job = _job(job_id)
    assert "shockslurm: job tagged and held" in stderr
    assert job.comment == "team-a;shock:managed" and job.managed
    assert job.admin_comment.replace("gres/", "gres:") == "shock:req=gres:gpu:2"
    assert job.held and job.reason == "JobHeldUser"


def test_the_users_own_node_list_is_recorded_where_pins_do_not_reach(slurm_cluster, user,
                                                                      jobs) -> None:
    """`-w gpu03`: the plugin records it in the admin comment (the daemon's pin replaces
    ReqNodeList), so the daemon knows the limits are the user's and never pins the job;
    `--exclude` comes back from squeue as is (a pin within the nodes left is kept)."""
    job_id, _ = _sbatch("--gres=gpu:2", "-w", "gpu03", "--wrap", "sleep 30", user=user)
    jobs.append(job_id)
    job = _job(job_id)
    assert job.admin_comment.endswith(";shock:nodes=gpu03"), job.admin_comment
    assert job.user_nodes == "gpu03" and job.required_nodes == "gpu03"
    assert not pins_allowed(job)
    plain, _ = _sbatch("--gres=gpu:2", "--exclude=gpu01", "--wrap", "sleep 30", user=user)
    jobs.append(plain)
    excluded = _job(plain)
    assert excluded.user_nodes == "" and excluded.excluded_nodes == "gpu01", excluded
    assert pins_allowed(excluded)         # pinned within the nodes it may run on


def test_cpu_jobs_and_unmanaged_partitions_are_untouched(slurm_cluster, user, jobs) -> None:
    cpu, _ = _sbatch("--wrap", "sleep 1", user=user)
    urgent, _ = _sbatch("-p", "urgent", "--gres=gpu:1", "--wrap", "sleep 1", user=user)
    jobs += [cpu, urgent]
    for job_id in (cpu, urgent):
        job = _job(job_id)
        assert not job.managed and job.priority != 0 and job.admin_comment == ""


@pytest.mark.parametrize("args", [
    ("--comment=shock:managed",),                       # CPU job with the tag
    ("--comment=a; shock:managed ",),                   # ... padded
    ("--comment=x\nshock:managed",),                    # ... as a substring
    ("-p", "urgent", "--gres=gpu:1", "--comment=shock:managed"),   # unmanaged GPU job
    ("-p", "gpu,urgent", "--gres=gpu:1"),               # GPU job, managed + unmanaged partitions
    ("-p", "urgent,gpu", "--gpus=1"),
    ("--gpus-per-task=1", "-n", "2"),                   # GPUs the daemon cannot size
    ("--gpus-per-socket=1", "--sockets-per-node=1"),
], ids=["cpu-tag", "cpu-padded-tag", "cpu-substring-tag", "urgent-tag", "mixed-partitions",
        "mixed-partitions-gpus", "gpus-per-task", "gpus-per-socket"])
def test_submit_refused(slurm_cluster, user, jobs, args) -> None:
    out = _try_sbatch(*args, "--wrap", "sleep 30", user=user)
    if out.returncode == 0:
        jobs.append(int(out.stdout.strip().split(";")[0]))
    assert out.returncode != 0, f"accepted: {out.stdout}"
    assert "shockslurm:" in out.stderr


@pytest.mark.parametrize("comment, expected", [
    ("x\nshock:managed", "x\nshock:managed;shock:managed"),   # substring: not the tag, appended
    (" shock:managed\t", "shock:managed"),                     # padded tag: made exact
    ("a;shock:managed;b", "a;b;shock:managed"),
    ("shock:managedX", "shock:managedX;shock:managed"),
    ("", "shock:managed"),
])
def test_gpu_job_comment_ends_with_the_exact_tag(slurm_cluster, user, jobs, comment,
                                                 expected) -> None:
    """Whatever tag-like text a GPU job brings, the stored comment has the exact token, so the
    daemon's rule finds it (with or without whitespace stripping) and agrees with the plugin."""
    job_id, _ = _sbatch("--gres=gpu:1", f"--comment={comment}", "--wrap", "sleep 30", user=user)
    jobs.append(job_id)
    job = _job(job_id)
    assert job.comment == expected
    assert "shock:managed" in job.comment.split(";")           # the exact token, unstripped
    assert job.managed and job.held                             # the daemon's decision = ours


def test_plugin_and_daemon_agree_on_every_stored_comment(slurm_cluster, user, jobs) -> None:
    """Across tag-like comments on CPU and GPU jobs: every job Slurm accepted is held by the plugin
    (priority 0 with shock:req) exactly when the daemon's rule calls it managed."""
    comments = ["shock:managed", "x\nshock:managed", " shock:managed ", "a;shock:managed\n",
                "shock:managed;;", "SHOCK:MANAGED", "shock:manage", "team-a", ""]
    for comment in comments:
        for resources in ((), ("--gres=gpu:1",), ("-p", "urgent", "--gres=gpu:1")):
            out = _try_sbatch(*resources, f"--comment={comment}", "--wrap", "sleep 30", user=user)
            if out.returncode != 0:
                continue
            job_id = int(out.stdout.strip().split(";")[0])
            jobs.append(job_id)
            job = _job(job_id)
            held_by_plugin = job.held and job.admin_comment.startswith("shock:req=")
            assert job.managed == held_by_plugin, (comment, resources, job.comment)


# --- modify: managed jobs -----------------------------------------------------------------------

def test_users_cannot_release_resize_or_retag_but_can_cancel(slurm_cluster, user, jobs) -> None:
    job_id, _ = _sbatch("--gres=gpu:1", "--comment=mine", "--wrap", "sleep 30", user=user)
    jobs.append(job_id)
    attempts = {
        "release": _run(["scontrol", "release", str(job_id)], user).returncode,
        "top": _run(["scontrol", "top", str(job_id)], user).returncode,
        "Gres": _update(job_id, "Gres=gpu:4", user=user),
        "TresPerNode": _update(job_id, "TresPerNode=", user=user),
        "Partition": _update(job_id, "Partition=urgent", user=user),
        "Comment": _update(job_id, "Comment=mine", user=user),      # would drop the tag
    }
    assert all(rc != 0 for rc in attempts.values()), attempts
    job = _assert_not_bypassed(job_id, seconds=0)
    assert job.held and job.managed and job.comment == "mine;shock:managed"
    assert job.partition == "gpu" and _tres(job) == "gres:gpu:1"
    cancel = _run(["scancel", str(job_id)], user)
    assert cancel.returncode == 0, cancel.stderr
    for _ in range(50):
        if _job(job_id).state is JobState.CANCELLED:
            break
        time.sleep(0.1)
    assert _job(job_id).state is JobState.CANCELLED


def test_operator_can_release_and_resize(slurm_cluster, user, jobs) -> None:
    job_id, _ = _sbatch("--gres=gpu:1", "--wrap", "sleep 1", user=user)
    jobs.append(job_id)
    assert _update(job_id, "Gres=gpu:2") == 0
    assert _run(["scontrol", "release", str(job_id)]).returncode == 0
    job = _job(job_id)
    assert job.priority != 0 and _tres(job) == "gres:gpu:2"


# --- modify: untagged jobs (the bypasses) -------------------------------------------------------

@pytest.mark.parametrize("field", [
    "Gres=gpu:8", "TresPerNode=gres:gpu:2", "TresPerJob=gres:gpu:2",
    "TresPerSocket=gres:gpu:1", "TresPerTask=gres:gpu:1",
])
def test_cpu_job_cannot_gain_gpus_in_a_managed_partition(slurm_cluster, user, jobs,
                                                        field) -> None:
    """A CPU job submitted held to `gpu`, given GPUs by an update, then released: the update is
    refused, so the job runs (if at all) without GPUs, never untagged with them."""
    job_id, _ = _sbatch("--hold", "-p", "gpu", "--wrap", "sleep 30", user=user)
    jobs.append(job_id)
    assert _update(job_id, field, user=user) != 0
    assert not _asks_gpus(_job(job_id)), "the refused update was applied in part"
    assert _run(["scontrol", "release", str(job_id)], user).returncode == 0
    _assert_not_bypassed(job_id)


@pytest.mark.parametrize("partition", ["gpu", "urgent,gpu"])
def test_gpu_job_cannot_move_into_a_managed_partition(slurm_cluster, user, jobs,
                                                      partition) -> None:
    job_id, _ = _sbatch("--hold", "-p", "urgent", "--gres=gpu:2", "--wrap", "sleep 30", user=user)
    jobs.append(job_id)
    assert _update(job_id, f"Partition={partition}", user=user) != 0
    assert _job(job_id).partition == "urgent"
    assert _run(["scontrol", "release", str(job_id)], user).returncode == 0
    _assert_not_bypassed(job_id)


def test_untagged_gpu_job_of_a_managed_partition_cannot_be_released(slurm_cluster, user,
                                                                     jobs) -> None:
    """An untagged GPU job in `gpu` (e.g. submitted before the plugin; made here by an operator's
    partition change) stays held: the user's release is refused."""
    job_id, _ = _sbatch("--hold", "-p", "urgent", "--gres=gpu:1", "--wrap", "sleep 30", user=user)
    jobs.append(job_id)
    assert _update_partition(job_id, "gpu") == 0                      # root: unrestricted
    assert _run(["scontrol", "release", str(job_id)], user).returncode != 0
    job = _job(job_id)
    assert not job.managed and job.held


@pytest.mark.parametrize("comment", ["shock:managed", "a;shock:managed", " shock:managed\n",
                                     "x\nshock:managed"])
def test_user_cannot_add_the_tag(slurm_cluster, user, jobs, comment) -> None:
    job_id, _ = _sbatch("--hold", "--wrap", "sleep 30", user=user)
    jobs.append(job_id)
    assert _update(job_id, f"Comment={comment}", user=user) != 0
    job = _job(job_id)
    assert not job.managed and "shock:managed" not in job.comment


def test_unrelated_updates_of_untagged_jobs_still_work(slurm_cluster, user, jobs) -> None:
    cpu, _ = _sbatch("--hold", "--wrap", "sleep 30", user=user)
    urgent, _ = _sbatch("--hold", "-p", "urgent", "--gres=gpu:1", "--wrap", "sleep 30", user=user)
    jobs += [cpu, urgent]
    assert _update(cpu, "Comment=note", "TimeLimit=5", user=user) == 0
    assert _update(urgent, "Gres=gpu:2", user=user) == 0
    assert _job(cpu).comment == "note"
    assert _tres(_job(urgent)) == "gres:gpu:2"
