"""`pack`: the market's rounds per job laid out in the window's rounds."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shockslurm.model import parse_cluster_shape
from shockslurm.placement import place
from shockslurm.policies.shockwave.packing import _in_order, _Layout, _Room, pack, priority_layout


def _counts(plan: list[list[int]]) -> dict[int, int]:
    out: dict[int, int] = {}
    for r in plan:
        for j in r:
            out[j] = out.get(j, 0) + 1
    return out


def test_the_tail_is_spread_so_no_planned_round_is_lost():
    # G=2, T=3, order A C B D with 1, 2, 1, 2 rounds: in priority order alone D finds room only
    # in the last round (A C | C B | D) and loses a round
    order, rounds, gang = [1, 2, 3, 4], {1: 1, 2: 2, 3: 1, 4: 2}, dict.fromkeys([1, 2, 3, 4], 1)
    priority_only = _Layout(order, rounds, gang, _Room.of(parse_cluster_shape("1x2"), 0, None, None), 3).lay(4)
    assert priority_only.lost == 1
    plan = pack(order, rounds, gang, gpus=2, horizon=3)
    assert _counts(plan) == rounds
    assert all(len(r) <= 2 for r in plan)
    assert 1 in plan[0]                      # the head keeps its place: A runs now


def test_a_layout_the_priority_rule_finds_is_kept():
    # both fit the round about to run; spread out, the second would wait a round
    order, rounds, gang = [1, 2], {1: 1, 2: 1}, {1: 1, 2: 1}
    assert pack(order, rounds, gang, gpus=2, horizon=2) == [[1, 2], []]


def test_an_impossible_layout_keeps_the_priority_rule():
    # G=4, T=3, gangs 1, 4, 1 with 1, 2, 3 rounds fit the aggregate (12 GPU-rounds) but no
    # layout: the 4-GPU job takes two whole rounds and the last job needs three
    order, rounds, gang = [1, 2, 3], {1: 1, 2: 2, 3: 3}, {1: 1, 2: 4, 3: 1}
    plan = pack(order, rounds, gang, gpus=4, horizon=3)
    assert plan == _Layout(order, rounds, gang, _Room.of(parse_cluster_shape("1x4"), 0, None, None), 3).lay(3).plan
    assert all(sum(gang[j] for j in r) <= 4 for r in plan)


@settings(max_examples=150, deadline=None)
@given(gpus=st.integers(1, 8), horizon=st.integers(1, 6), data=st.data())
def test_one_gpu_jobs_that_fit_the_window_lose_nothing(gpus, horizon, data):
    """With 1-GPU gangs the aggregate capacity is exact (Gale-Ryser): every plan within
    `sum n_j <= G T`, `n_j <= T` is laid out in full."""
    n = data.draw(st.lists(st.integers(1, horizon), min_size=1, max_size=gpus * horizon))
    while sum(n) > gpus * horizon:
        n.pop()
    order = list(range(len(n)))
    rounds = dict(enumerate(n))
    plan = pack(order, rounds, dict.fromkeys(order, 1), gpus=gpus, horizon=horizon)
    assert _counts(plan) == {j: k for j, k in rounds.items() if k}
    assert all(len(r) <= gpus for r in plan)


@settings(max_examples=100, deadline=None)
@given(shape=st.sampled_from(["1x8", "2x4", "4x8", "3x2"]), horizon=st.integers(1, 5),
       data=st.data())
def test_no_round_holds_more_than_the_nodes_place(shape, horizon, data):
    nodes = parse_cluster_shape(shape)
    gpus = sum(n.gpus for n in nodes)
    jobs = data.draw(st.lists(st.tuples(st.sampled_from([1, 2, 3, 4, 8]),
                                        st.integers(0, horizon + 1)), max_size=12))
    gang = {j: min(g, gpus) for j, (g, _) in enumerate(jobs)}
    rounds = {j: k for j, (_, k) in enumerate(jobs)}
    plan = pack(list(gang), rounds, gang, gpus, horizon, nodes=nodes)
    assert len(plan) == horizon
    for r in plan:
        assert len(set(r)) == len(r)
        assert not place(nodes, {j: gang[j] for j in r}).unplaced
    assert all(k <= min(rounds[j], horizon) for j, k in _counts(plan).items())


def test_the_priority_rule_takes_the_earliest_block_with_room():
    from shockslurm.node_book import NodeBook
    books = [NodeBook(parse_cluster_shape("1x2")) for _ in range(4)]
    books[0].take(2)
    books[2].take(1)
    def room(gang: int) -> np.ndarray:
        return np.array([b.can_take(gang) for b in books])
    assert _in_order(room(1), 2) == [1, 2]         # rounds 1-2 are a block with room
    assert _in_order(room(2), 2) == [1, 3]         # no block of two takes a gang of 2


@settings(max_examples=100, deadline=None)
@given(shape=st.sampled_from(["1x8", "2x4", "4x8", "3x2"]), horizon=st.integers(1, 5),
       data=st.data())
def test_the_priority_layout_is_packs_plan_when_it_holds_every_round(shape, horizon, data):
    """The planner takes `priority_layout`'s plan without calling `pack` when no job lost a
    round there: it must be the plan `pack` would have made. Where a job did lose rounds,
    `priority_layout` says how many it got."""
    nodes = parse_cluster_shape(shape)
    gpus = sum(n.gpus for n in nodes)
    jobs = data.draw(st.lists(st.tuples(st.sampled_from([1, 2, 4, 8]),
                                        st.integers(0, horizon)), max_size=10))
    gang = {j: min(g, gpus) for j, (g, _) in enumerate(jobs)}
    rounds = {j: k for j, (_, k) in enumerate(jobs)}
    order = list(gang)
    plan, got = priority_layout(order, rounds, gang, gpus, horizon, nodes=nodes)
    assert got == {j: _counts(plan).get(j, 0) for j in order}
    assert all(got[j] <= rounds[j] for j in order)
    if got == rounds:
        assert plan == pack(order, rounds, gang, gpus, horizon, nodes=nodes)
