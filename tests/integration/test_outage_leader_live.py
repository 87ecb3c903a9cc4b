"""No action on stale state and one leader, on the real Slurm test cluster with the daemon as a
subprocess (the `shockslurm daemon` command, 3 s rounds, SQLite store, 1 s store timeout):

- store locked (another process holds `BEGIN EXCLUSIVE`) for `SHOCK_OUTAGE_S` (60) seconds at
  start-up, then again while the daemon runs: a managed job submitted in each window stays held
  the whole window (no Slurm action, no intent), the daemon's output has one outage line at each
  edge and no traceback, and the job is released within one round of the unlock;
- two daemons on one store: one leads, the other stands by; every round's intents come from one
  process id; after `kill -9` of the leader, the standby takes over and releases a new job
  within one round.

Only the jobs whose name starts with this test's prefix are scheduled (`job_name_prefix`).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from shockslurm.slurm.cli_backend import CliBackend
from shockslurm.slurm.types import JobState
from shockslurm.store import open_store
from shockslurm.store.models import EnactmentIntent, Round, Run, stamp_seconds

pytestmark = pytest.mark.slurm

ROUND_S = 3.0
STORE_TIMEOUT_S = 1.0
OUTAGE_S = float(os.environ.get("SHOCK_OUTAGE_S", "60"))
# one round, plus the daemon's own work after the retry: start-up (upgrade, lock, reconcile) or
# a round's reads, and the squeue poll of this test; 1-3 s on an idle machine, twice that on a
# loaded one (a CI machine running other tests' processes; 12 s leaves twice that), and far
# from the 60 s outage
SLACK_S = 12.0


class ExclusiveLock:
    """Another process's transaction holding the SQLite store exclusively."""

    def __init__(self, path: str) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.conn.execute("BEGIN EXCLUSIVE")
        self.since = time.monotonic()

    def release(self) -> float:
        self.conn.execute("COMMIT")
        self.conn.close()
        return time.monotonic()


def _config(tmp: Path, db: str, prefix: str) -> Path:
    path = tmp / "daemon.toml"
    path.write_text(
        "[daemon]\n"
        f"round_seconds = {ROUND_S}\ngrace_seconds = 1\nstop_timeout_seconds = 10\n"
        f"policy = \"fifo\"\npartitions = [\"gpu\"]\ndb = \"{db}\"\nbackend = \"cli\"\n"
        f"job_name_prefix = \"{prefix}\"\nmetrics_port = 0\n"
        f"store_timeout_seconds = {STORE_TIMEOUT_S}\nstandby_retry_seconds = 1\n")
    return path


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("SHOCKSLURM_", "SLURM_"))}


def _start(config: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "shockslurm.cli.main", "daemon", "--config",
                             str(config)], stdout=open(log, "ab"), stderr=subprocess.STDOUT,
                            env=_env(), cwd=config.parent)


def _submit(tmp: Path, name: str) -> int:
    spec = json.dumps({"model": "ResNet-18", "epochs": 2, "epoch_seconds": 300},
                      separators=(",", ":"))
    out = subprocess.run(["sbatch", "--parsable", "--partition=gpu", "--gres=gpu:1",
                          f"--job-name={name}", f"--comment=shock:spec={spec}",
                          "-o", "/dev/null", "--wrap", "sleep 900"],
                         capture_output=True, text=True, timeout=30, cwd=tmp, env=_env())
    assert out.returncode == 0, out.stderr
    return int(out.stdout.strip().split(";")[0])


def _jobs(ids: set[int]) -> dict[int, object]:
    return {j.job_id: j for j in CliBackend(timeout=10).jobs() if j.job_id in ids}


