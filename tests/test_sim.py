"""The simulated cluster on hand-computed cases, and policy invariants on a generated workload."""

from __future__ import annotations

import pytest

from shockslurm.model import RoundPlan, Snapshot
from shockslurm.policies import PolicySettings, make_policy, policy_names
from shockslurm.sim.cluster import SimulatedCluster
from shockslurm.sim.jobs import SimJob
from shockslurm.sim.reference_rules import gns_pattern_bs, wanted_change
from shockslurm.sim.run import SimConfig, simulate
from shockslurm.workload.generator import GeneratorConfig, generate

from .conftest import make_spec


def _outcome(result, job_id):
    return next(o for o in result.outcomes if o.job_id == job_id)


def test_single_job_finishes_at_the_exact_moment() -> None:
    # 3 epochs x 100 iterations at 1 it/s = 300 s: rounds of 120 + 120 + 60, no restarts
    job = make_spec(epochs=3, bs=10, samples=1000, ips=1.0)
    r = simulate([job], "fifo", SimConfig(gpus=1))
    assert _outcome(r, 0).completion_s == pytest.approx(300.0)
    assert r.metrics.utilization == pytest.approx(1.0)


def test_restart_overhead_is_charged_on_full_rounds_only() -> None:
    # Two 240 s jobs on one GPU under FIFO: B first runs at 240 s (a restart, full round):
    # it keeps 100 of 120 iterations, then 120 more, then the last 20 finish at 500 s.
    a = make_spec(0, epochs=2, bs=10, samples=1200, ips=1.0)
    b = make_spec(1, epochs=2, bs=10, samples=1200, ips=1.0)
    r = simulate([a, b], "fifo", SimConfig(gpus=1))
    assert _outcome(r, 0).completion_s == pytest.approx(240.0)
    assert _outcome(r, 1).completion_s == pytest.approx(500.0)
    r0 = simulate([a, b], "fifo", SimConfig(gpus=1, restart_overhead_s=0))
    assert _outcome(r0, 1).completion_s == pytest.approx(480.0)


def test_an_overhead_as_long_as_the_round_costs_the_round_not_negative_progress() -> None:
    # 120 s overhead, 120 s rounds: B's restarted full round does no work (it used to go
    # backwards and crash the forecast with a negative epoch count); FIFO then runs B alone.
    a = make_spec(0, epochs=2, bs=10, samples=1200, ips=1.0)
    b = make_spec(1, epochs=2, bs=10, samples=1200, ips=1.0)
    r = simulate([a, b], "fifo", SimConfig(gpus=1, restart_overhead_s=120.0))
    assert _outcome(r, 1).completion_s == pytest.approx(600.0)
    r = simulate([a, b], "shockwave", SimConfig(gpus=1, restart_overhead_s=150.0))
    assert all(o.completion_s > 0 for o in r.outcomes)


def test_arrival_waits_for_the_next_round_boundary() -> None:
    a = make_spec(0, epochs=4, bs=10, samples=1200, ips=1.0)
    b = make_spec(1, epochs=1, bs=10, samples=100, ips=1.0, arrival=30.0)
    r = simulate([a, b], "fifo", SimConfig(gpus=2))
    # b joins at 120 s (a restart but a short one: no overhead) and needs 10 s
    assert _outcome(r, 1).completion_s == pytest.approx(130.0)
    assert _outcome(r, 1).jct_s == pytest.approx(100.0)


def test_profile_mode_follows_the_declared_schedule() -> None:
    spec = make_spec(epochs=4, schedule=[10, 10, 20, 20], samples=1000,
                     throughput={10: 1.0, 20: 0.8})
    job = SimJob(spec, adaptation="profile")
    job.record_run(job.iterations_for(120), 120, 120)     # 120 of 400 its: epoch 1 of 4
    assert job.batch_size == 10
    job.record_run(job.iterations_for(120), 120, 240)     # 240 its = 2.4 epochs -> switch to 20
    assert job.batch_size == 20
    assert job.epochs_done == pytest.approx(2.4)          # the partial epoch is kept exactly
    assert job.total_iterations == 200 and job.observed_batch_sizes == (10, 10)


