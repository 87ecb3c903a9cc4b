"""`EventPolling`: how the live cluster watches Slurm between rounds for an event that should
start the next round at once (`live.events`: a completion while jobs of ours wait, an arrival
that fits the idle GPUs, GPUs freed by a job we do not schedule), cheaply: a light `squeue` of
the partitions on our nodes first, the full `squeue --json` only when that changed."""

from __future__ import annotations

import logging
from typing import Collection, Sequence

from .events import (arrivals_that_fit, completions_with_waiting, departures_with_waiting,
                     pool_layout)
from .journaling import LiveJob
from .layout import read_layout
from .phases import EnactPhases
from ..slurm.types import JobState, SlurmJob, SlurmNode

log = logging.getLogger("shockslurm.live.cluster")


class EventPolling(EnactPhases):
    """`wants_early_round` for the live cluster (`SlurmCluster` holds the state it reads)."""

    jobs: dict[int, LiveJob]
    _nodes: list[SlurmNode]
    _last_now: float | None
    _poll_seen: frozenset[tuple[str, str]] | None
    _others_holding: frozenset[int]
    _watched: tuple[str, ...]

    def _never(self) -> set[int]:
        raise NotImplementedError      # SlurmCluster's

    def _capacity(self, nodes: Sequence[SlurmNode], jobs: Sequence[SlurmJob]) -> int:
        raise NotImplementedError      # SlurmCluster's

    def _sample_idle(self, jobs: Sequence[SlurmJob], now: float) -> None:
        raise NotImplementedError      # SlurmCluster's

    def wants_early_round(self) -> bool:
        """True when a round now would fill idle GPUs (`live.events`): a job of the last enacted
        plan has finished (a final state, or left the queue: its GPUs are free; COMPLETING still
        holds them) while a job of ours outside the plan is pending; a job we do not schedule
        that held GPUs on our nodes at the last round holds none now and a pending job of ours
        fits the GPUs idle now; or a new job of ours is pending and fits the GPUs idle now. A light read of
        the partitions on our nodes (`_queue_changed`), then one `squeue --json` only when it
        changed; no action; a read that fails is "no event". The full read is also an idle
        sample (`idle`)."""
        try:
            if not self._queue_changed():
                return False
            jobs = self._canonical(self.backend.jobs())
        except Exception as exc:       # noqa: BLE001 - an outage is the round's to handle
            log.debug("event poll: squeue failed (%s: %s); no event", type(exc).__name__, exc)
            return False
        if self._last_now is not None:   # on the rounds' clock
            self._sample_idle(jobs, self._last_now + self._monotonic() - self._observe_started)
        return (self._completion_event(jobs) or self._departure_event(jobs)
                or self._arrival_event(jobs))

    def _queue_changed(self) -> bool:
        """Whether the active jobs of the partitions on our nodes (`watched_partitions`: ours
        and any other partition sharing a node with them, whose jobs free GPUs we plan with)
        changed since the last poll (always after a round), by the backend's cheap text read
        when it has one (`active_job_states`); the full `squeue --json` read follows only on a
        change."""
        read = getattr(self.backend, "active_job_states", None)
        seen = None if read is None else read(self._watched)
        if seen is None:    # no cheap read (pyslurm, or a dry run over it)
            return True
        changed = seen != self._poll_seen
        self._poll_seen = seen
        return changed

    def _completion_event(self, jobs: Sequence[SlurmJob]) -> bool:
        freed, waiting = completions_with_waiting(jobs, self._planned, self._ours, self._never())
        if waiting:
            log.info("jobs %s finished with %s waiting: starting the next round now", freed,
                     waiting[:10], extra={"fields": {"event": "early_round", "finished": freed,
                                                     "waiting": len(waiting)}})
        return bool(waiting)

    def _departure_event(self, jobs: Sequence[SlurmJob]) -> bool:
        """A job we do not schedule left GPUs on our nodes and a waiting job of ours fits the
        GPUs idle now (a busy foreign partition freeing a GPU here and there starts no round
        for a gang that does not fit)."""
        gone, waiting = departures_with_waiting(jobs, self._others_holding, self._ours,
                                                self._never())
        if not waiting:
            return False
        ids = set(waiting)
        fits = self._fitting_now(jobs, [j for j in jobs if j.job_id in ids], ())
        if fits:
            log.info("GPUs of jobs %s we do not schedule are free and %s fit them: starting "
                     "the next round now", gone, fits[:10],
                     extra={"fields": {"event": "early_round", "others_left": gone,
                                       "fit": fits}})
        return bool(fits)

    def _fitting_now(self, jobs: Sequence[SlurmJob], pending: Sequence[SlurmJob],
                     skip: Collection[int]) -> list[int]:
        """The `pending` jobs (not in `skip`) whose gang the GPUs idle now can place."""
        if not pending or not self._nodes:
            return []
        layout = (read_layout(self._nodes, jobs, self.partitions, self._ours)
                  or pool_layout(self._capacity(self._nodes, jobs), jobs, self._ours))
        return arrivals_that_fit(layout, pending, skip)

    def _arrival_event(self, jobs: Sequence[SlurmJob]) -> bool:
        pending = [j for j in jobs if j.state is JobState.PENDING and self._ours(j)]
        fits = self._fitting_now(jobs, pending, self.jobs)
        if fits:
            log.info("jobs %s arrived and fit the idle GPUs: starting the next round now",
                     fits[:10], extra={"fields": {"event": "early_round", "arrived": fits}})
        return bool(fits)
