"""The live cluster's contracts with its memory (the store, wired in by the daemon) and the
records it keeps per job: `Journal` (rounds, an intent before each Slurm call, its outcome),
`StopLedger` (stops under way), `StopHistorySource` (past preemptions, checkpoint health).
`slurm/` never imports the store; `shockslurm.daemon.journal` implements these on it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Protocol, Sequence

from ..errors import ShockslurmError
from ..model import RoundPlan, Snapshot
from . import enact as en
from .progress_source import Progress
from .specs import LiveSpec
from ..slurm.types import CommandResult, SlurmJob


class JournalUnavailable(ShockslurmError):
    """The journal (the store) could not record: the round is abandoned before any action it
    could not record."""


# --------------------------------------------------------------------------- journal
class Journal(Protocol):
    """Durable record of rounds and actions (the store, wired in by the daemon)."""

    def begin_round(self, snapshot: Snapshot, plan: RoundPlan,
                    jobs: Mapping[int, "LiveJob"]) -> None: ...

    def intent(self, step: en.Step) -> object:
        """Record the step before it runs; return a handle for `outcome`."""

    def outcome(self, handle: object, result: CommandResult) -> None: ...

    def job_ended(self, job: "LiveJob", final: SlurmJob | None, now: float) -> None:
        """Record that a job of the last round left the queue: `final` is what Slurm shows of
        it now (a finished state), None when Slurm no longer knows it."""


class StopLedger(Protocol):
    """Stops in progress, durably (the store): USR1 sent, requeuehold not yet done."""

    def pending_stops(self, jobs: Sequence[SlurmJob]) -> Mapping[int, float]:
        """{job id: Unix time of its latest successful-or-unknown `signal`} for those of `jobs`
        with no successful `requeuehold` after it (one read); raises when it cannot read."""

    def job_event(self, job: SlurmJob, kind: str, detail: Mapping[str, object],
                  now: float) -> None:
        """Record a job event (e.g. `flagged`) once per job and kind."""


class NullJournal:
    def begin_round(self, snapshot: Snapshot, plan: RoundPlan,
                    jobs: Mapping[int, "LiveJob"]) -> None:
        pass

    def intent(self, step: en.Step) -> object:
        return None

    def outcome(self, handle: object, result: CommandResult) -> None:
        pass

    def job_ended(self, job: "LiveJob", final: SlurmJob | None, now: float) -> None:
        pass


# --------------------------------------------------------------------------- the cluster
@dataclass
class LiveJob:
    """What the daemon remembers of one managed job between rounds."""

    slurm: SlurmJob
    spec: LiveSpec
    run_time_s: float = 0.0
    last_seen_running: bool = False
    progress: Progress | None = None      # what the last round's view was built from


@dataclass
class EnactStats:
    """What the last `enact` did (for the daemon's round log line and for tests)."""

    started: int = 0
    stopped: int = 0
    held: int = 0
    updates: int = 0
    failed_calls: int = 0
    grace_wait_s: float = 0.0      # from the signals until the stopped jobs had exited
    stop_wait_s: float = 0.0       # from the requeuehold until their GPUs were free
    kept: dict[int, str] = field(default_factory=dict)    # stops the churn bounds dropped: rule
    dropped: tuple[int, ...] = ()                         # planned starts dropped for them
    moved: int = 0                 # running jobs restarted on the plan's other nodes
    pinned: int = 0                # jobs started (or re-pinned) with ReqNodeList=
    idle_unplaceable_gpu_s: float = 0.0  # since the last observe: released jobs waited in
    #                                      Reason=Resources while GPUs were free
    idle_switch_gpu_s: float = 0.0       # since the last round (`idle`): freed by stops, the
    #                                      successors not yet RUNNING
    idle_waiting_gpu_s: float = 0.0      # since the last round (`idle`): held jobs could run
    steps: list[en.Step] = field(default_factory=list)


class StopHistorySource(Protocol):
    """Past preemptions and checkpoint health of jobs, across daemon restarts (the store)."""

    def stop_history(self, jobs: Sequence[SlurmJob]) -> Mapping[int, en.StopHistory]:
        """Histories of `jobs` by job id (one read); may raise (memory is used instead)."""

    def flag(self, job: SlurmJob, reason: str, now: float) -> None:
        """Record durably that `job` was flagged (its checkpoints keep failing)."""
