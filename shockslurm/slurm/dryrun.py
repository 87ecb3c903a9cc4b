"""`--dry-run`: real reads, printed actions.

Why a backend wrapper and not a flag in the cluster: the round loop, the diff and the journal run
unchanged, so a dry run shows exactly the argv lists a real round would send, computed from the
real cluster state, while Slurm is never changed.
"""

from __future__ import annotations

import shlex
from collections import Counter
from typing import Callable, Sequence

from .types import CommandResult, SlurmBackend, SlurmJob, SlurmNode, SlurmVersion


class DryRunBackend:
    """Delegates reads to `inner`; `run` prints (or passes to `echo`) the argv and returns ok."""

    changes_slurm = False
    """What `run` sends changes nothing (`SlurmActions` waits for no stopped job to exit)."""

    def __init__(self, inner: SlurmBackend, echo: Callable[[str], None] | None = print) -> None:
        self.inner = inner
        self.name = f"dry-run({getattr(inner, 'name', 'backend')})"
        self.echo = echo
        self.actions: list[tuple[str, ...]] = []
        self.calls: Counter[str] = Counter()

    def version(self) -> SlurmVersion:
        return self.inner.version()

    def jobs(self) -> list[SlurmJob]:
        self.calls["jobs"] += 1
        return self.inner.jobs()

    def active_job_states(self, partitions: Sequence[str]) -> frozenset[tuple[str, str]] | None:
        """The wrapped backend's cheap change check (`CliBackend.active_job_states`); None when
        it has none (pyslurm): the poll then reads the queue in full once, not twice."""
        self.calls["active_job_states"] += 1
        read = getattr(self.inner, "active_job_states", None)
        return None if read is None else frozenset(read(partitions))

    def nodes(self) -> list[SlurmNode]:
        self.calls["nodes"] += 1
        return self.inner.nodes()

    def run(self, argv: Sequence[str]) -> CommandResult:
        argv = tuple(str(a) for a in argv)
        self.calls["run"] += 1
        self.actions.append(argv)
        if self.echo is not None:
            self.echo("dry-run: " + shlex.join(argv))
        return CommandResult(argv, 0, "", "", 0.0)
