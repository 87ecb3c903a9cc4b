"""How long slurmctld may wait before it starts a job the daemon released, from its
`SchedulerParameters` (`scontrol show config`), and the start-up advice when that is long.

A released job is not started by the release itself: the release queues a scheduling pass, and
slurmctld runs queued passes no more often than `batch_sched_delay` (seconds, default 3). A
submission is tried at once. Measured on the test cluster (Slurm 22.05.8, 32 GPUs idle,
release -> `squeue` shows RUNNING, polled every 0.05 s, 8 tries each): default delay 0.8-2.7 s
(median 1.9 s); `batch_sched_delay=0` 0.07-0.96 s (median 0.37 s). A plain `sbatch` onto idle
GPUs: 0.07-1.84 s (median 1.2 s) and 0.07-0.87 s (median 0.56 s). Every stop the daemon makes
and every job it starts pays this delay, plain Slurm only where a start follows a completion.
"""

from __future__ import annotations

import logging
from typing import Callable, Sequence

from .types import CommandResult

log = logging.getLogger(__name__)

# slurm.conf(5): "batch_sched_delay=# ... The default value is 3 seconds."
DEFAULT_BATCH_SCHED_DELAY_S = 3.0
# Above this the daemon's start-up log recommends `batch_sched_delay=0`.
ADVISE_ABOVE_S = 1.0


def batch_sched_delay(scheduler_parameters: str) -> float:
    """`batch_sched_delay` of a `SchedulerParameters` value ("bf_interval=5,batch_sched_delay=0"
    -> 0.0); Slurm's default when it is absent, "(null)" or unreadable."""
    for part in scheduler_parameters.split(","):
        key, _, value = part.strip().partition("=")
        if key.strip().lower() == "batch_sched_delay":
            try:
                seconds = float(value)
            except ValueError:
                return DEFAULT_BATCH_SCHED_DELAY_S
            return seconds if seconds >= 0 else DEFAULT_BATCH_SCHED_DELAY_S
    return DEFAULT_BATCH_SCHED_DELAY_S


def scheduler_parameters(show_config: str) -> str | None:
    """The `SchedulerParameters` value of `scontrol show config` output (None: no such line)."""
    for line in show_config.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "SchedulerParameters":
            return value.strip()
    return None


def release_delay_advice(run: Callable[[Sequence[str]], CommandResult]) -> str | None:
    """One `scontrol show config`: the advice to set `batch_sched_delay=0` when slurmctld may
    wait more than `ADVISE_ABOVE_S` before it starts a released job; None when it need not, or
    when the configuration cannot be read (logged at debug level: advice, not a check)."""
    try:
        result = run(["scontrol", "show", "config"])
    except Exception as exc:   # noqa: BLE001 - advice only; the rounds report real outages
        log.debug("scontrol show config failed (%s: %s)", type(exc).__name__, exc)
        return None
    params = scheduler_parameters(result.stdout) if result.ok else None
    if params is None:
        log.debug("no SchedulerParameters in scontrol show config (rc=%d)", result.returncode)
        return None
    delay = batch_sched_delay(params)
    if delay <= ADVISE_ABOVE_S:
        return None
    return (f"slurmctld may start a job the daemon releases up to {delay:g} s late "
            f"(SchedulerParameters batch_sched_delay, default 3): every switch and start pays "
            f"it; add batch_sched_delay=0 to SchedulerParameters in slurm.conf and run "
            f"`scontrol reconfigure` (README \"Slurm settings\")")

