"""SlurmCluster on a fake backend: two reads per observe, journal before each call, retries by
re-diffing, capacity net of foreign jobs, specs from the comment."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from shockslurm.churn_rules import ChurnLimits
from shockslurm.model import RoundPlan
from shockslurm.live.cluster import SlurmCluster
from shockslurm.live.specs import spec_from_comment
from shockslurm.slurm.types import CommandResult, JobState, SlurmError, SlurmNode

from .test_enact import job


class FakeBackend:
    name = "fake"

    def __init__(self, jobs, fail: set[str] = frozenset()):
        self._jobs = list(jobs)
        self.calls: Counter[str] = Counter()
        self.log: list[tuple[str, ...]] = []
        self.fail = set(fail)

    def jobs(self):
        self.calls["jobs"] += 1
        return list(self._jobs)

    def nodes(self):
        self.calls["nodes"] += 1
        return [SlurmNode(f"gpu0{i}", "idle", 8, 0, ("gpu",)) for i in range(1, 5)]

    def run(self, argv):
        argv = tuple(argv)
        self.log.append(argv)
        if argv[1] in self.fail:
            return CommandResult(argv, 1, "", "boom", 0.0)
        if argv[1] == "requeuehold":   # the stopped jobs go back to held pending at once
            ids = {int(i) for i in argv[2].split(",")}
            self._jobs = [replace(j, state=JobState.PENDING, priority=0,
                                  restart_count=j.restart_count + 1)
                          if j.job_id in ids else j for j in self._jobs]
        return CommandResult(argv, 0, "", "", 0.0)


class ListJournal:
    def __init__(self, backend):
        self.backend, self.events = backend, []

    def begin_round(self, snapshot, plan, jobs):
        self.events.append(("round", len(jobs)))

    def intent(self, step):
        self.events.append(("intent", step.argv, len(self.backend.log)))
        return step

    def outcome(self, handle, result):
        self.events.append(("outcome", result.argv, result.returncode))

    def job_ended(self, job, final, now):
        self.events.append(("ended", job.slurm.job_id, final and final.state.value))


def test_observe_reads_twice_and_nets_foreign_gpus():
    foreign = replace(job(9, JobState.RUNNING, managed=False), gpus_per_node=3)
    b = FakeBackend([job(1), job(2, JobState.RUNNING), foreign,
                     job(3, JobState.COMPLETED)])
    c = SlurmCluster(b, grace_seconds=0, sleep=lambda s: None)
    snap = c.observe(100.0)
    assert b.calls == Counter({"jobs": 1, "nodes": 1})
    assert snap.gpus == 32 - 3
    assert sorted(v.job_id for v in snap.jobs) == [1, 2]
    view = snap.job(1)
    assert view.num_epochs == 3 and view.gang_size == 2 and view.iterations_per_s > 0


def test_intent_written_before_each_call_and_failed_release_retried():
    b = FakeBackend([job(1, JobState.RUNNING), job(2)], fail={"release"})
    c = SlurmCluster(b, grace_seconds=0, sleep=lambda s: None)
    c.journal = j = ListJournal(b)
    c.enact(RoundPlan(frozenset({2})), c.observe(0.0))
    intents = [e for e in j.events if e[0] == "intent"]
    assert [e[1][:2] for e in intents] == [("scancel", "--signal=USR1"),
                                           ("scontrol", "requeuehold"), ("scontrol", "release")]
    # every intent was recorded when the backend had not yet run that command
    assert [e[2] for e in intents] == [0, 1, 2]
    assert c.last_stats.failed_calls == 1
    b.fail = set()
    b.log.clear()
    c.enact(RoundPlan(frozenset({2})), c.observe(6.0))
    assert b.log == [("scontrol", "release", "2")]
    assert b.calls["jobs"] == 4   # 2 observes; round 1 stops: 1 check before the requeue, 1 poll
    assert spec_from_comment('shock:spec={"epochs":3};shock:managed') == {"epochs": 3}


def test_stop_when_idle():
    b = FakeBackend([job(1)])
    c = SlurmCluster(b, stop_when_idle=True)
    c.observe(0.0)
    assert not c.finished()
    b._jobs = [replace(b._jobs[0], state=JobState.COMPLETED)]
    c.observe(5.0)
    assert c.finished()
    assert c.next_round_start(5.0, 120.0) == 125.0


def test_job_that_finished_before_the_signal_is_not_requeued():
    """One scancel per job: job 1 finished on its own (its signal fails), job 3 is signalled and
    requeued; job 1 is not requeued (requeuehold would rerun a COMPLETED job)."""
    b = FakeBackend([job(1, JobState.RUNNING), job(3, JobState.RUNNING)])
    original = b.run

    def run(argv):
        if argv[0] == "scancel":
            b.log.append(tuple(argv))
            if argv[-1] != "1":
                return CommandResult(tuple(argv), 0, "", "", 0.0)
            b._jobs = [replace(j, state=JobState.COMPLETED) if j.job_id == 1 else j
                       for j in b._jobs]
            return CommandResult(tuple(argv), 1, "",
                                 "scancel: error: Kill job error on job id 1: Invalid job id "
                                 "specified\n", 0.0)
        return original(argv)

    b.run = run
    c = SlurmCluster(b, grace_seconds=0, sleep=lambda s: None)
    c.enact(RoundPlan(frozenset()), c.observe(0.0))
    assert ("scontrol", "requeuehold", "3") in b.log
    assert not any(a[1] == "requeuehold" and "1" in a[2].split(",") for a in b.log)


def test_a_failed_signal_keeps_the_job_and_its_gpus_for_this_round():
    """scancel fails with nothing to say (rc 229, empty stderr, as seen live): the job may not
    have its USR1, so it is not requeued (it would lose its work since its checkpoint); it keeps
    its GPUs, so the planned start that needs them waits; the next round signals it afresh."""
    b = FakeBackend([job(1, JobState.RUNNING, gpus=32), job(2, JobState.PENDING, gpus=32)])
    original = b.run

    def run(argv):
        if argv[0] == "scancel":
            b.log.append(tuple(argv))
            return CommandResult(tuple(argv), 229, "", "", 0.0)
        return original(argv)

    b.run = run
    c = SlurmCluster(b, grace_seconds=0, sleep=lambda s: None)
    c.enact(RoundPlan(frozenset({2})), c.observe(0.0))
    assert b.log == [("scancel", "--signal=USR1", "--batch", "1")]   # no requeue, no release
    assert c.last_stats.started == 0 and c.last_stats.stopped == 0
    assert 1 in c.allowed_running
    b.run = original                                                 # next round: it works
    c.enact(RoundPlan(frozenset({2})), c.observe(120.0))
    assert [a[:2] for a in b.log[1:]] == [("scancel", "--signal=USR1"),
                                          ("scontrol", "requeuehold"), ("scontrol", "release")]


def test_a_job_that_had_finished_before_its_signal_is_not_requeued_now_or_later():
    """Slurm still showed job 1 RUNNING when the round read it, but its script had exited: the
    USR1 finds no process (scancel still says 0). Requeued, a finished job would run again.
    Job 2 ends after its signal (checkpoint, exit 0): that one is requeued."""
    b = FakeBackend([job(1, JobState.RUNNING), job(2, JobState.RUNNING)])
    original = b.run

    def run(argv):
        if argv[0] == "scancel":
            b.log.append(tuple(argv))
            jid = int(argv[-1])
            end = 990.0 if jid == 1 else 1002.0          # the round starts at 1000
            b._jobs = [replace(j, state=JobState.COMPLETED, end_time=end)
                       if j.job_id == jid else j for j in b._jobs]
            return CommandResult(tuple(argv), 0, "", "", 0.0)
        return original(argv)

    b.run = run
    c = SlurmCluster(b, grace_seconds=0, sleep=lambda s: None)
    c.enact(RoundPlan(frozenset()), c.observe(1000.0))
    requeued = [a for a in b.log if a[1] == "requeuehold"]
    assert requeued == [("scontrol", "requeuehold", "2")], b.log
    b.run = original
    b.log.clear()
    c.enact(RoundPlan(frozenset()), c.observe(1010.0))      # no resumed stop for job 1 either
    assert not any(a[1] == "requeuehold" for a in b.log), b.log


def test_a_usr1_whose_call_timed_out_is_resumed_as_a_stop_begun():
    """`scancel --signal=USR1` timed out, but the signal reached job 1, which saved and exited
    (COMPLETED at 1002): the round is given up at the failure, and the next requeueholds the
    job, without a second USR1. It was taken as never sent, and the job stayed COMPLETED, its
    training over (here without a store: the cluster's own memory of the stop)."""
    b = FakeBackend([job(1, JobState.RUNNING), job(2)])
    original = b.run

    def run(argv):
        if argv[0] == "scancel":
            b.log.append(tuple(argv))
            b._jobs = [replace(j, state=JobState.COMPLETED, end_time=1002.0)
                       if j.job_id == 1 else j for j in b._jobs]
            raise SlurmError(f"{' '.join(argv)} timed out after 30 s", argv=tuple(argv))
        return original(argv)

    b.run = run
    c = SlurmCluster(b, grace_seconds=0, sleep=lambda s: None)
    with pytest.raises(SlurmError, match="cannot be reached"):
        c.enact(RoundPlan(frozenset({2})), c.observe(1000.0))
    b.run = original
    b.log.clear()
    c.enact(RoundPlan(frozenset({2})), c.observe(1010.0))
    assert [a[:2] for a in b.log] == [("scontrol", "requeuehold"), ("scontrol", "release")]
    assert b.log[0][2] == "1", b.log


class FakeClock:
    """Monotonic time that only moves when the cluster sleeps."""

    def __init__(self) -> None:
        self.t = 0.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.t += s


def _exits_after(b: FakeBackend, clock: FakeClock, job_id: int, after_s: float | None):
    """Job `job_id` exits (COMPLETED) `after_s` seconds after its USR1; None: never."""
    original = b.run
    signalled: list[float] = []

    def jobs():
        b.calls["jobs"] += 1
        if signalled and after_s is not None and clock.t >= signalled[0] + after_s:
            b._jobs = [replace(j, state=JobState.COMPLETED, end_time=1000.0 + clock.t)
                       if j.job_id == job_id and j.state is JobState.RUNNING else j
                       for j in b._jobs]
        return list(b._jobs)

    def run(argv):
        if argv[0] == "scancel":
            signalled.append(clock.t)
        return original(argv)

    b.jobs, b.run = jobs, run
    return signalled


def test_a_stopped_job_is_requeued_as_soon_as_it_has_exited_not_after_the_whole_grace():
    """Job 1 saves and exits 1.3 s after its USR1: the requeuehold follows at the next poll
    (0.5 s steps), not 30 s later; its successor starts in the same round."""
    b = FakeBackend([job(1, JobState.RUNNING), job(2)])
    clock = FakeClock()
    signalled = _exits_after(b, clock, 1, 1.3)
    c = SlurmCluster(b, grace_seconds=30, sleep=clock.sleep, monotonic=clock.monotonic)
    c.enact(RoundPlan(frozenset({2})), c.observe(1000.0))
    assert [a[:2] for a in b.log] == [("scancel", "--signal=USR1"),
                                      ("scontrol", "requeuehold"), ("scontrol", "release")]
    assert signalled == [0.0]
    assert 1.3 <= c.last_stats.grace_wait_s <= 1.3 + 0.5
    assert clock.t < 2.0


def test_a_job_that_ignores_its_signal_is_requeued_at_the_grace_deadline():
    b = FakeBackend([job(1, JobState.RUNNING), job(2)])
    clock = FakeClock()
    _exits_after(b, clock, 1, None)
    c = SlurmCluster(b, grace_seconds=30, sleep=clock.sleep, monotonic=clock.monotonic)
    c.enact(RoundPlan(frozenset({2})), c.observe(1000.0))
    assert [a[:2] for a in b.log] == [("scancel", "--signal=USR1"),
                                      ("scontrol", "requeuehold"), ("scontrol", "release")]
    assert c.last_stats.grace_wait_s == 30.0


def starts_at_hold(b: FakeBackend, started) -> None:
    """Slurm starts `started` (the job as it then shows) just as `scontrol hold` goes out for
    it: the hold succeeds (rc 0) and the job runs on, as on 22.05."""
    original = b.run

    def run(argv):
        if argv[1] == "uhold":
            b.log.append(tuple(argv))
            b._jobs = [started if j.job_id == started.job_id else j for j in b._jobs]
            return CommandResult(tuple(argv), 0, "", "", 0.0)
        return original(argv)

    b.run = run


def test_a_job_started_before_its_hold_is_requeueheld_and_its_gpus_go_to_the_plan():
    """Job 1 was released last round and still waits; this round's plan runs job 2 instead.
    Slurm starts job 1 between the round's read and the hold; `scontrol hold` succeeds on a
    running job (22.05: rc 0, the job runs on). Job 1 then runs outside the plan on job 2's
    GPUs; with no churn bounds to keep it, it is requeueheld at once, and job 2 released once
    its GPUs are free (before: job 1 ran on until the next round, job 2 waited for its GPUs).
    With the bounds, a job that has just started is kept: `test_live_nodes`."""
    released = job(1, JobState.PENDING, priority=1000, reason="Resources", gpus=32)
    b = FakeBackend([released, job(2, gpus=32)])
    starts_at_hold(b, replace(released, state=JobState.RUNNING, priority=0))
    c = SlurmCluster(b, grace_seconds=10, sleep=lambda s: None, churn=ChurnLimits(0, 0, 0, 0))
    c.enact(RoundPlan(frozenset({2})), c.observe(1000.0))
    assert [a[:3] for a in b.log] == [("scontrol", "uhold", "1"), ("scontrol", "requeuehold", "1"),
                                      ("scontrol", "release", "2")], b.log
    assert c.last_stats.started == 1 and c.last_stats.stopped == 1


def test_a_hold_whose_job_still_waits_requeues_nothing():
    """The held job had not started (the usual case): nothing is requeued, and job 2 released;
    so is it when the hold fails."""
    for fail in (set(), {"uhold"}):
        released = job(1, JobState.PENDING, priority=1000, reason="Resources", gpus=32)
        b = FakeBackend([released, job(2, gpus=32)], fail=fail)
        c = SlurmCluster(b, grace_seconds=10, sleep=lambda s: None)
        c.enact(RoundPlan(frozenset({2})), c.observe(1000.0))
        assert [a[:3] for a in b.log] == [("scontrol", "uhold", "1"),
                                          ("scontrol", "release", "2")], b.log


def test_a_dry_runs_stop_waits_for_no_exit_and_warns_of_no_held_gpus(caplog):
    """`--dry-run` prints a stop's commands; the job goes on running (nothing was sent), so
    waiting for it to exit and let go of its GPUs only read the queue every 0.5 s for the
    whole grace and stop timeout (182 reads for one stop, 90 s) and then warned that it still
    held its GPUs after a requeuehold that never went out."""
    from shockslurm.slurm.dryrun import DryRunBackend

    inner = FakeBackend([job(1, JobState.RUNNING), job(2)])
    clock = FakeClock()
    dry = DryRunBackend(inner, echo=None)
    c = SlurmCluster(dry, grace_seconds=30, stop_timeout_s=60, sleep=clock.sleep,
                     monotonic=clock.monotonic)
    with caplog.at_level("WARNING"):
        c.enact(RoundPlan(frozenset({2})), c.observe(1000.0))
    assert [a[:2] for a in dry.actions] == [("scancel", "--signal=USR1"),
                                            ("scontrol", "requeuehold"), ("scontrol", "release")]
    assert inner.log == [] and clock.t < 2.0
    assert inner.calls["jobs"] <= 3, inner.calls
    assert "still hold GPUs" not in caplog.text
