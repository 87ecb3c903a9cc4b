"""Work one rank does alone inside a collective (a checkpoint written by the writer, the
checkpoint to load chosen by rank 0), with its outcome handed to every rank.

Without it, a rank that failed there (a full disk, an unreadable directory, a value of
`extras` that cannot be pickled) raised on its own while every other rank waited in the next
barrier or broadcast until the process group's timeout (NCCL's 10 minutes, gloo's 30): the job
hung instead of failing. `done_alone` gathers each rank's outcome (collective): the rank that
failed raises its own error, every other rank `RankFailed` naming it, at once.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

from ._env import _group

T = TypeVar("T")


class RankFailed(RuntimeError):
    """Raised on every other rank when one rank fails in the work it does alone; `os_error`:
    the failure was an OSError there (a full disk: what a save logs and trains on after)."""

    def __init__(self, message: str, os_error: bool = False) -> None:
        super().__init__(message)
        self.os_error = os_error


def done_alone(work: Callable[[], T], doer: bool, *, from_rank: int | None = None) -> T | None:
    """Run `work` where `doer` is True (collective under torch.distributed: every rank calls
    this); returns this rank's result (None where it did not run), or with `from_rank` that
    rank's on every rank. An exception in `work` (not a KeyboardInterrupt or SystemExit) is
    raised on its rank and as `RankFailed` on the others."""
    error: Exception | None = None
    result: T | None = None
    if doer:
        try:
            result = work()
        except Exception as exc:       # noqa: BLE001 - handed to every rank, then re-raised
            error = exc
    dist = _group()
    if dist is None:
        if error is not None:
            raise error
        return result
    mine = (None if error is None else f"{type(error).__name__}: {error}", result,
            isinstance(error, OSError))
    outcomes: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(outcomes, mine)
    if error is not None:
        raise error
    failed = [(rank, why, os_error) for rank, (why, _, os_error) in enumerate(outcomes)
              if why is not None]
    if failed:
        rank, why, os_error = failed[0]
        raise RankFailed(f"shockslurm.train: rank {rank} failed: {why}", os_error)
    return result if from_rank is None else outcomes[from_rank][1]


def gathered(value: Any) -> list[Any]:
    """Every rank's `value`, in rank order (collective under torch.distributed), else
    `[value]`."""
    dist = _group()
    if dist is None:
        return [value]
    values: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values
