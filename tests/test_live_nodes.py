"""The live cluster on nodes (fake backend): the snapshot's nodes, placements and reserved GPUs
read from squeue/sinfo records, the pinned start steps (golden argv), moves, starts whose nodes
are still held, and idle GPU-seconds of released jobs waiting for a node."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shockslurm.errors import InputError
from shockslurm.live.cluster import SlurmCluster
from shockslurm.live.enact import ChurnLimits, commands, diff, fit_on_nodes, pin_nodes
from shockslurm.model import RoundPlan
from shockslurm.plan_on_nodes import place_plan
from shockslurm.slurm.gres import expand_hostlist, gpus_per_allocated_node
from shockslurm.slurm.types import JobState, SlurmNode

from .test_enact import job
from .test_live import FakeBackend, FakeClock, starts_at_hold

NODES = [f"gpu0{i}" for i in range(1, 5)]
NO_CHURN = ChurnLimits(0, 0, 0, 0)


def on(job_id: int, node_list: str, *detail: str, state: JobState = JobState.RUNNING,
       gpus: int = 1, nodes: int = 1, managed: bool = True, **kw):
    """A job holding GPUs on `node_list` (gres_detail one entry per node)."""
    return replace(job(job_id, state, gpus=gpus, managed=managed), node_list=node_list,
                   gres_detail=tuple(detail), nodes=nodes, start_time=900.0, **kw)


class NodesBackend(FakeBackend):
    def __init__(self, jobs, nodes=None, **kw):
        super().__init__(jobs, **kw)
        self._nodes = nodes or [SlurmNode(n, "mixed", 8, 0, ("gpu",)) for n in NODES]

    def nodes(self):
        self.calls["nodes"] += 1
        return list(self._nodes)


# --------------------------------------------------------------------------- parsing
def test_host_lists_expand_as_slurm_writes_them():
    assert expand_hostlist("gpu[02,04]") == ("gpu02", "gpu04")
    assert expand_hostlist("gpu[01-03,07],cpu1") == ("gpu01", "gpu02", "gpu03", "gpu07", "cpu1")
    assert expand_hostlist("n[8-11]") == ("n8", "n9", "n10", "n11")
    assert expand_hostlist("") == ()
    for bad in ("gpu[1-", "gpu[3-1]", "gpu[a]", "gpu[0-99999999]"):
        with pytest.raises(InputError):
            expand_hostlist(bad)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="gpu0123456789[],-", max_size=40))
def test_a_garbled_host_list_is_an_input_error_never_a_crash(text):
    try:
        names = expand_hostlist(text)
    except InputError:
        return
    assert len(names) <= 100_000 and all(names)


def test_gpus_per_allocated_node_reads_gres_detail_per_node():
    assert gpus_per_allocated_node(on(1, "gpu03", "gpu:2(IDX:0-1)", gpus=2)) == (("gpu03", 2),)
    uneven = replace(on(2, "gpu[01,04]", "gpu:4(IDX:2-5)", "gpu:2(IDX:3-4)", nodes=2),
                     gpus_per_node=0, gpus_per_job=6)
    assert gpus_per_allocated_node(uneven) == (("gpu01", 4), ("gpu04", 2))
    # no gres_detail: the request's GPUs per node on every node
    assert gpus_per_allocated_node(on(3, "gpu[02-03]", gpus=8, nodes=2)) == (("gpu02", 8),
                                                                            ("gpu03", 8))
    assert gpus_per_allocated_node(on(4, "")) is None
    assert gpus_per_allocated_node(on(5, "gpu[1-")) is None


# --------------------------------------------------------------------------- the snapshot
def test_snapshot_names_nodes_placements_and_reserved_gpus():
    """Job 1 (2 GPUs on gpu01) and the 2-node job 2 are ours and placed; a foreign job (3 GPUs)
    and our COMPLETING job (1 GPU) on gpu04 are reserved; a drained node and another
    partition's node are not offered."""
    nodes = [SlurmNode(n, "mixed", 8, 0, ("gpu",)) for n in NODES] + [
        SlurmNode("gpu05", "idle+drain", 8, 0, ("gpu",)),
        SlurmNode("cpu01", "idle", 8, 0, ("cpu",))]
    b = NodesBackend([
        on(1, "gpu01", "gpu:2(IDX:0-1)", gpus=2),
        on(2, "gpu[02-03]", "gpu:8(IDX:0-7)", "gpu:8(IDX:0-7)", gpus=8, nodes=2),
        on(9, "gpu04", "gpu:3(IDX:0-2)", gpus=3, managed=False),
        on(3, "gpu04", "gpu:1(IDX:3)", state=JobState.COMPLETING),
        job(4)], nodes=nodes)
    c = SlurmCluster(b, grace_seconds=0, sleep=lambda s: None)
    snap = c.observe(1000.0)
    assert [n.name for n in snap.nodes] == NODES
    assert snap.placements == {1: (("gpu01", 2),), 2: (("gpu02", 8), ("gpu03", 8))}
    assert snap.reserved == {"gpu04": 4}
    assert snap.gpus == c.gpus == 32 - 4
    assert b.calls["jobs"] == 1 and b.calls["nodes"] == 1


