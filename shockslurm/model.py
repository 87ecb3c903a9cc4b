"""Plain typed records shared by every layer: what a job is, what a policy sees, what it returns.

Nothing here imports anything else from the package, so policies, the simulator, the store and
the Slurm backend can all depend on it without depending on each other.

Units: seconds for time, epochs for progress, samples for data. A job's *rate* is epochs per
second of exclusive run on its whole gang at its current batch size.
"""

from __future__ import annotations

import itertools
import re
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping, Sequence

ADAPTATION_MODES = ("static", "gns", "accordion")
MAX_EPOCHS = 1_000_000   # a job spec is a per-epoch list: bound it before building one

# Where one job's gang sits: (node name, GPUs it uses there) per node, in node order.
NodeShares = tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class Node:
    """One node of the cluster: its name and its GPUs (`gpu_type`: their type when the live
    cluster names one; placement reads GPU types through `Snapshot.allowed_nodes`, the nodes of
    the type a job asks for)."""

    name: str
    gpus: int
    gpu_type: str | None = None

    def __post_init__(self) -> None:
        if self.gpus <= 0:
            raise ValueError(f"node {self.name!r} needs at least one GPU, got {self.gpus}")


def pool(gpus: int) -> tuple[Node, ...]:
    """One pool of `gpus` GPUs: a single node, so that any gang up to `gpus` fits; no node at
    all when there are no GPUs (every node down or drained: nothing can be placed)."""
    return (Node("pool", gpus),) if gpus > 0 else ()


_SHAPE_GROUP = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*$")
# The largest cluster a shape may describe (the largest documented: 2048 GPUs): a simulation's
# memory grows with its GPUs (and a node has at least one, so its nodes are bounded too).
MAX_CLUSTER_GPUS = 100_000


def parse_cluster_shape(text: str) -> tuple[Node, ...]:
    """Nodes from `NODESxGPUS[,NODESxGPUS...]`, e.g. `4x8` or `2x8,4x4`; nodes are named
    `node01`, `node02`, ... in the order given. Raises ValueError naming the bad group, or when
    the cluster has more than MAX_CLUSTER_GPUS GPUs (counted before any node is built)."""
    groups: list[tuple[int, int]] = []
    for group in text.split(","):
        m = _SHAPE_GROUP.match(group)
        if m is None:
            raise ValueError(f"bad cluster group {group.strip()!r}: expected NODESxGPUS_PER_NODE, "
                             "e.g. 4x8 (several separated by commas)")
        count, gpus = int(m.group(1)), int(m.group(2))
        if count <= 0 or gpus <= 0:
            raise ValueError(f"bad cluster group {group.strip()!r}: nodes and GPUs per node "
                             "must be positive")
        groups.append((count, gpus))
    if sum(count * gpus for count, gpus in groups) > MAX_CLUSTER_GPUS:
        raise ValueError(f"cluster {text!r} has more than {MAX_CLUSTER_GPUS:,} GPUs")
    nodes: list[Node] = []
    for count, gpus in groups:
        first = len(nodes) + 1
        nodes.extend(Node(f"node{first + i:02d}", gpus) for i in range(count))
    return tuple(nodes)


def cluster_shape(nodes: Sequence[Node]) -> str:
    """The inverse of `parse_cluster_shape` (consecutive nodes of one size grouped): `4x8`."""
    groups: list[list[int]] = []
    for n in nodes:
        if groups and groups[-1][1] == n.gpus:
            groups[-1][0] += 1
        else:
            groups.append([1, n.gpus])
    return ",".join(f"{c}x{g}" for c, g in groups)


