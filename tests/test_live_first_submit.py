"""A requeued job keeps its identity: Slurm 22.05 sets `SubmitTime` anew at every requeue, and
the live scheduler keys a job by (job id, submit time) (`live/first_submit.py`)."""

from __future__ import annotations

from dataclasses import replace

from shockslurm.live.cluster import SlurmCluster
from shockslurm.live.first_submit import FirstSubmitTimes
from shockslurm.model import RoundPlan
from shockslurm.slurm.types import CommandResult, JobState

from .test_enact import job
from .test_live import FakeBackend, FakeClock, _exits_after


def test_a_requeue_keeps_the_first_submit_time_and_a_reused_id_does_not():
    times = FirstSubmitTimes()
    first = job(7, JobState.RUNNING)                            # submitted at 1007
    assert times.canonical(first) is first
    requeued = replace(first, state=JobState.PENDING, submit_time=1500.0, restart_count=1)
    assert times.canonical(requeued).submit_time == 1007.0
    assert times.canonical(replace(requeued, state=JobState.RUNNING)).submit_time == 1007.0
    again = replace(requeued, submit_time=2500.0, restart_count=2)      # a second requeue
    assert times.canonical(again).submit_time == 1007.0
    # the id reused by a new job (a controller reset): a later submit time, no more restarts
    reused = replace(first, submit_time=9000.0, restart_count=0)
    assert times.canonical(reused).submit_time == 9000.0
    assert times.canonical(replace(reused, restart_count=1, submit_time=9100.0)
                           ).submit_time == 9000.0
    times.forget_others([])
    assert times.canonical(replace(reused, submit_time=9100.0)).submit_time == 9100.0


class RequeueMovesSubmitTime(FakeBackend):
    """Like Slurm 22.05: `scontrol requeuehold` sets the job's submit time to now."""

    def __init__(self, jobs, now: float):
        super().__init__(jobs)
        self.now = now

    def run(self, argv):
        result: CommandResult = super().run(argv)
        if argv[1] == "requeuehold":
            ids = {int(i) for i in argv[2].split(",")}
            self._jobs = [replace(j, submit_time=self.now) if j.job_id in ids else j
                          for j in self._jobs]
        return result


def test_a_stopped_job_is_seen_with_its_submit_time_run_time_and_spec_after_its_requeue():
    """Job 1 runs, is stopped for job 2 (USR1, exit, requeuehold, which moves Slurm's submit
    time to 1050); the next round sees it as the job submitted at 1001 with the run time it had,
    behind no job submitted after it."""
    running = replace(job(1, JobState.RUNNING), start_time=700.0)
    b = RequeueMovesSubmitTime([running, job(2)], now=1050.0)
    clock = FakeClock()
    _exits_after(b, clock, 1, 1.0)
    c = SlurmCluster(b, grace_seconds=30, sleep=clock.sleep, monotonic=clock.monotonic)
    c.observe(960.0)
    snap = c.observe(1000.0)
    ran = c.jobs[1].run_time_s
    assert ran > 0 and {v.job_id: v.arrival_s for v in snap.jobs}[1] == 1001.0
    c.enact(RoundPlan(frozenset({2})), snap)
    assert ("scontrol", "requeuehold", "1") in b.log
    # the job exited (COMPLETED in the fake after its USR1): Slurm lists it pending again
    b._jobs = [replace(j, state=JobState.PENDING) if j.job_id == 1 else j for j in b._jobs]
    assert {j.job_id: j.submit_time for j in b.jobs()}[1] == 1050.0       # what Slurm says
    snap = c.observe(1060.0)
    view = {v.job_id: v for v in snap.jobs}[1]
    assert view.arrival_s == 1001.0
    assert c.jobs[1].run_time_s == ran
    assert c.jobs[1].slurm.submit_time == 1001.0