def test_a_draining_node_keeps_our_job_and_takes_nothing_new():
    nodes = [SlurmNode("gpu01", "mixed+drain", 8, 0, ("gpu",)),
             SlurmNode("gpu02", "idle", 8, 0, ("gpu",))]
    c = SlurmCluster(NodesBackend([on(1, "gpu01", "gpu:2(IDX:0-1)", gpus=2), job(2, gpus=4)],
                                  nodes=nodes))
    snap = c.observe(1000.0)
    assert [n.name for n in snap.nodes] == ["gpu01", "gpu02"]
    assert snap.reserved == {"gpu01": 6} and snap.gpus == 10
    plan = place_plan(RoundPlan(frozenset({1, 2})), snap)
    assert plan.placement == {1: (("gpu01", 2),), 2: (("gpu02", 4),)}


def test_a_job_holding_gpus_nowhere_known_makes_the_snapshot_one_pool():
    c = SlurmCluster(NodesBackend([job(1, JobState.RUNNING), job(2)]))   # no node list
    snap = c.observe(1000.0)
    assert snap.nodes == () and snap.placements == {} and snap.gpus == 32


# --------------------------------------------------------------------------- start steps
def test_pinned_start_steps_golden_argv():
    jobs = [job(5),                                        # held, first start
            job(6, restarts=1, gpus=8),                    # held after a requeue
            on(7, "gpu01", "gpu:1(IDX:0)"),                # running, moved by the plan
            replace(job(8, priority=10, reason="Resources"), required_nodes="gpu02"),
            replace(job(9, priority=10, reason="Resources"), required_nodes="gpu02"),
            on(10, "gpu04", "gpu:1(IDX:0)")]               # running, stays
    pins = {5: ("gpu03",), 6: ("gpu01", "gpu02"), 7: ("gpu04",), 8: ("gpu02",),
            9: ("gpu03",), 10: ("gpu04",)}
    e = diff(RoundPlan(frozenset(pins)), jobs, pins=pins, moved={7})
    assert e.stop == (7,) and e.moved == (7,) and e.start == (5, 6, 7)
    assert e.keep == (8, 9, 10)
    assert [s.argv for s in commands(e)] == [
        ("scancel", "--signal=USR1", "--batch", "7"),
        ("scontrol", "requeuehold", "7"),
        ("scontrol", "update", "JobId=5", "ReqNodeList=gpu03"),
        ("scontrol", "update", "JobId=6", "ReqNodeList=gpu01,gpu02", "StartTime=now"),
        ("scontrol", "update", "JobId=7", "ReqNodeList=gpu04", "StartTime=now"),
        ("scontrol", "update", "JobId=9", "ReqNodeList=gpu03"),     # re-pinned; 8 already is
        ("scontrol", "release", "5,6,7"),
    ]


def test_a_job_is_pinned_only_where_the_placement_has_its_shape():
    two_by_four = replace(job(1, gpus=4), nodes=2)                      # -N2 --gres=gpu:4
    gpus_job = replace(job(2, gpus=0), gpus_per_job=16)                 # --gpus=16
    single = job(3, gpus=4)
    placement = {1: (("gpu01", 8),), 2: (("gpu01", 8), ("gpu02", 8)), 3: (("gpu03", 4),)}
    assert pin_nodes(placement, [two_by_four, gpus_job, single]) == {
        2: ("gpu01", "gpu02"), 3: ("gpu03",)}


