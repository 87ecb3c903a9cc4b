"""Which nodes each job of ours may run on, on the live cluster (`live.job_nodes`): its
partition's, less what its user's `--exclude`, `-w` and `--constraint` rule out; read from
Slurm's records into the snapshot (`allowed_nodes`), used by placement and the pins."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from shockslurm.live import enact as en
from shockslurm.live.events import arrivals_that_fit
from shockslurm.live.job_nodes import NodeLimits, pins_allowed
from shockslurm.live.layout import read_layout
from shockslurm.model import RoundPlan
from shockslurm.plan_on_nodes import place_plan
from shockslurm.slurm.constraints import feature_test
from shockslurm.slurm.parse import parse_sinfo
from shockslurm.slurm.types import SlurmNode

from .slurm_samples import load
from .test_enact import job
from .test_live_nodes import NodesBackend
from .test_slurm_anomalies import cluster

NODES = [SlurmNode("gpu01", "idle", 8, 0, ("gpu",), frozenset({"a100", "ib"})),
         SlurmNode("gpu02", "idle", 8, 0, ("gpu",), frozenset({"a100"})),
         SlurmNode("gpu03", "idle", 8, 0, ("gpu", "big"), frozenset({"h100", "ib"})),
         SlurmNode("gpu04", "idle", 8, 0, ("big",))]


def test_constraints_the_daemon_reads_and_those_it_leaves_to_slurm():
    assert feature_test("")({"x"}) and feature_test("a100")({"a100", "ib"})
    assert not feature_test("a100")({"h100"})
    assert feature_test("a100&ib")({"a100", "ib"}) and not feature_test("a100&ib")({"a100"})
    assert feature_test("a100|h100")({"h100"}) and not feature_test("a100|h100")({"v100"})
    for other in ("[rack1|rack2]", "a100*2", "(a|b)&c", "a&b|c", "a100,ib", "a b"):
        assert feature_test(other) is None, other


@pytest.mark.parametrize("limits,allowed", [
    ({}, {"gpu01", "gpu02", "gpu03"}),                                # its partition's
    ({"partition": "gpu,big"}, None),                                 # a pending job's two
    ({"excluded_nodes": "gpu[01-02]"}, {"gpu03"}),
    ({"admin_comment": "shock:nodes=gpu02"}, {"gpu02"}),              # -w, as the plugin put it
    ({"admin_comment": "shock:nodes=gpu[02-03]", "nodes": 2}, {"gpu02", "gpu03"}),  # all of them
    ({"admin_comment": "shock:nodes=gpu03", "nodes": 2}, {"gpu01", "gpu02", "gpu03"}),  # + any
    ({"features": "ib"}, {"gpu01", "gpu03"}),
    ({"features": "a100&ib", "excluded_nodes": "gpu01"}, set()),      # nowhere now
    ({"features": "[a100|h100]"}, {"gpu01", "gpu02", "gpu03"}),       # unread: Slurm's alone
])
def test_the_nodes_a_job_may_run_on(limits, allowed):
    got = NodeLimits(NODES).allowed(replace(job(1), **limits))
    assert got == (None if allowed is None else frozenset(allowed))


@pytest.mark.parametrize("limits,pinned", [
    ({}, True),
    ({"excluded_nodes": "gpu01"}, True),
    ({"features": "a100|h100"}, True),
    ({"admin_comment": "shock:nodes=gpu02"}, False),      # a pin would replace the user's list
    ({"features": "[a100|h100]"}, False),                 # a form the daemon does not read
    ({"excluded_nodes": "gpu[01-"}, False),               # an unreadable host list
])
def test_a_job_is_pinned_only_where_the_pin_keeps_its_users_limits(limits, pinned):
    users = replace(job(1), **limits)
    assert pins_allowed(users) is pinned
    placement = {1: (("gpu02", 2),)}
    assert en.pin_nodes(placement, [users]) == ({1: ("gpu02",)} if pinned else {})


def test_node_features_are_read_from_every_sinfo_shape():
    doc = json.loads(load("sinfo", "22.05"))
    doc["nodes"][0]["active_features"] = "a100,ib"
    doc["nodes"][1]["features"] = "h100"
    nodes = {n.name: n for n in parse_sinfo(doc)}
    first, second = sorted(nodes)[:2]
    assert nodes[first].features == {"a100", "ib"} and nodes[second].features == {"h100"}
    new = json.loads(load("sinfo", "24.11"))
    new["sinfo"][0]["features"] = {"total": "a100,ib", "active": "a100"}
    # available and active together: Slurm can reboot a node into an available feature
    assert any(n.features == {"a100", "ib"} for n in parse_sinfo(new))
    listed = {"nodes": [{"name": "n1", "gres": "gpu:8", "active_features": ["a", "b"]},
                        {"name": "n2", "gres": "gpu:8", "features": {"odd": 1}}]}
    assert [n.features for n in parse_sinfo(listed)] == [{"a", "b"}, frozenset()]


def test_the_snapshot_says_where_limited_jobs_may_run_and_the_plan_keeps_to_it():
    """Job 1 excludes gpu01 and gpu02, job 2 asks for an h100, job 3 for a feature no node has,
    job 4 has no limit: job 3 is never planned (flagged), placement puts 1 and 2 on gpu03
    (4 + 4 GPUs), and the round pins 1 and 2 there."""
    jobs = [replace(job(1, gpus=4), excluded_nodes="gpu[01-02]"),
            replace(job(2, gpus=4), features="h100"), replace(job(3), features="v100"), job(4)]
    b = NodesBackend(jobs, NODES[:3])
    c = cluster(b)
    snap = c.observe(1000.0)
    assert snap.allowed_nodes == {1: {"gpu03"}, 2: {"gpu03"}, 3: frozenset()}
    assert sorted(v.job_id for v in snap.jobs) == [1, 2, 4]
    assert "--constraint v100" in c.impossible[(3, job(3).submit_time)]
    placed = place_plan(RoundPlan(frozenset({1, 2, 4})), snap)
    assert placed.placement[1] == (("gpu03", 4),) and placed.placement[2] == (("gpu03", 4),)
    c.enact(placed, snap)
    assert ("scontrol", "update", "JobId=1", "ReqNodeList=gpu03") in b.log
    assert ("scontrol", "update", "JobId=2", "ReqNodeList=gpu03") in b.log
    assert not any("3" in a[-1].split(",") for a in b.log if a[:2] == ("scontrol", "release"))


def test_an_arrival_that_fits_only_nodes_it_may_not_use_starts_no_round():
    busy = [replace(n, gpus_used=0) for n in NODES[:2]]
    layout = read_layout(busy, [replace(job(5), excluded_nodes="gpu[01-02]"), job(6)],
                         ("gpu",), lambda j: True)
    assert layout is not None and layout.allowed == {5: frozenset()}
    pending = [replace(job(5), excluded_nodes="gpu[01-02]"), job(6)]
    assert arrivals_that_fit(layout, pending, known=()) == [6]


def test_a_job_asking_for_a_gpu_type_may_run_only_on_nodes_with_it():
    """`--gres=gpu:a100:2` (squeue's tres_per_node "gres:gpu:a100:2", 23.11+ "gres/gpu:a100:2"):
    the nodes whose gres names a100 GPUs (sinfo "gpu:a100:8(S:0-1)"); an untyped request and
    untyped nodes as before. The snapshot's nodes carry the type."""
    doc = {"nodes": [{"name": "gpu01", "gres": "gpu:a100:8(S:0-1)", "partitions": ["gpu"], "state": "idle"},
                     {"name": "gpu02", "gres": "gpu:v100:4,gpu:a100:4", "partitions": ["gpu"], "state": "idle"},
                     {"name": "gpu03", "gres": "gpu:8", "partitions": ["gpu"], "state": "idle"}]}
    nodes = parse_sinfo(doc)
    assert [set(n.gpu_types) for n in nodes] == [{"a100"}, {"a100", "v100"}, set()]
    typed = [replace(job(1), gpu_types=frozenset({"a100"})),
             replace(job(2), gpu_types=frozenset({"v100"})), job(3)]
    limits = NodeLimits(nodes)
    assert [limits.allowed(j) for j in typed] == [{"gpu01", "gpu02"}, {"gpu02"}, None]
    layout = read_layout(nodes, typed, ("gpu",), lambda j: True)
    assert layout is not None and [n.gpu_type for n in layout.nodes] == ["a100", None, None]
    assert layout.allowed == {1: {"gpu01", "gpu02"}, 2: {"gpu02"}}
    rec = {"jobs": [{"job_id": 7, "job_state": "PENDING", "tres_per_node": "gres/gpu:a100:2"}]}
    from shockslurm.slurm.parse import parse_squeue
    (parsed,) = parse_squeue(rec)
    assert parsed.gpus == 2 and parsed.gpu_types == {"a100"}


def test_a_job_none_of_whose_nodes_can_ever_hold_it_is_flagged_and_never_planned():
    """Two managed partitions: `small` of 4-GPU nodes, `big` of 8-GPU ones. An 8-GPU job of
    `small`, or one excluding every node of its partition, can never start (Slurm 22.05 takes
    such a held job and leaves it pending): flagged once, naming its limits, and never offered
    to the policy; an 8-GPU job of `big`, or a `small` one of 4 whose node is drained now
    (it comes back), is planned as usual."""
    nodes = [SlurmNode("s1", "idle", 4, 0, ("small",)), SlurmNode("s2", "drained", 4, 0, ("small",)),
             SlurmNode("b1", "idle", 8, 0, ("big",))]
    jobs = [replace(job(1, gpus=8), partition="small"), replace(job(2, gpus=8), partition="big"),
            replace(job(3), partition="small", excluded_nodes="s[1-2]"),
            replace(job(4, gpus=4), partition="small", excluded_nodes="s1")]
    b = NodesBackend(jobs, nodes)
    c = cluster(b, partitions=("small", "big"))
    snap = c.observe(1000.0)
    assert sorted(v.job_id for v in snap.jobs) == [2, 4]
    reasons = {k[0]: r for k, r in c.impossible.items()}
    assert sorted(reasons) == [1, 3]
    assert "partition small" in reasons[1] and "4 at most" in reasons[1]
    assert "--exclude s[1-2]" in reasons[3]
    assert snap.allowed_nodes[4] == frozenset()    # s2 is drained now: it waits for it


def test_a_job_whose_only_big_node_is_drained_waits_unflagged_and_runs_when_it_returns():
    """Before: flagged "never scheduled" for as long as the job lived, though it was planned
    again the moment the node came back."""
    drained = [SlurmNode("s1", "idle", 4, 0, ("gpu",)), SlurmNode("b1", "drained", 8, 0, ("gpu",))]
    b = NodesBackend([job(1, gpus=8)], drained)
    c = cluster(b)
    assert [v.job_id for v in c.observe(1000.0).jobs] == [] and c.impossible == {}
    b._nodes = [drained[0], replace(drained[1], state="idle")]
    assert [v.job_id for v in c.observe(1010.0).jobs] == [1] and c.impossible == {}
