"""When the daemon's next round is due: the rules `DaemonRunner` waits by.

Event-driven rounds: GPUs a completion frees are filled at once, not a round later. While it
waits for the next round, a leader whose last round ran asks the cluster every
`event_poll_seconds` (`SlurmCluster.wants_early_round`: one `squeue --json` read) whether a job
of the last plan finished while others of ours are pending; if so, the next round starts now.
An early round is a normal round at the current time (the next one follows a whole round after
it): policies that count rounds (Shockwave's window, `resolve_every`, the fairness series'
weights) count it as one, and Shockwave re-solves on the completion anyway. A standby, a round
cut short by an outage or a stale snapshot never polls; a failed read is "no event".

Stop lead: a round that follows a round that ran starts `stop_lead_seconds` (at most half a
round) before its boundary (one round after the previous boundary), so its stop signals go out
early and the jobs it starts are RUNNING at the boundary, not a switch (about 1.5-3 s) after
it. The boundaries keep their period; the first round, an early round and a retry start at
once and are their own boundary (`DaemonRunner.boundary`).

Clock steps (since 2026-12-03): every wait is measured on the monotonic clock from the round's
start, never on the wall clock, and a round that starts off its boundary's rhythm (more than
`EARLY_TOLERANCE_S` early, or more than a round late) is its own boundary (`round_boundary`,
logged). Before, a wall clock stepped back (NTP, a virtual machine's resume) held the next
round back by the step, and one stepped forward, a suspended process or a round that took
longer than two rounds ran rounds back to back until the boundaries caught up (an hour's step
with 15 s rounds: 240 rounds at once).
"""

from __future__ import annotations

import logging

log = logging.getLogger("shockslurm.daemon")

# The event poll waits at least this many times its last read's duration: on a large queue
# (a slow `squeue`) it backs off rather than spend more than 1/20 of the time reading Slurm.
POLL_COST_FACTOR = 20.0
# A round due at its boundary's lead wakes on time or a little after; one that starts more than
# this much before it saw the wall clock step back.
EARLY_TOLERANCE_S = 1.0


def round_boundary(nominal: float | None, start: float, lead_s: float, round_s: float) -> float:
    """The boundary of a round that starts at wall-clock time `start`: `nominal`, the boundary
    the wait was for, when the round starts in its rhythm (no more than `EARLY_TOLERANCE_S`
    before `nominal - lead_s`, at most a round after it), else `start` (logged: the boundaries
    count from this round on). No `nominal` (the first round, an early round, a retry): `start`."""
    if nominal is None:
        return start
    late = start - (nominal - lead_s)
    if -EARLY_TOLERANCE_S <= late <= round_s:
        return nominal
    log.warning("this round starts %+.1f s off its boundary (the wall clock stepped, or the "
                "daemon was held up); the next boundaries count from it", late,
                extra={"fields": {"event": "rhythm", "late_s": round(late, 3)}})
    return start


def event_poll_s(poll_s: float, retry: float | None, leading: bool | None,
                 last_read_s: float) -> float | None:
    """Seconds between event polls while waiting for the next round, or None for no poll:
    polling is off (`event_poll_seconds` `poll_s` 0), the last attempt did not run a round
    (`retry`: a standby, an outage, a stale snapshot: it waits out its delay); at least
    `POLL_COST_FACTOR` times the last poll's read."""
    if poll_s <= 0 or retry is not None or leading is False:
        return None
    return max(poll_s, POLL_COST_FACTOR * last_read_s)