def test_fit_on_nodes_drops_starts_whose_nodes_are_held():
    placement = {1: (("a", 8),), 2: (("b", 4),), 3: (("b", 4),)}
    assert fit_on_nodes([1, 2, 3], placement, {"a": 7, "b": 8}) == (1,)
    assert fit_on_nodes([1, 2, 3], placement, {"a": 8, "b": 6}) == (3,)


# --------------------------------------------------------------------------- enact on nodes
def _fragmented(big_gpus: int = 8):
    """A 1-GPU job of ours on every node, and a held `big_gpus` job."""
    return [on(10 + i, n, "gpu:1(IDX:0)") for i, n in enumerate(NODES)] + [job(1, gpus=big_gpus)]


def test_a_fragmented_cluster_moves_one_job_and_starts_the_gang_pinned():
    b = NodesBackend(_fragmented())
    c = SlurmCluster(b, grace_seconds=0, sleep=lambda s: None, churn=NO_CHURN)
    snap = c.observe(1000.0)
    plan = place_plan(RoundPlan(frozenset({1, 10, 11, 12, 13})), snap)
    (node, gpus), = plan.placement[1]
    (mover,) = plan.info["moved"]
    assert gpus == 8 and snap.placements[mover] == ((node, 1),)
    (new_node, _), = plan.placement[mover]
    c.enact(plan, snap)
    assert b.log == [
        ("scancel", "--signal=USR1", "--batch", str(mover)),
        ("scontrol", "requeuehold", str(mover)),
        ("scontrol", "update", "JobId=1", f"ReqNodeList={node}"),
        ("scontrol", "update", f"JobId={mover}", f"ReqNodeList={new_node}", "StartTime=now"),
        ("scontrol", "release", f"1,{mover}"),
    ]
    assert c.last_stats.moved == 1 and c.last_stats.pinned == 2


def test_a_job_stopped_this_second_is_released_on_its_node_only_in_the_next():
    """Slurm refuses the credential of a job started again on a node within the second it left
    it (`live/credentials.py`): the fragmented move above goes to another node and waits for
    nothing; a job stopped and planned again 0.4 s later on its node waits for the next
    second before its release. Time moves only when the cluster sleeps, so the wait is exact
    on a loaded machine too."""
    clock = FakeClock()
    b = NodesBackend(_fragmented())
    c = SlurmCluster(b, grace_seconds=0, sleep=clock.sleep, monotonic=clock.monotonic,
                     churn=NO_CHURN)
    snap = c.observe(1000.0)
    c.enact(place_plan(RoundPlan(frozenset({1, 10, 11, 12, 13})), snap), snap)
    assert b.log[-1][:2] == ("scontrol", "release") and clock.slept == []

    one_node = [SlurmNode("gpu01", "mixed", 8, 0, ("gpu",))]
    b = NodesBackend([on(10, "gpu01", "gpu:8(IDX:0-7)", gpus=8), job(11, gpus=8)], one_node)
    c = SlurmCluster(b, grace_seconds=0, sleep=clock.sleep, monotonic=clock.monotonic,
                     churn=NO_CHURN)
    snap = c.observe(2000.0)
    c.enact(place_plan(RoundPlan(frozenset({11})), snap), snap)   # 10 left gpu01 at 2000.0
    assert ("scontrol", "requeuehold", "10") in b.log and clock.slept == []
    snap = c.observe(2000.4)
    c.enact(place_plan(RoundPlan(frozenset({10})), snap), snap)
    assert b.log[-1] == ("scontrol", "release", "10")
    assert clock.slept == [pytest.approx(2001.02 - 2000.4)], clock.slept


