"""Stops begun and not completed, on fake Slurm backends and a SQLite store: a daemon killed
in a stop's grace, a USR1 whose call timed out, a job its USR1 killed or that ended long after
it: the stop is resumed (requeuehold, never a second USR1) exactly when the job ended on it or
still runs the signalled run. (Split from tests/test_crash_safety.py, whose helpers it uses.)"""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from shockslurm.slurm.types import JobState, SlurmError

from .test_crash_safety import (Backend, Killed, _signal_stamp, daemon, engine,  # noqa: F401 (fixtures)
                                fresh_now, intents, round_, running)
from .test_enact import job


# ------------------------------------------------------------------ a stop cut short
@pytest.mark.parametrize("exits", [False, True], ids=["still-running", "exited-on-usr1"])
def test_killed_in_the_grace_period_resumes_the_stop_without_a_second_usr1(engine, exits):
    b = Backend([running(1), job(2, gpus=8)], exit_on_usr1=exits)
    d1 = daemon(engine, b)
    b.kill_on_read_after_signal = True      # dies waiting for job 1 to exit
    t = time.time()           # the store stamps the signal intent with the wall clock
    with pytest.raises(Killed):
        round_(d1, {2}, now=t)
    b.kill_on_read_after_signal = False
    assert [a[0] for a in b.log] == ["scancel"]
    assert [i[:2] for i in intents(engine)] == [("signal", 0)]

    b.log.clear()
    # the restart comes 2 s after the signal as the store stamped it (the wall clock's, which a
    # loaded machine's first round may take a while to reach: measured from the stamp, not `t`)
    back = _signal_stamp(engine) + 2
    d2 = daemon(engine, b)                          # the restarted daemon
    d2.reconcile(now=back)
    round_(d2, {1, 2} if not exits else {2}, now=back)   # even when the plan keeps job 1
    argv0 = [a[:2] for a in b.log]
    assert ("scancel", "--signal=USR1") not in argv0, b.log      # never signalled twice
    assert argv0[0] == ("scontrol", "requeuehold") and "1" in b.log[0][2].split(",")
    # still running: the rest of the grace, 5 s from the signal's stamp, 3 s after `back`;
    # exited on its USR1: requeued at once
    assert sum(d2.sleeps) == (pytest.approx(0.0) if exits else pytest.approx(3.0, abs=0.3))
    state = {j.job_id: j for j in b._jobs}[1]
    assert state.state is JobState.PENDING and state.held and state.restart_count == 1
    # the resumed requeuehold was journalled before it ran, also for a job that had exited
    assert [i[:2] for i in intents(engine)][:2] == [("signal", 0), ("requeuehold", 0)]

    b.log.clear()                                   # and the stop is over: nothing more
    round_(d2, set(), now=back + 10)
    assert not any(a[1] == "requeuehold" and "1" in a[2].split(",") for a in b.log), b.log


def test_a_job_its_usr1_killed_is_requeued_when_the_stop_is_resumed(engine):
    """A plain sbatch script without a trap ends FAILED on its USR1. The round of the stop
    requeued it; a stop resumed by the next daemon took COMPLETED jobs only, and the FAILED
    one stayed so, its training over."""
    b = Backend([running(1), job(2, gpus=8)])
    d1 = daemon(engine, b)
    b.kill_on_read_after_signal = True               # dies waiting for job 1 to exit
    with pytest.raises(Killed):
        round_(d1, {2}, now=time.time())
    b.kill_on_read_after_signal = False
    b._jobs = [replace(j, state=JobState.FAILED, end_time=int(_signal_stamp(engine)) + 1)
               if j.job_id == 1 else j for j in b._jobs]
    b.log.clear()
    back = _signal_stamp(engine) + 2
    d2 = daemon(engine, b)
    assert d2.reconcile(now=back)["finished"] == 0   # not recorded as ended: it is stopping
    round_(d2, {2}, now=back)
    assert ("scancel", "--signal=USR1") not in [a[:2] for a in b.log], b.log
    assert b.log[0][:2] == ("scontrol", "requeuehold") and "1" in b.log[0][2].split(",")
    assert {j.job_id: j for j in b._jobs}[1].state is JobState.PENDING


