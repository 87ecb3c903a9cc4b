"""Placement of plans on nodes: the module's rules as properties, plus hand-checked cases."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shockslurm.model import Node, RoundPlan, Snapshot, parse_cluster_shape, pool
from shockslurm.node_book import NodeBook
from shockslurm.placement import Allowed, Placement, _place_keeping, place
from shockslurm.plan_on_nodes import free_after, place_around, place_plan

from .conftest import make_view

PROPS = settings(deadline=None, derandomize=True, database=None, max_examples=300,
                 suppress_health_check=[HealthCheck.too_slow])


@st.composite
def cases(draw):
    """Nodes, a plan (job -> gang) and where jobs run now: an earlier plan's jobs each on a node
    drawn among those with room (multi-node gangs by `place`), so that the cluster could hold it
    but is fragmented as a real one gets."""
    sizes = draw(st.lists(st.sampled_from([1, 2, 3, 4, 8]), min_size=1, max_size=6))
    nodes = tuple(Node(f"n{i}", g) for i, g in enumerate(sizes))
    total = sum(sizes)
    gang = st.one_of(st.integers(1, min(4, total)), st.integers(1, total))
    jobs = draw(st.lists(gang, min_size=0, max_size=16))
    gangs = dict(enumerate(jobs))
    reserved = {n.name: r for n in nodes if (r := draw(st.sampled_from([0, 0, 0, 1, n.gpus])))}
    book = NodeBook(nodes, reserved)
    running = {}
    for j, g in gangs.items():
        if not draw(st.booleans()):
            continue
        if book.multi_node(g):
            got = book.take(g)
        else:
            room = [n.name for n in nodes if book.free_on(n.name) >= g]
            got = (((draw(st.sampled_from(room)), g),) if room else None)
            if got is not None:
                book.take_at(got)
        if got is not None:
            running[j] = got
    plan = {j: g for j, g in gangs.items() if draw(st.booleans())}
    return nodes, plan, running, reserved


def _owns_nodes(nodes, j, shares, running) -> bool:
    """Whether job `j` on `shares` owns its nodes: a gang larger than every node, not where it
    runs now (what a running job holds is what Slurm gave it)."""
    return sum(g for _, g in shares) > max(n.gpus for n in nodes) and \
        tuple(running.get(j, ())) != tuple(shares)


def _book_holding(nodes, reserved, placed, running) -> NodeBook:
    """A fresh book with every placed gang taken where it sits (asserting each fits)."""
    book = NodeBook(nodes, reserved)
    for j, shares in placed.items():
        assert book.take_at(shares, _owns_nodes(nodes, j, shares, running)), (j, shares)
    return book


def _check_capacity_and_shape(nodes, gangs, reserved, result: Placement,
                              allowed=None, running=None) -> None:
    """Nodes within capacity, gangs whole, a gang on one node when one it may use holds it
    (`allowed`: the nodes of the jobs limited to some), multi-node gangs owning their nodes
    unless they stay where they run (`running`)."""
    cap = {n.name: n.gpus for n in nodes}
    used = {n: reserved.get(n, 0) for n in cap}
    owners: dict[str, set[int]] = {n: set() for n in cap}
    owning = {j for j, shares in result.shares.items()
              if _owns_nodes(nodes, j, shares, running or {})}
    for j, shares in result.shares.items():
        assert sum(g for _, g in shares) == gangs[j], f"gang of job {j} not whole"
        assert len({n for n, _ in shares}) == len(shares)
        multi = j in owning
        within = (allowed or {}).get(j, cap)
        if gangs[j] <= max((cap[n] for n in within if n in cap), default=0):
            assert len(shares) == 1, f"job {j} fits one node but spans {shares}"
        for n, g in shares:
            assert g > 0
            used[n] += cap[n] if multi else g
            owners[n].add(j)
    for n in cap:
        assert used[n] <= cap[n], f"node {n} over capacity"
    for j in owning:
        for n, _ in result.shares[j]:
            assert owners[n] == {j}, f"multi-node job {j} shares node {n}"


@PROPS
@given(cases())
def test_placement_respects_nodes_and_gangs(case) -> None:
    nodes, plan, running, reserved = case
    result = place(nodes, plan, running, reserved)
    gangs = {**{j: sum(g for _, g in s) for j, s in running.items()}, **plan}
    _check_capacity_and_shape(nodes, gangs, reserved, result, running=running)
    # every planned job is placed or reported unplaced; only running jobs are kept beside them
    assert set(result.shares) | set(result.unplaced) == set(plan) | set(result.kept)
    assert not set(result.unplaced) & set(result.shares)
    assert set(result.kept) <= set(running) - set(plan)
    if not result.unplaced:
        assert not result.kept        # no unplaced job, so no stop to spare
    # kept jobs use at most the GPUs the unplaced jobs would have taken
    assert sum(gangs[j] for j in result.kept) <= sum(plan[j] for j in result.unplaced)


@PROPS
@given(cases())
def test_nothing_left_unplaced_that_still_fits(case) -> None:
    nodes, plan, running, reserved = case
    result = place(nodes, plan, running, reserved)
    book = _book_holding(nodes, reserved, result.shares, running)
    for j in result.unplaced:
        assert not book.can_take(plan[j]), f"job {j} was dropped but fits"


@PROPS
@given(cases())
def test_running_jobs_stay_where_they_are_when_they_can(case) -> None:
    nodes, plan, running, reserved = case
    result = place(nodes, plan, running, reserved)
    for j in result.kept:
        assert result.shares[j] == running[j]
    assert set(result.moved) <= set(plan) & set(running)
    for j in set(plan) & set(running):
        if j in result.shares and j not in result.moved:
            assert result.shares[j] == running[j]
    if result.moved:
        # a move happens only when keeping everyone in place would leave planned GPUs unplaced
        _, stay = _place_keeping(nodes, plan, running, reserved, Allowed({}))
        assert sum(plan[j] for j in stay) < sum(plan[j] for j in result.shares if j in plan)
    # a plan of exactly the running jobs stays put
    same = place(nodes, {j: sum(g for _, g in s) for j, s in running.items()}, running,
                 reserved)
    assert dict(same.shares) == running and not same.moved and not same.unplaced


@PROPS
@given(cases(), st.data())
def test_released_jobs_stay_on_their_pinned_nodes_and_are_never_moved_or_kept(case, data):
    """Some of the jobs that sit on nodes are released jobs that hold no GPUs yet (`pinned`):
    nodes and gangs hold as without them; a pinned job is never `moved` (no restart) nor
    `kept` (it holds nothing to keep); a plan of exactly the running and pinned jobs stays
    put; and when rules 2-3 place the whole plan, every planned pinned job is where it was
    pinned."""
    nodes, plan, sitting, reserved = case
    released = data.draw(st.sets(st.sampled_from(sorted(sitting)))) if sitting else set()
    running = {j: s for j, s in sitting.items() if j not in released}
    pinned = {j: s for j, s in sitting.items() if j in released}
    result = place(nodes, plan, running, reserved, pinned=pinned)
    gangs = {**{j: sum(g for _, g in s) for j, s in sitting.items()}, **plan}
    _check_capacity_and_shape(nodes, gangs, reserved, result, running=running)
    assert not set(result.moved) & released and not set(result.kept) & released
    assert set(result.kept) <= set(running) - set(plan)
    same = place(nodes, {j: gangs[j] for j in sitting}, running, reserved, pinned=pinned)
    assert dict(same.shares) == sitting and not same.moved and not same.unplaced
    _, stay = _place_keeping(nodes, plan, sitting, reserved, Allowed({}))
    if len(stay) == len(plan):       # rules 2-3 place the whole plan, every pin kept
        assert all(result.shares[j] == pinned[j] for j in set(plan) & released)


@PROPS
@given(cases(), st.randoms(use_true_random=False))
def test_placement_is_deterministic(case, rnd) -> None:
    nodes, plan, running, reserved = case
    first = place(nodes, plan, running, reserved)
    items, where = list(plan.items()), list(running.items())
    rnd.shuffle(items)
    rnd.shuffle(where)
    again = place(nodes, dict(items), dict(where), reserved)
    assert dict(again.shares) == dict(first.shares)
    assert (again.unplaced, again.kept, again.moved) == (first.unplaced, first.kept, first.moved)


@PROPS
@given(st.integers(1, 64), st.lists(st.integers(1, 64), max_size=20))
def test_one_pool_places_every_plan_that_fits_its_gpus(gpus, sizes) -> None:
    plan, used = {}, 0
    for j, g in enumerate(sizes):
        if used + g <= gpus:
            plan[j] = g
            used += g
    result = place(pool(gpus), plan)
    assert set(result.shares) == set(plan) and not result.unplaced


def test_a_gang_of_16_on_4x8_takes_two_whole_nodes() -> None:
    nodes = parse_cluster_shape("4x8")
    result = place(nodes, {1: 16, 2: 4, 3: 12})
    assert result.shares[1] == (("node01", 8), ("node02", 8))
    # 12 GPUs: two whole nodes as well, the last one's 4 spare GPUs idle; job 2 finds no room
    assert result.shares[3] == (("node03", 8), ("node04", 4))
    assert result.unplaced == (2,)


def test_best_fit_keeps_room_for_large_gangs() -> None:
    result = place(parse_cluster_shape("2x4"), {1: 1, 2: 3, 3: 4})
    assert result.shares == {3: (("node01", 4),), 2: (("node02", 3),), 1: (("node02", 1),)}


def test_gangs_of_three_do_not_pack_two_per_node() -> None:
    result = place(parse_cluster_shape("2x4"), {1: 3, 2: 3, 3: 2})
    assert set(result.shares) == {1, 2} and result.unplaced == (3,)


def test_a_running_job_outside_the_plan_keeps_its_gpus_when_its_successor_cannot_start() -> None:
    # The plan stops job 9 (on node02) to start job 3 (2 GPUs), which fits no node: job 9 keeps
    # running instead of leaving its GPU idle.
    running = {1: (("node01", 3),), 2: (("node02", 3),), 9: (("node02", 1),)}
    result = place(parse_cluster_shape("2x4"), {1: 3, 2: 3, 3: 2}, running)
    assert result.unplaced == (3,) and result.kept == (9,)
    assert result.shares[9] == (("node02", 1),)


def test_running_jobs_move_only_when_that_places_more() -> None:
    # jobs 1 and 2 (2 GPUs each) run on different nodes of 2x4; a 4-GPU job needs a whole node
    running = {1: (("node01", 2),), 2: (("node02", 2),)}
    result = place(parse_cluster_shape("2x4"), {1: 2, 2: 2, 3: 4}, running)
    assert not result.unplaced and len(result.moved) == 1
    (moved,) = result.moved
    stayed = 3 - moved                 # the other 2-GPU job
    home = running[stayed]
    assert result.shares[stayed] == home and result.shares[moved] == ((home[0][0], 2),)
    assert result.shares[3] == (("node02" if home[0][0] == "node01" else "node01", 4),)


def test_a_non_preemptive_plan_moves_no_running_job() -> None:
    # the case above: moving one 2-GPU job would place the 4-GPU gang; a plan that allows no
    # moves leaves both where they run and the gang waits
    running = {1: (("node01", 2),), 2: (("node02", 2),)}
    result = place(parse_cluster_shape("2x4"), {1: 2, 2: 2, 3: 4}, running, moves=False)
    assert result.unplaced == (3,) and not result.moved
    assert {j: result.shares[j] for j in (1, 2)} == running
    views = tuple(make_view(j, gang=g, ran_last_round=j < 3) for j, g in ((1, 2), (2, 2), (3, 4)))
    snap = Snapshot(now=0.0, round_index=0, round_s=120.0, gpus=8, jobs=views,
                    nodes=parse_cluster_shape("2x4"), placements=running)
    fixed = place_plan(RoundPlan(frozenset({1, 2, 3}), moves_allowed=False), snap)
    assert fixed.run == frozenset({1, 2}) and fixed.info == {"unplaced": [3]}
    assert place_plan(RoundPlan(frozenset({1, 2, 3})), snap).info_ids("moved")


def test_a_policys_own_placement_is_kept_only_when_it_fits() -> None:
    views = tuple(make_view(j, gang=g) for j, g in ((1, 2), (2, 2), (3, 4)))
    snap = Snapshot(now=0.0, round_index=0, round_s=120.0, gpus=8, jobs=views,
                    nodes=parse_cluster_shape("2x4"))
    own = {1: (("node02", 2),), 2: (("node02", 2),), 3: (("node01", 4),)}
    kept = place_plan(RoundPlan(frozenset(own), placement=own), snap)
    assert kept.placement == own and kept.run == frozenset(own)
    # node02 over its 4 GPUs: placed again by the rules (and never beyond a node)
    bad = {**own, 1: (("node01", 2),)}
    again = place_plan(RoundPlan(frozenset(bad), placement=bad), snap)
    assert again.placement != bad
    for node in ("node01", "node02"):
        assert sum(g for s in again.placement.values() for n, g in s if n == node) <= 4


def test_place_plan_trims_the_plan_and_says_why() -> None:
    views = tuple(make_view(j, gang=g) for j, g in ((1, 3), (2, 3), (3, 2)))
    snap = Snapshot(now=0.0, round_index=0, round_s=120.0, gpus=8, jobs=views,
                    nodes=parse_cluster_shape("2x4"))
    placed = place_plan(RoundPlan(frozenset({1, 2, 3}), {"status": "ok"}), snap)
    assert placed.run == frozenset({1, 2})
    assert placed.info == {"status": "ok", "unplaced": [3]}
    assert set(placed.placement) == {1, 2}
    # without nodes the snapshot is one pool: the plan comes back whole, info untouched
    plain = place_plan(RoundPlan(frozenset({1, 2}), {"status": "ok"}),
                       Snapshot(now=0.0, round_index=0, round_s=120.0, gpus=8, jobs=views))
    assert plain.run == frozenset({1, 2}) and plain.info == {"status": "ok"}


def test_thousands_of_jobs_on_a_thousand_nodes() -> None:
    rnd = random.Random(3)
    nodes = parse_cluster_shape("600x8,400x4")
    gangs = {j: rnd.choice([1, 1, 2, 4, 8, 16]) for j in range(5000)}
    result = place(nodes, gangs)
    assert sum(gangs[j] for j in result.shares) <= sum(n.gpus for n in nodes)
    assert len(result.shares) + len(result.unplaced) == len(gangs)


@pytest.mark.parametrize("text, error", [
    ("4x", "bad cluster group '4x'"), ("0x8", "must be positive"), ("2x8,,4x4", "bad cluster"),
    ("eight", "bad cluster group 'eight'")])
def test_bad_cluster_shapes_are_named(text: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse_cluster_shape(text)


def test_cluster_shapes_name_their_nodes_in_order() -> None:
    nodes = parse_cluster_shape("1x8, 2x4")
    assert [(n.name, n.gpus) for n in nodes] == [("node01", 8), ("node02", 4), ("node03", 4)]


def test_a_left_over_gang_displaces_the_fewest_running_jobs() -> None:
    # node01 runs job 1 (1 GPU), node02 runs jobs 2, 3 and 4 (1 GPU each): a 4-GPU gang takes
    # node01 and job 1 moves to node02's last GPU; nobody else moves
    running = {1: (("node01", 1),), 2: (("node02", 1),), 3: (("node02", 1),),
               4: (("node02", 1),)}
    result = place(parse_cluster_shape("2x4"), {1: 1, 2: 1, 3: 1, 4: 1, 5: 4}, running)
    assert not result.unplaced and result.moved == (1,)
    assert result.shares[5] == (("node01", 4),) and result.shares[1] == (("node02", 1),)


def test_reserved_gpus_are_never_placed_on() -> None:
    # another partition's job holds 1 GPU of node01: the 4-GPU gang goes to node02, and a
    # second 4-GPU gang finds no whole node, nor may a multi-node gang count node01 as whole
    nodes = parse_cluster_shape("2x4")
    result = place(nodes, {1: 4, 2: 4}, reserved={"node01": 1})
    assert result.shares == {1: (("node02", 4),)} and result.unplaced == (2,)
    assert place(parse_cluster_shape("3x4"), {1: 8}, reserved={"node01": 1}).shares == {
        1: (("node02", 4), ("node03", 4))}
    with pytest.raises(ValueError, match="unknown node 'node09'"):
        place(nodes, {1: 1}, reserved={"node09": 1})


def test_release_gives_back_what_take_took() -> None:
    book = NodeBook(parse_cluster_shape("3x4"))
    whole = book.take(6)
    single = book.take(3)
    assert whole == (("node01", 4), ("node02", 2)) and book.free_gpus == 1
    assert not book.can_take(2) and book.holds_whole(6)
    book.release(whole, whole=True)
    assert book.free_gpus == 9 and book.can_take(6) and book.take_at(whole, whole=True)
    assert book.free_gpus == 1
    book.release(single)
    assert book.free_on("node03") == 4


def test_a_cluster_with_no_gpus_places_nothing_and_does_not_fail():
    """Every node down or drained: a live snapshot has 0 GPUs and no nodes; the plan is empty."""
    from shockslurm.model import RoundPlan, Snapshot
    from shockslurm.engine import allocate
    from shockslurm.plan_on_nodes import place_plan
    from shockslurm.policies import make_policy, policy_names

    from .conftest import make_view

    snap = Snapshot(now=0.0, round_index=0, round_s=120.0, gpus=0, jobs=(make_view(1),))
    placed = place_plan(RoundPlan(frozenset({1})), snap)
    assert placed.run == frozenset() and placed.info.get("unplaced") == [1]
    for name in policy_names():             # and the round loop asks no policy to plan it
        plan = allocate(make_policy(name), snap)
        assert place_plan(plan, snap).run == frozenset(), name


def test_free_after_counts_reserved_and_every_placed_share():
    nodes = [Node("a", 8), Node("b", 8), Node("c", 4)]
    placement = {1: (("a", 4),), 2: (("a", 4), ("b", 2)), 3: (("b", 8),), 4: (("gone", 2),)}
    free = free_after(nodes, {"c": 1}, placement)
    # a full, b overfilled (2 + 8 of 8: below zero, so nothing fits there), c less its reserved
    # GPU, shares on a node the cluster does not have ignored
    assert free == {"a": 0, "b": -2, "c": 3}
    assert free_after(nodes, {}, {}) == {"a": 8, "b": 8, "c": 4}


def _snapshot(nodes, gangs, running, reserved) -> Snapshot:
    views = tuple(make_view(j, gang=g) for j, g in sorted(gangs.items()))
    return Snapshot(now=0.0, round_index=0, round_s=120.0, gpus=sum(n.gpus for n in nodes),
                    jobs=views, nodes=nodes, placements=running, reserved=reserved)


@PROPS
@given(cases(), st.data())
def test_placing_again_around_kept_jobs_moves_none_of_them_and_fits_the_nodes(case, data):
    """`place_around` (the churn bounds changed the run set): every running job of the plan
    outside `movable` stays exactly where it runs, no job is placed elsewhere than it runs
    unless `movable` allows it, and nodes and gangs hold as for `place`."""
    nodes, plan_gangs, running, reserved = case
    gangs = {**plan_gangs, **{j: sum(g for _, g in s) for j, s in running.items()}}
    snap = _snapshot(nodes, gangs, running, reserved)
    first = place_plan(RoundPlan(frozenset(plan_gangs)), snap)
    kept = data.draw(st.sets(st.sampled_from(sorted(running)))) if running else set()
    run = first.run | kept
    movable = first.info_ids("moved") - kept
    again = place_around(RoundPlan(run, {}, first.placement), snap, movable)
    for j in run & set(running) - movable:
        assert again.placement[j] == tuple(running[j]), f"kept job {j} moved"
    for j, shares in again.placement.items():
        assert j not in running or j in movable or shares == tuple(running[j]), j
    assert again.run == frozenset(again.placement)
    result = Placement(again.placement)
    _check_capacity_and_shape(nodes, gangs, reserved, result, running=running)


def test_a_start_blocked_by_a_kept_job_goes_to_the_node_the_plan_frees() -> None:
    """Two 8-GPU nodes: job 1 (1 GPU) on n0 is kept by the churn bounds; job 2 (7 GPUs) on n1
    is stopped by the plan. The first placement put the 8-GPU job 3 on n0 (stopping job 1):
    placed again around the kept job, job 3 takes n1."""
    nodes = (Node("n0", 8), Node("n1", 8))
    running = {1: (("n0", 1),), 2: (("n1", 7),)}
    snap = _snapshot(nodes, {1: 1, 2: 7, 3: 8}, running, {})
    plan = RoundPlan(frozenset({1, 3}), {"status": "ok"}, {3: (("n0", 8),)})
    again = place_around(plan, snap)
    assert again.run == frozenset({1, 3})
    assert again.placement == {1: (("n0", 1),), 3: (("n1", 8),)}
    assert again.info == {"status": "ok", "replaced": [3]}
    # with job 2 kept as well, job 3 fits no node: it leaves the plan, both keep running
    again = place_around(RoundPlan(frozenset({1, 2, 3}), {}, {3: (("n0", 8),)}), snap)
    assert again.run == frozenset({1, 2}) and again.info == {"unplaced": [3]}


def test_take_within_places_only_on_the_named_nodes() -> None:
    nodes = parse_cluster_shape("4x8")
    book = NodeBook(nodes)
    assert book.take_at((("node02", 6),))
    # best fit among the named nodes: node02 (2 free) is not named; node03 and node04 tie,
    # node03 comes first
    assert book.take(2, within={"node03", "node04"}) == (("node03", 2),)
    assert book.take(8, within={"node02"}) is None
    before = book.free_gpus
    # a multi-node gang takes whole named nodes only, and nothing when they do not cover it
    assert book.take(16, within={"node01", "node03"}) is None
    assert book.free_gpus == before
    assert book.take(16, within={"node01", "node04"}) == (("node01", 8), ("node04", 8))


def test_gangs_that_fill_nodes_exactly_are_all_placed() -> None:
    """Best fit largest first puts 4 and 3 on one free node and 3, 2, 2 on the other, and
    the last 2 fits nowhere; filling each node with the sizes closest to its room (4+2+2,
    3+3+2) places every gang, as Shockwave's window layout (`NodeBook` in priority order) had
    (a round of its plan lost a job here before)."""
    gangs = {0: 2, 1: 3, 2: 3, 3: 4, 4: 8, 5: 8, 6: 2, 7: 2}
    result = place(parse_cluster_shape("4x8"), gangs)
    assert result.unplaced == () and set(result.shares) == set(gangs)
    used: dict[str, int] = {}
    for shares in result.shares.values():
        for node, gpus in shares:
            used[node] = used.get(node, 0) + gpus
    assert all(v == 8 for v in used.values())
    assert place(parse_cluster_shape("4x8"), gangs, moves=False).unplaced == ()


def test_a_gang_slurm_spread_over_parts_of_nodes_takes_its_gpus_only():
    """A running `-N3 --gres=gpu:4` job on nodes of 8 holds 4 GPUs on each of its nodes (as
    Slurm allocated it, read into `placements`): the other 4 of each stay free for others. A
    multi-node gang that does not run yet still takes its nodes whole."""
    nodes = parse_cluster_shape("4x8")
    spread = (("node01", 4), ("node02", 4), ("node03", 4))
    book = NodeBook(nodes)
    assert book.holds_whole(12) and not book.holds_whole(12, running=True)
    assert not book.holds_whole(12, parts=3) and not book.holds_whole(8)
    assert book.take_at(spread) and book.free_gpus == 20
    book.release(spread)
    assert book.free_gpus == 32
    whole = NodeBook(nodes)
    assert whole.take_at((("node01", 8), ("node02", 4)), whole=True) and whole.free_gpus == 16
    whole.release((("node01", 8), ("node02", 4)), whole=True)
    assert whole.free_gpus == 32
    placed = place(nodes, {1: 12, 2: 4, 3: 4, 4: 4, 5: 8}, running={1: spread})
    assert placed.shares[1] == spread and not placed.unplaced
    assert set(placed.shares) == {1, 2, 3, 4, 5}, placed
    assert all(len(placed.shares[j]) == 1 for j in (2, 3, 4, 5)), placed


def test_a_running_gpus_gang_slurm_split_holds_its_gpus_only():
    """A running `--gpus=10` job that Slurm split 8 and 2 on nodes of 8 holds those GPUs, not
    node02 whole: the job running on node02's other 6 stays (it was unplaced, and the daemon
    stopped it, while a gang whose shares looked like rule 1's took its nodes whole)."""
    running = {1: (("node01", 8), ("node02", 2)), 2: (("node02", 6),)}
    placed = place(parse_cluster_shape("2x8"), {1: 10, 2: 6}, running=running)
    assert dict(placed.shares) == running and not placed.unplaced and not placed.moved, placed


def test_a_pinned_multi_node_gang_holds_its_nodes_whole():
    """A `--gpus=12` job released pinned to two nodes of 8 that has not started holds both
    nodes whole, whatever shares its pin reads as (6 and 6: Slurm splits its GPUs as it finds
    room, 8 and 4 or 7 and 5): nothing else is planned on them."""
    pinned = {1: (("node01", 6), ("node02", 6))}
    placed = place(parse_cluster_shape("3x8"), {1: 12, 2: 2, 3: 2}, pinned=pinned)
    assert placed.shares[1] == pinned[1] and not placed.unplaced, placed
    assert placed.shares[2] == placed.shares[3] == (("node03", 2),), placed
    tight = place(parse_cluster_shape("2x8"), {1: 12, 2: 2, 3: 2}, pinned=pinned)
    assert tight.shares[1] == pinned[1] and tight.unplaced == (2, 3), tight
