"""Stops on the real Slurm test cluster: the grace deadline, and the stop lead.

- A managed job that ignores USR1 (and one that also ignores TERM) is stopped by the grace
  deadline: requeueheld `grace_seconds` after its USR1, out of RUNNING within a few seconds of
  the requeuehold (Slurm's KillWait when it ignores TERM too), never a round later. Both are
  measured from the commands' own stamps (`helpers.StampedBackend`).
- The daemon (`DaemonRunner` in a thread, max-min fairness time-slicing five 8-GPU jobs on the
  32 GPUs, 20 s rounds, no event polls) with the default `stop_lead_seconds` starts each
  round's solve and stops ahead of the boundary: the jobs a round starts are RUNNING within two
  seconds of the boundary (the median; often before it); without the lead they start a switch
  (a few seconds) after it.

A watcher polls plain `squeue` (fast, filters work) every 0.1 s. Only the jobs this test
submits are scheduled (`job_filter`).
"""

from __future__ import annotations

import statistics
import subprocess
import threading
import time
from pathlib import Path

import pytest

from shockslurm.daemon import DaemonConfig, DaemonRunner, build_daemon, parse_config
from shockslurm.live.cluster import SlurmCluster
from shockslurm.live.enact import ChurnLimits
from shockslurm.model import RoundPlan
from shockslurm.slurm.cli_backend import CliBackend
from shockslurm.store import open_store

from .helpers import StampedBackend, wait_for
from .test_daemon_live import _shocksub

pytestmark = pytest.mark.slurm

GRACE_S = 4.0
KILL_WAIT_S = 5.0            # the test cluster's KillWait
ROUND_S = 20.0
LEAD_S = DaemonConfig().stop_lead_seconds      # the default is what is measured
ROUNDS = 5


class Watcher:
    """Polls `squeue -h -o "%i %T"` every 0.1 s: when each job was first and last seen RUNNING
    (wall time), as a list of (t, state) per job."""

    def __init__(self, ids: set[int]) -> None:
        self.ids, self.seen = ids, {j: [] for j in ids}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            out = subprocess.run(["squeue", "-h", "-o", "%i %T"], capture_output=True,
                                 text=True, timeout=30).stdout
            t = time.time()
            states = dict(line.split()[:2] for line in out.splitlines() if line.strip())
            for j in self.ids:
                self.seen[j].append((t, states.get(str(j), "GONE")))
            self.stop.wait(0.1)

    def first_running_after(self, job_id: int, t0: float) -> float | None:
        return next((t for t, s in self.seen[job_id] if t >= t0 and s == "RUNNING"), None)

    def left_running_after(self, job_id: int, t0: float) -> float | None:
        return next((t for t, s in self.seen[job_id] if t >= t0 and s != "RUNNING"), None)


