"""`SaveRecord`: the outcome of a training loop's checkpoint saves, shared by `ShockTrainer` and
the Lightning callback, so both say the same when a save fails or a stop leaves no checkpoint
(and every rank learns of a writer's failure at once, `collective.done_alone`);
`agree_on_resume`: every rank resumes from the same step, or none does."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from . import _env
from .checkpoint import CheckpointManager, CheckpointMismatch
from .collective import done_alone

log = logging.getLogger("shockslurm.train")


class SaveRecord:
    """A training loop's checkpoints as its writer rank sees them: the newest step checkpointed
    (or resumed from), and what a failed save or a stop says about it. A save that fails (full
    disk, lost mount) is logged and the loop goes on: the newest good checkpoint stays."""

    def __init__(self, manager: CheckpointManager) -> None:
        self.manager = manager
        self.good_step: int | None = None

    def save(self, state: dict[str, Any], step: int) -> tuple[Path | None, bool]:
        """Write `state` as the checkpoint of `step` on the writer (collective under
        torch.distributed: the other ranks wait for its word); (its path or None, whether the
        write succeeded; None and True on the other ranks). An error other than an OSError
        (a value of `extras` that cannot be pickled) is raised on the writer and as
        `collective.RankFailed` on every other rank."""
        mine = done_alone(lambda: self._write(state, step), self.manager.is_writer)
        return mine if mine is not None else (None, True)

    def _write(self, state: dict[str, Any], step: int) -> tuple[Path | None, bool]:
        try:
            path = self.manager.save(state, step)
        except OSError as exc:
            log.error("shockslurm.train: checkpoint at step %d failed: %s; %s", step, exc,
                      self.fallback())
            return None, False
        if self.manager.is_writer:
            self.good_step = step
        return path, True

    def fallback(self) -> str:
        """Where a rerun would resume from."""
        if self.good_step is None:
            return "no good checkpoint yet: a rerun starts from scratch"
        return f"a rerun resumes from step {self.good_step}, the newest good checkpoint"

    def stop_outcome(self, step: int) -> str:
        """What a stop at `step` leaves, for its log line."""
        if not self.manager.is_writer:
            return "the writer rank checkpoints it"
        if self.good_step == step:
            return "checkpoint written"
        return f"its checkpoint FAILED: {self.fallback()}"


def agree_on_resume(step: int, directory: Path) -> None:
    """Under torch.distributed, every rank must resume from the same step (-1: none): ranks that
    read different checkpoint directories (one per node, or a stale listing) would otherwise
    train on from different weights and steps without an error. Collective."""
    if not _env.distributed():
        return
    steps: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(steps, step)
    if len(set(steps)) > 1:
        found = ", ".join(f"rank {r}: {'none' if s < 0 else f'step {s}'}"
                          for r, s in enumerate(steps))
        raise CheckpointMismatch(f"the ranks found different checkpoints in {directory} "
                                 f"({found}): every rank must read the same checkpoint "
                                 "directory (a shared file system)")
