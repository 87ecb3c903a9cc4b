"""Slurm version detection, in ONE place.

Sources: `sinfo -V` ("slurm-wlm 22.05.8" on Debian, "slurm 23.11.4" upstream) and the `meta`
block of any `--json` output. 22.05 (v0.0.38) writes `meta.Slurm.version` with int fields;
23.11+ (v0.0.40+) write `meta.slurm.version` (lower-case key) with the numbers as STRINGS
("major": "25", "minor": "11"), so both spellings and both types are accepted.
"""

from __future__ import annotations

import re
from typing import Callable, Mapping, Sequence

from ..errors import InputError
from .types import CommandResult, SlurmError, SlurmVersion

_VERSION_RE = re.compile(r"(?:^|\s|-)(\d{2,})\.(\d{1,2})(?:\.(\d+))?")


def parse_version_text(text: str) -> SlurmVersion:
    """Parse `sinfo -V` output or a release string such as "22.05.8" / "23.11.4-1"."""
    m = _VERSION_RE.search(text.strip())
    if not m:
        raise InputError(f"cannot find a Slurm version in {text.strip()!r}", source="sinfo -V")
    try:
        return SlurmVersion(int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))
    except ValueError:  # a number over Python's 4300-digit limit
        raise InputError(f"unreadable Slurm version in {text.strip()[:80]!r}",
                         source="sinfo -V") from None


def version_from_meta(meta: Mapping[str, object]) -> SlurmVersion:
    """The Slurm version from the `meta` object of squeue/sinfo/scontrol JSON (any version)."""
    block = meta.get("Slurm") or meta.get("slurm")
    if not isinstance(block, Mapping):
        raise InputError("no Slurm/slurm block in JSON meta", field="meta.Slurm")
    ver = block.get("version")
    if isinstance(ver, Mapping):
        try:
            return SlurmVersion(int(ver["major"]), int(ver["minor"]),
                                int(ver.get("micro") or 0))
        except (KeyError, TypeError, ValueError, OverflowError):  # OverflowError: int(inf)
            pass
    release = block.get("release")
    if isinstance(release, str):
        return parse_version_text(release)
    raise InputError(f"unreadable Slurm version {ver!r}", field="meta.Slurm.version")


def detect_version(runner: Callable[[Sequence[str]], CommandResult]) -> SlurmVersion:
    """Run `sinfo -V` through `runner` (e.g. `CliBackend.run`) and parse it."""
    res = runner(["sinfo", "-V"])
    if not res.ok:
        raise SlurmError("sinfo -V failed", argv=res.argv, returncode=res.returncode,
                         stderr=res.stderr)
    return parse_version_text(res.stdout)
