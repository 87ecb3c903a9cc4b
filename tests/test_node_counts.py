"""Jobs that ask for several nodes themselves (Slurm's `-N 2 --gres=gpu:4`: 4 GPUs on each of 2
nodes; `Snapshot.node_counts`, `JobSpec.node_count`, JSONL `node_count`): placed in that many
equal parts on distinct nodes by every planner and the simulator, read from Slurm's records,
pinned to the parts' nodes, and judged impossible when too few nodes hold a part.

Before, such a job was one gang of 8: planned whole on one 8-GPU node, released unpinned (the
placement's one node was not its shape), and Slurm started it on two nodes the plan had given
to others."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shockslurm.errors import InputError
from shockslurm.live import enact as en
from shockslurm.live.events import arrivals_that_fit
from shockslurm.live.layout import read_layout
from shockslurm.model import Node, RoundPlan, parse_cluster_shape
from shockslurm.node_book import NodeBook
from shockslurm.placement import place
from shockslurm.plan_on_nodes import place_plan
from shockslurm.policies import PolicySettings, policy_names
from shockslurm.sim import run as sim_run
from shockslurm.sim.cluster import SimulatedCluster
from shockslurm.sim.run import SimConfig, simulate
from shockslurm.slurm.types import JobState, SlurmNode
from shockslurm.workload.generator import GeneratorConfig, generate
from shockslurm.workload.jsonl import job_to_row, parse_job

from .test_enact import job
from .test_live_nodes import NodesBackend
from .test_slurm_anomalies import cluster

PROPS = settings(deadline=None, derandomize=True, database=None, max_examples=300,
                 suppress_health_check=[HealthCheck.too_slow])
ROW = {"model": "ResNet-18", "gpus": 8, "arrival_s": 0.0, "epochs": 3, "schedule": [[0, 32]]}
SLURM_NODES = [SlurmNode(f"gpu0{i}", "idle", 8, 0, ("gpu",)) for i in range(1, 5)]


# ---------------------------------------------------------------- the node book
def test_a_spread_gang_takes_its_parts_on_the_best_fitting_nodes():
    book = NodeBook(parse_cluster_shape("4x8"))
    assert book.take(6) == (("node01", 6),)
    assert book.take(3) == (("node02", 3),)
    # 2 x 2: the two nodes with the fewest free GPUs that hold 2 (node01: 2, node02: 5)
    assert book.can_take(4, spread=2)
    assert book.take(4, spread=2) == (("node01", 2), ("node02", 2))
    assert book.free_on("node01") == 0 and book.free_on("node02") == 3
    # 2 x 4: node02's 3 free GPUs hold no part
    assert book.take(8, spread=2) == (("node03", 4), ("node04", 4))


def test_parts_land_on_distinct_nodes_with_room_or_not_at_all():
    book = NodeBook(parse_cluster_shape("3x4"))
    book.take_at((("node01", 3),))
    assert book.take(8, spread=2) == (("node02", 4), ("node03", 4))
    assert not book.can_take(2, spread=2)            # one GPU free in all: node01's
    book.release((("node02", 4), ("node03", 4)))
    assert not book.can_take(12, spread=3)           # node01 holds no part of 4
    assert book.take(3, spread=2) is None            # 3 GPUs do not split over 2 nodes
    assert book.take(2, spread=2) == (("node01", 1), ("node02", 1))


def test_a_spread_gang_prefers_where_it_runs_and_keeps_within_its_nodes():
    book = NodeBook(parse_cluster_shape("4x8"))
    assert book.take(8, prefer=(("node03", 4), ("node04", 4)), spread=2) == \
        (("node03", 4), ("node04", 4))
    assert book.take(4, within={"node02", "node04"}, spread=2) == (("node02", 2), ("node04", 2))
    assert not book.can_take(16, within={"node01", "node02"}, spread=2)


def test_parts_on_nodes_of_several_sizes_hold_their_gpus_only():
    """`-N3 --gres=gpu:4` on nodes of 4, 4 and 8: 12 GPUs, more than any node, on every node
    but one full, as rule 1 lays a multi-node gang; still parts, which leave 4 GPUs of the
    8-GPU node to others (before, the book took that node whole, a 4-GPU job beside the parts
    was left unplaced, and running there it was stopped)."""
    nodes = (Node("a", 4), Node("b", 4), Node("c", 8))
    book = NodeBook(nodes)
    assert book.take(12, spread=3) == (("a", 4), ("b", 4), ("c", 4))
    assert book.free_on("c") == 4
    both = place(nodes, {1: 12, 2: 4}, node_counts={1: 3})
    assert both.shares == {1: (("a", 4), ("b", 4), ("c", 4)), 2: (("c", 4),)}
    running = {1: (("a", 4), ("b", 4), ("c", 4)), 2: (("c", 4),)}
    stay = place(nodes, {1: 12, 2: 4}, running, node_counts={1: 3})
    assert stay.shares == running and not stay.unplaced and not stay.moved


def test_parts_that_fill_their_nodes_take_them_whole_as_a_multi_node_gang_does():
    """On nodes of 8, `-N 2 --gres=gpu:8` is a 16-GPU gang: it needs wholly free nodes and
    gives them back whole, as a 16-GPU gang laid by rule 1 does."""
    book = NodeBook(parse_cluster_shape("3x8"))
    got = book.take(16, spread=2)
    assert got == (("node01", 8), ("node02", 8)) and book.free_gpus == 8
    book.release(got)
    assert book.free_gpus == 24


@st.composite
def cases(draw):
    """Nodes, a plan with some jobs asking for several nodes, and where some of them run."""
    sizes = draw(st.lists(st.sampled_from([2, 4, 8]), min_size=2, max_size=6))
    nodes = tuple(Node(f"n{i}", g) for i, g in enumerate(sizes))
    gangs: dict[int, int] = {}
    counts: dict[int, int] = {}
    for j in range(draw(st.integers(0, 12))):
        parts = draw(st.sampled_from([1, 1, 2, 3]))
        part = draw(st.sampled_from([1, 2, 4]))
        if sum(1 for g in sizes if g >= part) < parts:
            parts = 1
        gangs[j] = parts * part
        if parts > 1:
            counts[j] = parts
    book = NodeBook(nodes)
    running = {}
    for j, g in gangs.items():
        if draw(st.booleans()) and (got := book.take(g, spread=counts.get(j, 1))) is not None:
            running[j] = got
    plan = {j: g for j, g in gangs.items() if draw(st.booleans())}
    return nodes, plan, running, counts


@PROPS
@given(cases())
def test_placement_puts_each_part_on_its_own_node_and_no_node_over_capacity(case):
    nodes, plan, running, counts = case
    result = place(nodes, plan, running, node_counts=counts)
    cap = {n.name: n.gpus for n in nodes}
    used = dict.fromkeys(cap, 0)
    for j, shares in result.shares.items():
        gang = plan.get(j) or sum(g for _, g in running[j])
        assert sum(g for _, g in shares) == gang
        if j in counts:
            assert len(shares) == counts[j] and len({n for n, _ in shares}) == counts[j]
            assert {g for _, g in shares} == {gang // counts[j]}
        whole = j not in counts and gang > max(cap.values())    # rule 1's multi-node gang
        for n, g in shares:
            used[n] += cap[n] if whole else g                   # parts hold their GPUs only
    assert all(used[n] <= cap[n] for n in cap), used
    book = NodeBook(nodes)
    for shares in result.shares.values():
        assert book.take_at(shares)
    for j in result.unplaced:
        assert not book.can_take(plan[j], spread=counts.get(j, 1)), f"job {j} dropped but fits"
        assert not _fits_beside(plan[j], counts.get(j, 1), cap, used), f"job {j} fits beside"


def _fits_beside(gang: int, parts: int, cap: dict[str, int], used: dict[str, int]) -> bool:
    """Whether a gang fits the GPUs `used` leaves, counted apart from `NodeBook`: in `parts`
    equal parts on as many nodes, on one node, or on wholly free nodes when larger than all."""
    free = {n: cap[n] - used[n] for n in cap}
    if parts > 1:
        return sum(1 for f in free.values() if f >= gang // parts) >= parts
    if gang <= max(cap.values()):
        return any(f >= gang for f in free.values())
    return sum(cap[n] for n in cap if free[n] == cap[n]) >= gang


def test_place_plan_reads_the_snapshots_node_counts():
    from .conftest import make_view
    from shockslurm.model import Snapshot
    views = (make_view(1, gang=8), make_view(2, gang=8))
    snap = Snapshot(now=0.0, round_index=0, round_s=60.0, gpus=16, jobs=views,
                    nodes=parse_cluster_shape("2x8"), node_counts={1: 2})
    placed = place_plan(RoundPlan(frozenset({1})), snap).placement
    assert placed[1] == (("node01", 4), ("node02", 4))
    # with both planned, the 2 x 4 job and a whole-node job cannot share two nodes of 8:
    # the parts go first (as multi-node gangs do), the 8-GPU job is left out
    both = place_plan(RoundPlan(frozenset({1, 2})), snap)
    assert both.run == {1} and both.info["unplaced"] == [2]


# ---------------------------------------------------------------- workloads and the simulator
def test_a_rows_node_count_is_read_and_written_back():
    spec = parse_job({**ROW, "node_count": 2}, index=0)
    assert spec.node_count == 2 and job_to_row(spec)["node_count"] == 2
    assert parse_job(json.loads(json.dumps(job_to_row(spec))), index=0).node_count == 2
    assert "node_count" not in job_to_row(parse_job(ROW, index=0))


@pytest.mark.parametrize("count, says", [
    (3, "8 GPUs do not split evenly over 3 nodes"),
    (0, "must be an integer in 1..8"),
    (9, "must be an integer in 1..8"),
    ("2", "must be an integer"),
])
def test_a_bad_node_count_names_the_field_and_line(count, says):
    with pytest.raises(InputError) as err:
        parse_job({**ROW, "node_count": count}, index=0, source="w.jsonl", line=3)
    assert err.value.field == "node_count" and err.value.line == 3 and says in str(err.value)


@pytest.mark.parametrize("shape, says", [
    (None, "asks for 2 nodes, but the cluster is one pool of GPUs"),
    ("1x8,2x2", "asks for 2 nodes of 4 GPUs, but only 1 of the nodes it may run on hold 4"),
])
def test_a_node_count_the_cluster_cannot_meet_is_refused(shape, says):
    spec = parse_job({**ROW, "node_count": 2}, index=4)
    with pytest.raises(ValueError, match=r"^job 4 ") as err:
        SimulatedCluster(12, [spec], nodes=parse_cluster_shape(shape) if shape else ())
    assert says in str(err.value)


def test_a_job_built_in_code_whose_gpus_do_not_split_is_refused():
    spec = replace(parse_job(ROW, index=4), node_count=3)          # 8 GPUs over 3 nodes
    with pytest.raises(ValueError, match=r"^job 4's 8 GPUs do not split evenly over 3 nodes"):
        SimulatedCluster(16, [spec], nodes=parse_cluster_shape("2x8"))


class _Checked(SimulatedCluster):
    """Asserts, every round, that each job asking for several nodes runs in its parts."""

    def enact(self, plan, snapshot):
        super().enact(plan, snapshot)
        used: dict[str, int] = {}
        for job_id, shares in self._where.items():
            spec = self.sim_jobs[job_id].spec
            assert sum(g for _, g in shares) == spec.gang_size
            if spec.node_count > 1:
                assert len({n for n, _ in shares}) == spec.node_count, (job_id, shares)
                assert {g for _, g in shares} == {spec.gang_size // spec.node_count}
            for name, gpus in shares:
                used[name] = used.get(name, 0) + gpus
        capacity = {n.name: n.gpus for n in self.nodes}
        assert all(used[n] <= capacity[n] for n in used), used


@pytest.mark.parametrize("shape, live_like", [("4x8", False), ("4x8", True),
                                              ("2x4,2x8", True)])
@pytest.mark.parametrize("policy", policy_names())
def test_every_policy_runs_jobs_in_the_parts_they_ask_for(monkeypatch, policy, shape,
                                                          live_like):
    specs = generate(GeneratorConfig(jobs=20, seed=5, jobs_per_hour=60.0,
                                     max_exclusive_hours=0.5))
    jobs = [replace(j, gang_size=8, node_count=2) if j.job_id % 4 == 0 else j for j in specs]
    monkeypatch.setattr(sim_run, "SimulatedCluster", _Checked)
    config = SimConfig.for_nodes(parse_cluster_shape(shape),
                                 settings=PolicySettings(round_s=360.0),
                                 fill_on_completion=live_like, keep_partial_iterations=live_like)
    result = simulate(jobs, policy, config)
    assert len(result.outcomes) == len(jobs)


def test_bench_live_refuses_a_multi_node_job_its_stand_in_cannot_run(tmp_path):
    from click.testing import CliRunner

    from shockslurm.cli.main import cli
    trace = tmp_path / "w.jsonl"
    trace.write_text(json.dumps({**ROW, "node_count": 2}) + "\n")
    result = CliRunner().invoke(cli, ["bench", "live", "--simulate-only", "--cluster", "4x8",
                                      "--workload", str(trace), "--arms", "fifo"])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert "job 0 asks for 8 GPUs on 2 node(s)" in result.output


# ---------------------------------------------------------------- the live cluster
def _spread(job_id: int, per_node: int = 4, nodes: int = 2, **more):
    return replace(job(job_id, gpus=per_node), nodes=nodes, **more)


def test_slurms_records_give_each_jobs_parts():
    jobs = [_spread(1), job(2, gpus=4), replace(job(3), gpus_per_node=0, gpus_per_job=8, nodes=2)]
    assert [j.node_parts for j in jobs] == [2, 1, 1]       # a --gpus job: Slurm's to spread
    layout = read_layout(SLURM_NODES, jobs, ("gpu",), lambda j: True)
    assert layout is not None and layout.node_counts == {1: 2}


def test_the_daemon_plans_and_pins_a_multi_node_job_on_its_parts_nodes():
    """gpu01 and gpu02 each have 4 GPUs taken by another's job: the 2 x 4 job goes there,
    is pinned to both, and the 8-GPU job takes a whole free node."""
    others = [replace(job(10 + i, JobState.RUNNING, managed=False, gpus=4),
                      node_list=f"gpu0{i}", start_time=900.0) for i in (1, 2)]
    b = NodesBackend([_spread(1), job(2, gpus=8), *others], SLURM_NODES)
    c = cluster(b)
    snap = c.observe(1000.0)
    assert snap.node_counts == {1: 2}
    placed = place_plan(RoundPlan(frozenset({1, 2})), snap)
    assert placed.placement[1] == (("gpu01", 4), ("gpu02", 4))
    assert placed.placement[2] in ((("gpu03", 8),), (("gpu04", 8),))
    c.enact(placed, snap)
    assert ("scontrol", "update", "JobId=1", "ReqNodeList=gpu01,gpu02") in b.log


def test_an_arrival_fits_only_when_enough_nodes_hold_its_part():
    busy = [replace(n, gpus_used=0) for n in SLURM_NODES[:3]]
    holders = [replace(job(10 + i, JobState.RUNNING, managed=False, gpus=6),
                       node_list=f"gpu0{i}", start_time=900.0) for i in (1, 2)]
    layout = read_layout(busy, holders, ("gpu",), lambda j: not j.job_id >= 10)
    assert layout is not None
    # free: gpu01 2, gpu02 2, gpu03 8: two nodes hold 2 each, only one holds 4
    assert arrivals_that_fit(layout, [_spread(5, per_node=2)], known=()) == [5]
    assert arrivals_that_fit(layout, [_spread(6, per_node=4)], known=()) == []


def test_a_job_asking_for_more_nodes_than_can_hold_its_part_is_flagged_never_planned():
    nodes = [SlurmNode("s1", "idle", 4, 0, ("gpu",)), SlurmNode("b1", "idle", 8, 0, ("gpu",)),
             SlurmNode("b2", "drained", 8, 0, ("gpu",))]
    jobs = [_spread(1, per_node=6, nodes=3), _spread(2, per_node=8, nodes=2),
            _spread(3, per_node=2, nodes=2, excluded_nodes="b[1-2]")]
    c = cluster(NodesBackend(jobs, nodes))
    snap = c.observe(1000.0)
    reasons = {k[0]: r for k, r in c.impossible.items()}
    assert sorted(reasons) == [1, 3]
    # 18 GPUs of 20, but only two nodes hold 6
    assert reasons[1].endswith("3 nodes of 6 GPUs, the managed partitions have 2 such nodes")
    assert reasons[3].endswith("2 nodes of 2 GPUs, the nodes it may run on (partition gpu, "
                               "--exclude b[1-2]) include 1 such node")
    assert [v.job_id for v in snap.jobs] == []      # job 2 waits for b2, unflagged


def test_pins_name_every_part():
    placement = {1: (("gpu01", 4), ("gpu03", 4))}
    assert en.pin_nodes(placement, [_spread(1)]) == {1: ("gpu01", "gpu03")}


def test_a_node_range_is_read_and_fixed_at_its_minimum_when_released():
    """`-N 2-3 --gres=gpu:4`: squeue's node_count 2, max_nodes 3 (22.05; 23.02+ as numbers).
    Slurm gives such a job as many nodes as it finds free (pinned to two and released, it ran
    on three: 12 GPUs where the plan counted 8), so the release fixes it at two
    (`NumNodes=2-2`), with the pin."""
    from shockslurm.slurm.parse import parse_squeue
    from shockslurm.slurm.types import SlurmJob
    rec = {"job_id": 7, "job_state": "PENDING", "tres_per_node": "gres:gpu:4", "node_count": 2,
           "max_nodes": 3}
    newer = {**rec, "node_count": {"set": True, "infinite": False, "number": 2},
             "max_nodes": {"set": True, "infinite": False, "number": 3}}
    for doc in (rec, newer):
        (parsed,) = parse_squeue({"jobs": [doc]})
        assert parsed.node_range and parsed.node_parts == 2 and parsed.gpus == 8
    (plain,) = parse_squeue({"jobs": [{**rec, "max_nodes": 0}]})
    assert not plain.node_range
    ranged: SlurmJob = replace(_spread(7), max_nodes=3)
    update, = en.diff(RoundPlan(frozenset({7})), [ranged],
                      pins={7: ("gpu01", "gpu03")}).updates
    assert update.argv() == ["scontrol", "update", "JobId=7", "NumNodes=2-2",
                             "ReqNodeList=gpu01,gpu03"]
    fixed, = en.diff(RoundPlan(frozenset({7})), [_spread(7)], pins={7: ("gpu01", "gpu03")}).updates
    assert "NumNodes" not in " ".join(fixed.argv())
    # `-N1-2 --gpus=12` on nodes of 8, planned 8 and 4: its GPUs do not grow with its nodes, so
    # its range is left as it is (fixed at one node, the pin to two contradicted it, and without
    # a pin it asked 12 GPUs of one 8-GPU node, which never runs)
    total = replace(ranged, gpus_per_node=0, gpus_per_job=12, nodes=1, max_nodes=2)
    pinned, = en.diff(RoundPlan(frozenset({7})), [total], pins={7: ("gpu01", "gpu02")}).updates
    assert pinned.argv() == ["scontrol", "update", "JobId=7", "ReqNodeList=gpu01,gpu02"]
    assert not en.diff(RoundPlan(frozenset({7})), [replace(total, priority=1)]).updates


def test_a_released_gpus_job_pinned_to_two_nodes_holds_them_whole_until_it_runs():
    """`--gpus=12` released pinned to gpu01 and gpu02 (nodes of 8), not started: read back as
    shares of its pin (6 and 6; 7 and 6 for 13 GPUs, which were not read as pinned at all),
    it holds both nodes whole, since Slurm chooses its split when it starts (8 and 4, or 7 and
    5): two 2-GPU jobs are not planned beside it (they were, on 6 and 6, and then waited in
    Reason=Resources). Once it runs, it holds the GPUs Slurm gave it and they fit beside it."""
    nodes = [SlurmNode(f"gpu0{i}", "idle", 8, 0, ("gpu",)) for i in (1, 2)]
    total = replace(job(1), gpus_per_node=0, gpus_per_job=12, nodes=2, priority=100,
                    reason="Resources", required_nodes="gpu01,gpu02")
    small = [job(2, gpus=2), job(3, gpus=2)]
    layout = read_layout(nodes, [total, *small], ("gpu",), lambda j: True)
    assert layout is not None and layout.pinned == {1: (("gpu01", 6), ("gpu02", 6))}
    placed = place(layout.nodes, {1: 12, 2: 2, 3: 2}, pinned=layout.pinned)
    assert placed.shares[1] == layout.pinned[1] and placed.unplaced == (2, 3), placed
    odd = read_layout(nodes, [replace(total, gpus_per_job=13)], ("gpu",), lambda j: True)
    assert odd is not None and odd.pinned == {1: (("gpu01", 7), ("gpu02", 6))}
    running = place(layout.nodes, {1: 12, 2: 2, 3: 2},
                    running={1: (("gpu01", 8), ("gpu02", 4))})
    assert not running.unplaced and running.shares[1] == (("gpu01", 8), ("gpu02", 4)), running