def test_a_declared_profile_is_what_the_policy_sees_not_how_the_job_runs() -> None:
    # A GNS-like job: epochs at 10 then 20 (faster). Declared as shocksub declares it live, the
    # policy sees 4 epochs at 10 of the first epoch's 100 s; the job still runs by its profile.
    spec = make_spec(epochs=4, schedule=[10, 10, 20, 20], samples=1000,
                     throughput={10: 1.0, 20: 1.0})
    profile = spec.declared_profile()
    assert tuple(profile.batch_sizes) == (10,) * 4
    assert tuple(profile.epoch_durations) == (100.0,) * 4
    assert profile.exclusive_runtime_s == 400.0
    assert spec.exclusive_runtime_s == pytest.approx(300.0)
    seen = {}
    for declared in (False, True):
        cluster = SimulatedCluster(1, [spec], round_s=120.0, declared_profile=declared)
        view = cluster.observe(0.0).jobs[0]
        seen[declared] = view
        r = simulate([spec], "fifo", SimConfig(gpus=1, declared_profile=declared))
        assert _outcome(r, 0).completion_s == pytest.approx(300.0)   # by the profile
        assert r.as_dict().get("declared_profile", False) is declared
    assert tuple(seen[False].profile_batch_sizes) == (10, 10, 20, 20)
    assert seen[False].exclusive_runtime_s == pytest.approx(300.0)
    assert tuple(seen[True].profile_batch_sizes) == (10,) * 4
    assert tuple(seen[True].profile_epoch_durations) == (100.0,) * 4
    assert seen[True].exclusive_runtime_s == pytest.approx(400.0)


def test_reference_rules() -> None:
    # accordion: LM stays small for its first 10 epochs, ResNet-18 jumps straight to 256
    assert wanted_change("accordion", "LM", 20, 1, 20, 9 * 2984, 59675) is None
    assert wanted_change("accordion", "LM", 20, 1, 20, 10 * 2984, 59675) == 80
    assert wanted_change("accordion", "ResNet-18", 32, 1, 32, 15468, 50000) == 256
    assert wanted_change("accordion", "Transformer", 64, 1, 64, 10**6, 10000) is None
    # gns: LM bs 10 on one GPU doubles from epoch 11, then 21, then 41; capped at 80
    assert [gns_pattern_bs("LM", 10, 1, e) for e in (10, 11, 21, 41, 500)] == [10, 20, 40, 80, 80]
    assert wanted_change("gns", "LM", 10, 1, 10, 10 * 5968, 59675) == 20   # looks one epoch ahead


def test_reference_mode_applies_a_flag_after_the_next_run() -> None:
    spec = make_spec(epochs=92, bs=32, samples=50000, mode="accordion",
                     throughput={32: 42.97497938, 256: 6.31952281})
    job = SimJob(spec, adaptation="reference")
    job.iterations_done = 15468        # 3 full rounds: epoch ceil(9.9) = 10 is not critical
    job.update_flags()
    assert job.pending_bs == 256 and job.batch_size == 32
    job.record_run(5156, 119.98, 480)  # the next run still goes at batch size 32 ...
    assert job.batch_size == 256       # ... and the change lands after it
    assert job.iterations_done == 14 * 196   # ceil(20624 / 1563) = 14 epochs, rounded up


def test_reference_mode_a_switch_that_rounds_up_the_last_epoch_ends_the_job() -> None:
    """The switch counts the epoch in progress as complete; in the last epoch that leaves no
    work, and the job ends with that run. (It used to stay active with no work left: a market
    that saw it done planned no round for it, and the fill served it last; at 2000/512 seed 2
    such a job waited 16,000 s for a zero-work round, worst rho 4.15.)"""
    spec = make_spec(epochs=92, bs=32, samples=50000, mode="accordion",
                     throughput={32: 42.97497938, 256: 6.31952281})
    job = SimJob(spec, adaptation="reference")
    job.iterations_done = job.total_iterations - 100      # inside the last epoch
    job.pending_bs = 256
    job.record_run(50, 1.2, 480)                          # 50 iterations still to go ...
    assert job.batch_size == 256 and job.remaining_iterations <= 0
    assert job.done and job.completion_s == 480          # ... but the rounded-up epoch ends it


