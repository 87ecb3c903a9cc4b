"""What the rest of shockslurm knows about Slurm: version-independent records and the backend
protocol. Parsing of each Slurm version's output lives in `parse.py`; nothing outside `slurm/`
sees raw Slurm JSON.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Mapping, Protocol, Sequence

from ..errors import ShockslurmError

MANAGED_TAG = "shock:managed"
SPEC_PREFIX = "shock:spec="
TAG_BLANKS = " \t\r\n\v\f"      # what has_managed_tag strips: exactly Lua's %s


def has_managed_tag(comment: str) -> bool:
    """Whether a job's comment carries the managed tag: the rule the daemon and job_submit.lua
    share. The comment is split on ';', each part stripped of ASCII blanks at both ends
    (`TAG_BLANKS`: space, tab, CR, LF, VT, FF, i.e. Lua's `%s`), and one part must then equal
    `shock:managed` exactly. So `a;shock:managed` and `a; shock:managed ` are managed;
    `x shock:managed`, `shock:managed2`, `xshock:managed` and a tag on a second line of the same
    part (`x\nshock:managed`) are not."""
    return any(part.strip(TAG_BLANKS) == MANAGED_TAG for part in comment.split(";"))


class JobState(enum.Enum):
    """Slurm's base job states (the flags such as REQUEUED are kept separately)."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUSPENDED = "SUSPENDED"
    COMPLETING = "COMPLETING"
    COMPLETED = "COMPLETED"
    CANCELLED = "CANCELLED"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    NODE_FAIL = "NODE_FAIL"
    PREEMPTED = "PREEMPTED"
    BOOT_FAIL = "BOOT_FAIL"
    DEADLINE = "DEADLINE"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    UNKNOWN = "UNKNOWN"

    @property
    def finished(self) -> bool:
        return self in FINISHED_STATES

    @property
    def holds_gpus(self) -> bool:
        return self in (JobState.RUNNING, JobState.SUSPENDED, JobState.COMPLETING)


FINISHED_STATES = frozenset({JobState.COMPLETED, JobState.CANCELLED, JobState.FAILED,
                             JobState.TIMEOUT, JobState.NODE_FAIL, JobState.BOOT_FAIL,
                             JobState.DEADLINE, JobState.OUT_OF_MEMORY})


@dataclass(frozen=True)
class SlurmVersion:
    major: int
    minor: int
    micro: int = 0

    def __str__(self) -> str:
        return f"{self.major}.{self.minor:02d}.{self.micro}"

    @property
    def major_minor(self) -> tuple[int, int]:
        return (self.major, self.minor)


@dataclass(frozen=True)
class SlurmJob:
    """One job as the daemon needs it, whatever the Slurm version."""

    job_id: int
    name: str
    user: str
    partition: str
    state: JobState
    state_flags: frozenset[str]      # e.g. {"REQUEUED"} (23.02+ report them in job_state)
    reason: str                      # state_reason, e.g. "JobHeldUser", "BeginTime", "None"
    priority: int
    gpus_per_node: int               # from tres_per_node "gres:gpu:N" / "gres:gpu:type:N"
    gpus_per_job: int                # from tres_per_job "gres:gpu:N" (--gpus jobs), else 0
    nodes: int                       # node count (requested while pending, allocated after)
    node_list: str
    submit_time: float               # Unix seconds
    start_time: float | None         # Unix seconds, None when not started / unknown
    restart_count: int
    comment: str
    admin_comment: str = ""
    gres_detail: tuple[str, ...] = ()  # allocated gres, e.g. ("gpu:3(IDX:0-2)",); empty while pending
    end_time: float | None = None    # Unix seconds, for finished / COMPLETING jobs (else None)
    required_nodes: str = ""         # the job's required node list (ReqNodeList), "" = none
    raw: Mapping[str, object] = field(default_factory=dict, compare=False, repr=False)

    @property
    def managed(self) -> bool:
        return has_managed_tag(self.comment)

    @property
    def held(self) -> bool:
        return self.state is JobState.PENDING and self.priority == 0

    @property
    def gpus(self) -> int:
        """GPUs the job holds or asks for in total."""
        return self.gpus_per_job or self.gpus_per_node * max(1, self.nodes)


@dataclass(frozen=True)
class SlurmNode:
    name: str
    state: str                       # e.g. "idle", "mixed", "allocated", "drained"
    gpus: int                        # configured gres gpu count
    gpus_used: int
    partitions: tuple[str, ...]

    @property
    def usable(self) -> bool:
        bad = ("down", "drain", "fail", "inval", "unknown", "not_responding")
        return not any(b in self.state.lower() for b in bad)


@dataclass(frozen=True)
class CommandResult:
    """The outcome of one Slurm command (argv list, never a shell string)."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0


class SlurmError(ShockslurmError):
    """A Slurm command could not be run, timed out, or a read failed; carries argv and stderr."""

    def __init__(self, message: str, *, argv: Sequence[str] = (), returncode: int | None = None,
                 stderr: str = "") -> None:
        self.argv = tuple(argv)
        self.returncode = returncode
        self.stderr = stderr
        detail = f" (rc={returncode})" if returncode is not None else ""
        tail = f": {stderr.strip()}" if stderr.strip() else ""
        super().__init__(f"{message}{detail}{tail}")


class SlurmBackend(Protocol):
    """Reads and actions the daemon needs; the CLI backend is primary, pyslurm optional."""

    name: str

    def version(self) -> SlurmVersion: ...

    def jobs(self) -> list[SlurmJob]:
        """Every job slurmctld knows (one read: `squeue --json`; filter in Python)."""

    def nodes(self) -> list[SlurmNode]:
        """Every node (one read: `sinfo --json`)."""

    def run(self, argv: Sequence[str]) -> CommandResult:
        """Run one action command (scontrol/scancel), capturing return code and stderr."""