def test_a_start_planned_onto_a_kept_jobs_node_takes_the_node_the_plan_frees():
    """Two nodes; job 10 runs on gpu01 for long, job 12 on gpu02 for 5 s; the plan stops both
    for the 8-GPU jobs 1 (gpu01, submitted last) and 2 (gpu02). The churn bounds keep 12, so
    only one start fits and job 1 is dropped. Job 2 is placed again around the kept job
    (`plan_on_nodes.place_around`, as the simulator does): it starts on gpu01 in place of 10.
    Before, job 2 waited for gpu02 and gpu01 stayed with 10: nothing was done, round after
    round, while the plan asked for job 2."""
    two = [SlurmNode(n, "mixed", 8, 0, ("gpu",)) for n in ("gpu01", "gpu02")]
    b = NodesBackend([replace(on(10, "gpu01", "gpu:8(IDX:0-7)", gpus=8), start_time=0.0),
                      replace(on(12, "gpu02", "gpu:8(IDX:0-7)", gpus=8), start_time=995.0),
                      replace(job(1, gpus=8), submit_time=1100.0), job(2, gpus=8)], two)
    c = SlurmCluster(b, grace_seconds=0, sleep=lambda s: None, round_s=120)
    snap = c.observe(1000.0)
    plan = place_plan(RoundPlan(frozenset({1, 2})), snap)
    assert plan.placement[1] == (("gpu01", 8),) and plan.placement[2] == (("gpu02", 8),)
    c.enact(plan, snap)
    assert b.log == [
        ("scancel", "--signal=USR1", "--batch", "10"),
        ("scontrol", "requeuehold", "10"),
        ("scontrol", "update", "JobId=2", "ReqNodeList=gpu01"),
        ("scontrol", "release", "2"),
    ]
    assert c.last_stats.kept == {12: "min_run"} and c.last_stats.dropped == (1,)
    assert c.allowed_running >= {2, 12}


def test_a_stop_whose_gpus_no_start_takes_is_not_made():
    """Two nodes; job 10 holds gpu01 and runs on; on gpu02 job 12 (1 GPU) started 5 s ago and
    job 13 (7 GPUs) long ago. The plan stops 12 and 13 for the 8-GPU job 1; the churn bounds
    keep 12, so job 1 fits no node and is not placed. Stopping 13 would leave its 7 GPUs idle
    for the round: 13 keeps running, nothing is done (before this rule: USR1 and requeuehold
    of 13, then nothing started)."""
    two = [SlurmNode(n, "mixed", 8, 0, ("gpu",)) for n in ("gpu01", "gpu02")]
    b = NodesBackend([replace(on(10, "gpu01", "gpu:8(IDX:0-7)", gpus=8), start_time=0.0),
                      replace(on(12, "gpu02", "gpu:1(IDX:0)"), start_time=995.0),
                      replace(on(13, "gpu02", "gpu:7(IDX:1-7)", gpus=7), start_time=0.0),
                      job(1, gpus=8)], two)
    c = SlurmCluster(b, grace_seconds=0, sleep=lambda s: None, round_s=120)
    snap = c.observe(1000.0)
    plan = place_plan(RoundPlan(frozenset({1, 10})), snap)
    assert plan.placement[1] == (("gpu02", 8),)
    c.enact(plan, snap)
    assert b.log == []
    assert c.last_stats.kept == {12: "min_run", 13: "idle"}
    assert c.allowed_running >= {10, 12, 13}


def test_a_move_the_churn_bounds_forbid_keeps_the_job_and_does_not_start_the_gang():
    """The 1-GPU jobs started 100 s ago (min run 180 s): the one the plan moves stays where it
    runs, and so must every other (none may move), so the 8-GPU job planned on its node is not
    released (it would wait in Reason=Resources)."""
    b = NodesBackend(_fragmented())
    c = SlurmCluster(b, grace_seconds=0, sleep=lambda s: None, round_s=120)
    snap = c.observe(1000.0)
    plan = place_plan(RoundPlan(frozenset({1, 10, 11, 12, 13})), snap)
    c.enact(plan, snap)
    assert b.log == []
    assert list(c.last_stats.kept.values()) == ["min_run"]


def test_a_move_the_churn_bounds_forbid_is_made_with_a_job_they_let_move():
    """As above, but only the job the plan moves is young: the plan is placed again around it,
    another 1-GPU job (old enough) moves instead, and the 8-GPU job starts on that one's node
    (before: nothing started, the gang waited for a later round)."""
    jobs = _fragmented()
    b = NodesBackend(jobs)
    c = SlurmCluster(b, grace_seconds=0, sleep=lambda s: None, round_s=120)
    snap = c.observe(1000.0)
    plan = place_plan(RoundPlan(frozenset({1, 10, 11, 12, 13})), snap)
    (young,) = plan.info["moved"]
    b._jobs = [replace(j, start_time=0.0) if j.job_id not in (young, 1) else j for j in jobs]
    snap = c.observe(1000.0)
    c.enact(plan, snap)
    assert c.last_stats.kept == {young: "min_run"} and c.last_stats.moved == 1
    (mover,) = [int(a[-1]) for a in b.log if a[:2] == ("scancel", "--signal=USR1")]
    assert mover != young
    (gang_pin,) = [a[3] for a in b.log if a[:3] == ("scontrol", "update", "JobId=1")]
    assert gang_pin == f"ReqNodeList={snap.placements[mover][0][0]}"
    assert b.log[-1] == ("scontrol", "release", f"1,{mover}")


