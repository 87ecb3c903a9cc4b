"""What the daemon relies on in scontrol and scancel, checked on the Slurm that runs here (22.05 on
the host; 24.11 and 26.05 through `bash docker/versions.sh VERSION tests/integration/...`):

- requeue delay: `scontrol requeuehold` then `release` leaves a job in Reason=BeginTime (Slurm
  sets its eligible time about 2 minutes ahead), and `scontrol update StartTime=now` clears it;
- pinning: `scontrol update ReqNodeList=<node>` on a held job shows up as squeue's
  `required_nodes`, the released job starts there, and `ReqNodeList=` clears the pin;
- comments: the plugin's tag in `comment` and its record in `admin_comment` (`shock:req=` and
  the job's tres_per_node, spelled `gres:gpu:N` by 22.05 and `gres/gpu:N` by 23.11+);
- `scancel --signal` names each job it could not signal on stderr (`SCANCEL_FAILED_RE`);
- a hold does not stop a running job: a release racing the round's `scontrol hold` leaves the
  job running outside the plan (`SlurmActions._started_before_hold` looks for it);
- `squeue --json` prints a job name that is no UTF-8 as its raw bytes (22.05): the backend reads
  each bad byte as U+FFFD.
"""

from __future__ import annotations

import re
import subprocess
import time
from typing import Iterator

import pytest

from shockslurm.live.enact import BEGIN_TIME_REASON, SCANCEL_FAILED_RE
from shockslurm.slurm.cli_backend import CliBackend
from shockslurm.slurm.sched_delay import (batch_sched_delay, release_delay_advice,
                                          scheduler_parameters)
from shockslurm.slurm.types import JobState, SlurmJob

pytestmark = pytest.mark.slurm


@pytest.fixture
def jobs(slurm_cluster) -> Iterator[list[int]]:
    ids: list[int] = []
    yield ids
    if ids:
        subprocess.run(["scancel", *map(str, ids)], capture_output=True, timeout=30)


