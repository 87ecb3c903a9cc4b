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
res = CliBackend().run(["sh", "-c", "sleep 1.5; echo done"])
print(res.returncode, res.stdout.strip(), "stop queued" if stopped else "no stop")
"""


def test_a_signal_to_the_daemons_process_group_does_not_kill_its_slurm_command():
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    time.sleep(0.7)                          # the command is under way
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

