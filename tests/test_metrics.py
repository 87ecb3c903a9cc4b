from __future__ import annotations

import pytest

from shockslurm.sim.metrics import JobOutcome, compute_metrics


def test_hand_computed_metrics() -> None:
    # 4 GPUs, 8 trace jobs -> static contention factor max(1, 8/4) = 2
    outcomes = [JobOutcome(0, 0, 100, 50, 1),     # JCT 100, rho 100/(50*2) = 1.0
                JobOutcome(1, 10, 310, 100, 2),   # JCT 300, rho 1.5
                JobOutcome(2, 20, 70, 50, 1)]     # JCT 50,  rho 0.5
    m = compute_metrics(outcomes, gpus=4, gpu_seconds_used=620, trace_jobs=8)
    assert m.makespan_s == 310                    # first arrival 0 -> last completion 310
    assert m.avg_jct_s == pytest.approx(150)
    assert m.worst_rho == pytest.approx(1.5) and m.median_rho == pytest.approx(1.0)
    assert m.unfair_fraction == pytest.approx(1 / 3)
    assert m.utilization == pytest.approx(620 / (4 * 310))
    assert m.p99_jct_s == pytest.approx(100 + 0.98 * 200)  # numpy's linear interpolation


def test_contention_below_one_is_one() -> None:
    m = compute_metrics([JobOutcome(0, 0, 100, 100, 1)], gpus=8, gpu_seconds_used=100)
    assert m.worst_rho == pytest.approx(1.0)


def test_themis_rho_uses_the_jobs_own_contention() -> None:
    # 2 GPUs; demand 4 GPUs during [0, 50), 2 GPUs after: job 0 sees 0.5*2 + 0.5*1 = 1.5 on average
    outcomes = [JobOutcome(0, 0, 100, 50, 1), JobOutcome(1, 0, 50, 50, 1)]
    m = compute_metrics(outcomes, gpus=2, gpu_seconds_used=150,
                        demand_timeline=[(0, 4), (50, 2)])
    assert m.themis_worst_rho == pytest.approx(100 / (50 * 1.5))
    assert m.themis_median_rho == pytest.approx((100 / 75 + 50 / 100) / 2)


def test_empty_is_an_error() -> None:
    with pytest.raises(ValueError):
        compute_metrics([], gpus=4, gpu_seconds_used=0)