@pytest.mark.parametrize("state", [JobState.COMPLETED, JobState.FAILED])
def test_a_job_that_ended_long_after_its_stop_began_is_not_rerun(engine, state):
    """The daemon died in a stop's grace and stayed away; job 1 ignored its USR1 and ended on
    its own an hour later (finished its training, or crashed). The next daemon took that end
    for the stop's, requeued the job and ran it again (and reconciliation left it without its
    `finished` event); now an end later than twice the grace and a minute after the signal
    is the job's own."""
    b = Backend([running(1), job(2, gpus=8)])
    d1 = daemon(engine, b)
    b.kill_on_read_after_signal = True
    with pytest.raises(Killed):
        round_(d1, {2}, now=time.time())
    b.kill_on_read_after_signal = False
    signalled = _signal_stamp(engine)
    b._jobs = [replace(j, state=state, end_time=int(signalled) + 3600) if j.job_id == 1 else j
               for j in b._jobs]
    b.log.clear()
    d2 = daemon(engine, b)
    assert d2.reconcile(now=signalled + 3700)["finished"] == 1
    round_(d2, {2}, now=signalled + 3700)
    assert not any(a[1] == "requeuehold" for a in b.log), b.log
    assert {j.job_id: j for j in b._jobs}[1].state is state


class SignalTimesOut(Backend):
    """`scancel` does not come back in time (the backend raises as CliBackend does on a
    timeout); with `exit_on_usr1` the USR1 has reached the job (it saved and exited)."""

    def run(self, argv):
        res = super().run(argv)
        if argv[0] == "scancel":
            raise SlurmError(f"{' '.join(argv)} timed out after 30 s", argv=tuple(argv))
        return res


@pytest.mark.parametrize("restarted", [False, True], ids=["same daemon", "restarted"])
def test_a_usr1_that_timed_out_before_reaching_a_job_is_sent_again(engine, restarted):
    """The timed-out USR1 did not reach job 1, which still runs: it is signalled again at the
    next round, not requeueheld without its checkpoint."""
    b = SignalTimesOut([running(1), job(2, gpus=8)])
    d1 = daemon(engine, b)
    with pytest.raises(SlurmError):
        round_(d1, {2}, now=time.time())
    b.log.clear()
    d = daemon(engine, b) if restarted else d1
    back = _signal_stamp(engine) + 40                    # the grace long over
    if restarted:
        d.reconcile(now=back)
    with pytest.raises(SlurmError):                      # it times out again, here
        round_(d, {2}, now=back)
    assert [a[:2] for a in b.log] == [("scancel", "--signal=USR1")], b.log


@pytest.mark.parametrize("restarted", [False, True], ids=["same daemon", "restarted"])
def test_a_usr1_whose_call_timed_out_is_a_stop_begun(engine, restarted):
    """A `scancel --signal=USR1` that timed out (or found the controller unreachable) may have
    been delivered: the job saved and exited on it. It was taken as not sent: the job stayed
    COMPLETED, never requeued, its training over. Now the stop is resumed: requeueheld, never
    signalled a second time."""
    b = SignalTimesOut([running(1), job(2, gpus=8)], exit_on_usr1=True)
    d1 = daemon(engine, b)
    with pytest.raises(SlurmError, match="cannot be reached"):
        round_(d1, {2}, now=time.time())            # the round is given up at the failure
    assert {j.job_id: j for j in b._jobs}[1].state is JobState.COMPLETED
    b.log.clear()
    d = daemon(engine, b) if restarted else d1
    back = _signal_stamp(engine) + 10
    if restarted:
        d.reconcile(now=back)
    round_(d, {2}, now=back)
    assert ("scancel", "--signal=USR1") not in [a[:2] for a in b.log], b.log
    assert b.log[0][:2] == ("scontrol", "requeuehold") and "1" in b.log[0][2].split(","), b.log
    assert {j.job_id: j for j in b._jobs}[1].state is JobState.PENDING


def test_a_stop_cut_short_is_resumed_on_a_job_requeued_before(engine):
    """Slurm sets a job's submit time anew at each requeue (`live/first_submit.py`): the
    restarted daemon still finds the stop the daemon before it began on a job it had stopped
    and requeued once already, and resumes it without a second USR1."""
    b = Backend([running(1), job(2, gpus=8)], exit_on_usr1=True)
    d1 = daemon(engine, b)
    t = time.time()
    round_(d1, {2}, now=t)                                  # job 1 stopped and requeued
    b._jobs = [replace(j, state=JobState.PENDING, submit_time=j.submit_time + 50)
               if j.job_id == 1 else j for j in b._jobs]     # as Slurm shows it after that
    round_(d1, {1, 2}, now=t + 10)                          # released: it runs again
    assert {j.job_id: j.state for j in b._jobs}[1] is JobState.RUNNING
    b.log.clear()
    b.kill_on_read_after_signal = True                      # dies after the second USR1
    with pytest.raises(Killed):
        round_(d1, {2}, now=t + 20)
    b.kill_on_read_after_signal = False

    b.log.clear()
    d2 = daemon(engine, b)                                  # the restarted daemon
    d2.reconcile(now=t + 22)
    round_(d2, {2}, now=t + 22)
    argv0 = [a[:2] for a in b.log]
    assert ("scancel", "--signal=USR1") not in argv0, b.log
    assert argv0[0] == ("scontrol", "requeuehold") and "1" in b.log[0][2].split(","), b.log
