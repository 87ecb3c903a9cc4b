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
ADMIN_HOLD_REASON = "JobHeldAdmin"  # squeue's state_reason of an operator's `scontrol hold`
USER_HOLD_REASON = "JobHeldUser"    # of `scontrol uhold`, the plugin's submit hold, `--hold`
# job_submit.lua records a user's own required node list (`sbatch -w`) in the admin comment,
# which users cannot change: the daemon's pins (ReqNodeList) would otherwise hide it.
USER_NODES_KEY = "shock:nodes="


def has_managed_tag(comment: str) -> bool:
    """Whether a job's comment carries the managed tag: the rule the daemon and job_submit.lua
    share. The comment is split on ';', each part stripped of ASCII blanks at both ends
    (`TAG_BLANKS`: space, tab, CR, LF, VT, FF, i.e. Lua's `%s`), and one part must then equal
    `shock:managed` exactly. So `a;shock:managed` and `a; shock:managed ` are managed;
    `x shock:managed`, `shock:managed2`, `xshock:managed` and a tag on a second line of the same
    part (`x\nshock:managed`) are not."""
    return any(part.strip(TAG_BLANKS) == MANAGED_TAG for part in comment.split(";"))


def tagged_value(comment: str, prefix: str) -> str | None:
    """The text after `prefix` in the first `;`-separated part of `comment` that starts with it
    (`shock:spec=`, `shock:nodes=`), None when no part does."""
    for part in comment.split(";"):
        if part.startswith(prefix):
            return part[len(prefix):]
    return None


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


# Slurm's IS_JOB_FINISHED: every base state after SUSPENDED, PREEMPTED included (a job preempted
# with PreemptMode=CANCEL ends PREEMPTED; one requeued by preemption shows PENDING instead).
FINISHED_STATES = frozenset({JobState.COMPLETED, JobState.CANCELLED, JobState.FAILED,
                             JobState.TIMEOUT, JobState.NODE_FAIL, JobState.PREEMPTED,
                             JobState.BOOT_FAIL, JobState.DEADLINE, JobState.OUT_OF_MEMORY})


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
    array_job_id: int = 0            # the array's id for a job array's record, else 0
    het_job_id: int = 0              # the leader's id for a heterogeneous job's component, else 0
    unreadable: str = ""             # a field Slurm gave in a form we cannot read (GPU request)
    excluded_nodes: str = ""         # the user's --exclude, "" = none
    features: str = ""               # the user's --constraint, "" = none
    gpu_types: frozenset[str] = frozenset()   # GPU types asked for (--gres=gpu:a100:2), none = any
    max_nodes: int = 0               # a node range's maximum (-N 2-3: 3); 0 = none or unknown
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

    @property
    def node_range(self) -> bool:
        """Whether the job asks for a range of nodes (`-N 2-3`): Slurm gives it as many as it
        finds free (verified on 22.05: pinned to two nodes and released, such a job ran on
        three), so its GPUs are not known until it starts."""
        return self.max_nodes > max(1, self.nodes)

    @property
    def node_parts(self) -> int:
        """The nodes its GPUs come in equal parts on: its node count for a job that asks for
        GPUs per node (`-N 2 --gres=gpu:4`: 4 on each of 2 nodes), 1 for a one-node job and a
        `--gpus` job (Slurm spreads those as it finds room)."""
        return max(1, self.nodes) if self.gpus_per_node > 0 and not self.gpus_per_job else 1

    @property
    def holds_gpus(self) -> bool:
        """Whether the job holds its GPUs now: RUNNING, SUSPENDED or COMPLETING, or in a state
        this version does not know (UNKNOWN) with nodes allocated (a future Slurm's state of a
        running job must not make its GPUs look free)."""
        return self.state.holds_gpus or (self.state is JobState.UNKNOWN and bool(self.node_list))

    @property
    def user_nodes(self) -> str:
        """The node list the user asked for at submission (`sbatch -w`), as job_submit.lua
        recorded it (`USER_NODES_KEY` in the admin comment), or ""."""
        return tagged_value(self.admin_comment, USER_NODES_KEY) or ""

    @property
    def admin_held(self) -> bool:
        """Held (priority 0) by an administrator (`scontrol hold`: Reason=JobHeldAdmin, also on a
        running job), or by Slurm after a special exit (RequeueExitHold: SPECIAL_EXIT). The
        daemon's own holds are user holds (`scontrol uhold`, the plugin's submit hold,
        `requeuehold`: JobHeldUser), so this is never one of its own."""
        if self.state.finished or self.priority != 0:
            return False
        return self.reason == ADMIN_HOLD_REASON or self.special_exit

    @property
    def special_exit(self) -> bool:
        """Held by Slurm after a special exit (RequeueExitHold: the SPECIAL_EXIT flag)."""
        return "SPECIAL_EXIT" in self.state_flags

    @property
    def user_held(self) -> bool:
        """Pending under a user hold (JobHeldUser): the daemon's own, the plugin's, or one
        someone put with `scontrol uhold`."""
        return self.held and self.reason == USER_HOLD_REASON


@dataclass(frozen=True)
class SlurmNode:
    name: str
    state: str                       # e.g. "idle", "mixed", "allocated", "drained"
    gpus: int                        # configured gres gpu count
    gpus_used: int
    partitions: tuple[str, ...]
    features: frozenset[str] = frozenset()   # available and active features (--constraint)
    gpu_types: frozenset[str] = frozenset()  # the types of its GPUs ("gpu:a100:8"), none if untyped

    @property
    def usable(self) -> bool:
        """Whether a job released now may start here: no token of the state ("idle+drain",
        "mixed+maintenance", "idle+powered_down") is in `UNUSABLE_NODE_STATES`. Matched token by
        token: a powered-down node (power saving) is usable, Slurm boots it for the job."""
        tokens = {t.strip("*~#!%$@^-") for t in self.state.lower().split("+")}
        return not tokens & UNUSABLE_NODE_STATES


# Node state tokens (base states and flags of sinfo's JSON, lower case; 22.05 .. 25.11) on which
# Slurm starts no job that does not ask for them: down, drained or draining, failing, invalid,
# not responding, in a maintenance or advanced reservation, being rebooted or powered down
# (POWER_DOWN: asked to power down; POWERING_DOWN), or not yet present (FUTURE). POWERED_DOWN
# (power saving) and POWERING_UP are usable: Slurm boots the node for the job. Sinfo's text
# suffixes ("down*", "idle~") are stripped.
UNUSABLE_NODE_STATES = frozenset({
    "down", "drain", "drained", "draining", "fail", "failing", "inval", "invalid",
    "invalid_reg", "unknown", "not_responding", "no_respond", "maint", "maintenance",
    "reserved", "resv", "reboot_issued", "power_down", "powering_down", "future"})


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
