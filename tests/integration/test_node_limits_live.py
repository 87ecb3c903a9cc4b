"""Jobs with their user's own node limits on the real Slurm test cluster (22.05, 4 x 8 GPUs).

Node gpu04 gets the feature `fast` (`scontrol update NodeName=gpu04 AvailableFeatures=fast
ActiveFeatures=fast`, cleared at the end). Three managed 8-GPU jobs, held by job_submit.lua:
X (no limit), A (`--exclude=gpu[01-02]`) and B (`--constraint=fast`). Counting GPUs alone,
placement would put them on gpu01, gpu02 and gpu03 by node order: A on a node it excludes and
B on one without its feature. Read from squeue and sinfo (`Snapshot.allowed_nodes`), the plan
puts A on gpu03 and B on gpu04; the daemon pins both there (a pin within the nodes a job may
run on is accepted: verified here on 22.05) and every job starts where the plan put it. (A pin
outside a job's limits is accepted too, but the released job then stays PENDING in
Reason=BadConstraints: checked by hand on 22.05 for `--exclude` and `--constraint`.)

Only this test's jobs are scheduled (`job_filter`) and they are cancelled at the end.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from shockslurm.live.cluster import SlurmCluster
from shockslurm.live.enact import ChurnLimits
from shockslurm.model import RoundPlan
from shockslurm.plan_on_nodes import place_plan
from shockslurm.slurm.types import JobState

from .helpers import StampedBackend, wait_for
from .test_pinned_release_live import _sbatch, _wait

pytestmark = pytest.mark.slurm


def _cancel_and_wait(ours: list[int]) -> None:
    """Cancel this test's jobs and wait until none is left (COMPLETING ones hold their GPUs: the
    next test, observing at once, found the cluster's GPUs taken by the last one's 32 GPUs of
    cancelled jobs, and could not place its own job, seen once in CI)."""
    if not ours:
        return
    ids = ",".join(map(str, ours))
    subprocess.run(["scancel", ids], capture_output=True, timeout=30)
    wait_for(lambda: not subprocess.run(
        ["squeue", "-h", "-j", ids, "-t", "PD,R,CG,S", "-o", "%i"], capture_output=True,
        text=True, timeout=30).stdout.strip(), 60, f"jobs {ids} gone after scancel")


def _set_features(node: str, features: str) -> None:
    subprocess.run(["scontrol", "update", f"NodeName={node}", f"AvailableFeatures={features}",
                    f"ActiveFeatures={features}"], check=True, capture_output=True, timeout=30)


def test_limited_jobs_are_planned_pinned_and_started_on_nodes_they_may_use(tmp_path: Path,
                                                                           slurm_cluster):
    assert slurm_cluster.gpus_per_node == 8 and slurm_cluster.nodes == 4
    ours: list[int] = []
    backend = StampedBackend()
    _set_features("gpu04", "fast")
    try:
        free = _sbatch(tmp_path, "--gres=gpu:8")
        excluding = _sbatch(tmp_path, "--gres=gpu:8", "--exclude=gpu[01-02]")
        fast = _sbatch(tmp_path, "--gres=gpu:8", "--constraint=fast")
        ours += [free, excluding, fast]
        cluster = SlurmCluster(backend, partitions=("gpu",), grace_seconds=5, round_s=20,
                               churn=ChurnLimits(0, 0, 0, 0),
                               job_filter=lambda j: j.job_id in ours)
        snap = cluster.observe(time.time())
        assert snap.allowed_nodes == {excluding: {"gpu03", "gpu04"}, fast: {"gpu04"}}
        plan = place_plan(RoundPlan(frozenset(ours)), snap)
        assert plan.placement == {free: (("gpu01", 8),), excluding: (("gpu03", 8),),
                                  fast: (("gpu04", 8),)}
        cluster.enact(plan, snap)
        updates = {s.argv for s in cluster.last_stats.steps if s.action == "update"}
        assert ("scontrol", "update", f"JobId={excluding}", "ReqNodeList=gpu03") in updates
        assert ("scontrol", "update", f"JobId={fast}", "ReqNodeList=gpu04") in updates
        running = _wait(backend, set(ours), JobState.RUNNING)
        assert {j: v.node_list for j, v in running.items()} == {
            free: "gpu01", excluding: "gpu03", fast: "gpu04"}
    finally:
        _cancel_and_wait(ours)
        _set_features("gpu04", "")


def test_a_multi_node_job_is_planned_pinned_and_started_in_its_parts(tmp_path: Path,
                                                                     slurm_cluster):
    """`-N2 --gres=gpu:4` is 4 GPUs on each of two nodes (`Snapshot.node_counts`). With two
    8-GPU jobs and two 4-GPU jobs beside it the 32 GPUs fit only as its parts: the plan puts it
    on gpu01 and gpu02, a 4-GPU job beside each part and the 8-GPU jobs on gpu03 and gpu04; the
    daemon pins it to both nodes and every job starts where the plan put it. (Counted as one gang
    of 8 it was planned on one node and released unpinned.)"""
    assert slurm_cluster.gpus_per_node == 8 and slurm_cluster.nodes == 4
    ours: list[int] = []
    backend = StampedBackend()
    try:
        spread = _sbatch(tmp_path, "--nodes=2", "--gres=gpu:4")
        whole = [_sbatch(tmp_path, "--gres=gpu:8") for _ in range(2)]
        half = [_sbatch(tmp_path, "--gres=gpu:4") for _ in range(2)]
        ours += [spread, *whole, *half]
        cluster = SlurmCluster(backend, partitions=("gpu",), grace_seconds=5, round_s=20,
                               churn=ChurnLimits(0, 0, 0, 0),
                               job_filter=lambda j: j.job_id in ours)
        snap = cluster.observe(time.time())
        assert snap.node_counts == {spread: 2}
        plan = place_plan(RoundPlan(frozenset(ours)), snap)
        assert plan.run == frozenset(ours)
        assert plan.placement[spread] == (("gpu01", 4), ("gpu02", 4))
        cluster.enact(plan, snap)
        updates = {s.argv for s in cluster.last_stats.steps if s.action == "update"}
        assert ("scontrol", "update", f"JobId={spread}", "ReqNodeList=gpu01,gpu02") in updates
        running = _wait(backend, set(ours), JobState.RUNNING)
        assert running[spread].node_list == "gpu[01-02]"
        for job_id in ours:
            if job_id != spread:
                (node, _), = plan.placement[job_id]
                assert running[job_id].node_list == node, job_id
    finally:
        _cancel_and_wait(ours)


def test_a_node_range_job_runs_on_the_nodes_the_plan_counted(tmp_path: Path, slurm_cluster):
    """`-N2-3 --gres=gpu:4` on an idle cluster: Slurm would give it three nodes (12 GPUs;
    verified by hand on 22.05: pinned to two and released, it ran on three), where the plan
    counted its minimum, two nodes of 4. The release fixes it at two (`NumNodes=2-2`) with
    the pin, and it runs on the plan's two nodes."""
    assert slurm_cluster.gpus_per_node == 8 and slurm_cluster.nodes == 4
    ours: list[int] = []
    backend = StampedBackend()
    try:
        ranged = _sbatch(tmp_path, "--nodes=2-3", "--gres=gpu:4")
        ours.append(ranged)
        cluster = SlurmCluster(backend, partitions=("gpu",), grace_seconds=5, round_s=20,
                               churn=ChurnLimits(0, 0, 0, 0),
                               job_filter=lambda j: j.job_id in ours)
        snap = cluster.observe(time.time())
        assert snap.node_counts == {ranged: 2} and snap.job(ranged).gang_size == 8
        plan = place_plan(RoundPlan(frozenset(ours)), snap)
        names = tuple(n for n, _ in plan.placement[ranged])
        assert len(names) == 2
        cluster.enact(plan, snap)
        updates = {s.argv for s in cluster.last_stats.steps if s.action == "update"}
        assert ("scontrol", "update", f"JobId={ranged}", "NumNodes=2-2",
                f"ReqNodeList={','.join(names)}") in updates
        running = _wait(backend, set(ours), JobState.RUNNING)
        assert running[ranged].nodes == 2 and running[ranged].node_list == \
            f"gpu[{names[0][3:]}-{names[1][3:]}]", running[ranged].node_list
    finally:
        _cancel_and_wait(ours)