def test_profile_mode_switches_batch_size_at_the_epoch_boundary_within_a_run() -> None:
    """A job that follows its schedule changes batch size where its epoch changes, as it does
    live, not at the end of the run: one run as long as the profile's exclusive time does the
    whole job. (Before, it ran the rest of the round at the old batch size, 4x slower here, and
    every round-based policy paid for it: on the live benchmark's workloads, seconds per job.)"""
    spec = make_spec(epochs=3, bs=32, samples=3200, schedule=[32, 128, 128],
                     throughput={32: 10.0, 128: 10.0})        # 10 s, then 2.5 s per epoch
    assert spec.exclusive_runtime_s == pytest.approx(15.0)
    job = SimJob(spec)
    run = job.plan_run(60.0)
    assert run.segments == ((32, 100), (128, 50)) and run.completes
    assert run.seconds == pytest.approx(15.0)
    job.record_run(run, run.seconds, 15.0)
    assert job.done and job.completion_s == 15.0
    assert job.observed_batch_sizes == (32, 128, 128)
    assert job.batch_size_changes == [(10.0, 32, 128)]          # logged at the boundary


def test_profile_mode_a_run_cut_after_the_switch_keeps_the_new_batch_size() -> None:
    spec = make_spec(epochs=3, bs=32, samples=3200, schedule=[32, 128, 128],
                     throughput={32: 10.0, 128: 10.0})
    job = SimJob(spec)
    run = job.plan_run(60.0)
    part = run.within(12.5, spec.throughput)               # the first epoch and one more
    assert part.segments == ((32, 100), (128, 25)) and not part.completes
    job.record_run(part, 12.5, 12.5)
    assert job.batch_size == 128 and job.epochs_done == pytest.approx(2.0)
    assert job.plan_run(60.0).segments == ((128, 25),)


def test_reference_mode_runs_keep_one_batch_size_per_run() -> None:
    spec = make_spec(epochs=3, bs=32, samples=3200, schedule=[32, 128, 128],
                     throughput={32: 10.0, 128: 10.0})
    run = SimJob(spec, adaptation="reference").plan_run(60.0)
    assert run.segments == ((32, 300),) and run.completes


class _Invariants:
    """Checks every round: capacity, whole gangs, and (optionally) work conservation."""

    def __init__(self, gpus: int, work_conserving: bool) -> None:
        self.gpus, self.work_conserving, self.rounds = gpus, work_conserving, 0

    def on_round(self, snapshot: Snapshot, plan: RoundPlan, solve_s: float) -> None:
        self.rounds += 1
        used = plan.gpus_used(snapshot)
        assert used <= self.gpus
        if self.work_conserving:
            free = self.gpus - used
            waiting = [j for j in snapshot.jobs if j.job_id not in plan.run]
            assert all(j.gang_size > free for j in waiting), "idle GPUs while a job fits"


@pytest.mark.parametrize("name", policy_names())
def test_policy_invariants_on_a_generated_workload(name: str) -> None:
    from shockslurm.engine import RoundLoop, VirtualClock
    from shockslurm.sim.cluster import SimulatedCluster

    jobs = generate(GeneratorConfig(jobs=30, seed=1, jobs_per_hour=120))
    gpus = 8
    cluster = SimulatedCluster(gpus, jobs)
    policy = make_policy(name, PolicySettings(min_resolve_interval_s=0, idle_unallocated=False))
    check = _Invariants(gpus, work_conserving=name != "fifo")
    RoundLoop(cluster, policy, VirtualClock(), 120.0, observers=[check]).run()
    assert cluster.finished() and check.rounds > 10
    assert all(j.done for j in cluster.sim_jobs.values())


