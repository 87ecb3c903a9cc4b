"""Slurm job-state strings -> `JobState`, kept as data so a new Slurm release is a table edit.

Shapes seen across versions:
- 22.05 (openapi v0.0.38) reports ONE string per job. Slurm's `job_state_string()` returns the
  name of a set flag *instead of* the base state (e.g. "COMPLETING", "CONFIGURING",
  "REQUEUED"), so a flag can arrive alone and must imply a base state.
- 23.02+ (data_parser v0.0.39 ... v0.0.44) report a LIST: the base state plus every flag,
  e.g. ["RUNNING", "COMPLETING"] or ["PENDING", "REQUEUED"].
- squeue's text output and `squeue -t` use the short codes (PD, R, CG, ...).
Unknown strings never crash the daemon: they log a warning and map to `JobState.UNKNOWN`.
"""

from __future__ import annotations

import logging
from typing import Iterable

from .types import JobState

log = logging.getLogger(__name__)

# Base states, long and short forms (squeue(1) "JOB STATE CODES").
BASE_STATES: dict[str, JobState] = {
    "PENDING": JobState.PENDING, "PD": JobState.PENDING,
    "RUNNING": JobState.RUNNING, "R": JobState.RUNNING,
    "SUSPENDED": JobState.SUSPENDED, "S": JobState.SUSPENDED,
    "COMPLETED": JobState.COMPLETED, "CD": JobState.COMPLETED,
    "CANCELLED": JobState.CANCELLED, "CA": JobState.CANCELLED,
    "CANCELED": JobState.CANCELLED,             # spelling used by some tools/docs
    "FAILED": JobState.FAILED, "F": JobState.FAILED,
    "TIMEOUT": JobState.TIMEOUT, "TO": JobState.TIMEOUT,
    "NODE_FAIL": JobState.NODE_FAIL, "NF": JobState.NODE_FAIL,
    "PREEMPTED": JobState.PREEMPTED, "PR": JobState.PREEMPTED,
    "BOOT_FAIL": JobState.BOOT_FAIL, "BF": JobState.BOOT_FAIL,
    "DEADLINE": JobState.DEADLINE, "DL": JobState.DEADLINE,
    "OUT_OF_MEMORY": JobState.OUT_OF_MEMORY, "OOM": JobState.OUT_OF_MEMORY,
}

# State flags: short code -> long name (the name we keep in `SlurmJob.state_flags`).
FLAG_ALIASES: dict[str, str] = {
    "CG": "COMPLETING", "CF": "CONFIGURING", "RQ": "REQUEUED", "RH": "REQUEUE_HOLD",
    "RF": "REQUEUE_FED", "RS": "RESIZING", "RV": "REVOKED", "SI": "SIGNALING",
    "SE": "SPECIAL_EXIT", "SO": "STAGE_OUT", "ST": "STOPPED", "RD": "RESV_DEL_HOLD",
}

# State flags -> the base state they imply when they arrive alone (22.05 single string).
# None: the flag says nothing about the base state.
STATE_FLAGS: dict[str, JobState | None] = {
    "COMPLETING": JobState.COMPLETING,       # job ended, epilog/steps still cleaning up: GPUs busy
    "CONFIGURING": JobState.RUNNING,        # allocated, nodes booting/prolog: GPUs held
    "POWER_UP_NODE": JobState.RUNNING,
    "RESIZING": JobState.RUNNING,
    "SIGNALING": JobState.RUNNING,
    "STAGE_OUT": JobState.COMPLETING,
    "REQUEUED": JobState.PENDING,           # being requeued (preemption / scontrol requeue)
    "REQUEUE_HOLD": JobState.PENDING,
    "REQUEUE_FED": JobState.PENDING,
    "SPECIAL_EXIT": JobState.PENDING,
    "RESV_DEL_HOLD": JobState.PENDING,
    "STOPPED": JobState.SUSPENDED,
    "REVOKED": JobState.CANCELLED,
    "LAUNCH_FAILED": JobState.FAILED,
    "RECONFIG_FAIL": JobState.FAILED,
    "UPDATE_DB": None,
}


def parse_job_state(value: str | Iterable[str], *, job_id: object = None
                    ) -> tuple[JobState, frozenset[str]]:
    """Map one Slurm job-state value (a string or a list of strings) to (state, flags).

    The base state wins, except that COMPLETING (a job holding GPUs while it winds down)
    overrides a finished base state, which is then kept among the flags (23.02+ list it:
    ["CANCELLED", "COMPLETING"] is COMPLETING with the flag CANCELLED: how the job ends).
    Unknown strings are logged and ignored; if nothing is recognised the state is UNKNOWN.
    """
    tokens = [value] if isinstance(value, str) else list(value)
    base: JobState | None = None
    flags: set[str] = set()
    for raw in tokens:
        tok = str(raw).strip().upper()
        if not tok:
            continue
        tok = FLAG_ALIASES.get(tok, tok)
        if tok in BASE_STATES:
            base = base or BASE_STATES[tok]
        elif tok in STATE_FLAGS:
            flags.add(tok)
        else:
            log.warning("job %s: unknown Slurm job state %r, treated as UNKNOWN", job_id, raw)
    if "COMPLETING" in flags:
        if base is not None and base.finished:
            flags.add(base.value)
        return JobState.COMPLETING, frozenset(flags)
    if base is None:
        implied = [s for s in (STATE_FLAGS[f] for f in sorted(flags)) if s is not None]
        base = implied[0] if implied else JobState.UNKNOWN
    return base, frozenset(flags)


def job_state(value: str, *, job_id: object = None) -> JobState:
    """Only the base state of one string (long or short form)."""
    return parse_job_state(value, job_id=job_id)[0]
