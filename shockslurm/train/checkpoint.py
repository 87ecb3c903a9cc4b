"""Atomic, checksummed, rotated checkpoints of everything a training loop needs to resume exactly.

Files (per checkpoint, in the checkpoint directory):

    ckpt-<step:012d>.pt          torch.save() of a plain dict: tensors, numbers, strings, lists,
                                 dicts, so `torch.load(path, weights_only=True)` reads it
    ckpt-<step:012d>.pt.sha256   its sha256, in `sha256sum` format ("<hex>  <name>"):
                                 `sha256sum -c ckpt-000000000200.pt.sha256` checks it by hand

The dict (`state.capture`): "format" (2), "step", "model" (the state_dict of the model itself: a
DDP, DataParallel or torch.compile wrapper is unwrapped, so there is no `module.` prefix),
"optimizer", "optimizer_type" (its class name; since 2026-12-02), "scheduler", "scaler", "rng"
(python, numpy as a tensor, torch, cuda), "data" (the
data position), "batch_size", "extras" (the user's own), and "rng_ranks" in a multi-rank run. So

    state = torch.load("ckpt/ckpt-000000000200.pt", weights_only=True)
    model.load_state_dict(state["model"])

Writing (rank 0 only): `torch.save` streams into a temporary file in the same directory, hashed
as it is written (one pass; no copy of the payload in memory), which is flushed and fsynced; then
the sidecar is written the same way and `os.replace`d onto its name, then the file (then the
directory is fsynced); then all but the newest `keep` checkpoints are deleted. A save of a step
already on disk (an epoch's end after a save on its last step) lists the old and the new
digest in the sidecar until the file is replaced, then the new alone. Checkpoints of later
steps than the one written are not this run's (an earlier run's in the directory, a bad newest
file skipped at resume): they are moved, each batch into a new folder of its own
(`superseded/<UTC time>-before-step-<N>/`, train/superseded.py), never rotated instead of the
new ones, and a resume no longer takes them. A crash at any
moment leaves the old set of checkpoints plus at most one new one that is either complete with
its sidecar or fails its check (plus perhaps a stale `.tmp` or an orphan sidecar, swept by the next save).
Reading (any rank): newest first; a file without its sidecar, with a wrong checksum, or that does
not load is logged as a warning naming it and the next older one is tried. The checksum is read
in chunks, then `torch.load(..., mmap=True)` maps the file (its pages are in the page cache from
the checksum pass), so a resume holds no second copy of the checkpoint in memory either. Measured
by `python -m shockslurm.train.restart_bench` (README "Training helper").

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
import re
import struct
import tempfile
from pathlib import Path
from typing import IO, Any, Callable, cast

import torch

from ..atomic import atomic_write
from ._env import rank
from .superseded import set_aside

log = logging.getLogger("shockslurm.train")

FORMAT_VERSION = 2
FORMATS_READ = (1, 2)
SIDECAR_SUFFIX = ".sha256"
CHECKPOINT_MODE = 0o600   # a job's weights are its owner's alone, on a shared file system too
_NAME_RE = re.compile(r"^ckpt-(\d{12})\.pt$")
_CHUNK = 8 << 20          # bytes read at a time for the checksum
# format 1: header (magic, payload length, sha256) + pickle, in one file
LEGACY_MAGIC = b"SHCKPT01"
_LEGACY_HEADER = struct.Struct(">8sQ32s")


class CorruptCheckpoint(Exception):
    """A checkpoint file failed validation (the message says why)."""


class CheckpointMismatch(RuntimeError):
    """A good checkpoint that does not fit the objects it is loaded into (another model's)."""


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
    return sha256sum_line(hashlib.sha256(data).hexdigest(), name)


def sha256sum_line(digest: str, name: str) -> str:
    """One line of `sha256sum`'s format (sidecars here, the sharded checkpoints' manifest)."""
    return f"{digest}  {name}\n"


class _HashingWriter:
    """A binary file for `torch.save` that hashes what passes through it into `fh`."""

    def __init__(self) -> None:
        self.fh: Any = None
        self.sha256 = hashlib.sha256()
        self.error: OSError | None = None   # torch.save reports a failed write as RuntimeError

    def write(self, data: Any) -> int:
        self.sha256.update(data)
        try:
            return int(self.fh.write(data))
        except OSError as exc:
            self.error = exc
            raise

    def flush(self) -> None:
        self.fh.flush()


def file_sha256(fh: Any, head: bytes = b"") -> str:
    """The sha256 of `head` and the rest of the open file `fh`, read in chunks."""
    digest = hashlib.sha256(head)
    while chunk := fh.read(_CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


def write_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """`torch.save(state)` to `path` with its sidecar, atomically (module docstring): the file
    is streamed to a temporary name and hashed on the way, the sidecar goes in place first, then
    the file is renamed onto `path`."""
    writer = _HashingWriter()

    def dump(fh: IO[bytes]) -> None:
        writer.fh = fh
        try:
            torch.save(state, cast(IO[bytes], writer))
        except RuntimeError:
            if writer.error is not None:    # e.g. ENOSPC, which torch words as "unexpected pos"
                raise writer.error from None
            raise

    def sidecar(digests: list[str]) -> None:
        text = "".join(sha256sum_line(d, path.name) for d in digests)
        atomic_write(sidecar_path(path), text.encode("ascii"), new_mode=CHECKPOINT_MODE)

    # A save of a step already on disk (the epoch's end after a save on its last step): the
    # sidecar lists both digests while the file is replaced, so a crash between the two renames
    # leaves a file that checks out, old or new, not the good old one with the new's checksum.
    previous = _listed_digests(path) if path.exists() else []
    atomic_write(path, dump, before_replace=lambda: sidecar([writer.sha256.hexdigest(),
                                                             *previous]),
                 new_mode=CHECKPOINT_MODE)
    if previous:
        sidecar([writer.sha256.hexdigest()])


def _listed_digests(path: Path) -> list[str]:
    """The digests `path`'s sidecar lists ([] when it cannot be read)."""
    try:
        return _expected_digests(path)
    except CorruptCheckpoint:
        return []


def _expected_digests(path: Path) -> list[str]:
    """The sha256 digests `path`'s sidecar lists, one per line (two only while a save of the
    same step replaces the file: `write_checkpoint`)."""
    sidecar = sidecar_path(path)
    try:
        text = sidecar.read_text(encoding="ascii")
    except FileNotFoundError:
        raise CorruptCheckpoint(f"{path}: no checksum file {sidecar.name} (the save that wrote it "
                                "did not finish)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CorruptCheckpoint(f"{path}: unreadable checksum file {sidecar.name}: {exc}") from None
    digests = [line.split(maxsplit=1)[0] for line in text.splitlines() if line.strip()]
    if not digests or not all(re.fullmatch(r"[0-9a-f]{64}", d) for d in digests):
        raise CorruptCheckpoint(f"{path}: checksum file {sidecar.name} holds no sha256")
    return digests


def read_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The state in one checkpoint file, checked against its sidecar (format 1 files against
    their header); raises CorruptCheckpoint saying why when anything does not check out."""
    path = Path(path)
    with open(path, "rb") as fh:
        head = fh.read(len(LEGACY_MAGIC))
        if head == LEGACY_MAGIC:
            return decode_legacy(head + fh.read(), str(path))
        expected = _expected_digests(path)
        if file_sha256(fh, head) not in expected:
            raise CorruptCheckpoint(f"{path}: sha256 differs from {sidecar_path(path).name} "
                                    "(corrupt, truncated or torn)")
    return load_checked(path, str(path))


def load_checked(payload: bytes | memoryview | Path, name: str) -> dict[str, Any]:
    """torch.load of checked bytes or a checked file (mapped, not read again; its checksum
    matched, so it is our own writer's): weights_only first, a full pickle for extras it
    refuses (with a warning). CorruptCheckpoint when it does not load or is no dict."""
    def load(weights_only: bool) -> Any:
        if isinstance(payload, Path):
            return torch.load(payload, map_location="cpu", weights_only=weights_only, mmap=True)
        return torch.load(io.BytesIO(payload), map_location="cpu", weights_only=weights_only)

    try:
        state = load(weights_only=True)
    except pickle.UnpicklingError as refused:
        try:    # checksum matched: our own writer; extras beyond tensors and plain containers
            state = load(weights_only=False)
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
    return load_checked(payload, name)


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


def rotate(directory: Path, checkpoints: list[tuple[int, Path]], step: int,
           keep: int) -> list[Path]:
    """After the checkpoint of `step` is written in `directory` (`checkpoints`: (step, path) of
    all, oldest first), the old ones to delete: all but the `keep` newest up to `step`. Those
    of later steps are not this run's (an earlier run's in the same directory, or a bad newest
    one skipped at resume): a resume would take them, and rotating by step would delete this
    run's instead, so they are moved to a new folder of their own under `superseded/` (kept,
    not deleted; a file with its sidecar: `superseded.set_aside`). `CheckpointManager` and the
    sharded manager both rotate so."""
    ahead = [(path, sidecar_path(path)) for s, path in checkpoints if s > step]
    if ahead:
        set_aside(directory, ahead, step)
    return [path for s, path in checkpoints if s <= step][:-keep]


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

    def check_writable(self) -> None:
        """Create the directory and a file in it (removed again); raise an OSError naming the
        directory when that fails, so a job that could never checkpoint stops before training."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, probe = tempfile.mkstemp(prefix=".ckpt-probe.", suffix=".tmp", dir=self.directory)
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            raise OSError(exc.errno, f"checkpoint directory {self.directory} is not writable: "
                          f"{exc.strerror or exc}") from None

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
        write_checkpoint(path, state)
        self._rotate(step)
        return path

    def load_latest(self, check: Callable[[dict[str, Any], str], None] | None = None
                    ) -> tuple[Path, dict[str, Any]] | None:
        """The newest checkpoint that validates, or None; bad ones are logged and skipped.
        `check(state, name)` may refuse a state by raising CorruptCheckpoint (`state.check_format`:
        a file that is not the trainer's)."""
        for step, path in reversed(self.checkpoints()):
            try:
                state = read_checkpoint(path)
                if check is not None:
                    check(state, str(path))
                return path, state
            except CorruptCheckpoint as exc:
                log.warning("shockslurm.train: skipping bad checkpoint %s: %s", path, exc)
            except OSError as exc:
                log.warning("shockslurm.train: cannot read checkpoint %s: %s", path, exc)
        return None

    def _rotate(self, step: int) -> None:
        for old in rotate(self.directory, self.checkpoints(), step, self.keep):
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
