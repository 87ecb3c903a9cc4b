"""The daemon on the real Slurm test cluster: 12 managed jobs (about twice the GPUs) run to
completion under the round loop, stopped with USR1 + requeuehold and restarted, never more GPUs
than the cluster has, never a job outside the plan; an unmanaged job is never touched.

The daemon runs in-process (a thread) with 6 s rounds and a 2 s grace; a watcher polls
`squeue --json` every 0.5 s. Only the jobs this test submits are scheduled (`job_filter`), so
other managed jobs on the shared test cluster are left alone (their GPUs count as taken).
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from shockslurm.daemon import build_daemon, parse_config
from shockslurm.slurm.cli_backend import CliBackend
from shockslurm.slurm.types import JobState
from shockslurm.store import open_store
from shockslurm.store.models import EnactmentIntent, Job, Run, stamp_seconds

pytestmark = pytest.mark.slurm

WORKER = Path(__file__).resolve().parent / "worker.py"
GPUS = [8, 8, 8, 4, 4, 4, 4, 4, 2, 2, 2, 2]             # 52 GPUs asked of 32
TARGETS = [60, 90, 70, 100, 80, 120, 60, 150, 110, 90, 130, 70]   # units of 0.2 s
COMPLETION_TIMEOUT_S = 330
# The worker saves and exits within 0.2 s of its USR1: the requeuehold must follow its exit, not
# the end of this (long) grace period: the median stop within SWITCH_BOUND_S, every stop well
# within the grace (a loaded machine may stretch one stop's scancel, exit and polls).
GRACE_S = 20
SWITCH_BOUND_S = 4.0
START_RE = re.compile(r"^start restart=(\d+) unit (\d+)$")


def _shocksub(tmp: Path, db: str, k: int, gpus: int, target: int) -> int:
    argv = [sys.executable, "-m", "shockslurm.cli.shocksub", "--gpus", str(gpus),
            "--partition", "gpu", "--job-name", f"shockit-{k}", "--model", "ResNet-18",
            "--epochs", str(target // 10), "--epoch-seconds", "2", "--grace-seconds", "60",
            "--output", str(tmp / "%x-%j.out"), "--script-dir", str(tmp / "scripts"),
            "--db", db, "--", sys.executable, str(WORKER), "--target", str(target),
            "--state", str(tmp / "state")]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=tmp)
    assert out.returncode == 0, out.stderr
    assert "held for the meta-scheduler" in out.stderr
    return int(out.stdout.strip().splitlines()[-1])


def _run_daemon(tmp: Path, policy: str, options: dict, ours: set[int], db: str):
    # The jobs last 12-30 s against 6 s rounds: the default finish window (two rounds) would
    # keep most of them running to their end; half a round leaves stops to exercise.
    cfg = parse_config({"daemon": {"round_seconds": 6, "grace_seconds": GRACE_S, "policy": policy,
                                   "partitions": ["gpu"], "db": db, "stop_timeout_seconds": 20,
                                   "finish_window_seconds": 3},
                        "policy": options})
    engine = open_store(db, create=True)
    lines: list[str] = []
    daemon = build_daemon(cfg, CliBackend(), engine=engine,
                          job_filter=lambda j: j.job_id in ours, stop_when_idle=True,
                          emit=lines.append)
    return daemon, engine, lines


def _scenario(tmp_path: Path, slurm_cluster, policy: str, options: dict, *,
              must_stop: bool) -> None:
    """`must_stop`: the policy time-slices (max-min fairness), so demand twice the cluster
    must make it stop jobs; Shockwave may plan without any stop (its one stop may be of a job
    about to finish, which the churn bounds keep running)."""
    tmp = tmp_path
    (tmp / "state").mkdir()
    db = str(tmp / "store.db")
    ours: set[int] = set()
    cpu_job = None
    try:
        for k, (g, t) in enumerate(zip(GPUS, TARGETS)):
            ours.add(_shocksub(tmp, db, k, g, t))
        cpu = subprocess.run(["sbatch", "--parsable", "--partition=gpu", "--job-name=shockit-cpu",
                              "-o", str(tmp / "cpu-%j.out"), "--wrap", "sleep 60"],
                             capture_output=True, text=True, timeout=30, cwd=tmp)
        assert cpu.returncode == 0, cpu.stderr
        cpu_job = int(cpu.stdout.strip().split(";")[0])

        daemon, engine, lines = _run_daemon(tmp, policy, options, ours, db)
        cluster = daemon.cluster
        violations: list[str] = []
        max_gpus = [0]
        stop = threading.Event()
        backend = CliBackend()

        def watch() -> None:
            while not stop.is_set():
                before = cluster.allowed_running
                jobs = backend.jobs()
                after = cluster.allowed_running
                running = [j for j in jobs if j.job_id in ours and j.state is JobState.RUNNING]
                used = sum(j.gpus for j in running)
                max_gpus[0] = max(max_gpus[0], used)
                if used > slurm_cluster.gpus:
                    violations.append(f"{used} GPUs in use > {slurm_cluster.gpus}")
                outside = {j.job_id for j in running} - (before | after)
                if outside:
                    violations.append(f"running outside plan/stopping: {sorted(outside)}")
                if any(j.job_id == cpu_job and j.state.finished
                       and j.state is not JobState.COMPLETED for j in jobs):
                    violations.append("the unmanaged job did not complete normally")
                stop.wait(0.5)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        deadline = time.monotonic() + COMPLETION_TIMEOUT_S
        original_finished = cluster.finished
        cluster.finished = lambda: original_finished() or time.monotonic() > deadline  # type: ignore
        t0 = time.monotonic()
        daemon.loop.run()
        elapsed = time.monotonic() - t0
        stop.set()
        watcher.join(timeout=5)
        print(f"{policy}: {daemon.loop.stats.rounds} rounds in {elapsed:.0f} s, "
              f"max GPUs {max_gpus[0]}", *lines, sep="\n")

        final = {j.job_id: j for j in backend.jobs() if j.job_id in ours | {cpu_job}}
        states = {jid: final[jid].state.value for jid in ours if jid in final}
        assert all(s == "COMPLETED" for s in states.values()) and len(states) == len(ours), (
            f"not all completed after {elapsed:.0f} s: {states}\n" + "\n".join(lines))
        assert not violations, violations[:10]

        stopped_jobs = 0
        for jid in ours:
            out = next(tmp.glob(f"*-{jid}.out")).read_text().splitlines()
            events = [ln for ln in out if START_RE.match(ln) or ln.startswith("got SIG")
                      or ln.startswith("done at")]
            assert events and events[-1].startswith("done at"), (jid, out)
            previous_restart = -1
            signalled = False
            for ev in events:
                m = START_RE.match(ev)
                if m:
                    restart = int(m.group(1))
                    assert restart > previous_restart, (jid, events)
                    if restart > 0:
                        assert signalled, (f"job {jid} restarted without SIGUSR1 first", events)
                    previous_restart, signalled = restart, False
                elif ev.startswith("got SIGUSR1"):
                    signalled = True
            if previous_restart > 0:
                stopped_jobs += 1
        if must_stop:
            assert stopped_jobs > 0, "demand is twice the cluster: max-min must stop jobs"

        with Session(engine) as s:
            intents = list(s.scalars(select(EnactmentIntent)))
            touched = {s.get(Job, i.job_pk).job_id for i in intents}
            assert intents and all(i.return_code is not None for i in intents)
            assert cpu_job not in touched and touched <= ours
            assert all(str(cpu_job) not in " ".join(i.argv) for i in intents)
            signalled: dict[int, float] = {}
            waits = []
            for i in sorted(intents, key=lambda i: (i.created_at, i.id)):
                if i.action == "signal":
                    signalled[i.job_pk] = stamp_seconds(i.created_at)
                elif i.action == "requeuehold" and i.job_pk in signalled:
                    waits.append(stamp_seconds(i.created_at) - signalled.pop(i.job_pk))
            assert (waits or not must_stop) and max(waits, default=0.0) < GRACE_S / 2, (
                f"USR1 -> requeuehold took {sorted(waits)} s (grace {GRACE_S} s)")
            assert statistics.median(waits or [0.0]) < SWITCH_BOUND_S, (
                f"USR1 -> requeuehold took {sorted(waits)} s (grace {GRACE_S} s)")
            print(f"USR1 -> requeuehold: median {statistics.median(waits or [0.0]):.2f} s, "
                  f"max {max(waits, default=0.0):.2f} s over {len(waits)} stops (grace {GRACE_S} s)")
            # A requeue moves Slurm's submit time; the daemon keeps the job as it first saw it
            # (`live/first_submit.py`): one row per job in its run, stopped or not.
            rows = Counter(j.job_id for j in s.scalars(
                select(Job).join(Run, Job.run_id == Run.id).where(Run.kind == "live")))
            assert set(rows) == ours and set(rows.values()) == {1}, rows
        engine.dispose()

        # The unmanaged job ran to its normal end.
        cpu_deadline = time.monotonic() + 90
        while time.monotonic() < cpu_deadline:
            state = {j.job_id: j.state for j in backend.jobs()}.get(cpu_job)
            if state is None or state.finished:
                break
            time.sleep(1)
        assert state in (None, JobState.COMPLETED), state
    finally:
        leftovers = [str(j) for j in ours | ({cpu_job} if cpu_job else set())]
        if leftovers:
            subprocess.run(["scancel", *leftovers], capture_output=True, timeout=30)


def test_daemon_max_min_fairness(tmp_path: Path, slurm_cluster):
    _scenario(tmp_path, slurm_cluster, "max_min_fairness",
              {"min_resolve_interval_s": 0, "idle_unallocated": False}, must_stop=True)


def test_daemon_shockwave(tmp_path: Path, slurm_cluster):
    _scenario(tmp_path, slurm_cluster, "shockwave", {}, must_stop=False)