class RunLength(Sequence[Any]):
    """An immutable sequence kept as runs of equal values: `RunLength.repeat(32, 10**6)` is one
    run, so a per-epoch profile of a job that declares a million epochs costs O(1) memory.

    It indexes, slices (step 1 stays run-length) and iterates like a tuple, and compares equal to
    any sequence (tuple, list) with the same elements. `runs_of` reads any sequence as runs.
    """

    __slots__ = ("runs", "_ends")

    def __init__(self, runs: Iterable[tuple[Any, int]] = ()) -> None:
        merged: list[tuple[Any, int]] = []
        for value, count in runs:
            if count <= 0:
                continue
            if merged and merged[-1][0] == value:
                merged[-1] = (value, merged[-1][1] + count)
            else:
                merged.append((value, int(count)))
        self.runs: tuple[tuple[Any, int], ...] = tuple(merged)
        self._ends = tuple(itertools.accumulate(c for _, c in merged))

    @classmethod
    def repeat(cls, value: Any, count: int) -> "RunLength":
        return cls(((value, count),))

    def extended(self, value: Any, count: int) -> "RunLength":
        """This sequence with `count` more `value`s at its end: O(runs), not O(length)."""
        return RunLength(self.runs + ((value, count),))

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def __getitem__(self, index: Any) -> Any:
        n = len(self)
        if isinstance(index, slice):
            start, stop, step = index.indices(n)
            if step != 1:
                return tuple(self[i] for i in range(start, stop, step))
            return RunLength(self._clipped(start, max(start, stop)))
        if not isinstance(index, int):
            raise TypeError(f"RunLength indices must be integers or slices, not "
                            f"{type(index).__name__}")
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError("RunLength index out of range")
        return self.runs[bisect_right(self._ends, index)][0]

    def _clipped(self, start: int, stop: int) -> Iterator[tuple[Any, int]]:
        begin = 0
        for (value, count), end in zip(self.runs, self._ends):
            lo, hi = max(begin, start), min(end, stop)
            if lo < hi:
                yield value, hi - lo
            begin = end

    def __iter__(self) -> Iterator[Any]:
        for value, count in self.runs:
            yield from itertools.repeat(value, count)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RunLength):
            return self.runs == other.runs
        if isinstance(other, (tuple, list)):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.runs)

    def __repr__(self) -> str:
        return f"RunLength({list(self.runs)!r})"


def runs_of(values: Sequence[Any]) -> tuple[tuple[Any, int], ...]:
    """`values` as runs (value, count) of equal neighbours: O(runs) for a `RunLength`."""
    if isinstance(values, RunLength):
        return values.runs
    return tuple((value, sum(1 for _ in group)) for value, group in itertools.groupby(values))


