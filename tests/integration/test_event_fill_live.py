"""GPUs a completion frees are filled at once, on the real Slurm test cluster: the daemon
(`DaemonRunner`, in a thread, FIFO, 30 s rounds, `event_poll_seconds` 2) runs four 8-GPU jobs
on the 32 GPUs, one of them short; a fifth 8-GPU job waits held. When the short job ends mid-round
the runner's poll sees it and starts the next round early, which releases the fifth job: the gap
between the short job's end and the fifth's start is a few seconds, not the rest of the round.

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
# one poll, the early round's reads and release, Slurm's scheduling pass (1 s resolution)
FILL_BOUND_S = POLL_S + 4.0


def measure_fill_gap(tmp: Path, event_poll_s: float) -> tuple[float, float]:
    """Run the scenario; (gap between the short job's end and the waiting job's start, seconds
    from the daemon's first round to that start)."""
    (tmp / "state").mkdir(exist_ok=True)
    db = str(tmp / "store.db")
    ours: list[int] = []
    runner = thread = None
    engine = open_store(db, create=True)
    backend = CliBackend()
    try:
        for k, units in enumerate([SHORT_UNITS, LONG_UNITS, LONG_UNITS, LONG_UNITS, LONG_UNITS]):
            ours.append(_shocksub(tmp, db, k, 8, units))
        short, waiting = ours[0], ours[4]
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
        return started.start_time - done.end_time, started.start_time - first_round
    finally:
        if runner is not None:
            runner.request_stop()
        if thread is not None:
            thread.join(timeout=ROUND_S + 30)
        if ours:
            subprocess.run(["scancel", *map(str, ours)], capture_output=True, timeout=30)
        engine.dispose()


def test_a_completion_mid_round_is_filled_within_seconds(tmp_path: Path, slurm_cluster):
    assert slurm_cluster.gpus == 32, "the scenario fills 4 nodes x 8 GPUs"
    gap, since_first = measure_fill_gap(tmp_path, POLL_S)
    print(f"completion -> next start: {gap:.0f} s ({since_first:.0f} s after the first round, "
          f"rounds of {ROUND_S:g} s)")
    assert 0 <= gap <= FILL_BOUND_S, gap
    assert since_first < ROUND_S, "filled at the next round boundary, not at once"