def _sbatch(tmp: Path, body: str) -> int:
    script = tmp / "job.sh"
    script.write_text(f"#!/bin/bash\n{body}\n")
    out = subprocess.run(["sbatch", "--parsable", "--partition=gpu", "--job-name=shockgrace",
                          "--gres=gpu:8", "--comment=shock:managed", "-o", str(tmp / "%j.out"),
                          str(script)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.strip().split(";")[0])


def _node_of(job_id: int) -> str:
    out = subprocess.run(["squeue", "-h", "-j", str(job_id), "-o", "%N"], capture_output=True,
                         text=True, timeout=30).stdout.strip()
    assert out, f"job {job_id} has no node"
    return out


def _stop_after_start(tmp: Path, trap: str) -> tuple[float, float]:
    """Start a job that sets `trap` and then sleeps, stop it with the cluster's stop for a
    successor planned on its node (a stop whose GPUs no job takes is not made:
    `churn_rules.idle_stops`); (USR1 sent -> requeuehold sent, requeuehold sent -> the job seen
    out of RUNNING), seconds, each from the command's own stamp."""
    ready = tmp / "trap-set"
    jid = _sbatch(tmp, f"{trap}; touch {ready}; for i in $(seq 300); do sleep 1; done")
    successor = _sbatch(tmp, "sleep 300")
    watcher = Watcher({jid})
    backend = StampedBackend()
    cluster = SlurmCluster(backend, grace_seconds=GRACE_S, stop_timeout_s=30,
                           job_filter=lambda j: j.job_id in (jid, successor),
                           churn=ChurnLimits(0, 0, 0, 0))
    watcher.thread.start()
    try:
        cluster.enact(RoundPlan(run=frozenset({jid})), cluster.observe(time.time()))
        wait_for(ready.exists, 60, f"job {jid} to set its trap")
        node = _node_of(jid)
        cluster.enact(RoundPlan(run=frozenset({successor}),
                                placement={successor: ((node, 8),)}), cluster.observe(time.time()))
        actions = [s.action for s in cluster.last_stats.steps]
        assert actions[:2] == ["signal", "requeuehold"] and "release" in actions, actions
        signalled, _ = backend.sent(jid, "scancel", "--signal=USR1")
        requeued, _ = backend.sent(jid, "scontrol", "requeuehold")
        left = wait_for(lambda: watcher.left_running_after(jid, requeued), 60,
                        f"job {jid} to leave RUNNING after its requeuehold")
        return requeued - signalled, left - requeued
    finally:
        watcher.stop.set()
        subprocess.run(["scancel", str(jid), str(successor)], capture_output=True, timeout=30)


@pytest.mark.parametrize("trap,bound", [
    ("trap '' USR1", 4.0),
    ("trap '' USR1 TERM", KILL_WAIT_S + 4.0),
], ids=["ignores-usr1", "ignores-usr1-and-term"])
def test_a_job_ignoring_its_stop_signal_is_stopped_at_the_grace_deadline(
        tmp_path: Path, slurm_cluster, trap: str, bound: float):
    requeue_s, left_s = _stop_after_start(tmp_path, trap)
    print(f"USR1 -> requeuehold {requeue_s:.1f} s, requeuehold -> out of RUNNING {left_s:.1f} s")
    # the grace deadline, not a round later (one squeue --json poll may overshoot it)
    assert GRACE_S - 0.5 <= requeue_s <= GRACE_S + 3.0, requeue_s
    assert left_s <= bound, left_s


def measure_successor_delays(tmp: Path, lead_s: float) -> list[float]:
    """Run the daemon for `ROUNDS` rounds; for each round after the first that started jobs,
    seconds from its boundary until the last job it started was seen RUNNING."""
    (tmp / "state").mkdir(parents=True, exist_ok=True)
    db = str(tmp / "store.db")
    ours: set[int] = set()
    engine = open_store(db, create=True)
    rounds: list[tuple[float, list[int]]] = []
    watcher = None
    try:
        for k in range(5):
            ours.add(_shocksub(tmp, db, k, 8, 3000))
        cfg = parse_config({"daemon": {
            "round_seconds": ROUND_S, "grace_seconds": 10, "policy": "max_min_fairness",
            "partitions": ["gpu"], "db": db, "min_run_seconds": 0, "event_poll_seconds": 0,
            "stop_lead_seconds": lead_s}})
        lines: list[str] = []
        daemon = build_daemon(cfg, CliBackend(), engine=engine,
                              job_filter=lambda j: j.job_id in ours, emit=lines.append)
        runner = DaemonRunner(daemon)
        real = runner.attempt

        def attempt() -> float | None:
            boundary = runner.boundary
            out = real()
            rounds.append((boundary, [j for s in daemon.cluster.last_stats.steps
                                      if s.action == "release" for j in s.job_ids]))
            return out

        runner.attempt = attempt               # type: ignore[method-assign]
        watcher = Watcher(ours)
        watcher.thread.start()
        runner.run(max_rounds=ROUNDS)
        deadline = time.monotonic() + 60     # the last round's starts: seen RUNNING
        while time.monotonic() < deadline and any(
                watcher.first_running_after(j, b - ROUND_S / 2) is None
                for b, started in rounds[1:] for j in started):
            time.sleep(0.2)
        print("\n".join(f"lead {lead_s:g}: boundary {b:.2f}: {line}"
                        for (b, _), line in zip(rounds, lines)))
    finally:
        if watcher is not None:
            watcher.stop.set()
        if ours:
            subprocess.run(["scancel", *map(str, ours)], capture_output=True, timeout=30)
        engine.dispose()
    delays = []
    for boundary, started in rounds[1:]:
        if not started:
            continue
        seen = [watcher.first_running_after(j, boundary - ROUND_S / 2) for j in started]
        assert all(t is not None for t in seen), (boundary, started)
        delays.append(max(t for t in seen if t is not None) - boundary)
    return delays


def test_with_the_stop_lead_successors_run_at_the_boundary(tmp_path: Path, slurm_cluster):
    assert slurm_cluster.gpus == 32, "the scenario time-slices 5 x 8 GPUs on 4 nodes x 8"
    with_lead = measure_successor_delays(tmp_path / "lead", LEAD_S)
    without = measure_successor_delays(tmp_path / "none", 0.0)
    print(f"boundary -> successors RUNNING, lead {LEAD_S:g} s: "
          f"{[round(d, 2) for d in with_lead]}, median {statistics.median(with_lead):.2f} s; "
          f"no lead: {[round(d, 2) for d in without]}, "
          f"median {statistics.median(without):.2f} s")
    assert len(with_lead) >= 2 and len(without) >= 2
    assert -LEAD_S <= statistics.median(with_lead) <= 2.0
    assert statistics.median(without) > statistics.median(with_lead)
