"""The round loop: one loop for the simulator and the live daemon.

Each round the loop observes the cluster, asks the policy for a plan, checks it, places it on the
cluster's nodes (`plan_on_nodes.place_plan`: jobs that cannot be placed leave the plan), enacts it and
tells its observers. What differs between the two worlds is behind two small protocols:

- `Cluster`: the simulated cluster advances jobs itself when the clock moves; the Slurm cluster
  is moved by real jobs. Both turn a `RoundPlan` into reality in `enact`.
- `Clock`: a `VirtualClock` jumps, a `WallClock` sleeps.

Like SimPy's kernel, the loop never asks which world it runs in.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterable, Protocol

from .model import RoundPlan, Snapshot, check_plan
from .plan_on_nodes import place_plan


class Clock(Protocol):
    def now(self) -> float: ...

    def sleep_until(self, t: float) -> None: ...


class VirtualClock:
    """Simulated time: sleeping is instantaneous."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)

    def now(self) -> float:
        return self._now

    def sleep_until(self, t: float) -> None:
        self._now = max(self._now, float(t))


class WallClock:
    """Real time in seconds since the epoch."""

    def __init__(self, sleep: Callable[[float], None] = time.sleep) -> None:
        self._sleep = sleep

    def now(self) -> float:
        return time.time()

    def sleep_until(self, t: float) -> None:
        delay = t - time.time()
        if delay > 0:
            self._sleep(delay)


class Cluster(Protocol):
    """What the round loop needs of a cluster, simulated or real."""

    gpus: int

    def observe(self, now: float) -> Snapshot:
        """The active jobs at `now` (arrived, not finished), after time has passed up to `now`."""

    def enact(self, plan: RoundPlan, snapshot: Snapshot) -> None:
        """Make the plan's jobs, and only them, hold their GPUs from now on (on the nodes of
        `plan.placement`)."""

    def finished(self) -> bool:
        """True when no job will ever need the cluster again (a simulation's end)."""

    def next_round_start(self, now: float, round_s: float) -> float:
        """When the round that starts at `now` ends and the next begins.

        Slurm: `now + round_s`. The simulator follows the reference: when the last job dispatched
        in the round finishes, or at the next arrival when nothing runs.
        """


class Policy(Protocol):
    name: str

    def allocate(self, snapshot: Snapshot) -> RoundPlan: ...


class RoundObserver(Protocol):
    def on_round(self, snapshot: Snapshot, plan: RoundPlan, solve_s: float) -> None: ...


@dataclass
class LoopStats:
    rounds: int = 0
    solve_s: float = 0.0


def allocate(policy: Policy, snapshot: Snapshot) -> RoundPlan:
    """The policy's plan for `snapshot`; with no GPUs at all (every node down or drained) the
    policy is not asked: nothing can run, and a policy need not handle an empty cluster."""
    if snapshot.gpus <= 0:
        return RoundPlan(frozenset(), {"status": "no_gpus"})
    return policy.allocate(snapshot)


class RoundLoop:
    """Runs rounds until the cluster is finished or `max_rounds` is reached; the cluster says
    when each round ends (`Cluster.next_round_start`)."""

    def __init__(self, cluster: Cluster, policy: Policy, clock: Clock, round_s: float,
                 observers: Iterable[RoundObserver] = ()) -> None:
        if round_s <= 0:
            raise ValueError("round_s must be positive")
        self.cluster = cluster
        self.policy = policy
        self.clock = clock
        self.round_s = float(round_s)
        self.observers = list(observers)
        self.stats = LoopStats()

    def run_round(self) -> Snapshot:
        now = self.clock.now()
        snapshot = self.cluster.observe(now)
        t0 = time.perf_counter()
        plan = allocate(self.policy, snapshot)
        solve_s = time.perf_counter() - t0
        check_plan(plan, snapshot)
        plan = place_plan(plan, snapshot)
        self.cluster.enact(plan, snapshot)
        self.stats.rounds += 1
        self.stats.solve_s += solve_s
        for obs in self.observers:
            obs.on_round(snapshot, plan, solve_s)
        return snapshot

    def run(self, max_rounds: int | None = None) -> LoopStats:
        while not self.cluster.finished():
            if max_rounds is not None and self.stats.rounds >= max_rounds:
                break
            self.run_round()
            now = self.clock.now()
            self.clock.sleep_until(self.cluster.next_round_start(now, self.round_s))
        return self.stats
