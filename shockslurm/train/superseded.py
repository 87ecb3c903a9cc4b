"""Checkpoints set aside in `superseded/` (`checkpoint.rotate`, for both checkpoint managers):
those of later steps than the one a run has just written are not that run's, so they are moved
out of the checkpoint directory, where a resume would take them. Kept, not deleted.

Each set-aside batch goes into a folder of its own, made new for it:

    superseded/<UTC time>-before-step-<N>/      e.g. superseded/20250301T101502Z-before-step-10/
    superseded/<UTC time>-before-step-<N>-2/    the same name taken already (then -3, ...)

so nothing is ever moved onto an existing name: a second fresh run in the same directory does
not overwrite the first one's set-aside files (file checkpoints), nor fail on its directories
(sharded checkpoints: ENOTEMPTY, and the stale checkpoint stayed where a resume took it).

A checkpoint file moves with its sidecar: the sidecar is first copied into the batch (atomically),
then the file renamed there, then the old sidecar removed. A kill at any moment leaves every
checkpoint, in the checkpoint directory or in its batch, beside its own sidecar (at worst a
sidecar alone besides, which a resume ignores and the next save sweeps).
"""

from __future__ import annotations

import logging
import os
import stat
from datetime import datetime, timezone
from pathlib import Path

from ..atomic import atomic_write, fsync_dir

log = logging.getLogger("shockslurm.train")

SUPERSEDED_DIR = "superseded"


def set_aside(directory: Path, moves: list[tuple[Path, Path]], step: int) -> Path | None:
    """Move each (checkpoint, its sidecar) of `moves` from `directory` into a new batch folder
    under `directory/superseded/` (module docstring), logged as a warning; returns the folder.
    A sidecar that does not exist (a file without one; a sharded checkpoint's directory) is
    skipped. When a move fails: an error is logged and None returned."""
    names = ", ".join(path.name for path, _ in moves)
    root = directory / SUPERSEDED_DIR
    try:
        batch = _new_batch(root, step)
        for path, sidecar in moves:
            _move(path, sidecar, batch)
        fsync_dir(batch)
        fsync_dir(directory)
    except OSError as exc:
        log.error("shockslurm.train: checkpoints of later steps than this run's %d (%s) could "
                  "not be moved to %s: %s; a resume would take them", step, names, root, exc)
        return None
    log.warning("shockslurm.train: checkpoints of later steps than this run's %d are not its "
                "own (%s): moved to %s, where a resume does not look", step, names, batch)
    return batch


def _new_batch(root: Path, step: int) -> Path:
    """A new, empty folder under `root` for one batch (never one that exists)."""
    root.mkdir(exist_ok=True)
    base = f"{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}-before-step-{int(step)}"
    n = 1
    while True:
        batch = root / (base if n == 1 else f"{base}-{n}")
        try:
            batch.mkdir()
        except FileExistsError:
            n += 1
            continue
        fsync_dir(root)
        return batch


def _move(path: Path, sidecar: Path, batch: Path) -> None:
    """`path` into `batch` (a new folder: no name there is taken) with its sidecar beside it
    at every moment: the sidecar's copy first, the file's rename, the old sidecar removed."""
    try:
        mode = stat.S_IMODE(os.stat(sidecar).st_mode)
    except FileNotFoundError:
        os.replace(path, batch / path.name)
        return
    atomic_write(batch / sidecar.name, sidecar.read_bytes(), new_mode=mode)
    os.replace(path, batch / path.name)
    sidecar.unlink(missing_ok=True)
