"""`SaveRecord`: the outcome of a training loop's checkpoint saves, shared by `ShockTrainer` and
the Lightning callback, so both say the same when a save fails or a stop leaves no checkpoint."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from .checkpoint import CheckpointManager

log = logging.getLogger("shockslurm.train")


class SaveRecord:
    """A training loop's checkpoints as its writer rank sees them: the newest step checkpointed
    (or resumed from), and what a failed save or a stop says about it. A save that fails (full
    disk, lost mount) is logged and the loop goes on: the newest good checkpoint stays."""

    def __init__(self, manager: CheckpointManager) -> None:
        self.manager = manager
        self.good_step: int | None = None

    def save(self, state: dict[str, Any], step: int) -> tuple[Path | None, bool]:
        """Write `state` as the checkpoint of `step` (on the writer); (its path or None, whether
        the write succeeded)."""
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
