"""The pure diff of a plan against Slurm's jobs, and the argv lists it turns into."""

from __future__ import annotations

from shockslurm.model import RoundPlan
from shockslurm.live.enact import commands, diff, requeue_step, start_steps, stop_steps
from shockslurm.slurm.types import JobState, SlurmJob

SPEC = 'shock:spec={"epochs":3,"model":"ResNet-18","epoch_seconds":600}'  # 30 min: no job is nearly done


def job(job_id: int, state: JobState = JobState.PENDING, *, managed: bool = True,
        priority: int | None = None, reason: str | None = None, restarts: int = 0,
        gpus: int = 2) -> SlurmJob:
    if priority is None:
        priority = 0 if state is JobState.PENDING else 4294901757
    if reason is None:
        reason = "JobHeldUser" if state is JobState.PENDING and priority == 0 else "None"
    comment = f"{SPEC};shock:managed" if managed else "plain user job"
    return SlurmJob(job_id=job_id, name=f"j{job_id}", user="root", partition="gpu", state=state,
                    state_flags=frozenset(), reason=reason, priority=priority,
                    gpus_per_node=gpus, gpus_per_job=0, nodes=1, node_list="",
                    submit_time=1000.0 + job_id, start_time=None, restart_count=restarts,
                    comment=comment)


def plan(*ids: int) -> RoundPlan:
    return RoundPlan(run=frozenset(ids))


def all_ids_in(steps) -> set[int]:
    ids = set()
    for step in steps:
        for arg in step.argv:
            for token in arg.replace("JobId=", "").split(","):
                if token.isdigit():
                    ids.add(int(token))
    return ids


def test_starts_held_planned_jobs_with_one_release_call():
    jobs = [job(1), job(2), job(3), job(4)]
    e = diff(plan(1, 2, 4), jobs)
    assert e.start == (1, 2, 4) and e.stop == () and e.updates == ()
    steps = commands(e)
    assert [s.argv for s in steps] == [("scontrol", "release", "1,2,4")]
    assert [s.action for s in steps] == ["release"]


def test_stops_running_managed_jobs_not_in_plan():
    """A SUSPENDED job (an administrator's or Slurm's suspension) is left alone: not stopped
    (`test_slurm_anomalies`)."""
    jobs = [job(1, JobState.RUNNING), job(2, JobState.RUNNING), job(3, JobState.SUSPENDED),
            job(4)]
    e = diff(plan(2, 4), jobs)
    assert e.stop == (1,) and e.signal == (1,) and e.keep == (2,) and e.start == (4,)
    argvs = [s.argv for s in commands(e)]
    assert argvs == [("scancel", "--signal=USR1", "--batch", "1"),
                     ("scontrol", "requeuehold", "1"),
                     ("scontrol", "release", "4")]


def test_start_time_now_after_requeue_or_begin_time():
    jobs = [job(1, restarts=1, reason="job_requeued_in_held_state"), job(2, reason="BeginTime"),
            job(3)]
    e = diff(plan(1, 2, 3), jobs)
    argvs = [s.argv for s in start_steps(e)]
    assert argvs == [("scontrol", "update", "JobId=1", "StartTime=now"),
                     ("scontrol", "update", "JobId=2", "StartTime=now"),
                     ("scontrol", "release", "1,2,3")]


def test_gres_update_when_plan_resizes():
    e = diff(plan(1, 2), [job(1, gpus=4), job(2, gpus=2, restarts=2)], gpus_per_node={1: 2, 2: 2})
    assert [s.argv for s in start_steps(e)] == [
        ("scontrol", "update", "JobId=1", "Gres=gpu:2"),
        ("scontrol", "update", "JobId=2", "StartTime=now"),
        ("scontrol", "release", "1,2")]


def test_released_but_waiting_job_dropped_from_plan_is_held_again():
    released = job(5, priority=100, reason="Resources")
    e = diff(plan(), [released])
    assert e.hold == (5,) and e.start == ()
    assert [s.argv for s in stop_steps(e)] == [("scontrol", "uhold", "5")]
    # still planned: nothing to do, unless it waits on BeginTime
    assert diff(plan(5), [released]).empty
    waiting = job(5, priority=100, reason="BeginTime", restarts=1)
    assert [s.argv for s in start_steps(diff(plan(5), [waiting]))] == [
        ("scontrol", "update", "JobId=5", "StartTime=now")]


def test_unmanaged_and_finished_jobs_never_appear():
    jobs = [job(1, JobState.RUNNING, managed=False), job(2, managed=False, priority=0),
            job(3, JobState.COMPLETED), job(4, JobState.CANCELLED, restarts=3),
            job(5, JobState.RUNNING), job(6)]
    for p in (plan(), plan(1, 2, 3, 4), plan(6), plan(1, 2, 3, 4, 5, 6)):
        e = diff(p, jobs)
        steps = commands(e)
        assert all_ids_in(steps) <= {5, 6}, [s.argv for s in steps]
    e = diff(plan(1, 2, 3, 4, 6), jobs)
    assert e.missing == (1, 2, 3, 4)
    assert e.stop == (5,) and e.start == (6,)


def test_every_argv_is_a_list_of_strings_and_no_shell():
    e = diff(plan(2), [job(1, JobState.RUNNING), job(2, restarts=1)])
    for step in commands(e):
        assert all(isinstance(a, str) for a in step.argv)
        assert step.argv[0] in ("scontrol", "scancel")


def test_nothing_to_do_is_empty():
    e = diff(plan(1), [job(1, JobState.RUNNING)])
    assert e.empty and commands(e) == []
    assert requeue_step([]) is None


def test_unsignalled_jobs_are_read_from_scancel_stderr():
    from shockslurm.live.enact import unsignalled
    err = ("scancel: error: Kill job error on job id 2131: Invalid job id specified\n"
           "scancel: error: Kill job error on job id 7: Job/step already completing or completed\n")
    assert unsignalled(err) == {2131, 7}
    assert unsignalled("") == set()


def test_only_exactly_tagged_jobs_are_ever_named():
    """A job with a spec-looking comment but no `shock:managed`, or with a tag that only looks
    like it (`shock:managedX`, `xshock:managed`, `shock:managed ` inside another token), is never
    in any argv, whatever the plan says and whatever its state."""
    from dataclasses import replace

    impostors = {
        101: f"{SPEC}",                                    # spec, no tag
        102: f"{SPEC};shock:managedX",
        103: f"{SPEC};xshock:managed",
        104: "shock:managed-not;shock:spec={}",
        105: f"{SPEC};shock:managed=1",
        106: f"{SPEC} shock:managed",                      # not a ;-separated token
    }
    jobs = []
    for job_id, comment in impostors.items():
        for k, state in enumerate((JobState.PENDING, JobState.RUNNING, JobState.SUSPENDED)):
            jobs.append(replace(job(job_id * 10 + k, state), comment=comment))
    jobs += [job(1), job(2, JobState.RUNNING)]
    everyone = {j.job_id for j in jobs}
    for wanted in (everyone, set(), {j for j in everyone if j % 2}):
        e = diff(plan(*wanted), jobs)
        named = all_ids_in(commands(e))
        assert named <= {1, 2}, named
        assert not any(j.managed for j in jobs if j.job_id not in (1, 2))
