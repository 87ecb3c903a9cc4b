"""Fault injection on the real Slurm test cluster: the daemon as a subprocess, SIGKILLed at
random (seeded) moments at least 10 times and restarted each time, slurmctld restarted twice,
20 managed jobs (1/2/4/8 GPUs, 75 GPUs asked of 32) that must all complete.

A watcher polls `squeue --json` every 0.5 s (tolerating outages) and counts violations:
- over capacity: the RUNNING jobs of this test hold more GPUs than the cluster has (also checked
  afterwards from the store: no round's plan entries exceed it);
- held while GPUs were free: a held job of this test asks at most the free GPUs (the
  cluster's GPUs minus those held by any job and those promised to released jobs of this test
  still pending), continuously for more than 2 x round_seconds + grace_seconds + RESTART_SLACK_S,
  counted only from when the daemon was last (re)started and Slurm last came back.
Only the jobs whose name starts with this test's prefix are scheduled (`job_name_prefix`),
watched and cancelled.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from shockslurm.slurm.cli_backend import CliBackend
from shockslurm.slurm.types import JobState
from shockslurm.store import open_store
from shockslurm.store.models import EnactmentIntent, PlanEntry, Round

from .helpers import controller_up, end_daemon

pytestmark = pytest.mark.slurm

WORKER = Path(__file__).resolve().parent / "worker.py"
SEED = 20240611
JOBS = 20
GPUS = [1, 2, 4, 8] * 5                       # 75 GPUs asked of 32
ROUND_S, GRACE_S = 3.0, 1.0
RESTART_SLACK_S = 8.0                          # daemon start-up, a stop's wait, a backoff step
MIN_KILLS, CTLD_RESTARTS = 10, 2
DEADLINE_S = 330
SLURM_DIR = Path(os.environ.get("SHOCK_SLURM_DIR", "/tmp/shockslurm-cluster"))


def _restart_slurmctld() -> float:
    """Kill slurmctld alone (its pid file), start it again, wait until it answers."""
    t0 = time.monotonic()
    pid = int((SLURM_DIR / "slurmctld.pid").read_text().strip())
    os.kill(pid, signal.SIGTERM)
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    time.sleep(1.0)
    subprocess.run(["slurmctld"], check=True, timeout=30)
    for _ in range(300):
        if controller_up(timeout_s=5):
            break
        time.sleep(0.1)
    assert controller_up(timeout_s=5), "slurmctld did not come back"
    return time.monotonic() - t0


def test_daemon_survives_kills_and_controller_restarts(tmp_path: Path, slurm_cluster):
    rng = random.Random(SEED)
    prefix = f"shockfi{os.getpid()}-"
    capacity = slurm_cluster.gpus
    db = str(tmp_path / "store.db")
    (tmp_path / "state").mkdir()
    config = tmp_path / "daemon.toml"
    config.write_text(
        "[daemon]\n"
        f"round_seconds = {ROUND_S}\ngrace_seconds = {GRACE_S}\n"
        "stop_timeout_seconds = 10\npolicy = \"max_min_fairness\"\npartitions = [\"gpu\"]\n"
        f"db = \"{db}\"\nbackend = \"cli\"\njob_name_prefix = \"{prefix}\"\n"
        "metrics_port = 0\nmin_run_seconds = 2\n"
        "[policy]\nmin_resolve_interval_s = 0\nidle_unallocated = false\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SHOCKSLURM_", "SLURM_"))}
    ours: dict[int, int] = {}              # job id -> GPUs
    daemon: subprocess.Popen | None = None
    log = open(tmp_path / "daemon.log", "ab")
    state = {"daemon_since": 0.0, "slurm_since": 0.0, "daemon_alive": False, "slurm_up": True}
    violations: list[str] = []
    figures = {"kills": 0, "daemon_starts": 0, "slurmctld_restarts": 0, "max_gpus": 0,
               "polls": 0, "failed_polls": 0}
    stop = threading.Event()

    def start_daemon() -> subprocess.Popen:
        figures["daemon_starts"] += 1
        p = subprocess.Popen([sys.executable, "-m", "shockslurm.cli.main", "daemon", "--config",
                              str(config)], stdout=log, stderr=subprocess.STDOUT, env=env,
                             cwd=tmp_path)
        state["daemon_since"] = time.monotonic()
        state["daemon_alive"] = True
        return p

    def watch() -> None:
        backend = CliBackend(timeout=10)
        held_since: dict[int, float] = {}
        while not stop.is_set():
            figures["polls"] += 1
            try:
                jobs = backend.jobs()
            except Exception:
                figures["failed_polls"] += 1
                if state["slurm_up"]:
                    state["slurm_up"] = False
                held_since.clear()
                stop.wait(0.5)
                continue
            now = time.monotonic()
            if not state["slurm_up"]:
                state["slurm_up"] = True
                state["slurm_since"] = now
            mine = [j for j in jobs if j.job_id in ours]
            used = sum(j.gpus for j in mine if j.state is JobState.RUNNING)
            figures["max_gpus"] = max(figures["max_gpus"], used)
            if used > capacity:
                violations.append(f"{used} GPUs running > {capacity}")
            taken = sum(j.gpus for j in jobs if "gpu" in j.partition.split(",")
                        and j.state.holds_gpus)
            promised = sum(j.gpus for j in mine if j.state is JobState.PENDING and not j.held)
            free = capacity - taken - promised
            window = 2 * ROUND_S + GRACE_S + RESTART_SLACK_S
            origin = max(state["daemon_since"], state["slurm_since"])
            for j in mine:
                if j.held and j.gpus <= free and state["daemon_alive"]:
                    since = max(held_since.setdefault(j.job_id, now), origin)
                    if now - since > window:
                        violations.append(f"job {j.job_id} ({j.gpus} GPUs) held {now - since:.1f}"
                                          f" s with {free} GPUs free")
                        held_since[j.job_id] = now          # count each episode once
                else:
                    held_since.pop(j.job_id, None)
            stop.wait(0.5)

    watcher = threading.Thread(target=watch, daemon=True)
    try:
        for k in range(JOBS):
            g = GPUS[k]
            target = rng.randint(50, 120)               # units of 0.2 s: 10-24 s of work
            spec = json.dumps({"model": "ResNet-18", "epochs": 2, "epoch_seconds": target / 10},
                              separators=(",", ":"))
            out = subprocess.run(
                ["sbatch", "--parsable", "--partition=gpu", f"--gres=gpu:{g}", "--requeue",
                 f"--job-name={prefix}{k}", f"--comment=shock:spec={spec}",
                 "-o", str(tmp_path / "%x-%j.out"),
                 "--wrap", f"exec {sys.executable} {WORKER} --target {target} "
                           f"--state {tmp_path / 'state'}"],
                capture_output=True, text=True, timeout=30, cwd=tmp_path, env=env)
            assert out.returncode == 0, out.stderr
            ours[int(out.stdout.strip().split(";")[0])] = g
        daemon = start_daemon()
        watcher.start()
        restarts_at = sorted(rng.sample(range(2, MIN_KILLS), CTLD_RESTARTS))
        t0 = time.monotonic()
        backend = CliBackend(timeout=10)
        completed: dict[int, str] = {}
        while time.monotonic() - t0 < DEADLINE_S:
            time.sleep(rng.uniform(2.0, 7.0))
            try:
                snapshot = {j.job_id: j for j in backend.jobs() if j.job_id in ours}
                completed = {jid: j.state.value for jid, j in snapshot.items()
                             if j.state.finished}
            except Exception:
                pass
            if len(completed) == JOBS and figures["kills"] >= MIN_KILLS:
                break
            if len(completed) < JOBS or figures["kills"] < MIN_KILLS:
                daemon.send_signal(signal.SIGKILL)
                daemon.wait(timeout=10)
                state["daemon_alive"] = False
                figures["kills"] += 1
                time.sleep(rng.uniform(0.0, 1.0))
                if figures["kills"] in restarts_at:
                    _restart_slurmctld()
                    figures["slurmctld_restarts"] += 1
                daemon = start_daemon()
        elapsed = time.monotonic() - t0
        # let the daemon finish anything left (requeued jobs released again, ...)
        while time.monotonic() - t0 < DEADLINE_S:
            try:
                snapshot = {j.job_id: j for j in backend.jobs() if j.job_id in ours}
                if all(j.state.finished for j in snapshot.values()) and \
                        len(snapshot) == JOBS:
                    break
            except Exception:
                pass
            time.sleep(1.0)
        stop.set()
        watcher.join(timeout=15)
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=60)
        final = {j.job_id: j.state.value for j in backend.jobs() if j.job_id in ours}
        done = sum(1 for s in final.values() if s == "COMPLETED")

        # the store: no round's plan ever ran more GPUs than exist; every intent has an outcome
        engine = open_store(db)
        with Session(engine) as s:
            per_round = s.execute(select(PlanEntry.round_id, func.sum(PlanEntry.gpus))
                                  .group_by(PlanEntry.round_id)).all()
            rounds = s.scalar(select(func.count()).select_from(Round))
            open_intents = s.scalar(select(func.count()).select_from(EnactmentIntent)
                                    .where(EnactmentIntent.return_code.is_(None)))
            from shockslurm.store.models import Job
            seq = s.execute(select(Job.job_id, EnactmentIntent.action)
                            .join(Job, EnactmentIntent.job_pk == Job.id)
                            .where(EnactmentIntent.action.in_(("signal", "requeuehold")))
                            .order_by(EnactmentIntent.created_at, EnactmentIntent.id)).all()
        signals = sum(1 for _j, a in seq if a == "signal")
        last: dict[int, str] = {}
        for jid, action in seq:      # a job signalled twice with no requeuehold between
            if action == "signal" and last.get(jid) == "signal":
                violations.append(f"job {jid} signalled twice in one stop")
            last[jid] = action
        engine.dispose()
        for rid, gpus in per_round:
            if gpus > capacity:
                violations.append(f"round {rid} planned {gpus} GPUs > {capacity}")
        # a worker that finished its target ends with "done at"
        unfinished = []
        for jid in ours:
            out = next(tmp_path.glob(f"*-{jid}.out"), None)
            lines = out.read_text().splitlines() if out else []
            if not lines or not lines[-1].startswith("done at"):
                unfinished.append(jid)
        print(f"\nfault injection: jobs={JOBS} completed={done} kills={figures['kills']} "
              f"daemon_restarts={figures['daemon_starts'] - 1} "
              f"slurmctld_restarts={figures['slurmctld_restarts']} rounds={rounds} "
              f"signals={signals} max_gpus={figures['max_gpus']}/{capacity} "
              f"polls={figures['polls']} failed_polls={figures['failed_polls']} "
              f"open_intents_at_end={open_intents} trained_to_target={JOBS - len(unfinished)} "
              f"elapsed={elapsed:.0f}s violations={len(violations)}")
        for v in violations[:20]:
            print("  violation:", v)
        assert figures["kills"] >= MIN_KILLS
        assert figures["slurmctld_restarts"] == CTLD_RESTARTS
        assert done == JOBS, (final, (tmp_path / "daemon.log").read_text()[-5000:])
        assert not unfinished, f"jobs completed without reaching their target: {unfinished}"
        assert violations == [], violations[:20]
    finally:
        end_daemon(daemon, stop, log)
        if not controller_up(timeout_s=5):
            subprocess.run(["slurmctld"], timeout=30)
        if ours:
            subprocess.run(["scancel", *map(str, ours)], capture_output=True, timeout=30)