def _sbatch(ids: list[int], *opts: str) -> int:
    out = subprocess.run(["sbatch", "--parsable", "-o", "/dev/null", "-D", "/tmp", *opts,
                          "--wrap", "sleep 300"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    ids.append(int(out.stdout.strip().split(";")[0]))
    return ids[-1]


def _scontrol(*args: str) -> None:
    out = subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, f"scontrol {' '.join(args)}: {out.stderr}"


def _job(job_id: int) -> SlurmJob:
    return next(j for j in CliBackend().jobs() if j.job_id == job_id)


def _wait(job_id: int, ok, what: str, timeout_s: float = 30.0) -> SlurmJob:
    deadline = time.monotonic() + timeout_s
    while True:
        job = _job(job_id)
        if ok(job):
            return job
        assert time.monotonic() < deadline, f"job {job_id} not {what} after {timeout_s} s: {job}"
        time.sleep(0.3)


def test_requeue_delay_is_begin_time_and_start_time_now_clears_it(jobs):
    job_id = _sbatch(jobs, "-p", "gpu", "--gres=gpu:1")
    assert _job(job_id).held
    _scontrol("release", str(job_id))
    _wait(job_id, lambda j: j.state is JobState.RUNNING, "RUNNING")
    _scontrol("requeuehold", str(job_id))
    held = _wait(job_id, lambda j: j.held and j.state is JobState.PENDING, "held again")
    assert held.restart_count == 1
    _scontrol("release", str(job_id))
    waiting = _wait(job_id, lambda j: j.reason == BEGIN_TIME_REASON, "in Reason=BeginTime", 30)
    assert waiting.state is JobState.PENDING
    time.sleep(6)                       # two scheduling passes (sched_interval=5): still waiting
    assert _job(job_id).state is JobState.PENDING
    _scontrol("update", f"JobId={job_id}", "StartTime=now")
    _wait(job_id, lambda j: j.state is JobState.RUNNING, "RUNNING after StartTime=now", 30)


def test_req_node_list_pins_a_held_job_and_an_empty_one_clears_it(jobs):
    pinned = _sbatch(jobs, "-p", "gpu", "--gres=gpu:1")
    _scontrol("update", f"JobId={pinned}", "ReqNodeList=gpu03")
    assert _job(pinned).required_nodes == "gpu03"
    _scontrol("release", str(pinned))
    running = _wait(pinned, lambda j: j.state is JobState.RUNNING, "RUNNING")
    assert running.node_list == "gpu03"
    cleared = _sbatch(jobs, "-p", "gpu", "--gres=gpu:1")
    _scontrol("update", f"JobId={cleared}", "ReqNodeList=gpu02")
    _scontrol("update", f"JobId={cleared}", "ReqNodeList=")
    assert _job(cleared).required_nodes == ""


def test_plugin_tag_and_request_record(jobs):
    job = _job(_sbatch(jobs, "-p", "gpu", "--gres=gpu:2", "--comment", "mine"))
    assert job.comment == "mine;shock:managed" and job.managed and job.held
    assert re.fullmatch(r"shock:req=gres[:/]gpu:2", job.admin_comment), job.admin_comment
    cpu = _job(_sbatch(jobs, "-p", "gpu", "--comment", "mine"))
    assert (cpu.comment, cpu.admin_comment, cpu.managed) == ("mine", "", False)


def test_scancel_signal_names_the_jobs_it_could_not_signal(jobs):
    """The daemon's stop (`scancel --signal=USR1 --batch`) on a running job, an unknown id and
    a finished job: rc 1, and stderr names exactly the two it could not reach (a plain scancel
    of an unknown id says nothing without -v, on every version here)."""
    live = _sbatch(jobs, "-p", "gpu")
    done = _sbatch(jobs, "-p", "gpu")
    _wait(live, lambda j: j.state is JobState.RUNNING, "RUNNING")
    subprocess.run(["scancel", str(done)], capture_output=True, timeout=30)
    _wait(done, lambda j: j.state is JobState.CANCELLED, "CANCELLED", 15)
    gone = 9_999_999
    out = subprocess.run(["scancel", "--signal=USR1", "--batch", str(live), str(gone), str(done)],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode != 0
    assert sorted(int(m) for m in SCANCEL_FAILED_RE.findall(out.stderr)) == [done, gone], \
        out.stderr


def test_the_test_cluster_starts_released_jobs_without_slurms_batch_delay(slurm_cluster) -> None:
    """testcluster.sh sets `batch_sched_delay=0`, as README "Slurm settings" asks of a site: the
    daemon reads it from the running slurmctld and has no advice to give."""
    backend = CliBackend()
    shown = backend.run(["scontrol", "show", "config"])
    assert shown.ok, shown.stderr
    params = scheduler_parameters(shown.stdout)
    assert params is not None and batch_sched_delay(params) == 0.0, params
    assert release_delay_advice(backend.run) is None


def test_a_hold_leaves_a_running_job_running(jobs):
    """`scontrol uhold` (the daemon's hold) on a job Slurm has just started (rc 0, priority 0,
    Reason JobHeldUser) does not stop it: the daemon must read which held jobs run and
    requeuehold them itself."""
    job_id = _sbatch(jobs, "-p", "gpu", "--gres=gpu:1")
    _scontrol("release", str(job_id))
    _wait(job_id, lambda j: j.state is JobState.RUNNING, "RUNNING")
    subprocess.run(["scontrol", "uhold", str(job_id)], capture_output=True, timeout=30)
    time.sleep(2)
    held = _job(job_id)
    assert held.state is JobState.RUNNING and held.priority == 0, held
    assert held.reason == "JobHeldUser" and not held.admin_held, held


def test_the_daemons_hold_is_a_user_hold_and_turns_an_admin_hold_into_one(jobs):
    """Root's `scontrol uhold` gives JobHeldUser (the daemon's holds), root's `scontrol hold`
    JobHeldAdmin (an administrator's, which the daemon leaves alone); `uhold` on an
    admin-held job makes it a user hold (how the daemon takes back the holds its versions
    before 2026-11-29 made with `hold`). `--begin` keeps it pending between the holds."""
    job_id = _sbatch(jobs, "-p", "gpu", "--gres=gpu:1", "--begin=now+3600")
    _scontrol("release", str(job_id))
    _scontrol("uhold", str(job_id))
    user = _job(job_id)
    assert user.priority == 0 and user.reason == "JobHeldUser" and not user.admin_held, user
    _scontrol("release", str(job_id))
    _scontrol("hold", str(job_id))
    admin = _job(job_id)
    assert admin.priority == 0 and admin.reason == "JobHeldAdmin" and admin.admin_held, admin
    _scontrol("uhold", str(job_id))
    back = _job(job_id)
    assert back.priority == 0 and back.reason == "JobHeldUser" and not back.admin_held, back


def test_squeue_prints_a_job_name_as_its_bytes_and_every_job_is_read(jobs):
    """A job name that is no UTF-8 (Latin-1 `résumé`) comes out of `squeue --json` as its raw
    bytes on 22.05: the backend's read ended in a UnicodeDecodeError, for every job, so any
    user could stop the daemon's rounds with a job name. Now each bad byte reads as U+FFFD."""
    job_id = _sbatch(jobs, "--hold", "--job-name=r\udce9sum\udce9")   # the bytes r\xe9sum\xe9
    raw = subprocess.run(["squeue", "--json"], capture_output=True, timeout=30).stdout
    name = _job(job_id).name                  # the backend's read of every job
    if b'"r\xe9sum\xe9"' in raw:               # 22.05: the raw bytes
        assert name == "r\ufffdsum\ufffd"
    else:                                     # a Slurm that escapes or replaces them
        assert name.startswith("r") and "sum" in name
