"""The lower bounds of `sim/bounds.py`: exact on small cases, never above a real schedule."""

from __future__ import annotations

import pytest

from shockslurm.policies import PolicySettings
from shockslurm.sim.bounds import avg_jct_bound, fluid_feasible, makespan_bound, worst_rho_bound
from shockslurm.sim.run import SimConfig, simulate
from shockslurm.workload.generator import GeneratorConfig, generate

from .conftest import make_spec


def test_two_whole_cluster_gangs_bound_at_two() -> None:
    # Two 2-GPU jobs of 100 s on 2 GPUs from time 0: whatever the order or sharing, the last
    # one ends at 200 s, rho 2 (contention max(1, 2/2) = 1).
    jobs = [make_spec(0, gang=2, epochs=1, bs=10, samples=1000), make_spec(1, gang=2, epochs=1,
                                                                          bs=10, samples=1000)]
    assert worst_rho_bound(jobs, gpus=2) == pytest.approx(2.0, abs=0.015)
    assert not fluid_feasible(jobs, 2, 1.9)
    assert avg_jct_bound(jobs) == pytest.approx(100.0)
    assert makespan_bound(jobs, gpus=2) == pytest.approx(200.0)      # the work over 2 GPUs


def test_makespan_bound_takes_the_latest_heavy_arrival_and_the_longest_job() -> None:
    # 100 s jobs: two 4-GPU ones at 0 and four 2-GPU ones at 300 s on 4 GPUs: after 300 s,
    # 800 GPU-s of work on 4 GPUs ends at 500 s at the earliest; a lone 1-GPU 1000 s job at
    # 50 s ends at 1050 s at the earliest.
    early = [make_spec(k, gang=4, epochs=1, bs=10, samples=1000) for k in range(2)]
    late = [make_spec(2 + k, gang=2, epochs=1, bs=10, samples=1000, arrival=300.0)
            for k in range(4)]
    assert makespan_bound(early + late, gpus=4) == pytest.approx(500.0)
    long = make_spec(9, epochs=10, bs=10, samples=1000, arrival=50.0)
    assert makespan_bound(early + late + [long], gpus=4) == pytest.approx(1050.0)
    with pytest.raises(ValueError):
        makespan_bound([], gpus=4)


def test_makespan_bound_takes_given_run_times_in_place_of_the_exclusive_ones() -> None:
    # the same 4-GPU pair at 0 s and four 2-GPU jobs at 300 s, but each late job runs 50 s
    # where its rules let it (the work after 300 s: 400 GPU-s on 4 GPUs, ending at 400 s); the
    # early pair's 800 GPU-s from 0 s then end at 200 s at the earliest.
    early = [make_spec(k, gang=4, epochs=1, bs=10, samples=1000) for k in range(2)]
    late = [make_spec(2 + k, gang=2, epochs=1, bs=10, samples=1000, arrival=300.0)
            for k in range(4)]
    runtimes = {0: 100.0, 1: 100.0, 2: 50.0, 3: 50.0, 4: 50.0, 5: 50.0}
    assert makespan_bound(early + late, gpus=4, runtimes=runtimes) == pytest.approx(400.0)


@pytest.mark.parametrize("scale", [0.004, 1.0, 250.0])
def test_the_fluid_bound_is_exact_at_any_time_scale(scale: float) -> None:
    # the two whole-cluster gangs of 100 s, arriving at 0.3 s and 0.7 s, and the same scaled:
    # the second one ends at 200.3 s at the earliest, so the bound is (200.3 - 0.7) / 100
    # whatever the seconds' size (time is cut at arrivals and deadlines, not in 1 s slots,
    # which loosened it and grew with the time scale)
    from shockslurm.livebench.workload import scale as scaled
    jobs = scaled([make_spec(0, gang=2, epochs=1, bs=10, samples=1000, arrival=0.3),
                   make_spec(1, gang=2, epochs=1, bs=10, samples=1000, arrival=0.7)], scale)
    assert worst_rho_bound(jobs, gpus=2) == pytest.approx(1.996, abs=0.004)
    assert not fluid_feasible(jobs, 2, 1.98) and fluid_feasible(jobs, 2, 2.0)


def test_jobs_that_fit_together_bound_at_one() -> None:
    jobs = [make_spec(k, gang=1, epochs=1, bs=10, samples=500, arrival=7.0 * k) for k in range(3)]
    assert worst_rho_bound(jobs, gpus=4) == pytest.approx(1.0, abs=0.005)


@pytest.mark.parametrize("seed", [1, 2])
def test_no_policy_beats_the_bounds(seed: int) -> None:
    jobs = generate(GeneratorConfig(jobs=14, seed=seed, jobs_per_hour=12.0, max_exclusive_hours=0.5))
    bound = worst_rho_bound(jobs, gpus=8)
    floor = avg_jct_bound(jobs)
    for policy in ("fifo", "max_min_fairness", "shockwave"):
        metrics = simulate(jobs, policy, SimConfig(gpus=8, settings=PolicySettings(round_s=60.0))).metrics
        assert metrics.worst_rho >= bound - 1e-6, policy
        assert metrics.avg_jct_s >= floor - 1e-6, policy
        assert metrics.makespan_s >= makespan_bound(jobs, 8) - 1e-6, policy
