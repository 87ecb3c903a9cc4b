"""GPUs a completion frees are filled at once, on the real Slurm test cluster: the daemon
(`DaemonRunner`, in a thread, FIFO, 30 s rounds, `event_poll_seconds` 2) runs four 8-GPU jobs
on the 32 GPUs, one of them short; a fifth 8-GPU job waits held. When the short job ends mid-round
the runner's poll sees it and starts the next round early, which releases the fifth job: the gap
between the short job's end and the fifth's start is a few seconds, not the rest of the round.
The same holds when the short job is a plain job of another partition on the same nodes.

Only the jobs this test submits are scheduled (`job_filter`).
"""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest

from shockslurm.daemon import DaemonRunner, build_daemon, parse_config
from shockslurm.slurm.cli_backend import CliBackend
from shockslurm.slurm.types import JobState
from shockslurm.store import open_store

from .test_daemon_live import _shocksub

pytestmark = pytest.mark.slurm

ROUND_S = 30.0
POLL_S = 2.0
SHORT_UNITS = 40            # 8 s (units of 0.2 s)
LONG_UNITS = 600            # 120 s: still running when the test ends (cancelled)
PLAIN_S = 12               # the plain job's run: it starts after the managed jobs are submitted
# one poll (the runner stretches its interval to 20x a slow poll's read), the early round's
# reads and release, Slurm's scheduling pass (1 s resolution); the next boundary would be
# 20 s or more after the completion (8 s idle; 14 s leaves room for a loaded machine)
FILL_BOUND_S = POLL_S + 14.0


def _plain_short_job(backend: CliBackend) -> int:
    """An 8-GPU job of `PLAIN_S` on the unmanaged `urgent` partition (the same nodes), once
    running."""
    out = subprocess.run(["sbatch", "--parsable", "-p", "urgent", "--gres=gpu:8", "-o",
                          "/dev/null", "--job-name", "shockit-plain", "--wrap", f"sleep {PLAIN_S}"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    job_id = int(out.stdout.strip().split(";")[0])
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        state = {j.job_id: j.state for j in backend.jobs()}.get(job_id)
        if state is JobState.RUNNING:
            return job_id
        time.sleep(0.2)
    pytest.fail(f"the plain job {job_id} did not start: {state}")


def measure_fill_gap(tmp: Path, event_poll_s: float, *, plain: bool = False
                     ) -> tuple[float, float]:
    """Run the scenario (with `plain`, the short job is another partition's job the daemon does
    not schedule, running before the daemon starts); (gap between the short job's end and the
    waiting job's start, seconds from the daemon's first round to that start)."""
    (tmp / "state").mkdir(exist_ok=True)
    db = str(tmp / "store.db")
    ours: list[int] = []
    others: list[int] = []
    runner = thread = None
    engine = open_store(db, create=True)
    backend = CliBackend()
    try:
        units = [LONG_UNITS] * 4 if plain else [SHORT_UNITS] + [LONG_UNITS] * 4
        for k, n in enumerate(units):
            ours.append(_shocksub(tmp, db, k, 8, n))
        if plain:     # last, so that it still runs at the daemon's first round
            others.append(_plain_short_job(backend))
        short, waiting = (others[0] if plain else ours[0]), ours[-1]
        cfg = parse_config({"daemon": {"round_seconds": ROUND_S, "grace_seconds": 5,
                                       "policy": "fifo", "partitions": ["gpu"], "db": db,
                                       "min_run_seconds": 0,
                                       "event_poll_seconds": event_poll_s}})
        daemon = build_daemon(cfg, backend, engine=engine,
                              job_filter=lambda j: j.job_id in ours, emit=lambda _line: None)
        runner = DaemonRunner(daemon)
        first_round = time.time()
        thread = threading.Thread(target=runner.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 2 * ROUND_S + 20
        while time.monotonic() < deadline:
            jobs = {j.job_id: j for j in backend.jobs()}
            if waiting in jobs and jobs[waiting].state is JobState.RUNNING:
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"job {waiting} never started: {jobs.get(waiting)}")
        done, started = jobs[short], jobs[waiting]
        assert done.state is JobState.COMPLETED and done.end_time is not None, done
        assert started.start_time is not None
        assert done.end_time > first_round, "the short job ended before the daemon's first round"
        return started.start_time - done.end_time, started.start_time - first_round
    finally:
        if runner is not None:
            runner.request_stop()
        if thread is not None:
            thread.join(timeout=ROUND_S + 30)
        if ours or others:
            subprocess.run(["scancel", *map(str, ours + others)], capture_output=True,
                           timeout=30)
        engine.dispose()


def test_a_completion_mid_round_is_filled_within_seconds(tmp_path: Path, slurm_cluster):
    assert slurm_cluster.gpus == 32, "the scenario fills 4 nodes x 8 GPUs"
    gap, since_first = measure_fill_gap(tmp_path, POLL_S)
    print(f"completion -> next start: {gap:.0f} s ({since_first:.0f} s after the first round, "
          f"rounds of {ROUND_S:g} s)")
    assert 0 <= gap <= FILL_BOUND_S, gap
    assert since_first < ROUND_S, "filled at the next round boundary, not at once"


def test_gpus_a_job_of_another_partition_frees_are_filled_within_seconds(tmp_path: Path,
                                                                         slurm_cluster):
    """The short job is a plain job of the `urgent` partition on the same nodes: the daemon
    planned around its GPUs; when it ends mid-round the poll (which reads `urgent` too) sees
    it and the next round starts at once."""
    assert slurm_cluster.gpus == 32, "the scenario fills 4 nodes x 8 GPUs"
    gap, since_first = measure_fill_gap(tmp_path, POLL_S, plain=True)
    print(f"plain job's end -> next start: {gap:.0f} s ({since_first:.0f} s after the first "
          f"round, rounds of {ROUND_S:g} s)")
    assert 0 <= gap <= FILL_BOUND_S, gap
    assert since_first < ROUND_S, "filled at the next round boundary, not at once"
