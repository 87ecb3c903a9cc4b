"""Atomic, checksummed, rotated checkpoints of everything a training loop needs to resume exactly.

Files (per checkpoint, in the checkpoint directory):

    ckpt-<step:012d>.pt          torch.save() of a plain dict: tensors, numbers, strings, lists,
                                 dicts, so `torch.load(path, weights_only=True)` reads it
    ckpt-<step:012d>.pt.sha256   its sha256, in `sha256sum` format ("<hex>  <name>"):
                                 `sha256sum -c ckpt-000000000200.pt.sha256` checks it by hand

The dict (`capture`): "format" (2), "step", "model" (the state_dict of the model itself: a DDP,
DataParallel or torch.compile wrapper is unwrapped, so there is no `module.` prefix), "optimizer",
"scheduler", "scaler", "rng" (python, numpy as a tensor, torch, cuda), "data" (the data position),
"batch_size", "extras" (the user's own), and "rng_ranks" in a multi-rank run. So

    state = torch.load("ckpt/ckpt-000000000200.pt", weights_only=True)
    model.load_state_dict(state["model"])

Writing (rank 0 only): serialise to memory, write the sidecar, then the file, each to a temporary
file in the same directory, flushed, fsynced and `os.replace`d onto its name (then the directory
is fsynced); then all but the newest `keep` checkpoints are deleted. A crash at any moment leaves
the old set of checkpoints plus at most one new one that is either complete with its sidecar or
fails its check (plus perhaps a stale `.tmp` or an orphan sidecar, swept by the next save).
Reading (any rank): newest first; a file without its sidecar, with a wrong checksum, or that does
not load is logged as a warning naming it and the next older one is tried.

Extras that are not tensors / plain containers (your own classes) still save, but
`weights_only=True` refuses them; the helper then loads its own checkpoint as a full pickle (with
a warning), so only point it at a directory you trust: your own job's.

Older checkpoints (format 1: a `SHCKPT01` header with the checksum, then the pickle; `module.`
keys from DDP) are still read and restored.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import pickle
import random
import re
import struct
import tempfile
from pathlib import Path
from typing import Any, Callable, cast

import numpy as np
import torch

from ._env import rank

log = logging.getLogger("shockslurm.train")

FORMAT_VERSION = 2
FORMATS_READ = (1, 2)
SIDECAR_SUFFIX = ".sha256"
_NAME_RE = re.compile(r"^ckpt-(\d{12})\.pt$")
# format 1: header (magic, payload length, sha256) + pickle, in one file
LEGACY_MAGIC = b"SHCKPT01"
_LEGACY_HEADER = struct.Struct(">8sQ32s")


class CorruptCheckpoint(Exception):
    """A checkpoint file failed validation (the message says why)."""


# --------------------------------------------------------------------------- file level

def serialize(state: dict[str, Any]) -> bytes:
    """The bytes of one checkpoint file (`torch.save` of the dict)."""
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def sidecar_path(path: Path) -> Path:
    return path.with_name(path.name + SIDECAR_SUFFIX)


def sidecar_text(data: bytes, name: str) -> str:
    """The sidecar of a file named `name` holding `data` (`sha256sum` format)."""
    return f"{hashlib.sha256(data).hexdigest()}  {name}\n"


def _expected_digest(path: Path) -> str:
    sidecar = sidecar_path(path)
    try:
        text = sidecar.read_text(encoding="ascii")
    except FileNotFoundError:
        raise CorruptCheckpoint(f"{path}: no checksum file {sidecar.name} (the save that wrote it "
                                "did not finish)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CorruptCheckpoint(f"{path}: unreadable checksum file {sidecar.name}: {exc}") from None
    digest = text.split(maxsplit=1)[0] if text.strip() else ""
    if not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise CorruptCheckpoint(f"{path}: checksum file {sidecar.name} holds no sha256")
    return digest


def read_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The state in one checkpoint file, checked against its sidecar (format 1 files against
    their header); raises CorruptCheckpoint saying why when anything does not check out."""
    path = Path(path)
    data = path.read_bytes()
    if data[:len(LEGACY_MAGIC)] == LEGACY_MAGIC:
        return decode_legacy(data, str(path))
    if hashlib.sha256(data).hexdigest() != _expected_digest(path):
        raise CorruptCheckpoint(f"{path}: sha256 differs from {sidecar_path(path).name} "
                                "(corrupt, truncated or torn)")
    return _load(data, str(path))


