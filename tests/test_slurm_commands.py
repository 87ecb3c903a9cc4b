"""What the CLI backend makes of Slurm commands that misbehave: output that is no UTF-8, a
command that cannot run. Each is a `SlurmError` or a read that goes on, never a traceback
out of the daemon's round, `status` or `shocksub --status`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from shockslurm.slurm.cli_backend import CliBackend
from shockslurm.slurm.types import SlurmError

from .slurm_samples import load


def _command(tmp_path: Path, name: str, body: bytes, mode: int = 0o755) -> Path:
    path = tmp_path / name
    path.write_bytes(body)
    path.chmod(mode)
    return path


def test_a_job_name_that_is_no_utf8_does_not_fail_the_read_of_every_job(tmp_path: Path):
    """squeue prints a job's name as its bytes: one named in Latin-1 made the whole read end in
    a UnicodeDecodeError (the daemon's round, `status`, `shocksub --status`). Now each such
    byte reads as U+FFFD, and every job is read."""
    sample = json.loads(load("squeue", "22.05"))
    sample["jobs"][0]["name"] = "MARKER"
    raw = json.dumps(sample).replace("MARKER", "r\\u00e9sum\\u00e9").encode()
    raw = raw.replace(b"r\\u00e9sum\\u00e9", b"r\xe9sum\xe9")          # Latin-1 bytes
    out = tmp_path / "out.json"
    out.write_bytes(raw)
    fake = _command(tmp_path, "squeue", f"#!/bin/sh\ncat {out}\n".encode())
    backend = CliBackend(env={"PATH": f"{tmp_path}:{os.environ['PATH']}"})
    result = backend.run([str(fake)])
    assert result.ok and "r\ufffdsum\ufffd" in result.stdout
    jobs = backend.jobs()
    assert len(jobs) == len(sample["jobs"]) and jobs[0].name == "r\ufffdsum\ufffd"


def test_a_slurm_command_that_cannot_run_is_a_slurm_error(tmp_path: Path):
    """Not executable, or no program: a PermissionError or OSError traceback; now the
    daemon's `SlurmError` (an outage it waits out), naming the command."""
    for name, body, mode, why in (("noexec", b"#!/bin/sh\n", 0o644, "Permission denied"),
                                  ("garbage", b"\x7fELF\x00\x01garbage", 0o755, "format")):
        path = _command(tmp_path, name, body, mode)
        with pytest.raises(SlurmError, match=f"cannot run .*{name}: .*{why}"):
            CliBackend().run([str(path)])
