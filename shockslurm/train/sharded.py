"""Sharded checkpoints (FSDP) through `torch.distributed.checkpoint` (DCP): each rank writes its
own shards, nothing is gathered whole on one rank.

Layout (per checkpoint, in the checkpoint directory):

    dcp-<step:012d>/             DCP's files (`.metadata`, `__<rank>_0.distcp`, ...)
    dcp-<step:012d>/rng.pt       every rank's RNG states and `extras` (written by rank 0)
    dcp-<step:012d>/MANIFEST.sha256   every other file's sha256, `sha256sum -c` format

Writing (`save`, collective: every rank calls it): DCP writes into a dot-named temporary
directory; rank 0 then checksums every file into the manifest (written last, fsynced), fsyncs the
files and renames the directory onto its name, so a checkpoint directory either is whole with its
manifest or does not exist (a checkpoint of the same step already there is renamed aside first and
removed after, `_swap_in`, never deleted before its replacement is in place); then all but the newest `keep` are deleted (`checkpoint.rotate`:
those of later steps than the one written go to a new folder of their own under `superseded/`,
train/superseded.py). Reading (`load_latest`,
collective): rank 0 checks the newest directories' manifests (a missing, wrong or incomplete one
is logged and the next older one tried) and tells every rank which one to load; each rank loads
its shards (`dcp.load`) and puts them into the live model and optimizer (`set_state_dict`).

What is saved: the model and optimizer states (`get_state_dict`: FSDP/DTensor sharded, or plain),
every rank's RNG states, and `extras` (plain values). The directory must be on a file system every
rank sees (the job's shared checkpoint directory).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..atomic import atomic_write, fsync_dir
from .collective import done_alone, gathered
from .checkpoint import file_sha256, load_checked, rotate, sha256sum_line
from .state import Optimizers, each, rng_state, set_rng_state

log = logging.getLogger("shockslurm.train")

MANIFEST = "MANIFEST.sha256"
RANK0_FILE = "rng.pt"       # rank 0's own: every rank's RNG states and the extras
_NAME_RE = re.compile(r"^dcp-(\d{12})$")
_ASIDE_RE = re.compile(r"^\.(dcp-\d{12})\.old$")      # a same-step save's predecessor


def sharded_model(model: torch.nn.Module) -> bool:
    """Whether `model`'s parameters are sharded over the ranks (FSDP2's `fully_shard` or
    tensor parallelism: DTensor parameters; FSDP1's `FullyShardedDataParallel`): no rank holds
    it whole, so it is checkpointed through DCP (`ShockTrainer` does so by itself)."""
    if not dist.is_available():             # a torch built without torch.distributed
        return False
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.tensor import DTensor

    return (any(isinstance(p, DTensor) for p in model.parameters())
            or any(isinstance(m, FullyShardedDataParallel) for m in model.modules()))


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _digest(path: Path) -> str:
    with open(path, "rb") as fh:
        digest = file_sha256(fh)
        os.fsync(fh.fileno())
    return digest


def write_manifest(directory: Path) -> None:
    """Checksum every file of a DCP directory into its manifest (written last)."""
    files = sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST)
    text = "".join(sha256sum_line(_digest(p), str(p.relative_to(directory))) for p in files)
    atomic_write(directory / MANIFEST, text.encode("utf-8"))


def check_manifest(directory: Path) -> str | None:
    """None when every file the manifest names is there with its checksum, else why not."""
    try:
        lines = (directory / MANIFEST).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return "no manifest (the save that wrote it did not finish)"
    except (OSError, UnicodeDecodeError) as exc:
        return f"unreadable manifest: {exc}"
    if not lines:
        return "empty manifest"
    for line in lines:
        digest, _, name = line.partition("  ")
        if not name or Path(name).is_absolute() or ".." in Path(name).parts:
            return f"manifest line {line[:80]!r} names no file of this checkpoint"
        path = directory / name
        if not path.is_file():
            return f"{name} is missing"
        try:
            if _digest(path) != digest:
                return f"{name}: sha256 differs from the manifest (corrupt or torn)"
        except OSError as exc:
            return f"{name} cannot be read: {exc}"
    return None


class ShardedCheckpointManager:
    """Rotated DCP checkpoints of a (possibly FSDP-sharded) model and its optimizer."""

    def __init__(self, directory: str | os.PathLike[str], *, keep: int = 3) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.directory = Path(directory)
        self.keep = keep
        self.extras: dict[str, Any] = {}

    def path_for(self, step: int) -> Path:
        return self.directory / f"dcp-{int(step):012d}"

    def checkpoints(self) -> list[tuple[int, Path]]:
        """(step, directory) of every checkpoint, oldest first."""
        if not self.directory.is_dir():
            return []
        return sorted((int(m.group(1)), self.directory / e.name)
                      for e in os.scandir(self.directory)
                      if (m := _NAME_RE.match(e.name)) and e.is_dir())

    def save(self, model: torch.nn.Module, optimizer: Optimizers | None, step: int,
             extras: dict[str, Any] | None = None) -> Path:
        """Checkpoint (collective); returns the checkpoint's directory. Rank 0 checksums every
        rank's files while the others wait for its word, which fails after the process group's
        timeout (NCCL's default: 10 minutes): a large checkpoint needs a longer one. Should rank 0
        fail there, it raises its error and every other rank `collective.RankFailed` at once."""
        import torch.distributed.checkpoint as dcp

        final = self.path_for(step)
        tmp = self.directory / f".dcp-{int(step):012d}.tmp"
        done_alone(lambda: self._prepare(tmp), _rank() == 0)
        state = _state(model, optimizer)
        state["meta"] = {"step": int(step)}
        dcp.save(state, checkpoint_id=str(tmp))
        rngs = gathered(rng_state())
        _barrier()
        done_alone(lambda: self._finish(tmp, final, step, rngs, extras), _rank() == 0)
        return final

    def _prepare(self, tmp: Path) -> None:
        """Rank 0, before a save: the directory there, no torn temporary left in the way."""
        self.directory.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        _recover_replaced(self.directory)

    def _finish(self, tmp: Path, final: Path, step: int, rngs: list[Any],
                extras: dict[str, Any] | None) -> None:
        """Rank 0, after every rank's shards are written: the RNG file, the manifest, the
        rename into place and the rotation."""
        torch.save({"rng_ranks": rngs, "extras": dict(extras or {})}, tmp / RANK0_FILE)
        write_manifest(tmp)
        _swap_in(tmp, final)
        for old in rotate(self.directory, self.checkpoints(), step, self.keep):
            shutil.rmtree(old, ignore_errors=True)

    def _choose(self) -> Path | None:
        """Rank 0: the newest checkpoint whose manifest checks out."""
        if self.directory.is_dir():
            _recover_replaced(self.directory)
        for _, path in reversed(self.checkpoints()):
            problem = check_manifest(path)
            if problem is None:
                return path
            log.warning("shockslurm.train: skipping bad sharded checkpoint %s: %s", path, problem)
        return None

    def load_latest(self, model: torch.nn.Module,
                    optimizer: Optimizers | None = None) -> tuple[Path, int] | None:
        """Load the newest good checkpoint into `model` / `optimizer` (collective); returns its
        directory and step, or None when there is none."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        chosen = done_alone(lambda: _text(self._choose()), _rank() == 0, from_rank=0)
        if chosen is None:
            return None
        path = Path(chosen)
        state = _state(model, optimizer)
        state["meta"] = {"step": 0}
        dcp.load(state, checkpoint_id=str(path))
        set_state_dict(model, each(optimizer),
                       model_state_dict=state["model"],
                       optim_state_dict=state.get("optim", {}))
        rank0 = load_checked(path / RANK0_FILE, str(path / RANK0_FILE))   # (in the manifest)
        # DCP restores only the keys its template names, so the extras travel in rank 0's file
        self.extras = dict(rank0.get("extras") or {})
        rngs = rank0["rng_ranks"]
        if len(rngs) > _rank():
            set_rng_state(rngs[_rank()])
        return path, int(state["meta"]["step"])


def _text(path: Path | None) -> str | None:
    return None if path is None else str(path)


def _swap_in(tmp: Path, final: Path) -> None:
    """Rename the written `tmp` onto `final`. A checkpoint of the same step already there is
    first renamed aside (`.dcp-<step>.old`, removed once the new one is in place), never
    deleted before: a kill between the renames leaves it aside, whole, and the next save or
    load puts it back (`_recover_replaced`), so that step always has a checkpoint."""
    aside = _aside(final)
    if final.exists():
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(final, aside)
    os.replace(tmp, final)
    fsync_dir(final.parent)
    shutil.rmtree(aside, ignore_errors=True)


def _aside(final: Path) -> Path:
    return final.with_name(f".{final.name}.old")


def _recover_replaced(directory: Path) -> None:
    """Put back each checkpoint a save renamed aside and never replaced (killed between its
    two renames); drop those whose replacement is in place."""
    for entry in os.scandir(directory):
        m = _ASIDE_RE.match(entry.name)
        if m is None or not entry.is_dir():
            continue
        final = directory / m.group(1)
        if final.exists():
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            os.replace(entry.path, final)
            fsync_dir(directory)
            log.warning("shockslurm.train: restored checkpoint %s, set aside by a save that "
                        "did not finish", final)


def _state(model: torch.nn.Module, optimizer: Optimizers | None) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, each(optimizer))
    state: dict[str, Any] = {"model": model_sd}
    if optimizer is not None:
        state["optim"] = optim_sd
    return state