def test_a_start_whose_node_is_held_by_a_kept_job_is_not_released():
    """The plan stops job 10 (alone on gpu01) for the 8-GPU job, but the churn bounds keep it
    running: the 8-GPU job is not released; the 2-GPU job planned elsewhere is."""
    b = NodesBackend([on(10, "gpu01", "gpu:1(IDX:0)")] + [
        on(11 + i, n, "gpu:8(IDX:0-7)", gpus=8) for i, n in enumerate(NODES[1:])]
        + [job(1, gpus=8)])
    c = SlurmCluster(b, grace_seconds=0, sleep=lambda s: None, round_s=120)
    snap = c.observe(1000.0)
    plan = place_plan(RoundPlan(frozenset({1, 11, 12, 13})), snap)
    assert plan.placement[1] == (("gpu01", 8),)
    c.enact(plan, snap)
    assert not any(a[1] in ("release", "update") for a in b.log), b.log
    assert c.last_stats.dropped == (1,)


# --------------------------------------------------------------------------- idle GPU-seconds
def test_idle_gpu_seconds_of_a_released_job_waiting_for_a_node():
    """Job 1 (8 GPUs) was released at t=1000 and still waits in Reason=Resources at t=1020
    while 31 GPUs are free: 8 x 20 GPU-seconds; a held job and a job waiting for its
    BeginTime count nothing."""
    waiting = replace(job(1, priority=10, reason="Resources", gpus=8))
    b = NodesBackend([on(10, "gpu01", "gpu:1(IDX:0)"), waiting, job(2, gpus=4),
                      replace(job(3, priority=10, reason="BeginTime"))])
    c = SlurmCluster(b, grace_seconds=0, sleep=lambda s: None)
    c.observe(1000.0)
    assert c._unplaceable_gpu_s == 0.0          # no interval yet
    c.observe(1020.0)
    c.enact(RoundPlan(frozenset({10, 1})), c.observe(1030.0))
    assert c.last_stats.idle_unplaceable_gpu_s == 8 * 10.0
    assert c.idle_gpu_s["unplaceable"] == 8 * 30.0


def test_idle_unplaceable_reaches_the_round_log_and_the_metric():
    from shockslurm.daemon.round_log import RoundLogger
    from shockslurm.ops.metrics import DaemonMetrics, MetricsObserver

    b = NodesBackend([on(10, "gpu01", "gpu:1(IDX:0)"),
                      job(1, priority=10, reason="Resources", gpus=8)])
    c = SlurmCluster(b, grace_seconds=0, sleep=lambda s: None)
    lines: list[str] = []
    logger = RoundLogger(c, emit=lines.append, clock=lambda: 1030.0)
    metrics = DaemonMetrics()
    observer = MetricsObserver(metrics, c, clock=lambda: 1030.0)
    for now in (1000.0, 1030.0):
        snap = c.observe(now)
        plan = place_plan(RoundPlan(frozenset({10, 1})), snap)
        c.enact(plan, snap)
        logger.on_round(snap, plan, 0.0)
        observer.on_round(snap, plan, 0.0)
    assert "idle_unplaceable_gpu_s=240.0" in lines[-1] and "pinned=1" in lines[-1]
    text = metrics.render().decode()
    assert 'shockslurm_idle_gpu_seconds_total{cause="unplaceable"} 240.0' in text


