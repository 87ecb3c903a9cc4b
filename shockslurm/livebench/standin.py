"""The live benchmark's stand-in training job (no torch, no GPU work: it keeps time).

    python -m shockslurm.livebench.standin --plan PLAN.json --state STATE.json

It follows PLAN (`workload.StandinPlan`: real seconds and batch size per epoch), advancing its
position by the wall time it runs. Its position (epoch, seconds into it) lives in STATE: read at
start (a requeued run resumes there), written atomically once a second and when it stops. On
SIGUSR1 or SIGTERM it saves and exits 0 (requeueing is the daemon's job); at the end of the plan
it exits 0.

It reports like a training job using the helper: `train.reports.reporter_from_env` (the
daemon's spool `$SHOCKSLURM_SPOOL`, signed with `$SHOCKSLURM_REPORT_SECRET` from shocksub's job
script): a throughput sample with its position every `--report-seconds`, each batch-size change,
each completed epoch, and a checkpoint report when it saves on a stop. Outside a managed job
(no spool) the reports go nowhere.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import time
from pathlib import Path

from ..train.reports import Reporter, reporter_from_env
from .workload import StandinPlan

TICK_S = 0.05
SAVE_EVERY_S = 1.0
_stop: list[str] = []


def load_position(path: Path) -> tuple[int, float]:
    """(epoch, seconds into it) from STATE, (0, 0.0) when there is none yet."""
    if not path.exists():
        return 0, 0.0
    data = json.loads(path.read_text())
    return int(data["epoch"]), float(data["into_epoch_s"])


def save_position(path: Path, epoch: int, into_epoch_s: float) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps({"epoch": epoch, "into_epoch_s": into_epoch_s}))
    os.replace(tmp, path)


def _report_position(reporter: Reporter, plan: StandinPlan, epoch: int, into: float) -> None:
    batch = plan.batch_sizes[epoch]
    steps = math.ceil(plan.samples_per_epoch / batch)
    fraction = min(1.0, into / plan.epoch_seconds[epoch])
    reporter.throughput(plan.samples_per_epoch / plan.epoch_seconds[epoch], batch,
                        gpus=plan.gpus, epoch=epoch, epochs=len(plan.batch_sizes),
                        step_in_epoch=int(fraction * steps), steps_per_epoch=steps,
                        epoch_progress=epoch + fraction)


def run(plan: StandinPlan, state: Path, reporter: Reporter) -> int:
    epoch, into = load_position(state)
    print(f"start restart={os.environ.get('SLURM_RESTART_COUNT', '0')} epoch {epoch} "
          f"+{into:.2f}s on {os.environ.get('SLURM_JOB_NODELIST', '?')}", flush=True)
    last = time.monotonic()
    saved = last
    while epoch < len(plan.epoch_seconds):
        _report_position(reporter, plan, epoch, into)
        time.sleep(min(TICK_S, max(0.0, plan.epoch_seconds[epoch] - into)))
        now = time.monotonic()
        into += now - last
        last = now
        if into >= plan.epoch_seconds[epoch]:
            into -= plan.epoch_seconds[epoch]
            reporter.epoch_done(epoch, 0, batch_size=plan.batch_sizes[epoch])
            epoch += 1
            if epoch < len(plan.batch_sizes) and plan.batch_sizes[epoch] != plan.batch_sizes[epoch - 1]:
                reporter.batch_size_change(plan.batch_sizes[epoch - 1], plan.batch_sizes[epoch],
                                           epoch=epoch, step=0)
        if _stop:
            save_position(state, epoch, into)
            reporter.checkpoint(str(state), epoch, ok=True)
            print(f"got {_stop[0]} at epoch {epoch} +{into:.2f}s", flush=True)
            return 0
        if now - saved >= SAVE_EVERY_S:
            save_position(state, epoch, into)
            saved = now
    save_position(state, epoch, 0.0)
    print(f"done at epoch {epoch}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="shockslurm.livebench.standin")
    ap.add_argument("--plan", required=True, type=Path)
    ap.add_argument("--state", required=True, type=Path)
    ap.add_argument("--report-seconds", type=float, default=2.0)
    args = ap.parse_args(argv)
    for sig in (signal.SIGUSR1, signal.SIGTERM):
        signal.signal(sig, lambda num, _frame: _stop.append(signal.Signals(num).name))
    plan = StandinPlan.from_json(args.plan.read_text())
    reporter = reporter_from_env(min_interval_s=args.report_seconds)
    try:
        return run(plan, args.state, reporter)
    finally:
        reporter.close()


if __name__ == "__main__":
    sys.exit(main())
