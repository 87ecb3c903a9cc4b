"""The Slurm JSON samples of tests/data/slurm (its README says how each was made)."""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).parent / "data" / "slurm"
# Recorded from a live test cluster: 22.05 on the host (Debian 12), 24.11 and 26.05 in a Debian
# 13 / sid root (docker/versions.sh VERSION --record).
RECORDED = ["22.05", "24.11", "26.05"]
# Reconstructed from SchedMD's data_parser sources: versions no Debian release here ships.
RECONSTRUCTED = ["23.02", "23.11", "24.05", "25.11"]
VERSIONS = sorted(RECORDED + RECONSTRUCTED)


def load(kind: str, ver: str, ext: str = "json") -> str:
    """`kind` is squeue, sinfo, sinfo-N (recorded only) or scontrol (recorded 24.11+ only)."""
    return (DATA / f"{kind}-{ver}.{ext}").read_text()