def test_reference_gate_leaves_new_jobs_idle() -> None:
    """With Gavel's re-solve gate a job arriving between re-solves waits, GPUs idle."""
    # re-solves at 0 s and at 120 s (job 1 arrived); job 2 arrives at 300 s, inside the gate
    jobs = [make_spec(0, epochs=50, bs=10, samples=1200, ips=1.0),
            make_spec(1, epochs=20, bs=10, samples=1200, ips=1.0, arrival=60.0),
            make_spec(2, epochs=2, bs=10, samples=1200, ips=1.0, arrival=300.0)]
    gated = simulate(jobs, "max_min_fairness", SimConfig(gpus=3))
    eager = simulate(jobs, "max_min_fairness", SimConfig(gpus=3, settings=PolicySettings(
        min_resolve_interval_s=0, idle_unallocated=False)))
    # eager: starts at 360 s, keeps 100 of its first 120 iterations (restart), 240 in all
    assert _outcome(eager, 2).completion_s == pytest.approx(360 + 120 + 120 + 20)
    # gated: waits for the re-solve at 1200 s (first boundary >= 120 + 1000 s)
    assert _outcome(gated, 2).completion_s == pytest.approx(1200 + 120 + 120 + 20)
    idle = [r.info.get("idle_unallocated_gpus", 0) for r in gated.rounds]
    assert max(idle) == 1


def test_fragmentation_on_nodes_costs_simulated_time() -> None:
    # Gangs of 3, 3 and 2 on 8 GPUs: one pool runs all three at once; two nodes of 4 cannot
    # hold two gangs of 3 beside a gang of 2 (each node keeps 1 GPU free), so the 2-GPU job
    # waits for a node, its GPUs idle meanwhile.
    from shockslurm.model import parse_cluster_shape

    jobs = [make_spec(j, epochs=2, bs=10, samples=1200, ips=1.0, gang=g)
            for j, g in enumerate((3, 3, 2))]
    pool = simulate(jobs, "fifo", SimConfig(gpus=8, restart_overhead_s=0))
    nodes = simulate(jobs, "fifo", SimConfig.for_nodes(parse_cluster_shape("2x4"),
                                                       restart_overhead_s=0))
    assert pool.metrics.makespan_s == pytest.approx(240.0)
    assert nodes.metrics.makespan_s == pytest.approx(480.0)
    assert _outcome(nodes, 2).completion_s == pytest.approx(480.0)
    # fifo plans on nodes itself: the 2-GPU job is not planned (no node has room), not unplaced
    assert nodes.rounds[0].run == (0, 1) and "unplaced" not in nodes.rounds[0].info
    assert nodes.metrics.utilization < pool.metrics.utilization
    assert nodes.as_dict()["cluster"] == "2x4" and pool.as_dict()["cluster"] == "pool"


def test_a_job_moved_to_another_node_pays_the_restart_overhead() -> None:
    from shockslurm.model import parse_cluster_shape
    from shockslurm.sim.cluster import SimulatedCluster

    jobs = [make_spec(j, epochs=4, bs=10, samples=1200, ips=1.0, gang=2) for j in (1, 2)]
    jobs.append(make_spec(3, epochs=4, bs=10, samples=1200, ips=1.0, gang=4))
    cluster = SimulatedCluster(8, jobs, restart_overhead_s=20.0,
                               nodes=parse_cluster_shape("2x4"))
    where = {1: (("node01", 2),), 2: (("node02", 2),)}
    for rnd in range(3):   # round 0 and 1: jobs 1 and 2 on separate nodes; round 2: job 3 too
        snap = cluster.observe(rnd * 120.0)
        if rnd < 2:
            cluster.enact(RoundPlan(frozenset(where), placement=where), snap)
        else:
            assert snap.placements == where
            cluster.enact(RoundPlan(frozenset({1, 2, 3})), snap)   # placed by the cluster
    cluster.observe(360.0)
    # one of the two 2-GPU jobs moved to make room for the 4-GPU gang: it lost 20 s of round 2
    done = sorted(cluster.sim_jobs[j].iterations_done for j in (1, 2))
    assert done == [340, 360]


# ------------------------------------------------------------------ fill_on_completion
def _three(arrival_c: float = 0.0):
    """On 2 GPUs under FIFO: A (30 s) and B (240 s) run, C (100 s) waits."""
    return [make_spec(0, epochs=1, bs=10, samples=300, ips=1.0),
            make_spec(1, epochs=2, bs=10, samples=1200, ips=1.0),
            make_spec(2, epochs=1, bs=10, samples=1000, ips=1.0, arrival=arrival_c)]


