"""The primary backend: Slurm's own command-line tools, argv lists only, never a shell.

Reads are exactly one command each (`squeue --json`, `sinfo -N --json`) because a round must
stay cheap (312 jobs: 48 ms on 22.05) and because 22.05's `squeue --json` ignores its filters
anyway. Every call is counted in `calls` so tests and benchmarks can assert "2 reads per
round". Actions go through `run`, which never raises for a non-zero exit: the caller decides,
with the return code and stderr in hand (Slurm prints its reasons only on stderr).
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from collections import Counter
from typing import Mapping, Sequence

from .parse import parse_scontrol_line, parse_sinfo, parse_squeue
from .quirks import SQUEUE_ALL_STATES_24_11
from .types import CommandResult, SlurmError, SlurmJob, SlurmNode, SlurmVersion
from .version import detect_version

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 30.0


class CliBackend:
    """`SlurmBackend` over squeue/sinfo/scontrol/scancel."""

    name = "cli"

    def __init__(self, *, timeout: float = DEFAULT_TIMEOUT_S,
                 env: Mapping[str, str] | None = None) -> None:
        self.timeout = timeout
        self.env = dict(env) if env is not None else None
        self.calls: Counter[str] = Counter()
        self._version: SlurmVersion | None = None

    # --- the one place that executes -----------------------------------------------------
    def run(self, argv: Sequence[str], *, timeout: float | None = None) -> CommandResult:
        """Run one command; a missing binary or a timeout raises `SlurmError`, a non-zero
        exit is returned as `CommandResult(ok=False)` with stderr captured."""
        argv = tuple(str(a) for a in argv)
        if not argv:
            raise SlurmError("empty command")
        self.calls[os.path.basename(argv[0])] += 1
        limit = self.timeout if timeout is None else timeout
        env = None if self.env is None else {**os.environ, **self.env}
        start = time.monotonic()
        try:
            # a session of its own: a stop signalled to the daemon's whole group (Ctrl-C,
            # `systemctl stop`) must not kill the round's command under way with the daemon
            proc = subprocess.run(list(argv), capture_output=True, timeout=limit,
                                  env=env, check=False, shell=False, start_new_session=True)
        except FileNotFoundError as exc:
            raise SlurmError(f"Slurm command not found: {argv[0]} (is Slurm installed and on "
                             f"PATH?)", argv=argv) from exc
        except subprocess.TimeoutExpired as exc:
            raise SlurmError(f"{' '.join(argv)} timed out after {limit:g} s", argv=argv,
                             stderr=_text(exc.stderr)) from exc
        except OSError as exc:              # not executable, not a program, ...
            raise SlurmError(f"cannot run {argv[0]}: {exc.strerror or exc}", argv=argv) from exc
        result = CommandResult(argv, proc.returncode, _text(proc.stdout), _text(proc.stderr),
                               time.monotonic() - start)
        if not result.ok:
            log.info("%s -> rc=%d: %s", " ".join(argv), result.returncode,
                     result.stderr.strip())
        return result

    def _read(self, argv: Sequence[str]) -> CommandResult:
        res = self.run(argv)
        if not res.ok:
            raise SlurmError(f"{' '.join(res.argv)} failed", argv=res.argv,
                             returncode=res.returncode, stderr=res.stderr)
        return res

    # --- reads ----------------------------------------------------------------------------
    def version(self) -> SlurmVersion:
        """`sinfo -V`, once per backend."""
        if self._version is None:
            self._version = detect_version(self._read)
        return self._version

    def jobs(self) -> list[SlurmJob]:
        """Every job slurmctld knows, finished ones included, from one `squeue --json` (filter in
        Python; 24.11+ would leave finished jobs out without `--states=all`)."""
        argv = ["squeue", "--json", *SQUEUE_ALL_STATES_24_11]
        return parse_squeue(self._read(argv).stdout)

    def active_job_states(self, partitions: Sequence[str]) -> frozenset[tuple[str, str]]:
        """(job id, state) of the pending, running and completing jobs of `partitions`: one
        `squeue -h -p ... -o '%i %T'`, the between-rounds poll's change check. Text output
        honours the filters that `--json` ignores on 22.05, and costs about a seventh of it
        (312 jobs: 7 ms against 48 ms, ../shared/slurm/NOTES.md)."""
        argv = ["squeue", "--noheader", f"--partition={','.join(partitions)}",
                "--format=%i %T"]
        lines = self._read(argv).stdout.splitlines()
        return frozenset(tuple(line.split(None, 1)) for line in lines  # type: ignore[misc]
                         if len(line.split(None, 1)) == 2)

    def nodes(self) -> list[SlurmNode]:
        """Every node, from one `sinfo -N --json` (-N: one record per node and partition in
        23.02+; 22.05 lists nodes either way)."""
        return parse_sinfo(self._read(["sinfo", "-N", "--json"]).stdout)

    def show_job(self, job_id: int) -> dict[str, str]:
        """`scontrol -o -d show job ID` as {key: value}: the fallback for fields squeue's JSON
        lacks (22.05 has no `scontrol --json`; -d adds JOB_GRES= and GRES=gpu:2(IDX:0-1))."""
        res = self._read(["scontrol", "-o", "-d", "show", "job", str(int(job_id))])
        for line in res.stdout.splitlines():
            fields = parse_scontrol_line(line)
            if fields.get("JobId") == str(job_id):
                return fields
        raise SlurmError(f"scontrol show job {job_id}: job not in output", argv=res.argv,
                         stderr=res.stderr)


def _text(output: bytes | str | None) -> str:
    """A command's output as text: bytes that are no UTF-8 (a job name in Latin-1) each
    replaced by U+FFFD, so that one job's name cannot make the whole read fail."""
    if isinstance(output, bytes):
        return output.decode("utf-8", errors="replace")
    return output or ""