def _load(payload: bytes | memoryview, name: str) -> dict[str, Any]:
    """torch.load of checked bytes: weights_only first, a full pickle for extras it refuses."""
    try:
        state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as refused:
        try:    # checksum matched: our own writer; extras beyond tensors and plain containers
            state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=False)
        except Exception as exc:  # the pickle is bad: written by a bad writer
            raise CorruptCheckpoint(f"{name}: payload does not load: {exc}") from None
        log.warning("shockslurm.train: %s holds objects torch.load(weights_only=True) refuses "
                    "(%s); loaded as a full pickle", name, str(refused).splitlines()[0])
    except Exception as exc:
        raise CorruptCheckpoint(f"{name}: payload does not load: {exc}") from None
    if not isinstance(state, dict):
        raise CorruptCheckpoint(f"{name}: payload is a {type(state).__name__}, not a dict")
    return state


def encode_legacy(state: dict[str, Any]) -> bytes:
    """A format 1 file (header + payload); only to test that old checkpoints still load."""
    payload = serialize(state)
    return _LEGACY_HEADER.pack(LEGACY_MAGIC, len(payload),
                               hashlib.sha256(payload).digest()) + payload


def decode_legacy(data: bytes, name: str = "<bytes>") -> dict[str, Any]:
    """The state in a format 1 file, checked against its header."""
    if len(data) < _LEGACY_HEADER.size:
        raise CorruptCheckpoint(f"{name}: truncated header ({len(data)} bytes)")
    magic, length, digest = _LEGACY_HEADER.unpack_from(data)
    if magic != LEGACY_MAGIC:
        raise CorruptCheckpoint(f"{name}: bad magic {magic!r}")
    payload = memoryview(data)[_LEGACY_HEADER.size:]
    if len(payload) != length:
        raise CorruptCheckpoint(f"{name}: payload is {len(payload)} bytes, header says {length}"
                                " (truncated or torn)")
    if hashlib.sha256(payload).digest() != digest:
        raise CorruptCheckpoint(f"{name}: sha256 mismatch (corrupt)")
    return _load(payload, name)


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A checkpoint's state, checked: `path` is a checkpoint file, or a checkpoint directory
    (its newest good checkpoint). Raises FileNotFoundError when there is none, CorruptCheckpoint
    when the file does not check out."""
    path = Path(path)
    if path.is_dir():
        found = CheckpointManager(path).load_latest()
        if found is None:
            raise FileNotFoundError(f"{path}: no good checkpoint (ckpt-*.pt) in this directory")
        return found[1]
    return read_checkpoint(path)


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
        self._sweep()
        path = self.path_for(step)
        data = serialize(state)
        atomic_write(sidecar_path(path), sidecar_text(data, path.name).encode("ascii"))
        atomic_write(path, data)
        self._rotate()
        return path

    def load_latest(self) -> tuple[Path, dict[str, Any]] | None:
        """The newest checkpoint that validates, or None; bad ones are logged and skipped."""
        for step, path in reversed(self.checkpoints()):
            try:
                return path, read_checkpoint(path)
            except CorruptCheckpoint as exc:
                log.warning("shockslurm.train: skipping bad checkpoint %s: %s", path, exc)
            except OSError as exc:
                log.warning("shockslurm.train: cannot read checkpoint %s: %s", path, exc)
        return None

    def _rotate(self) -> None:
        files = self.checkpoints()
        for _, old in files[:-self.keep]:
            try:
                old.unlink()                       # the file first: a sidecar alone is ignored
                sidecar_path(old).unlink(missing_ok=True)
            except OSError as exc:  # pragma: no cover
                log.warning("shockslurm.train: could not delete old checkpoint %s: %s", old, exc)

    def _sweep(self) -> None:
        """Temporary files and orphan sidecars left by a writer that died mid-save (only the
        writer writes here)."""
        for entry in os.scandir(self.directory):
            name = entry.name
            stale = name.startswith(".ckpt-") and name.endswith(".tmp")
            orphan = (name.endswith(SIDECAR_SUFFIX)
                      and _NAME_RE.match(name[:-len(SIDECAR_SUFFIX)]) is not None
                      and not os.path.exists(entry.path[:-len(SIDECAR_SUFFIX)]))
            if stale or orphan:
                try:
                    os.unlink(entry.path)
                except OSError:
                    pass


# --------------------------------------------------------------------------- state level

def _numpy_rng_state() -> dict[str, Any]:
    """numpy's global RNG state as a tensor and numbers (weights_only cannot load an ndarray)."""
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    return {"bit_generator": str(name), "keys": torch.from_numpy(np.asarray(keys).astype(np.int64)),
            "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}


def _set_numpy_rng_state(state: Any) -> None:
    if isinstance(state, dict):
        np.random.set_state((state["bit_generator"], state["keys"].numpy().astype(np.uint32),
                             state["pos"], state["has_gauss"], state["cached_gaussian"]))
    else:                                   # format 1: numpy's own tuple
        np.random.set_state(state)


def rng_state() -> dict[str, Any]:
    """Every RNG stream a training loop commonly touches."""
    state: dict[str, Any] = {"python": random.getstate(), "numpy": _numpy_rng_state(),
                             "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    python = state["python"]   # a tuple when pickled, a list after some round trips
    random.setstate((python[0], tuple(python[1]), python[2]))
    _set_numpy_rng_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
        else:
            log.warning("shockslurm.train: checkpoint has CUDA RNG states for %d devices, this "
                        "process sees %d; CUDA RNG not restored", len(cuda),
                        torch.cuda.device_count())


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside DistributedDataParallel / DataParallel / torch.compile wrappers, whose
    state_dict keys carry no `module.` / `_orig_mod.` prefix."""
    while True:
        if isinstance(model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
            model = cast(torch.nn.Module, model.module)
        elif type(model).__name__ == "OptimizedModule" and hasattr(model, "_orig_mod"):
            model = cast(torch.nn.Module, model._orig_mod)
        else:
            return model


def _model_state(state: dict[str, Any], model: torch.nn.Module) -> dict[str, Any]:
    """The checkpoint's model state for the unwrapped `model`: a format 1 checkpoint of a DDP
    model has `module.`-prefixed keys, stripped here."""
    saved = state["model"]
    prefix = "module."
    if saved and all(k.startswith(prefix) for k in saved) and not any(
            k.startswith(prefix) for k in model.state_dict()):
        return type(saved)((k[len(prefix):], v) for k, v in saved.items())
    return saved


def capture(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, *,
            scheduler: Any = None, scaler: Any = None, data: dict[str, Any] | None = None,
            batch_size: int | None = None, step: int = 0,
            extras: dict[str, Any] | None = None) -> dict[str, Any]:
    """A checkpoint dict: model (unwrapped), optimizer, scheduler, GradScaler, RNG, data
    position, extras."""
    return {
        "format": FORMAT_VERSION,
        "step": int(step),
        "model": unwrap(model).state_dict(),
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
    if state.get("format") not in FORMATS_READ:
        raise CorruptCheckpoint(f"unknown checkpoint format {state.get('format')!r} (this "
                                f"version reads formats {', '.join(map(str, FORMATS_READ))})")
    inner = unwrap(model)
    inner.load_state_dict(_model_state(state, inner))
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