@pytest.mark.parametrize("arrival_c", [0.0, 10.0])
def test_fill_on_completion_starts_the_waiting_job_when_one_finishes(arrival_c: float) -> None:
    ref = simulate(_three(arrival_c), "fifo", SimConfig(gpus=2))
    # the reference: C starts at the round boundary (120 s, a short run: no overhead)
    assert _outcome(ref, 2).completion_s == pytest.approx(220.0)
    fill = simulate(_three(arrival_c), "fifo", SimConfig(gpus=2, fill_on_completion=True))
    # live-like: a round at A's end (30 s); C pays its 20 s restart, then runs 100 s
    assert [round(r.start_s) for r in fill.rounds][:2] == [0, 30]
    assert _outcome(fill, 2).completion_s == pytest.approx(150.0)
    # B was cut at 30 s and went on without a restart: it ends when it would have
    assert _outcome(fill, 1).completion_s == pytest.approx(_outcome(ref, 1).completion_s)
    free = simulate(_three(arrival_c), "fifo",
                    SimConfig(gpus=2, fill_on_completion=True, restart_overhead_s=0))
    assert _outcome(free, 2).completion_s == pytest.approx(130.0)


def test_fill_on_completion_without_a_waiting_job_keeps_the_rounds() -> None:
    jobs = _three()[:2]
    ref = simulate(jobs, "fifo", SimConfig(gpus=2))
    fill = simulate(jobs, "fifo", SimConfig(gpus=2, fill_on_completion=True))
    assert [r.start_s for r in fill.rounds] == [r.start_s for r in ref.rounds]
    assert [o.completion_s for o in fill.outcomes] == [o.completion_s for o in ref.outcomes]


def test_fill_on_completion_a_run_cut_during_its_restart_owes_the_rest() -> None:
    # On 2 GPUs under FIFO, B ends 10 s into the restart of C (which took A's GPU): the early
    # round cuts C there, and C then owes the other 10 s of its 20 s restart, not 20 again.
    a = make_spec(0, epochs=1, bs=10, samples=300, ips=1.0)           # 0-30
    b = make_spec(1, epochs=1, bs=10, samples=400, ips=1.0)           # 0-40
    c = make_spec(2, epochs=1, bs=10, samples=1000, ips=1.0)          # waits
    d = make_spec(3, epochs=1, bs=10, samples=500, ips=1.0)           # waits
    r = simulate([a, b, c, d], "fifo", SimConfig(gpus=2, fill_on_completion=True))
    # 30 s: C replaces A (restart until 50 s); 40 s: D replaces B, C is cut 10 s into its
    # restart and keeps going (10 s owed): C runs from 50 s, D from 60 s
    assert [round(x.start_s) for x in r.rounds][:3] == [0, 30, 40]
    assert _outcome(r, 2).completion_s == pytest.approx(150.0)
    assert _outcome(r, 3).completion_s == pytest.approx(110.0)


@pytest.mark.parametrize("gang_b, starts_early", [(1, True), (2, False)])
def test_fill_on_completion_starts_an_arrival_that_fits_the_idle_gpus(gang_b: int,
                                                                     starts_early: bool) -> None:
    # On 2 GPUs, A (1 GPU, 240 s) runs alone; B (100 s) arrives at 10 s. A 1-GPU B fits the
    # idle GPU: a round starts at its arrival. A 2-GPU B does not: it waits for the boundary.
    a = make_spec(0, epochs=2, bs=10, samples=1200, ips=1.0)
    b = make_spec(1, epochs=1, bs=10, samples=1000, ips=1.0, arrival=10.0, gang=gang_b)
    r = simulate([a, b], "fifo", SimConfig(gpus=2, fill_on_completion=True, restart_overhead_s=0))
    starts = [round(x.start_s) for x in r.rounds]
    if starts_early:
        assert starts[:2] == [0, 10]
        assert _outcome(r, 1).completion_s == pytest.approx(110.0)
        assert _outcome(r, 0).completion_s == pytest.approx(240.0)     # A was not disturbed
    else:
        assert 10 not in starts
        assert _outcome(r, 1).completion_s > 200.0


@pytest.mark.parametrize("samples_a, ask, kept", [(6000, 60.0, True), (1300, 120.0, True),
                                                   (6000, 120.0, False)])
