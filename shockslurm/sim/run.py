"""Run one policy over one workload in simulation and collect its metrics."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

from ..engine import RoundLoop, VirtualClock
from ..churn_rules import ChurnLimits
from ..model import JobSpec, Node, RoundPlan, Snapshot, cluster_shape
from ..policies import PolicySettings, make_policy
from .cluster import RESTART_OVERHEAD_S, SimulatedCluster
from .metrics import JobOutcome, RunMetrics, compute_metrics


@dataclass(frozen=True)
class SimConfig:
    """`gpus` is one pool unless `nodes` (whose GPUs sum to `gpus`) say how they are split;
    `SimConfig.for_nodes` fills `gpus` in. `settings`: what the policy is given (the round
    length, Gavel's re-solve gate; the policy's options come with each `simulate` call)."""

    gpus: int
    restart_overhead_s: float = RESTART_OVERHEAD_S
    adaptation: str = "profile"
    settings: PolicySettings = field(default_factory=PolicySettings)
    nodes: tuple[Node, ...] = ()
    fill_on_completion: bool = False    # live-like rounds (`SimulatedCluster`); off: reference
    declared_profile: bool = False      # the policy sees the spec as shocksub declares it (live)
    keep_partial_iterations: bool = False   # a run going on keeps its part-done iteration (live)

    @property
    def round_s(self) -> float:
        return self.settings.round_s

    @classmethod
    def for_nodes(cls, nodes: tuple[Node, ...], **kwargs: Any) -> "SimConfig":
        return cls(gpus=sum(n.gpus for n in nodes), nodes=tuple(nodes), **kwargs)

    @property
    def cluster(self) -> str:
        """`4x8`-style shape, or `pool` for a plain GPU count."""
        return cluster_shape(self.nodes) if self.nodes else "pool"

    def __post_init__(self) -> None:
        if self.gpus <= 0:
            raise ValueError(f"gpus must be positive, got {self.gpus}")
        if self.nodes and sum(n.gpus for n in self.nodes) != self.gpus:
            raise ValueError(f"the nodes hold {sum(n.gpus for n in self.nodes)} GPUs, "
                             f"not gpus={self.gpus}")
        if self.round_s <= 0:
            raise ValueError(f"round_s must be positive, got {self.round_s}")
        if self.restart_overhead_s < 0:
            raise ValueError(f"restart_overhead_s must be >= 0, got {self.restart_overhead_s}")


@dataclass
class RoundRecord:
    """One round as the simulator saw it (for reports and the store)."""

    start_s: float
    active: int
    run: tuple[int, ...]
    gpus_used: int
    solve_s: float
    info: dict[str, Any]


@dataclass
class SimResult:
    policy: str
    config: SimConfig
    metrics: RunMetrics
    outcomes: list[JobOutcome]
    rounds: list[RoundRecord]
    sim_wall_s: float
    solve_s: float
    batch_size_changes: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    # (time_s, job_id, old batch size, new batch size) of every change, in time order (the store).
    batch_size_events: list[tuple[float, int, int, int]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        out = {"policy": self.policy, **self.metrics.as_dict(), "sim_wall_s": self.sim_wall_s,
               "solve_s": self.solve_s, "rounds": len(self.rounds), "gpus": self.config.gpus,
               "cluster": self.config.cluster,
               "round_s": self.config.round_s, "adaptation": self.config.adaptation,
               "restart_overhead_s": self.config.restart_overhead_s,
               "batch_size_changes": self.batch_size_changes}
        if self.config.fill_on_completion:
            out["fill_on_completion"] = True
        if self.config.declared_profile:
            out["declared_profile"] = True
        if self.config.keep_partial_iterations:
            out["keep_partial_iterations"] = True
        out.update(self.extra)
        return out


class _Recorder:
    """Keeps a record of every round and reports the fraction of jobs finished."""

    def __init__(self, cluster: SimulatedCluster, progress: Callable[[float], None] | None) -> None:
        self.rounds: list[RoundRecord] = []
        self._cluster = cluster
        self._progress = progress

    def on_round(self, snapshot: Snapshot, plan: RoundPlan, solve_s: float) -> None:
        self.rounds.append(RoundRecord(snapshot.now, len(snapshot.jobs), tuple(sorted(plan.run)),
                                       plan.gpus_used(snapshot), solve_s, dict(plan.info)))
        if self._progress is not None:
            jobs = self._cluster.sim_jobs.values()
            self._progress(sum(j.done for j in jobs) / len(jobs))


def _check_pace(jobs: Sequence[JobSpec], seconds: float, span: str = "round") -> None:
    """A job that cannot finish one iteration in a round at some batch size would never end
    (the simulator counts whole iterations per round): refuse the workload, naming the job.
    With `keep_partial_iterations` a job that runs on keeps its part-done iteration, so the
    check is against the shortest run the churn bounds give a job (none without them: a policy
    that stopped a job before each of its iterations ended would never let it finish, as live)."""
    for job in jobs:
        for batch_size, rate in sorted(job.throughput.items()):
            if rate * seconds < 1:
                raise ValueError(f"job {job.job_id}: {rate:g} iterations/s at batch size "
                                 f"{batch_size} is less than one iteration in a {seconds:g} s "
                                 f"{span}; it would never finish")


def simulate(jobs: Sequence[JobSpec], policy: str, config: SimConfig, *,
             progress: Callable[[float], None] | None = None,
             policy_options: Mapping[str, Any] | None = None) -> SimResult:
    """Simulate `policy` on `jobs` and return its metrics (see `metrics` for definitions);
    `policy_options` are the policy's keyword arguments (e.g. ShockwaveConfig fields)."""
    if not jobs:
        raise ValueError("the workload has no jobs")
    churn = ChurnLimits.for_round(config.round_s) if config.fill_on_completion else None
    if not config.keep_partial_iterations:
        _check_pace(jobs, config.round_s)
    elif churn is not None:         # a run lasts at least that long unless the job ends
        _check_pace(jobs, churn.min_run_seconds, "run (the churn bounds' shortest)")
    t0 = time.perf_counter()
    cluster = SimulatedCluster(config.gpus, jobs, round_s=config.round_s,
                               restart_overhead_s=config.restart_overhead_s,
                               adaptation=config.adaptation, nodes=config.nodes,
                               fill_on_completion=config.fill_on_completion,
                               declared_profile=config.declared_profile,
                               keep_partial_iterations=config.keep_partial_iterations,
                               churn=churn)
    settings = replace(config.settings, options=tuple(sorted((policy_options or {}).items())))
    recorder = _Recorder(cluster, progress)
    loop = RoundLoop(cluster, make_policy(policy, settings), VirtualClock(0.0), config.round_s,
                     observers=[recorder])
    stats = loop.run()
    outcomes = [JobOutcome(j.spec.job_id, j.spec.arrival_s, j.completion_s,
                           j.spec.exclusive_runtime_s, j.spec.gang_size)
                for j in cluster.sim_jobs.values() if j.completion_s is not None]
    metrics = compute_metrics(outcomes, config.gpus, cluster.gpu_seconds_used,
                              cluster.demand_timeline, trace_jobs=len(jobs))
    events = sorted((t, j.spec.job_id, old, new) for j in cluster.sim_jobs.values()
                    for t, old, new in j.batch_size_changes)
    return SimResult(policy, config, metrics, outcomes, recorder.rounds,
                     time.perf_counter() - t0, stats.solve_s, len(events),
                     extra={"policy_options": dict(policy_options)} if policy_options else {},
                     batch_size_events=events)
