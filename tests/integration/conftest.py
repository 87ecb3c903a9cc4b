"""The real Slurm test cluster for integration tests (`@pytest.mark.slurm`).

The session fixture starts the project's cluster (`shockslurm/slurm/testcluster.sh`: Debian's
slurm-wlm 22.05, 4 nodes x 8 fake GPUs on 127.0.0.1, our job_submit.lua) unless a controller
already answers; a cluster that was running keeps its daemons but loses its jobs (an earlier
run's jobs would take this run's GPUs; the script needs root, so a run as another user keeps
them). It fails, never skips, when the cluster cannot be had: CI must exercise Slurm.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from .helpers import controller_up

SCRIPT = Path(__file__).resolve().parents[2] / "shockslurm" / "slurm" / "testcluster.sh"


@dataclass(frozen=True)
class SlurmTestCluster:
    nodes: int
    gpus_per_node: int

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


@pytest.fixture(scope="session")
def slurm_cluster() -> SlurmTestCluster:
    up = controller_up()
    command = "start" if not up else "clear" if os.geteuid() == 0 else ""
    result = subprocess.run(["bash", str(SCRIPT), command], capture_output=True, text=True,
                            timeout=600, env={**os.environ}) if command else None
    if result is not None and (result.returncode != 0 or not controller_up()):
        pytest.fail(f"could not {command} the Slurm test cluster ({SCRIPT} {command}):\n"
                    f"{result.stdout}\n{result.stderr}")
    info = subprocess.run(["sinfo", "-h", "-N", "-p", "gpu", "-o", "%N %G"], capture_output=True,
                          text=True, timeout=10).stdout.split("\n")
    rows = sorted({line.split()[0]: line for line in info if line.strip()}.values())
    gpus = [int(r.split("gpu:")[-1].split("(")[0]) for r in rows if "gpu:" in r]
    if not gpus:
        pytest.fail(f"the Slurm test cluster has no GPU nodes: {info}")
    return SlurmTestCluster(nodes=len(gpus), gpus_per_node=max(gpus))


@pytest.fixture(autouse=True)
def no_job_completing(request: pytest.FixtureRequest) -> None:
    """Before each Slurm test, wait (at most 60 s) until no job is COMPLETING: an earlier
    test's cancelled jobs hold their GPUs until their steps are gone, and a test observing the
    cluster at once found them taken (seen once in CI). Never fails the test itself."""
    if request.node.get_closest_marker("slurm") is None:
        return
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            out = subprocess.run(["squeue", "-h", "-t", "CG", "-o", "%i"], capture_output=True,
                                 text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return                     # no Slurm commands here, or no answer: nothing to wait
        if out.returncode != 0 or not out.stdout.strip():
            return
        time.sleep(0.5)
