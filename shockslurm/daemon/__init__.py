"""The daemon: the only place where the store meets the live scheduler (`live/`).

- `build`: wires a `Daemon` from a configuration (Slurm backend, policy, store journal, reports,
  metrics) — one path for start-up and SIGHUP reload.
- `runner`: the long-running process (signals, leader lock, outages around each round).
- `round_log`: one log line per round.
- `journal`: the live cluster's `Journal`, `SpecRegistry` and `StopLedger` on the SQL store.
"""

from .runner import *  # noqa: F401,F403  (the daemon's public names)
from .runner import __all__  # noqa: F401