@dataclass(frozen=True)
class JobSpec:
    """What is known about a job when it is submitted.

    `batch_sizes` and `epoch_durations` are the per-epoch profile: the batch size of each epoch
    and its exclusive duration on `gang_size` GPUs. The fairness metric's exclusive run time is
    their sum. `throughput` maps every batch size the job may use to iterations per second on its
    gang; the forecaster and the simulator read durations of batch sizes not in the profile from it.
    `allowed_nodes` limits the job to some nodes (by name), as a partition, `--exclude` or
    `--constraint` limit a live job (`Snapshot.allowed_nodes`). `node_count` above 1: the job
    asks for that many nodes, its gang in equal parts on each (`-N 2 --gres=gpu:4`,
    `Snapshot.node_counts`).
    """

    job_id: int
    job_type: str
    model: str
    dataset: str
    samples_per_epoch: int
    gang_size: int
    arrival_s: float
    mode: str
    batch_sizes: tuple[int, ...]
    epoch_durations: tuple[float, ...]
    throughput: Mapping[int, float]
    priority_weight: float = 1.0
    total_iterations: int | None = None  # at the initial batch size; default whole epochs
    allowed_nodes: frozenset[str] | None = None  # the nodes it may run on; None: any node
    node_count: int = 1                 # nodes it asks for, its gang split evenly over them

    @property
    def iterations(self) -> int:
        """Iterations at the initial batch size (the reference trace's `total_steps`)."""
        if self.total_iterations is not None:
            return self.total_iterations
        return self.num_epochs * self.iterations_per_epoch(self.initial_batch_size)

    def iterations_per_epoch(self, batch_size: int) -> int:
        return -(-self.samples_per_epoch // batch_size)

    @property
    def num_epochs(self) -> int:
        return len(self.batch_sizes)

    @property
    def initial_batch_size(self) -> int:
        return self.batch_sizes[0]

    @property
    def exclusive_runtime_s(self) -> float:
        return float(sum(self.epoch_durations))

    @property
    def batch_size_ladder(self) -> tuple[int, ...]:
        """Every batch size the job may train with, ascending (the forecaster's support)."""
        return tuple(sorted(self.throughput))

    def epoch_duration_at(self, batch_size: int) -> float:
        """Exclusive seconds for one epoch at `batch_size` on the job's gang."""
        return self.samples_per_epoch / batch_size / self.throughput[batch_size]

    @property
    def declared_epoch_s(self) -> float:
        """The one epoch time `shocksub --epoch-seconds` declares for the job (`bench live`
        passes it): the first epoch's."""
        return self.epoch_durations[0]

    def declared_profile(self) -> EpochProfile:
        """The job as the live daemon knows it from what `shocksub` declares: the number of
        epochs, the initial batch size and `declared_epoch_s`."""
        return EpochProfile.declared(self.initial_batch_size, self.declared_epoch_s, self.num_epochs)


@dataclass(frozen=True)
class EpochProfile:
    """A job's per-epoch batch sizes and exclusive durations as a policy is told them, with
    their total: the workload's profile in the simulator, or (`declared`) what a submission
    declares, which the live daemon and the simulator's `declared_profile` view plan with."""

    batch_sizes: Sequence[int]
    epoch_durations: Sequence[float]
    exclusive_runtime_s: float

    @classmethod
    def declared(cls, batch_size: int, epoch_s: float, epochs: int) -> EpochProfile:
        """Every epoch at one batch size and one duration (`shocksub` declares those)."""
        return cls(RunLength.repeat(batch_size, epochs), RunLength.repeat(epoch_s, epochs),
                   epoch_s * epochs)


@dataclass(frozen=True)
class JobView:
    """What a policy sees of one active job at the start of a round (a pure value).

    Progress is given both in iterations at the current batch size (the unit of Gavel-style
    policies, whose throughputs are iterations/s) and in epochs (the unit of Shockwave).
    """

    job_id: int
    gang_size: int
    arrival_s: float
    num_epochs: int
    epochs_done: float
    batch_size: int
    iterations_per_s: float             # whole gang, at the current batch size, isolated
    remaining_iterations: float         # at the current batch size
    iterations_per_epoch: int           # at the current batch size
    # Per-epoch sequences: tuples, or `RunLength` (the live daemon's, whose size must not grow
    # with the epochs a user declares).
    observed_batch_sizes: Sequence[int]  # batch size of every completed epoch, in order
    profile_batch_sizes: Sequence[int]   # declared/profiled batch size of every epoch
    profile_epoch_durations: Sequence[float]  # profiled exclusive seconds of every epoch
    exclusive_runtime_s: float          # whole-job exclusive run time from the profile
    run_time_s: float                   # seconds of useful GPU-holding time so far (per gang)
    ran_last_round: bool
    priority_weight: float = 1.0

    @property
    def rate(self) -> float:
        """Epochs per second at the current batch size."""
        return self.iterations_per_s / self.iterations_per_epoch

    @property
    def remaining_epochs(self) -> float:
        return max(0.0, self.num_epochs - self.epochs_done)

    @property
    def remaining_time_at_current_rate(self) -> float:
        if self.iterations_per_s <= 0:
            return float("inf")
        return self.remaining_iterations / self.iterations_per_s


@dataclass(frozen=True)
class Snapshot:
    """The cluster as a policy sees it at a round boundary.

    `gpus` is what policies plan with. `nodes` are the cluster's nodes (their GPUs, less
    `reserved`, sum to `gpus`); empty means no node information, one pool of `gpus` GPUs where any
    gang up to `gpus` fits. `placements` says where each job
    that holds GPUs now sits (jobs not in it hold none); `reserved` the GPUs per node that jobs
    outside the snapshot hold (another partition's, unmanaged ones). `pinned`: jobs released
    to start that hold no GPUs yet, and the nodes they will start on (the live daemon's, whose
    starts take Slurm a moment; none in the simulator, where a start is immediate); placement
    keeps them there while those nodes have room. `allowed_nodes`: the nodes a job may run on,
    for the jobs limited to some (on the live cluster: the nodes of its partition that its
    user's `-w`, `--exclude` and `--constraint` leave it; a job not in it may run on any);
    placement puts such a job on those only. `node_counts`: the jobs that ask for several
    nodes, job id -> N > 1 (Slurm's `-N N --gres=gpu:K`: K GPUs on each of N nodes); placement
    puts such a gang in N equal parts on N nodes (absent: rule 1, one node when one holds it).
    """

    now: float
    round_index: int
    round_s: float
    gpus: int
    jobs: tuple[JobView, ...]
    nodes: tuple[Node, ...] = ()
    placements: Mapping[int, NodeShares] = field(default_factory=dict)
    reserved: Mapping[str, int] = field(default_factory=dict)
    pinned: Mapping[int, NodeShares] = field(default_factory=dict)
    allowed_nodes: Mapping[int, frozenset[str]] = field(default_factory=dict)
    node_counts: Mapping[int, int] = field(default_factory=dict)

    def parts(self, job_id: int) -> int:
        """The nodes the job asks for (1: rule 1 places its gang)."""
        return self.node_counts.get(job_id, 1)

    @property
    def cluster_nodes(self) -> tuple[Node, ...]:
        """The nodes, or one pool of `gpus` GPUs when the snapshot names none."""
        return self.nodes or pool(self.gpus)

    def home(self, job_id: int) -> NodeShares | None:
        """Where the job holds GPUs now, else the nodes it is pinned to, else None."""
        return self.placements.get(job_id) or self.pinned.get(job_id)

    def runs_at(self, job_id: int, shares: NodeShares) -> bool:
        """Whether the job holds GPUs now exactly as `shares` says (it stays where it runs)."""
        held = self.placements.get(job_id)
        return held is not None and tuple(held) == tuple(shares)

    def job(self, job_id: int) -> JobView:
        for j in self.jobs:
            if j.job_id == job_id:
                return j
        raise KeyError(job_id)


@dataclass(frozen=True)
class RoundPlan:
    """A policy's answer: the jobs that hold their whole gang for the coming round.

    `info` carries policy diagnostics (solve time, status, objective) for logs and the store.
    `placement` says where each job of `run` sits once the round loop has placed the plan on
    the snapshot's nodes (`plan_on_nodes.place_plan`); a policy's own answer leaves it empty,
    or places every job itself (fifo's backfill) and the round loop keeps it when it fits.
    """

    run: frozenset[int]
    info: Mapping[str, object] = field(default_factory=dict)
    placement: Mapping[int, NodeShares] = field(default_factory=dict)
    # False in a non-preemptive policy's answer: placing the plan never moves a running job
    # (a restart); a gang that does not fit around the running jobs waits, as under Slurm
    moves_allowed: bool = True

    def info_ids(self, key: str) -> set[int]:
        """Job ids of an `info` entry (a list of ids, e.g. placement's "moved"; empty when
        absent)."""
        value = self.info.get(key)
        return {int(j) for j in value} if isinstance(value, (list, tuple)) else set()

    def gpus_used(self, snapshot: Snapshot) -> int:
        sizes = {j.job_id: j.gang_size for j in snapshot.jobs}
        return sum(sizes[j] for j in self.run)


def check_plan(plan: RoundPlan, snapshot: Snapshot) -> None:
    """Raise if a plan names unknown jobs or needs more GPUs than the cluster has."""
    known = {j.job_id for j in snapshot.jobs}
    unknown = set(plan.run) - known
    if unknown:
        raise ValueError(f"plan names jobs that are not active: {sorted(unknown)}")
    used = plan.gpus_used(snapshot)
    if used > snapshot.gpus:
        raise ValueError(f"plan uses {used} GPUs but the cluster has {snapshot.gpus}")


def total_gpus(views: Sequence[JobView]) -> int:
    return sum(v.gang_size for v in views)
