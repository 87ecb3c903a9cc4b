"""A stand-in training job for the live daemon test (no torch): one unit of work per 0.2 s.

    python worker.py --target UNITS --state DIR

Progress survives requeues in DIR/<job id>.progress (written after every unit). On SIGUSR1 or
SIGTERM it saves, prints "got SIG... at unit N" and exits 0: requeueing is the daemon's job. On
every start it prints "start restart=$SLURM_RESTART_COUNT unit N"; it exits 0 at the target.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

UNIT_S = 0.2
got: list[str] = []


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", type=int, required=True)
    ap.add_argument("--state", required=True)
    args = ap.parse_args()
    path = Path(args.state) / f"{os.environ.get('SLURM_JOB_ID', 'local')}.progress"
    unit = int(path.read_text()) if path.exists() else 0
    for sig in (signal.SIGUSR1, signal.SIGTERM):
        signal.signal(sig, lambda num, _frame: got.append(signal.Signals(num).name))
    print(f"start restart={os.environ.get('SLURM_RESTART_COUNT', '0')} unit {unit}", flush=True)
    while unit < args.target:
        time.sleep(UNIT_S)
        if got:   # checked after the sleep: a signal during the last unit still stops us
            print(f"got {got[0]} at unit {unit}", flush=True)
            return 0
        unit += 1
        tmp = path.with_suffix(".tmp")
        tmp.write_text(str(unit))
        os.replace(tmp, path)
    print(f"done at unit {unit}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