def test_live_like_rounds_keep_the_jobs_the_daemons_churn_bounds_keep(samples_a: int, ask: float,
                                                                        kept: bool) -> None:
    # One GPU, 60 s rounds: A runs from 0; at `ask` the plan says B instead. The daemon keeps A
    # when its run is younger than 1.5 rounds (90 s: at 60 s), or when it ends within half a
    # round (1300 samples: 10 s left at 120 s); a long A that ran 2 rounds gives way to B.
    from shockslurm.churn_rules import ChurnLimits
    from shockslurm.sim.cluster import SimulatedCluster

    a = make_spec(0, epochs=1, bs=10, samples=samples_a, ips=1.0)
    b = make_spec(1, epochs=1, bs=10, samples=600, ips=1.0)
    cluster = SimulatedCluster(1, [a, b], round_s=60.0, restart_overhead_s=0.0,
                               fill_on_completion=True, churn=ChurnLimits.for_round(60.0))
    cluster.enact(RoundPlan(frozenset({0})), cluster.observe(0.0))
    if ask > 60.0:
        cluster.enact(RoundPlan(frozenset({0})), cluster.observe(60.0))
    cluster.enact(RoundPlan(frozenset({1})), cluster.observe(ask))
    assert {d.job_id for d in cluster._running} == ({0} if kept else {1})


def test_live_like_rounds_keep_a_job_whose_gpus_no_start_takes() -> None:
    """As the daemon does (`churn_rules.idle_stops`): on 2 GPUs, A has run 180 s, C 60 s
    (younger than the 90 s minimum run); the plan stops both for the 2-GPU job B. The churn
    bounds keep C, so B does not fit and waits; A's GPU would idle: A keeps running."""
    from shockslurm.churn_rules import ChurnLimits
    from shockslurm.plan_on_nodes import place_plan
    from shockslurm.sim.cluster import SimulatedCluster

    a = make_spec(0, epochs=10, bs=10, samples=1000, ips=1.0)
    c = make_spec(1, epochs=10, bs=10, samples=1000, ips=1.0, arrival=100.0)
    b = make_spec(2, gang=2, epochs=10, bs=10, samples=1000, ips=1.0, arrival=100.0)
    cluster = SimulatedCluster(2, [a, c, b], round_s=60.0, restart_overhead_s=0.0,
                               fill_on_completion=True, churn=ChurnLimits.for_round(60.0))
    for now, run in ((0.0, {0}), (60.0, {0}), (120.0, {0, 1}), (180.0, {2})):
        snap = cluster.observe(now)
        cluster.enact(place_plan(RoundPlan(frozenset(run)), snap), snap)
    assert {d.job_id for d in cluster._running} == {0, 1}


@pytest.mark.parametrize("a_since", [0.0, 120.0])
def test_live_like_rounds_bound_a_move_like_a_stop(a_since: float) -> None:
    """As the daemon does (`live.churn.ChurnGuard.bound`: a move is a stop and a restart): on
    two nodes of 2 GPUs, A runs on the first since `a_since`, C on the second since 120 s. At
    180 s the plan moves C beside A to make room for the 2-GPU job B; C's run (60 s) is younger
    than the 90 s minimum, so C stays where it runs (before: the simulator moved C, which the
    daemon never does). The plan is placed again around C: A, when it may move (it has run
    180 s), goes beside C and B takes A's node; when A is as young as C, B fits no node and
    waits."""
    from shockslurm.churn_rules import ChurnLimits
    from shockslurm.model import parse_cluster_shape
    from shockslurm.sim.cluster import SimulatedCluster

    nodes = parse_cluster_shape("2x2")
    a = make_spec(0, epochs=10, bs=10, samples=1000, ips=1.0)
    c = make_spec(1, epochs=10, bs=10, samples=1000, ips=1.0, arrival=100.0)
    b = make_spec(2, gang=2, epochs=10, bs=10, samples=1000, ips=1.0, arrival=100.0)
    cluster = SimulatedCluster(4, [a, c, b], round_s=60.0, restart_overhead_s=0.0, nodes=nodes,
                               fill_on_completion=True, churn=ChurnLimits.for_round(60.0))
    n0, n1 = nodes[0].name, nodes[1].name
    plans = [(0.0, {}), (60.0, {}), (120.0, {1: ((n1, 1),)}),
             (180.0, {1: ((n0, 1),), 2: ((n1, 2),)})]
    for now, placement in plans:
        if now >= a_since:
            placement = {0: ((n0, 1),), **placement}
        snap = cluster.observe(now)
        moved = [1] if now == 180.0 else []
        cluster.enact(RoundPlan(frozenset(placement), {"moved": moved} if moved else {},
                                placement), snap)
    assert cluster._where[1] == ((n1, 1),)
    if a_since == 0.0:
        assert {d.job_id for d in cluster._running} == {0, 1, 2}
        assert cluster._where[0] == ((n1, 1),) and cluster._where[2] == ((n0, 2),)
    else:
        assert {d.job_id for d in cluster._running} == {0, 1}


