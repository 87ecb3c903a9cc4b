"""Jobs limited to some nodes (`Snapshot.allowed_nodes`: on the live cluster their partition's
nodes less what `--exclude`, `-w` and `--constraint` rule out): placement, the node book, fifo's
backfill and Shockwave's window layout put such a job on those nodes only."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shockslurm.model import Node, RoundPlan, Snapshot, parse_cluster_shape
from shockslurm.node_book import NodeBook
from shockslurm.placement import place
from shockslurm.plan_on_nodes import place_around, place_plan
from shockslurm.policies.fifo import Fifo
from shockslurm.policies.shockwave.packing import pack, priority_layout

from .conftest import make_view
from .test_placement import PROPS, _book_holding, _check_capacity_and_shape, cases


def _allowed(data, nodes, jobs) -> dict[int, frozenset[str]]:
    names = [n.name for n in nodes]
    return {j: frozenset(data.draw(st.sets(st.sampled_from(names))))
            for j in jobs if data.draw(st.booleans())}


@PROPS
@given(cases(), st.data())
def test_a_limited_job_is_placed_on_its_nodes_only_and_nothing_that_fits_is_dropped(case, data):
    nodes, plan, running, reserved = case
    allowed = _allowed(data, nodes, plan)
    result = place(nodes, plan, running, reserved, allowed=allowed)
    gangs = {**{j: sum(g for _, g in s) for j, s in running.items()}, **plan}
    staying = {j for j, s in result.shares.items() if s == running.get(j)}
    _check_capacity_and_shape(nodes, gangs, reserved, result,
                              {j: a for j, a in allowed.items() if j not in staying}, running)
    for j, shares in result.shares.items():
        if j in allowed and shares != running.get(j):     # a running job may stay where it is
            assert {n for n, _ in shares} <= allowed[j], (j, shares, allowed[j])
    book = _book_holding(nodes, reserved, result.shares, running)
    for j in result.unplaced:
        assert not book.can_take(plan[j], allowed.get(j)), f"job {j} was dropped but fits"
    # the same input in another order gives the same placement
    again = place(nodes, dict(reversed(plan.items())), dict(reversed(running.items())),
                  reserved, allowed=dict(reversed(allowed.items())))
    assert dict(again.shares) == dict(result.shares) and again.unplaced == result.unplaced


def test_the_node_book_answers_for_the_named_nodes() -> None:
    book = NodeBook(parse_cluster_shape("3x4"))
    assert book.take_at((("node01", 4),)) and book.take_at((("node02", 1),))
    assert not book.can_take(2, {"node01"}) and book.can_take(3, {"node02"})
    assert not book.can_take(4, {"node01", "node02"}) and book.can_take(4, {"node03", "x"})
    assert book.can_take(8, {"node02", "node03"}) is False       # multi-node: whole nodes only
    assert book.take(3, prefer=(("node02", 3),), within={"node03"}) == (("node03", 3),)
    assert book.take(1, within=set()) is None


def test_a_job_limited_to_a_full_node_is_dropped_and_another_takes_the_free_one() -> None:
    """Plain GPU counting plans both 4-GPU jobs on 8 free GPUs; job 1 may only run on node01,
    which job 9 fills: job 1 is unplaced (it would wait in Slurm), job 2 starts on node02."""
    views = tuple(make_view(j, gang=4) for j in (1, 2, 9))
    snap = Snapshot(now=0.0, round_index=1, round_s=60.0, gpus=12, jobs=views,
                    nodes=parse_cluster_shape("3x4"), placements={9: (("node01", 4),)},
                    allowed_nodes={1: frozenset({"node01"})})
    plan = place_plan(RoundPlan(frozenset({1, 2, 9})), snap)
    # job 9 is moved off node01 for job 1, which only node01 can hold
    assert plan.placement[1] == (("node01", 4),) and plan.info["moved"] == [9]
    kept = place_around(RoundPlan(frozenset({1, 2, 9}), {}, plan.placement), snap)
    assert kept.run == frozenset({2, 9}) and kept.info["unplaced"] == [1]
    assert kept.placement[9] == (("node01", 4),)


def test_fifo_backfills_around_a_head_that_may_only_run_on_a_busy_node() -> None:
    """The head may only run on node01, busy for 1000 s: it reserves node01, and a long job
    behind it still starts on node02 (it leaves node01 to the head); without the limit the
    head would start on node02 at once."""
    running = make_view(9, gang=4, ran_last_round=True, remaining=1000.0)
    head = make_view(1, gang=4, arrival=1.0, remaining=100.0)
    later = make_view(2, gang=4, arrival=2.0, remaining=5000.0)
    snap = Snapshot(now=0.0, round_index=1, round_s=60.0, gpus=8, jobs=(running, head, later),
                    nodes=parse_cluster_shape("2x4"), placements={9: (("node01", 4),)},
                    allowed_nodes={1: frozenset({"node01"})})
    plan = Fifo().allocate(snap)
    assert plan.run == frozenset({9, 2}) and plan.placement[2] == (("node02", 4),)
    free = Fifo().allocate(Snapshot(**{**snap.__dict__, "allowed_nodes": {}}))
    assert free.run == frozenset({9, 1}) and free.placement[1] == (("node02", 4),)


def test_the_window_layout_lays_a_limited_job_only_where_its_nodes_have_room() -> None:
    """Jobs 1 and 2 (4 GPUs each) may only run on node01 (4 GPUs): at most one of them a round;
    the priority layout gives job 2 the rounds job 1 leaves, and `pack` never puts both in a
    round, where counting GPUs alone would (8 free)."""
    nodes = parse_cluster_shape("2x4")
    allowed = {1: frozenset({"node01"}), 2: frozenset({"node01"})}
    gang = {1: 4, 2: 4, 3: 4}
    laid, got = priority_layout([1, 2, 3], {1: 2, 2: 2, 3: 3}, gang, 8, 3, nodes,
                                allowed=allowed)
    assert got == {1: 2, 2: 1, 3: 3}
    assert [sorted(r) for r in laid] == [[1, 3], [1, 3], [2, 3]]
    plan = pack([1, 2, 3], {1: 2, 2: 2, 3: 2}, gang, 8, 3, nodes, allowed=allowed)
    assert all(not {1, 2} <= set(r) for r in plan)
    # GPUs others hold count too: with node02 reserved, only one job a round fits
    assert [len(r) for r in pack([1, 3], {1: 1, 3: 1}, gang, 8, 2, nodes,
                                 reserved={"node02": 4})] == [1, 1]


def test_a_gang_larger_than_each_node_it_may_use_spans_them():
    """A job of 8 GPUs limited to two 4-GPU nodes beside an 8-GPU node (`-N2 --gres=gpu:4
    --exclude=a1`): it takes both small nodes, only its GPUs there (before: never placed, the
    cluster's largest node held the gang, so it counted as a single-node gang)."""
    nodes = (Node("a1", 8), Node("v1", 4), Node("v2", 4))
    allowed = {1: frozenset({"v1", "v2"})}
    assert NodeBook(nodes).can_take(8, allowed[1]) and not NodeBook(nodes).can_take(9, allowed[1])
    result = place(nodes, {1: 8, 2: 8}, allowed=allowed)
    assert result.shares == {1: (("v1", 4), ("v2", 4)), 2: (("a1", 8),)}
    book = NodeBook(nodes)
    assert book.take(6, within=allowed[1]) == (("v1", 4), ("v2", 2))
    assert book.free_on("v2") == 2            # not a whole-node gang of the cluster's
    book.release((("v1", 4), ("v2", 2)))
    assert book.free_gpus == 16


def test_unlimited_gangs_leave_a_limited_job_its_node():
    """Job 1 may only use n0; job 2 may use any node: best fit alone put job 2 on n0 (node
    order) and left job 1 out while n1 and n2 stood empty."""
    nodes = tuple(Node(f"n{i}", 4) for i in range(3))
    result = place(nodes, {1: 1, 2: 4}, allowed={1: frozenset({"n0"})})
    assert result.shares == {2: (("n1", 4),), 1: (("n0", 1),)} and not result.unplaced


def test_a_released_job_pinned_outside_its_nodes_is_placed_within_them():
    """Pinned to v1 (by a daemon before the limit was read, or before the node lost a
    feature): Slurm would hold it in BadConstraints there, so placement does not keep it."""
    nodes = (Node("a1", 8), Node("v1", 8))
    result = place(nodes, {1: 4}, pinned={1: (("v1", 4),)}, allowed={1: frozenset({"a1"})})
    assert result.shares == {1: (("a1", 4),)}