def _held_for(job_id: int, seconds: float, daemon: subprocess.Popen) -> None:
    """The job stays held (pending, priority 0) for `seconds`, the daemon alive."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        job = _jobs({job_id})[job_id]
        assert job.held, f"job {job_id} was acted on during the outage: {job}"
        assert daemon.poll() is None, "the daemon exited during the outage"
        time.sleep(1.0)


def _released_within(job_id: int, since: float, bound: float) -> float:
    """Seconds from `since` until the job is no longer held; fails past `bound`."""
    while time.monotonic() - since < bound + 10:
        job = _jobs({job_id})[job_id]
        if not job.held:
            took = time.monotonic() - since
            assert took <= bound, f"job {job_id} released {took:.1f} s after, bound {bound} s"
            return took
        time.sleep(0.2)
    pytest.fail(f"job {job_id} still held {bound + 10:.0f} s after")


def _outage_ends(lock: ExclusiveLock, job_id: int, daemon: subprocess.Popen,
                 left_alone: int | None = None) -> tuple[float, float]:
    """The store outage `lock` makes: the job stays held until it has lasted `OUTAGE_S` (the
    job `left_alone` still running at its end), then the lock is released. Returns the seconds
    until the job is released after that (bounded by a round) and the wall time of the end."""
    _held_for(job_id, OUTAGE_S - (time.monotonic() - lock.since), daemon)
    if left_alone is not None:
        assert _jobs({left_alone})[left_alone].state is JobState.RUNNING
    unlocked_wall = time.time()
    unlocked = lock.release()
    return _released_within(job_id, unlocked, ROUND_S + SLACK_S), unlocked_wall


def _wait_log(log: Path, needle: str, timeout: float = 30.0) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if needle in log.read_text(errors="replace"):
            return time.monotonic() - t0
        time.sleep(0.1)
    pytest.fail(f"{needle!r} not in {log}:\n{log.read_text(errors='replace')[-3000:]}")


def _stop(p: subprocess.Popen | None) -> None:
    if p is not None and p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)


def _cancel(ids: set[int]) -> None:
    if ids:
        subprocess.run(["scancel", *map(str, sorted(ids))], capture_output=True, timeout=30)


def test_store_locked_at_start_up_and_while_running(tmp_path: Path, slurm_cluster):
    prefix = f"shockout{os.getpid()}-"
    db = str(tmp_path / "store.db")
    open_store(db, create=True).dispose()
    config, log = _config(tmp_path, db, prefix), tmp_path / "daemon.log"
    ours: set[int] = set()
    daemon = None
    figures: dict[str, float] = {}
    try:
        # 1. locked before the daemon starts
        lock = ExclusiveLock(db)
        ours.add(first := _submit(tmp_path, prefix + "0"))
        daemon = _start(config, log)
        figures["start_up_resume_s"], _ = _outage_ends(lock, first, daemon)
        # 2. locked while the daemon runs rounds
        time.sleep(2 * ROUND_S)
        lock = ExclusiveLock(db)
        locked_wall = time.time()
        ours.add(second := _submit(tmp_path, prefix + "1"))
        figures["mid_run_resume_s"], unlocked_wall = _outage_ends(lock, second, daemon,
                                                                   left_alone=first)
        _stop(daemon)
        assert daemon.returncode == 0
    finally:
        _stop(daemon)
        _cancel(ours)
    output = log.read_text(errors="replace")
    print(f"outage {OUTAGE_S:.0f} s: {figures}")
    assert "Traceback" not in output, output[-3000:]
    assert output.count("the store is unavailable at start-up") == 1, output[-3000:]
    assert output.count("the store is available again after") == 1, output[-3000:]
    assert output.count("the store is unavailable (") == 1, output[-3000:]
    assert output.count("the store is writable again after") == 1, output[-3000:]
    engine = open_store(db)
    with Session(engine) as s:
        made = [stamp_seconds(i.created_at) for i in s.scalars(select(EnactmentIntent))]
    engine.dispose()
    assert made and not [t for t in made if locked_wall + STORE_TIMEOUT_S < t < unlocked_wall]


def test_two_daemons_one_leader_and_takeover(tmp_path: Path, slurm_cluster):
    prefix = f"shocklead{os.getpid()}-"
    db = str(tmp_path / "store.db")
    open_store(db, create=True).dispose()
    config = _config(tmp_path, db, prefix)
    log_a, log_b = tmp_path / "a.log", tmp_path / "b.log"
    ours: set[int] = set()
    a = b = None
    figures: dict[str, float] = {}
    try:
        a = _start(config, log_a)
        _wait_log(log_a, "leader: this daemon")
        b = _start(config, log_b)
        _wait_log(log_b, "standby: pid")
        for k in range(2):
            ours.add(job_id := _submit(tmp_path, f"{prefix}{k}"))
            _released_within(job_id, time.monotonic(), 2 * ROUND_S + SLACK_S)
        time.sleep(3 * ROUND_S)
        assert "standby" in log_b.read_text() and "leader:" not in log_b.read_text()
        a.send_signal(signal.SIGKILL)
        a.wait(timeout=10)
        killed, killed_wall = time.monotonic(), time.time()
        ours.add(late := _submit(tmp_path, f"{prefix}late"))
        figures["takeover_s"] = _wait_log(log_b, "(took over)", ROUND_S + SLACK_S)
        figures["first_action_s"] = _released_within(late, killed, ROUND_S + SLACK_S)
        _stop(b)
        assert b.returncode == 0
    finally:
        _stop(a)
        _stop(b)
        _cancel(ours)
    print(f"two daemons: {figures}")
    output = log_a.read_text(errors="replace") + log_b.read_text(errors="replace")
    assert "Traceback" not in output
    engine = open_store(db)
    with Session(engine) as s:
        rows = s.execute(select(Round.id, Run.config, EnactmentIntent.created_at)
                         .join(Run, Round.run_id == Run.id)
                         .join(EnactmentIntent, EnactmentIntent.round_id == Round.id)).all()
    engine.dispose()
    pids_by_round: dict[int, set[int]] = defaultdict(set)
    before, after = set(), set()
    for round_id, run_config, created in rows:
        pids_by_round[round_id].add(run_config["pid"])
        (before if stamp_seconds(created) < killed_wall else after).add(run_config["pid"])
    assert all(len(p) == 1 for p in pids_by_round.values())
    assert before == {a.pid} and after == {b.pid}
