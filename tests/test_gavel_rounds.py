from __future__ import annotations

from shockslurm.model import Snapshot
from shockslurm.policies.gavel_rounds import GavelRounds

from .conftest import make_view


class Fixed:
    name = "fixed"

    def __init__(self, fractions: dict[int, float]) -> None:
        self.values, self.calls = fractions, 0

    def fractions(self, jobs, gpus, now):
        self.calls += 1
        return {j.job_id: self.values.get(j.job_id, 0.0) for j in jobs}


def _snap(now, views, gpus=4):
    return Snapshot(now=now, round_index=0, round_s=120.0, gpus=gpus, jobs=tuple(views))


def test_ranks_by_allocation_over_time_received_and_backfills() -> None:
    policy = Fixed({0: 0.5, 1: 0.25, 2: 1.0})
    rounds = GavelRounds(policy, min_resolve_interval_s=0, idle_unallocated=False)
    views = [make_view(0, gang=2), make_view(1, gang=1), make_view(2, gang=4)]
    plan = rounds.allocate(_snap(0, views))
    assert plan.run == {2}                   # highest fraction, takes all 4 GPUs
    # job 2 ran a whole round; now the others have the best x / share and 3 GPUs fit them
    views = [make_view(0, gang=2), make_view(1, gang=1), make_view(2, gang=4, run_time=120)]
    plan = rounds.allocate(_snap(120, views))
    assert plan.run == {0, 1}
    assert policy.calls == 1                 # nothing changed: no re-solve


def test_resolve_is_gated_and_new_jobs_idle() -> None:
    policy = Fixed({0: 1.0, 1: 1.0})
    rounds = GavelRounds(policy, min_resolve_interval_s=1000, idle_unallocated=True)
    # (a re-solve at exactly t=0 does not start the gate in Gavel; start at 10 s)
    rounds.allocate(_snap(10, [make_view(0)]))
    rounds.allocate(_snap(130, [make_view(0, run_time=120)]))
    assert policy.calls == 1
    plan = rounds.allocate(_snap(250, [make_view(0, run_time=240), make_view(1)]))
    assert plan.run == {0} and plan.info["idle_unallocated_gpus"] == 1
    plan = rounds.allocate(_snap(1010, [make_view(0, run_time=1000), make_view(1)]))
    assert policy.calls == 2 and plan.run == {0, 1}
