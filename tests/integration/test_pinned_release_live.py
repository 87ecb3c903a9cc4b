"""Pinned releases on the real Slurm test cluster (22.05, 4 nodes x 8 GPUs).

The cluster is fragmented: a managed 1-GPU job runs on every node, so no node has 8 GPUs free.
An 8-GPU job is planned beside them. The round loop's placement puts it on one node and moves
that node's 1-GPU job elsewhere; `SlurmCluster.enact` stops the moved job, then releases both
pinned to the plan's nodes (`ReqNodeList=`). The 8-GPU job starts on the planned node on the
scheduling pass its release triggers (within 4.5 s of the release call's return, before
the periodic pass), never
waiting in Reason=Resources, and the moved job starts on its new node. The next observe finds
no idle GPU-seconds of released jobs waiting for a node.

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
from shockslurm.slurm.cli_backend import CliBackend
from shockslurm.slurm.types import JobState

from .helpers import StampedBackend

pytestmark = pytest.mark.slurm

SCRIPT = """#!/bin/bash
trap 'exit 0' USR1
for i in $(seq 600); do sleep 1 & wait $!; done
"""
START_BOUND_S = 4.5
"""Release returned -> seen RUNNING: the pass the release triggers, before the test cluster's
periodic one (`sched_interval=5`) would have to start it."""


def _sbatch(tmp: Path, *opts: str) -> int:
    script = tmp / "job.sh"
    script.write_text(SCRIPT)
    out = subprocess.run(["sbatch", "--parsable", "--partition=gpu", "--job-name=shockpin",
                          "--comment=shock:managed", "-o", str(tmp / "%j.out"), *opts,
                          str(script)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.strip().split(";")[0])


def _states(ids: set[int]) -> list[tuple[int, str, str, str]]:
    """(job id, state, reason, node list) of `ids` from one plain `squeue` (its filters work
    outside --json, and it is far quicker than a JSON read)."""
    out = subprocess.run(["squeue", "-h", "-j", ",".join(map(str, sorted(ids))),
                          "-o", "%i %T %r %N"], capture_output=True, text=True, timeout=30)
    rows = [line.split() + [""] for line in out.stdout.splitlines() if line.strip()]
    return [(int(r[0]), r[1], r[2], r[3]) for r in rows]


def _wait(backend: CliBackend, ids: set[int], state: JobState, timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    while True:
        jobs = {j.job_id: j for j in backend.jobs() if j.job_id in ids}
        if all(j.state is state for j in jobs.values()) and len(jobs) == len(ids):
            return jobs
        assert time.monotonic() < deadline, {j: (v.state, v.reason) for j, v in jobs.items()}
        time.sleep(0.2)


def test_a_released_gang_starts_on_its_planned_node_in_one_pass(tmp_path: Path, slurm_cluster):
    assert slurm_cluster.gpus_per_node == 8 and slurm_cluster.nodes >= 2
    nodes = [f"gpu{i:02d}" for i in range(1, slurm_cluster.nodes + 1)]
    ours: list[int] = []
    backend = StampedBackend()
    try:
        fillers = {}
        for node in nodes:            # one 1-GPU job per node: no node has 8 GPUs free
            jid = _sbatch(tmp_path, "--gres=gpu:1")
            ours.append(jid)
            fillers[jid] = node
            # pinned by the operator, as the daemon pins: a user's own `--nodelist` is never
            # moved (job_submit.lua records it, `job_nodes.pins_allowed`)
            subprocess.run(["scontrol", "update", f"JobId={jid}", f"ReqNodeList={node}"],
                           check=True, capture_output=True, timeout=30)
        big = _sbatch(tmp_path, "--gres=gpu:8")
        ours.append(big)
        subprocess.run(["scontrol", "release", ",".join(map(str, fillers))], check=True,
                       capture_output=True, timeout=30)
        running = _wait(backend, set(fillers), JobState.RUNNING)
        assert {j: v.node_list for j, v in running.items()} == fillers

        cluster = SlurmCluster(backend, partitions=("gpu",), grace_seconds=5, round_s=20,
                               churn=ChurnLimits(0, 0, 0, 0),
                               job_filter=lambda j: j.job_id in ours)
        snap = cluster.observe(time.time())
        assert [n.name for n in snap.nodes] == nodes and snap.gpus == 8 * len(nodes)
        assert snap.placements == {j: ((n, 1),) for j, n in fillers.items()}
        plan = place_plan(RoundPlan(frozenset(ours)), snap)
        assert plan.run == frozenset(ours)
        (where,) = plan.placement[big]
        assert where[1] == 8
        moved = plan.info["moved"]
        assert [fillers[j] for j in moved] == [where[0]]
        cluster.enact(plan, snap)
        assert cluster.last_stats.moved == 1 and cluster.last_stats.pinned == 2
        updates = [s.argv for s in cluster.last_stats.steps if s.action == "update"]
        assert ("scontrol", "update", f"JobId={big}", f"ReqNodeList={where[0]}") in updates

        started: dict[int, float] = {}
        reasons: set[str] = set()
        watched = {big, *moved}
        deadline = time.monotonic() + 60
        while len(started) < len(watched) and time.monotonic() < deadline:
            for jid, state, reason, node in _states(watched):   # plain squeue: ~10 ms a read
                if jid in started:
                    continue
                if state == "RUNNING":
                    started[jid] = time.time()
                    assert node == plan.placement[jid][0][0], (jid, node)
                elif jid == big:
                    reasons.add(reason)
            time.sleep(0.02)
        assert set(started) == {big, *moved}, reasons
        released = {j: backend.sent(j, "scontrol", "release")[1] for j in watched}
        latency = started[big] - released[big]
        print(f"pinned 8-GPU job: release -> RUNNING {latency:.2f} s "
              f"(moved job {started[moved[0]] - released[moved[0]]:.2f} s)")
        assert latency < START_BOUND_S
        assert "Resources" not in reasons
        cluster.observe(time.time())
        assert cluster.last_stats.idle_unplaceable_gpu_s == 0.0
        assert cluster._unplaceable_gpu_s == 0.0
    finally:
        if ours:
            subprocess.run(["scancel", *map(str, ours)], capture_output=True, timeout=30)