def test_a_job_slower_than_one_iteration_per_round_is_refused_not_simulated_forever() -> None:
    slow = make_spec(epochs=3, bs=32, samples=64, throughput={32: 1e-4})
    with pytest.raises(ValueError, match=r"job 0: 0.0001 iterations/s at batch size 32"):
        simulate([slow], "fifo", SimConfig(gpus=1))


# ---------------------------------------------------------------- partial iterations kept
def _pool(round_s: float, **kwargs) -> SimConfig:
    return SimConfig(gpus=2, restart_overhead_s=0.0, settings=PolicySettings(round_s=round_s),
                     **kwargs)


def test_a_job_slower_than_a_round_is_refused_unless_partial_iterations_are_kept() -> None:
    # 2 s iterations in 1 s rounds (bench live's native prediction of a slow replay)
    slow = make_spec(epochs=2, bs=100, samples=500, ips=0.5)       # 10 iterations: 20 s
    with pytest.raises(ValueError, match="job 0: 0.5 iterations/s .* 1 s round"):
        simulate([slow], "fifo", _pool(1.0))
    kept = simulate([slow], "fifo", _pool(1.0, keep_partial_iterations=True))
    assert _outcome(kept, 0).completion_s == pytest.approx(20.0)
    assert kept.as_dict()["keep_partial_iterations"] is True


def test_whole_iterations_per_round_slow_a_job_beside_a_faster_one_unless_kept() -> None:
    # The round ends when its longest run does (the fast job's 1 s); the slow job's 1.5
    # iterations a second count as one a round unless its part-done iteration is kept.
    slow = make_spec(0, epochs=1, bs=10, samples=300, ips=1.5)     # 30 iterations: 20 s
    fast = make_spec(1, epochs=1, bs=10, samples=4000, ips=100.0)  # 400 iterations: 4 s
    long_fast = make_spec(2, epochs=1, bs=10, samples=40000, ips=100.0, arrival=0.0)
    jobs = [slow, fast, long_fast]
    whole = simulate(jobs, "fifo", SimConfig(gpus=3, restart_overhead_s=0.0,
                                            settings=PolicySettings(round_s=1.0)))
    kept = simulate(jobs, "fifo", SimConfig(gpus=3, restart_overhead_s=0.0,
                                           settings=PolicySettings(round_s=1.0),
                                           keep_partial_iterations=True))
    assert _outcome(whole, 0).completion_s == pytest.approx(30.0, abs=0.5)
    assert _outcome(kept, 0).completion_s == pytest.approx(20.0, abs=1e-6)
    assert _outcome(kept, 2).completion_s == pytest.approx(40.0, abs=1e-6)


@pytest.mark.parametrize("keep", [False, True])
def test_a_round_cut_by_an_arrival_keeps_the_iteration_in_progress_only_when_asked(
        keep: bool) -> None:
    # Live-like rounds: job 1 arrives at 3.3 s and fits the idle GPU, so the round is cut
    # there; job 0 (2 s iterations) runs on, 1.3 s into its second iteration.
    runner = make_spec(0, epochs=2, bs=100, samples=500, ips=0.5)  # 20 s alone
    arrival = make_spec(1, epochs=1, bs=100, samples=100, ips=1.0, arrival=3.3)
    result = simulate([runner, arrival], "fifo",
                      _pool(15.0, fill_on_completion=True, keep_partial_iterations=keep))
    assert any(abs(r.start_s - 3.3) < 1e-9 for r in result.rounds)      # the cut
    assert _outcome(result, 0).completion_s == pytest.approx(20.0 if keep else 21.3)
