"""Stopping the daemon lets the round under way finish its Slurm commands.

`systemctl stop` (and Ctrl-C in a terminal) signals every process of the daemon's group, not
only the daemon: a Slurm command it was running (the `squeue` of a stop's wait, a
`requeuehold`) died with it, the round failed on that, and jobs that had their USR1 were left
unrequeued. The daemon's handler only queues the stop; its Slurm commands run in a session of
their own, and the unit sends SIGTERM to the daemon alone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from shockslurm.ops.config import parse_config

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import signal, sys
from shockslurm.slurm.cli_backend import CliBackend
stopped = []
signal.signal(signal.SIGTERM, lambda *_: stopped.append(1))
res = CliBackend().run(["sh", "-c", 'touch "$0"; sleep 1.5; echo done', sys.argv[1]])
print(res.returncode, res.stdout.strip(), "stop queued" if stopped else "no stop")
"""


def test_a_signal_to_the_daemons_process_group_does_not_kill_its_slurm_command(
        tmp_path: Path):
    started = tmp_path / "started"           # the command touches it when under way
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(started)],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 60
    while not started.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the command never began"
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGTERM)      # what systemd's control-group stop does
    out, _ = proc.communicate(timeout=30)
    assert out.split() == ["0", "done", "stop", "queued"], out


def test_the_unit_stops_the_daemon_alone_and_waits_for_its_round():
    """KillMode=mixed: SIGTERM to the daemon only (SIGKILL to all at the timeout), and a stop
    timeout longer than a round's stop can take with the default settings."""
    unit = (ROOT / "contrib" / "systemd" / "shockslurm.service").read_text()
    assert "\nKillMode=mixed\n" in unit
    (timeout,) = [int(line.split("=", 1)[1]) for line in unit.splitlines()
                  if line.startswith("TimeoutStopSec=")]
    cfg = parse_config({})
    assert timeout >= cfg.grace_seconds + cfg.stop_timeout_seconds + 60