def test_a_job_started_before_its_hold_keeps_running_and_its_successor_waits():
    """Job 1 (8 GPUs) was released last round and still waits; this round's plan runs job 2 (8
    GPUs) on gpu01 instead. Slurm starts job 1 on gpu01 between the round's read and the hold
    (the hold does not stop it). Job 1 has just started: the churn bounds keep it (minimum
    run), so it is not requeued, and job 2 is not released (pinned to gpu01, it would wait in
    Reason=Resources); the next round plans with job 1 running."""
    released = job(1, JobState.PENDING, priority=1000, reason="Resources", gpus=8)
    b = NodesBackend([released, job(2, gpus=8)])
    starts_at_hold(b, replace(on(1, "gpu01", "gpu:8(IDX:0-7)", gpus=8), start_time=1000.5))
    c = SlurmCluster(b, grace_seconds=10, sleep=lambda s: None, round_s=120)
    snap = c.observe(1000.0)
    plan = place_plan(RoundPlan(frozenset({2})), snap)
    assert plan.placement[2] == (("gpu01", 8),)
    c.enact(plan, snap)
    assert b.log == [("scontrol", "uhold", "1")]
    assert c.last_stats.started == 0 and c.last_stats.stopped == 0


def test_a_released_job_slurm_may_be_starting_stays_on_its_pinned_node():
    """Job 1 (2 GPUs) was released pinned to gpu02 and still shows PENDING: Slurm may be
    starting it there as the round reads. Job 10 holds 6 GPUs of gpu01, job 11 one of gpu02;
    the plan starts job 2 (2 GPUs) too. Best fit alone would send job 1 to gpu01 (a re-pin
    that fails once Slurm has started it, measured live) and job 2 to gpu02; the snapshot
    names job 1's pin, so job 1 stays and job 2 takes gpu01: no update for job 1."""
    two = [SlurmNode(n, "mixed", 8, 0, ("gpu",)) for n in NODES[:2]]
    released = replace(job(1, priority=1000, reason="None", gpus=2), required_nodes="gpu02")
    b = NodesBackend([released, job(2, gpus=2), on(10, "gpu01", "gpu:6(IDX:0-5)", gpus=6),
                      on(11, "gpu02", "gpu:1(IDX:0)")], two)
    c = SlurmCluster(b, grace_seconds=0, sleep=lambda s: None, churn=NO_CHURN)
    snap = c.observe(1000.0)
    assert snap.pinned == {1: (("gpu02", 2),)} and 1 not in snap.placements
    assert snap.gpus == 16
    plan = place_plan(RoundPlan(frozenset({1, 2, 10, 11})), snap)
    assert plan.placement[1] == (("gpu02", 2),) and plan.placement[2] == (("gpu01", 2),)
    assert not plan.info_ids("moved")
    blind = place_plan(RoundPlan(frozenset({1, 2, 10, 11})), replace(snap, pinned={}))
    assert blind.placement[1] == (("gpu01", 2),)          # what the daemon did before
    c.enact(plan, snap)
    assert b.log == [("scontrol", "update", "JobId=2", "ReqNodeList=gpu01"),
                     ("scontrol", "release", "2")]


def test_only_released_jobs_with_a_readable_pin_are_pinned():
    """Held jobs keep their old ReqNodeList but Slurm starts none of them; a released job with
    no list, an unreadable one, GPUs per node that do not split over its nodes, or a node
    outside the managed partitions is not pinned; a 2-node gang is pinned on both nodes, and
    so is a `--gpus=3` job (Slurm splits it as it finds room: its shares split it as evenly as
    they go)."""
    jobs = [replace(job(1, gpus=2), required_nodes="gpu01"),                       # held
            replace(job(2, priority=9, reason="None"), required_nodes=""),
            replace(job(3, priority=9, reason="None"), required_nodes="gpu[01"),
            replace(job(4, priority=9, reason="None", gpus=3), required_nodes="gpu[01-02]"),
            replace(job(8, priority=9, reason="None", gpus=0), gpus_per_job=3,
                    required_nodes="gpu[01-02]"),
            replace(job(5, priority=9, reason="None"), required_nodes="cpu01"),
            replace(job(6, priority=9, reason="None", gpus=8), nodes=2,
                    required_nodes="gpu[03-04]"),
            replace(job(7, priority=9, reason="None", gpus=8, managed=False),
                    required_nodes="gpu04")]                                       # not ours
    snap = SlurmCluster(NodesBackend(jobs)).observe(1000.0)
    assert snap.pinned == {6: (("gpu03", 8), ("gpu04", 8)), 8: (("gpu01", 2), ("gpu02", 1))}
