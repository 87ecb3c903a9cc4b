from __future__ import annotations

from shockslurm.model import Snapshot, parse_cluster_shape
from shockslurm.plan_on_nodes import place_plan
from shockslurm.policies.fifo import Fifo

from .conftest import make_view


def _snap(views, gpus=8):
    return Snapshot(now=0, round_index=0, round_s=120.0, gpus=gpus, jobs=tuple(views))


def test_fifo_is_non_preemptive_and_in_order() -> None:
    views = [make_view(0, gang=4, ran_last_round=True, arrival=5),
             make_view(1, gang=4, arrival=1), make_view(2, gang=2, arrival=2)]
    assert Fifo().allocate(_snap(views)).run == {0, 1}


def test_easy_backfill_respects_the_heads_reservation() -> None:
    # running: job 0 (4 GPUs) ends in 100 s. Head job 1 needs 8 -> reserved at t=100.
    # job 2 (2 GPUs, 50 s) ends before that: backfilled. job 3 (2 GPUs, 500 s) would delay it.
    views = [make_view(0, gang=4, ran_last_round=True, remaining=100),
             make_view(1, gang=8, arrival=1), make_view(2, gang=2, arrival=2, remaining=50),
             make_view(3, gang=2, arrival=3, remaining=500)]
    assert Fifo().allocate(_snap(views)).run == {0, 2}


def test_fifo_starts_a_gang_only_where_a_node_has_room_and_never_moves_a_running_job() -> None:
    # 2x4: jobs 1 and 2 (2 GPUs) run on different nodes; 4 GPUs are free in all, but no node
    # has 4. The 4-GPU head waits (Slurm would not move a running job for it); the 1-GPU job
    # behind it ends before either running job: backfilled on a node with room
    running = {1: (("node01", 2),), 2: (("node02", 2),)}
    views = [make_view(1, gang=2, ran_last_round=True, remaining=100),
             make_view(2, gang=2, ran_last_round=True, remaining=200),
             make_view(3, gang=4, arrival=1), make_view(4, gang=1, arrival=2, remaining=50)]
    snap = Snapshot(now=0, round_index=0, round_s=120.0, gpus=8, jobs=tuple(views),
                    nodes=parse_cluster_shape("2x4"), placements=running)
    plan = Fifo().allocate(snap)
    assert plan.run == {1, 2, 4} and not plan.moves_allowed
    placed = place_plan(plan, snap)
    assert placed.run == {1, 2, 4} and not placed.info_ids("moved")
    assert {j: placed.placement[j] for j in (1, 2)} == running
    # one pool of the same 8 GPUs: the head fits and starts
    assert Fifo().allocate(_snap(views)).run == {1, 2, 3}


def test_backfill_keeps_off_the_nodes_reserved_for_the_head() -> None:
    # 2x4: job 1 (2 GPUs, node01) ends at 100 s, job 2 (2 GPUs, node02) at 300 s. The 4-GPU
    # head is reserved node01 at 100 s. Job 4 (2 GPUs, 500 s) runs past that: it may start,
    # but only on node02, beside job 2 (counted in GPUs it would fit either node; on node01
    # it would hold the head off until 500 s). Job 5 (1 GPU, 500 s) has no such room; job 6
    # (1 GPU, 50 s) ends before the head starts and takes what is free now.
    running = {1: (("node01", 2),), 2: (("node02", 2),)}
    views = [make_view(1, gang=2, ran_last_round=True, remaining=100),
             make_view(2, gang=2, ran_last_round=True, remaining=300),
             make_view(3, gang=4, arrival=1), make_view(4, gang=2, arrival=2, remaining=500),
             make_view(5, gang=1, arrival=3, remaining=500),
             make_view(6, gang=1, arrival=4, remaining=50)]
    snap = Snapshot(now=0, round_index=0, round_s=120.0, gpus=8, jobs=tuple(views),
                    nodes=parse_cluster_shape("2x4"), placements=running)
    plan = Fifo().allocate(snap)
    assert plan.run == {1, 2, 4, 6}
    assert plan.placement[4] == (("node02", 2),) and plan.placement[6] == (("node01", 1),)
    placed = place_plan(plan, snap)         # the round loop keeps fifo's own placement
    assert placed.placement == plan.placement and placed.run == plan.run


def test_a_released_job_starts_on_the_node_it_was_pinned_to() -> None:
    # 2x4: job 1 (2 GPUs) runs on node01; job 2 (2 GPUs) was released pinned to node02 and has
    # not started yet. Best fit would put it beside job 1; it stays on node02 (Slurm may be
    # starting it there), and job 3 takes node01's room.
    views = [make_view(1, gang=2, ran_last_round=True, remaining=100),
             make_view(2, gang=2, arrival=1), make_view(3, gang=2, arrival=2)]
    snap = Snapshot(now=0, round_index=0, round_s=120.0, gpus=8, jobs=tuple(views),
                    nodes=parse_cluster_shape("2x4"), placements={1: (("node01", 2),)},
                    pinned={2: (("node02", 2),)})
    plan = Fifo().allocate(snap)
    assert plan.placement[2] == (("node02", 2),) and plan.placement[3] == (("node01", 2),)
    blind = Fifo().allocate(Snapshot(now=0, round_index=0, round_s=120.0, gpus=8,
                                     jobs=tuple(views), nodes=parse_cluster_shape("2x4"),
                                     placements={1: (("node01", 2),)}))
    assert blind.placement[2] == (("node01", 2),)
