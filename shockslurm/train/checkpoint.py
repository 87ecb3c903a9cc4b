"""Atomic, checksummed, rotated checkpoints of everything a training loop needs to resume exactly.

File format (one file per checkpoint, `ckpt-<step:012d>.pt`):

    8 bytes   magic  b"SHCKPT01"
    8 bytes   payload length, big-endian unsigned
    32 bytes  sha256 of the payload
    payload   torch.save() of a dict

Writing (rank 0 only): serialise to memory, write header + payload to a temporary file in the
same directory, flush + fsync it, `os.replace` it onto the final name, fsync the directory, then
delete all but the newest `keep` checkpoints. A crash at any moment leaves either the old set of
files or the old set plus one complete new file (plus perhaps a stale `.tmp`, swept by the next
save). Reading (any rank): newest first; a file that is short, has a bad magic, a wrong length or
a wrong checksum, or does not unpickle is logged as a warning naming it and the next older one is
tried.

The payload is a pickle (`torch.load(weights_only=False)`: RNG states hold numpy arrays and
tuples), so only load checkpoints from a directory you trust — your own job's.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import random
import re
import struct
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from ._env import rank

log = logging.getLogger("shockslurm.train")

MAGIC = b"SHCKPT01"
_HEADER = struct.Struct(">8sQ32s")
HEADER_SIZE = _HEADER.size
FORMAT_VERSION = 1
_NAME_RE = re.compile(r"^ckpt-(\d{12})\.pt$")


class CorruptCheckpoint(Exception):
    """A checkpoint file failed validation (the message says why)."""


# --------------------------------------------------------------------------- file level

def encode(state: dict[str, Any]) -> bytes:
    """Header + payload bytes of one checkpoint."""
    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getvalue()
    return _HEADER.pack(MAGIC, len(payload), hashlib.sha256(payload).digest()) + payload


def decode(data: bytes, name: str = "<bytes>") -> dict[str, Any]:
    """The state in `data`; raises CorruptCheckpoint when anything does not check out."""
    if len(data) < HEADER_SIZE:
        raise CorruptCheckpoint(f"{name}: truncated header ({len(data)} bytes)")
    magic, length, digest = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise CorruptCheckpoint(f"{name}: bad magic {magic!r}")
    payload = memoryview(data)[HEADER_SIZE:]
    if len(payload) != length:
        raise CorruptCheckpoint(f"{name}: payload is {len(payload)} bytes, header says {length}"
                                " (truncated or torn)")
    if hashlib.sha256(payload).digest() != digest:
        raise CorruptCheckpoint(f"{name}: sha256 mismatch (corrupt)")
    try:
        state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=False)
    except Exception as exc:  # checksum matched but the pickle is bad: written by a bad writer
        raise CorruptCheckpoint(f"{name}: payload does not load: {exc}") from None
    if not isinstance(state, dict):
        raise CorruptCheckpoint(f"{name}: payload is a {type(state).__name__}, not a dict")
    return state


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - some filesystems refuse fsync on directories
        pass
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that a crash leaves either the old file or the whole new one."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(path.parent)


class CheckpointManager:
    """Rotated checkpoints in one directory.

    `is_writer` decides who writes; by default the process of global rank 0 (torch.distributed,
    else RANK / SLURM_PROCID). Every rank can read.
    """

    def __init__(self, directory: str | os.PathLike[str], *, keep: int = 3,
                 is_writer: bool | Callable[[], bool] | None = None) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.directory = Path(directory)
        self.keep = keep
        self._is_writer = is_writer

    @property
    def is_writer(self) -> bool:
        if self._is_writer is None:
            return rank() == 0
        if callable(self._is_writer):
            return bool(self._is_writer())
        return bool(self._is_writer)

    def path_for(self, step: int) -> Path:
        return self.directory / f"ckpt-{int(step):012d}.pt"

    def checkpoints(self) -> list[tuple[int, Path]]:
        """(step, path) of every checkpoint file, oldest first."""
        if not self.directory.is_dir():
            return []
        found = []
        for entry in os.scandir(self.directory):
            m = _NAME_RE.match(entry.name)
            if m and entry.is_file():
                found.append((int(m.group(1)), Path(entry.path)))
        return sorted(found)

    def save(self, state: dict[str, Any], step: int) -> Path | None:
        """Write one checkpoint (only on the writer; others return None at once)."""
        if not self.is_writer:
            return None
        self.directory.mkdir(parents=True, exist_ok=True)
        self._sweep_tmp()
        path = self.path_for(step)
        atomic_write(path, encode(state))
        self._rotate()
        return path

    def load_latest(self) -> tuple[Path, dict[str, Any]] | None:
        """The newest checkpoint that validates, or None; bad ones are logged and skipped."""
        for step, path in reversed(self.checkpoints()):
            try:
                return path, decode(path.read_bytes(), str(path))
            except CorruptCheckpoint as exc:
                log.warning("shockslurm.train: skipping bad checkpoint %s: %s", path, exc)
            except OSError as exc:
                log.warning("shockslurm.train: cannot read checkpoint %s: %s", path, exc)
        return None

    def _rotate(self) -> None:
        files = self.checkpoints()
        for _, old in files[:-self.keep]:
            try:
                old.unlink()
            except OSError as exc:  # pragma: no cover
                log.warning("shockslurm.train: could not delete old checkpoint %s: %s", old, exc)

    def _sweep_tmp(self) -> None:
        """Temporary files left by a writer that died mid-write (only the writer writes here)."""
        for entry in os.scandir(self.directory):
            if entry.name.startswith(".ckpt-") and entry.name.endswith(".tmp"):
                try:
                    os.unlink(entry.path)
                except OSError:
                    pass


# --------------------------------------------------------------------------- state level

def rng_state() -> dict[str, Any]:
    """Every RNG stream a training loop commonly touches."""
    state: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(),
                             "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
        else:
            log.warning("shockslurm.train: checkpoint has CUDA RNG states for %d devices, this "
                        "process sees %d; CUDA RNG not restored", len(cuda),
                        torch.cuda.device_count())


def capture(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, *,
            scheduler: Any = None, scaler: Any = None, data: dict[str, Any] | None = None,
            batch_size: int | None = None, step: int = 0,
            extras: dict[str, Any] | None = None) -> dict[str, Any]:
    """A checkpoint dict: model, optimizer, scheduler, GradScaler, RNG, data position, extras."""
    return {
        "format": FORMAT_VERSION,
        "step": int(step),
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "scaler": scaler.state_dict() if scaler is not None else None,
        "rng": rng_state(),
        "data": dict(data or {}),
        "batch_size": batch_size,
        "extras": dict(extras or {}),
    }


def restore(state: dict[str, Any], model: torch.nn.Module,
            optimizer: torch.optim.Optimizer | None = None, *, scheduler: Any = None,
            scaler: Any = None, rng: bool = True, rng_rank: int = 0,
            world_size: int = 1) -> None:
    """Load a `capture()` dict back into live objects (RNG last, so nothing consumes it after).

    A checkpoint of a multi-rank run holds every rank's RNG states (`rng_ranks`); rank
    `rng_rank` takes its own when the world size is unchanged, else rank 0's (with a warning:
    the run continues, but not bit-identically)."""
    if state.get("format") != FORMAT_VERSION:
        raise CorruptCheckpoint(f"unknown checkpoint format {state.get('format')!r}")
    model.load_state_dict(state["model"])
    if optimizer is not None and state.get("optimizer") is not None:
        optimizer.load_state_dict(state["optimizer"])
    if scheduler is not None and state.get("scheduler") is not None:
        scheduler.load_state_dict(state["scheduler"])
    if scaler is not None and state.get("scaler") is not None:
        scaler.load_state_dict(state["scaler"])
    if rng:
        ranks = state.get("rng_ranks")
        if ranks and len(ranks) == world_size and 0 <= rng_rank < len(ranks):
            set_rng_state(ranks[rng_rank])
        else:
            if ranks or world_size > 1:
                log.warning("shockslurm.train: checkpoint has RNG states of %d rank(s), this run "
                            "has %d; every rank restores rank 0's", len(ranks or [1]),
                            world_size)
            set_rng_state(state["rng"])
