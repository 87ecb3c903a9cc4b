"""What the live path does when Slurm, a user or an administrator does something unusual (fake
backends): an administrator's hold is never released nor a held running job stopped; a job
suspended by Slurm or an administrator is not requeued; a stopped job its user cancels (or that
times out) during the grace period is not requeued; nodes in maintenance or a reservation take
nothing new, while powered-down (power saving) ones do; job arrays, heterogeneous jobs and
unreadable GPU requests are never released; one job's unreadable GPU request does not stop the
read of all the others."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from shockslurm.live.cluster import SlurmCluster
from shockslurm.live import enact as en
from shockslurm.live.enact import ChurnLimits, diff, stop_steps
from shockslurm.live.events import others_holding
from shockslurm.model import RoundPlan
from shockslurm.slurm.parse import parse_squeue
from shockslurm.slurm.types import JobState, SlurmNode

from .slurm_samples import load
from .test_enact import SPEC, job, plan
from .test_live import FakeBackend, ListJournal
from .test_crash_safety import engine  # noqa: F401 (a fixture)
from .test_live_nodes import NodesBackend, on

NO_CHURN = ChurnLimits(0, 0, 0, 0)


def cluster(b, **kw) -> SlurmCluster:
    return SlurmCluster(b, grace_seconds=kw.pop("grace_seconds", 0), sleep=lambda s: None,
                        churn=NO_CHURN, **kw)


def releases(b) -> list[tuple[str, ...]]:
    return [a for a in b.log if a[:2] == ("scontrol", "release")]


def one_round(b, *planned: int) -> tuple[list[int], list[tuple[str, ...]]]:
    """One round whose plan names `planned`: the jobs the policy was offered, the releases."""
    c = cluster(b)
    snap = c.observe(1000.0)
    c.enact(plan(*planned), snap)
    return [v.job_id for v in snap.jobs], releases(b)


# --------------------------------------------------------------------------- holds
def test_an_administrators_hold_is_never_released():
    """`scontrol hold` by an operator (Reason=JobHeldAdmin, priority 0): the job is not offered
    to the policy and a plan that names it anyway does not release it (before: released)."""
    admin = job(1, reason="JobHeldAdmin")
    assert diff(plan(1, 2), [admin, job(2)]).start == (2,)
    assert one_round(FakeBackend([admin, job(2)]), 1, 2) == ([2], [("scontrol", "release", "2")])


def test_a_running_job_an_administrator_held_is_not_stopped_and_keeps_its_gpus():
    """`scontrol hold` on a RUNNING job (22.05: it runs on, priority 0, JobHeldAdmin). A stop
    would turn the admin's hold into the daemon's requeue hold, which a later round releases:
    the job is left running and its GPUs are planned around (before: USR1 + requeuehold)."""
    held_running = replace(on(1, "gpu01", "gpu:8(IDX:0-7)", gpus=8), priority=0,
                           reason="JobHeldAdmin")
    b = NodesBackend([held_running, job(2, gpus=8)])
    c = cluster(b)
    snap = c.observe(1000.0)
    assert snap.reserved == {"gpu01": 8} and snap.gpus == 24 and 1 not in snap.placements
    c.enact(plan(2), snap)
    assert not [a for a in b.log if a[0] == "scancel" or a[1] == "requeuehold"], b.log


def test_the_daemons_own_hold_is_a_user_hold_and_is_released_later():
    """The daemon holds with `scontrol uhold` (JobHeldUser), so JobHeldAdmin is never its own;
    a job it held is released when a later plan runs it."""
    released = job(1, priority=1000, reason="Resources")
    assert [s.argv for s in stop_steps(diff(plan(), [released]))] == [
        ("scontrol", "uhold", "1")]
    b = FakeBackend([released])
    c = cluster(b)
    c.enact(plan(), c.observe(1000.0))
    b._jobs = [replace(released, priority=0, reason="JobHeldUser")]     # our uhold took
    b.log.clear()
    c.enact(plan(1), c.observe(1010.0))
    assert releases(b) == [("scontrol", "release", "1")]


def test_a_user_hold_someone_else_put_on_a_job_we_released_is_not_overridden():
    """The daemon released job 1; an administrator then `scontrol uhold`s it (JobHeldUser, as
    the daemon's own holds). The daemon did not hold it, so it does not release it again
    (before: released at the next round); once they release it, it is scheduled again."""
    b = FakeBackend([job(1)])
    c = cluster(b)
    c.enact(plan(1), c.observe(1000.0))
    assert releases(b) == [("scontrol", "release", "1")]
    b._jobs = [job(1)]                    # held again (priority 0, JobHeldUser), not by us
    b.log.clear()
    snap = c.observe(1010.0)
    assert snap.jobs == ()
    c.enact(plan(1), snap)
    assert b.log == []
    b._jobs = [job(1, priority=1000, reason="Resources")]   # they released it
    assert [v.job_id for v in c.observe(1020.0).jobs] == [1]


def test_the_recorded_holds_of_the_plugin_and_requeuehold_are_user_holds():
    """On 22.05, 24.11 and 26.05 (live recordings) the plugin's submit hold and `requeuehold`
    show JobHeldUser: never taken for an administrator's hold."""
    for version in ("22.05", "24.11", "26.05"):
        held = [j for j in parse_squeue(load("squeue", version)) if j.held]
        assert len(held) == 3 and not any(j.admin_held for j in held), version


def test_a_special_exit_hold_is_not_released():
    """A job that exited with a RequeueExitHold code is requeued held by Slurm (SPECIAL_EXIT):
    left for its user or an administrator (before: released when planned)."""
    special = replace(job(1, restarts=1), state_flags=frozenset({"SPECIAL_EXIT"}))
    assert diff(plan(1), [special]).start == ()
    doc = json.loads(load("squeue", "22.05"))
    rec = dict(doc["jobs"][0], job_state="SPECIAL_EXIT", priority=0)
    parsed = parse_squeue({"jobs": [rec]})[0]
    assert parsed.state is JobState.PENDING and parsed.admin_held


# --------------------------------------------------------------------------- job states
def test_a_suspended_job_is_not_requeued_and_keeps_its_gpus():
    """`scontrol suspend` (or suspend preemption): a requeuehold would kill it without its USR1
    checkpoint and a later release would override the suspension (before: requeueheld)."""
    suspended = on(1, "gpu01", "gpu:8(IDX:0-7)", gpus=8, state=JobState.SUSPENDED)
    b = NodesBackend([suspended, job(2, gpus=8)])
    c = cluster(b)
    snap = c.observe(1000.0)
    assert snap.reserved == {"gpu01": 8} and [v.job_id for v in snap.jobs] == [2]
    c.enact(plan(2), snap)
    assert not [a for a in b.log if a[1] == "requeuehold"], b.log


def _ends_on_usr1(b: FakeBackend, state: JobState) -> None:
    """The stopped job ends in `state` right after its USR1 (its user cancels it meanwhile,
    its time limit hits, or it saves and exits: COMPLETED)."""
    original = b.run

    def run(argv):
        if argv[0] == "scancel":
            b._jobs = [replace(j, state=state, end_time=1001.0) if j.job_id == 1 else j
                       for j in b._jobs]
        return original(argv)

    b.run = run


def test_a_stopped_job_cancelled_or_timed_out_in_its_grace_period_is_not_requeued():
    """USR1, then its user `scancel`s it (or its time limit hits) before the requeuehold:
    requeuehold requeues finished jobs too, so the job would come back held and be released
    again against its user's decision (before: requeueheld). A job that saved and exited
    (COMPLETED) after its signal is requeued, as before."""
    for state, requeued in ((JobState.CANCELLED, False), (JobState.TIMEOUT, False),
                            (JobState.COMPLETED, True)):
        b = FakeBackend([replace(job(1, JobState.RUNNING), start_time=100.0)])
        _ends_on_usr1(b, state)
        c = cluster(b, grace_seconds=30)
        c.enact(plan(), c.observe(1000.0))
        assert (("scontrol", "requeuehold", "1") in b.log) is requeued, (state, b.log)


# --------------------------------------------------------------------------- nodes
def test_node_states_that_take_no_new_job():
    def usable(state):
        return SlurmNode("gpu01", state, 8, 0, ("gpu",)).usable

    for state in ("idle+maintenance", "mixed+reserved", "idle+drain", "down", "down*",
                  "idle+not_responding", "idle+power_down", "idle+powering_down", "future",
                  "allocated+fail", "idle+reboot_issued"):
        assert not usable(state), state
    for state in ("idle", "mixed", "allocated", "idle+powered_down", "idle+powering_up",
                  "mixed+planned", "idle+cloud+powered_down", "idle+reboot_requested"):
        assert usable(state), state


def test_a_maintenance_or_reserved_node_is_not_planned_and_power_saving_ones_are():
    """A node in a maintenance or advanced reservation takes no job that does not ask for it: a
    release pinned there would wait (before: planned and pinned). A powered-down node (power
    saving) is booted by Slurm for the job it starts (before: never used)."""
    nodes = [SlurmNode("gpu01", "idle+maintenance", 8, 0, ("gpu",)),
             SlurmNode("gpu02", "idle+reserved", 8, 0, ("gpu",)),
             SlurmNode("gpu03", "idle+powered_down", 8, 0, ("gpu",)),
             SlurmNode("gpu04", "idle", 8, 0, ("gpu",))]
    snap = cluster(NodesBackend([job(1)], nodes)).observe(1000.0)
    assert [n.name for n in snap.nodes] == ["gpu03", "gpu04"] and snap.gpus == 16


def test_nothing_starts_on_a_draining_node_when_the_plan_stops_our_job_there():
    """gpu01 drains while job 1 of ours runs on it (the snapshot keeps the node, its other
    GPUs reserved). A plan that stops job 1 for job 2 started job 2 pinned to gpu01, which
    takes no new job: job 1 was preempted for nothing and job 2 waited (before: USR1,
    requeuehold, ReqNodeList=gpu01, release). Job 2's start is dropped; job 1 keeps running."""
    nodes = [SlurmNode("gpu01", "mixed+drain", 8, 8, ("gpu",)),
             SlurmNode("gpu02", "mixed", 8, 8, ("gpu",))]
    b = NodesBackend([on(1, "gpu01", "gpu:8(IDX:0-7)", gpus=8),
                      on(9, "gpu02", "gpu:8(IDX:0-7)", gpus=8, managed=False),
                      job(2, gpus=8)], nodes)
    c = cluster(b)
    snap = c.observe(1000.0)
    c.enact(RoundPlan(frozenset({2}), placement={2: (("gpu01", 8),)}), snap)
    assert b.log == [] and c.last_stats.dropped == (2,)


def test_a_released_job_pinned_to_a_node_drained_since_is_pinned_elsewhere():
    """Refuted suspect: a job released pinned to gpu01, which drains before it starts, is
    re-pinned to where the plan places it now (`enact._pending_update`)."""
    nodes = [SlurmNode("gpu01", "idle+drain", 8, 0, ("gpu",)),
             SlurmNode("gpu02", "idle", 8, 0, ("gpu",))]
    released = replace(job(1, priority=1000, reason="Resources"), required_nodes="gpu01")
    b = NodesBackend([released], nodes)
    c = cluster(b)
    snap = c.observe(1000.0)
    assert snap.pinned == {}
    c.enact(RoundPlan(frozenset({1}), placement={1: (("gpu02", 2),)}), snap)
    assert b.log == [("scontrol", "update", "JobId=1", "ReqNodeList=gpu02")]


# --------------------------------------------------------------------------- job shapes
def _record(**over):
    """The 22.05 recording's held managed job (gres:gpu:2), with a valid spec."""
    rec = dict(json.loads(load("squeue", "22.05"))["jobs"][0], comment=f"{SPEC};shock:managed")
    rec.update(over)
    return rec


def test_job_arrays_and_heterogeneous_jobs_are_never_released():
    """`scontrol release <array id>` releases every pending task of the array (N times the
    GPUs the plan gave it); a het job's components start together. Neither is scheduled: never
    offered to the policy, never named (before: released as one job)."""
    array = parse_squeue({"jobs": [_record(job_id=50, array_job_id=50,
                                           array_task_string="0-9")]})[0]
    het = parse_squeue({"jobs": [_record(job_id=61, het_job_id=60, het_job_offset=1)]})[0]
    assert array.managed and array.array_job_id == 50 and het.het_job_id == 60
    assert one_round(FakeBackend([array, het, job(2)]), 50, 61, 2) == \
        ([2], [("scontrol", "release", "2")])


def test_one_unreadable_gpu_request_does_not_stop_the_read_of_every_job():
    """Any user's job (any partition) whose GPU request Slurm writes in a form the parser does
    not know made the whole `squeue --json` read fail, every round, for every job (before:
    InputError). It is read with no GPUs and `unreadable` set, and never scheduled."""
    doc = {"jobs": [_record(job_id=7, tres_per_node="gres:gpu:x:y"), _record(job_id=8)]}
    bad, good = parse_squeue(doc)
    assert bad.unreadable.startswith("tres_per_node=") and bad.gpus == 0
    assert good.gpus_per_node == 2 and not good.unreadable
    assert one_round(FakeBackend([bad, good]), 7, 8) == ([8], [("scontrol", "release", "8")])


def test_unknown_state_names_never_crash_and_are_never_acted_on():
    """Refuted suspect: a state name of a future Slurm maps to UNKNOWN (logged); the job is
    neither planned nor named (`enact.diff` leaves it to Slurm)."""
    rec = _record(job_id=9, job_state="EXPEDITING")
    (unknown,) = parse_squeue({"jobs": [rec]})
    assert unknown.state is JobState.UNKNOWN
    b = FakeBackend([unknown])
    c = cluster(b)
    snap = c.observe(1000.0)
    c.enact(plan(9), snap)
    assert snap.jobs == () and b.log == []


def test_a_job_preempted_by_cancel_has_ended():
    """PreemptMode=CANCEL ends a job PREEMPTED, a final state (Slurm's IS_JOB_FINISHED); it was
    neither finished nor active, so its end was never recorded, nor an early round started."""
    running = replace(on(1, "gpu01", "gpu:2(IDX:0-1)", gpus=2), start_time=900.0)
    b = NodesBackend([running, job(2)])
    c = cluster(b)
    c.journal = journal = ListJournal(b)
    c.enact(plan(1), c.observe(1000.0))
    b._jobs = [replace(running, state=JobState.PREEMPTED, end_time=1005.0), job(2)]
    assert c.wants_early_round()                   # its GPUs are free, job 2 waits
    c.enact(plan(2), c.observe(1010.0))
    assert ("ended", 1, "PREEMPTED") in journal.events


def test_requeue_states_map_to_pending_and_final_ones_are_finished():
    """Refuted suspect: REQUEUED / REQUEUE_HOLD / REQUEUE_FED alone (22.05) are PENDING;
    RESIZING / SIGNALING / CONFIGURING hold GPUs; STAGE_OUT is COMPLETING; PREEMPTED,
    NODE_FAIL, BOOT_FAIL, DEADLINE and OUT_OF_MEMORY are finished."""
    def state(s):
        return parse_squeue({"jobs": [_record(job_id=3, job_state=s)]})[0].state

    assert {state(s) for s in ("REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED")} == {JobState.PENDING}
    assert all(state(s).holds_gpus for s in ("RESIZING", "SIGNALING", "CONFIGURING"))
    assert state("STAGE_OUT") is JobState.COMPLETING
    assert all(state(s).finished for s in ("PREEMPTED", "NODE_FAIL", "BOOT_FAIL", "DEADLINE",
                                            "OUT_OF_MEMORY"))


def test_a_job_with_the_users_own_node_list_is_never_pinned():
    """`sbatch -w gpu03` (recorded by job_submit.lua: a pin would replace it): released
    unpinned, Slurm keeps the user's list (before: pinned to the plan's node, replacing it);
    `--exclude` and `--constraint` are kept by pinning within them (test_live_job_nodes)."""
    users = replace(job(1), admin_comment="shock:req=gres:gpu:2;shock:nodes=gpu03",
                    required_nodes="gpu03")
    placement = {1: (("gpu03", 2),)}
    assert en.pin_nodes(placement, [users]) == {}
    e = diff(RoundPlan(frozenset({1})), [users], pins=en.pin_nodes(placement, [users]))
    assert e.start == (1,) and not any(u.nodes for u in e.updates)
    assert en.pin_nodes(placement, [job(1)]) == {1: ("gpu03",)}      # without: pinned


# --------------------------------------------------------------------------- upgrading
def test_the_admin_holds_an_earlier_daemon_made_become_user_holds_at_start(engine,
                                                                          monkeypatch):
    """Daemons before 2026-11-29 held with `scontrol hold` (JobHeldAdmin), which the daemon now
    leaves alone as an administrator's. At start the store says which of those holds were its
    own; the first round makes them, with one journalled `scontrol uhold`, the user holds it
    holds with now, and a later round releases them; an administrator's own hold stays."""
    from .test_crash_safety import Backend, daemon, intents, round_

    b = Backend([job(5, priority=1000, reason="Resources"), job(7, priority=1000,
                                                                 reason="Resources")])
    old_hold = en.hold_step
    monkeypatch.setattr(en, "hold_step", lambda ids: en.Step(
        "stop", "hold", ("scontrol", "hold", ",".join(map(str, ids))), tuple(ids)))
    round_(daemon(engine, b), set())              # the old daemon holds 5 and 7
    assert ("scontrol", "hold", "5,7") in b.log
    monkeypatch.setattr(en, "hold_step", old_hold)
    b._jobs = [replace(j, priority=0, reason="JobHeldAdmin") for j in b._jobs]
    b._jobs.append(job(9, priority=0, reason="JobHeldAdmin"))     # an administrator's hold
    b.log.clear()
    d2 = daemon(engine, b)
    assert d2.reconcile()["own_admin_holds"] == 2
    round_(d2, {5, 7, 9})                  # aside this round (admin-held): converted only
    assert b.log == [("scontrol", "uhold", "5,7")], b.log
    assert intents(engine)[-1][:2] == ("hold", 0)
    b._jobs = [replace(j, reason="JobHeldUser") if j.job_id in (5, 7) else j for j in b._jobs]
    b.log.clear()
    round_(d2, {5, 7, 9})
    assert releases(b) == [("scontrol", "release", "5,7")], b.log
    assert "own_admin_holds" not in daemon(engine, b).reconcile()   # nothing left to convert


def test_a_job_cancelled_while_still_completing_is_not_requeued():
    """23.02+ list the states: ["CANCELLED", "COMPLETING"] is COMPLETING (it still holds its
    GPUs) that ends CANCELLED; a stopped job so shown is not requeued (before: the CANCELLED was
    dropped and the job requeued against its user's scancel)."""
    from shockslurm.live.stops import not_done_before_signal
    from shockslurm.slurm.states import parse_job_state
    state, flags = parse_job_state(["CANCELLED", "COMPLETING"])
    assert state is JobState.COMPLETING and "CANCELLED" in flags
    assert parse_job_state(["RUNNING", "COMPLETING"])[1] == {"COMPLETING"}
    cancelling = replace(job(1, JobState.RUNNING), state=state, state_flags=flags)
    exiting = replace(job(2, JobState.RUNNING), state=JobState.COMPLETING,
                      state_flags=frozenset({"COMPLETING"}))
    keep, done = not_done_before_signal([1, 2], {1: 900.0, 2: 900.0}, [cancelling, exiting])
    assert keep == [2] and done == {1}


def test_a_user_hold_put_after_an_earlier_daemons_release_is_left_alone(engine):
    """The daemon released job 4, was restarted, and meanwhile an administrator put a user hold
    on it (`scontrol uhold`: JobHeldUser, as the daemon's own holds). The store's last command
    on the job is the release, so the hold is someone else's: left alone, never released
    (before: only the process that released it knew)."""
    from .test_crash_safety import Backend, daemon, round_

    b = Backend([job(4)])
    round_(daemon(engine, b), {4})                        # the first daemon releases job 4
    assert releases(b) == [("scontrol", "release", "4")]
    b._jobs = [job(4, priority=0, reason="JobHeldUser")]  # an administrator's uhold since
    b.log.clear()
    d2 = daemon(engine, b)
    assert d2.reconcile()["held_by_others_after_release"] == 1
    round_(d2, {4})
    assert releases(b) == [] and (4, 1004.0) in d2.cluster.aside, b.log
    b._jobs = [job(5)]                                     # a job the daemon never released
    assert "held_by_others_after_release" not in daemon(engine, b).reconcile()


def test_a_job_in_a_state_we_do_not_know_keeps_its_gpus_out_of_the_plan():
    """A future Slurm's state name (UNKNOWN here) on a job with nodes allocated: its GPUs are
    not handed out, on nodes (reserved) and in one pool (capacity) alike, whether the job is
    another's or ours (before: counted free, a released job then waited for them)."""
    nodes = [SlurmNode("gpu01", "mixed", 8, 8, ("gpu",))]
    for managed in (False, True):
        odd = replace(on(9, "gpu01", "gpu:8(IDX:0-7)", gpus=8, managed=managed),
                      state=JobState.UNKNOWN)
        assert odd.holds_gpus and not replace(odd, node_list="").holds_gpus
        b = NodesBackend([odd, job(1)], nodes)
        snap = cluster(b).observe(1000.0)
        assert snap.gpus == 0 and snap.reserved == {"gpu01": 8}, managed
        assert others_holding([odd, job(1)], lambda j: j.managed, None) == {9}, managed
