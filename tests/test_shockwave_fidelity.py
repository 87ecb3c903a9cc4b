"""Shockwave on the reference's 120-job trace, 32 GPUs, against the reference's own result.

Uses the `reference` adaptation mode, as `shockslurm simulate` does for reference traces: the
jobs change batch size by the reference simulator's rules, so the comparison is like for like.
"""

from __future__ import annotations

import pytest


@pytest.mark.slow
def test_shockwave_120_jobs_matches_or_beats_the_reference(reference_data):
    from shockslurm.sim.run import SimConfig, simulate
    from shockslurm.workload.reference import load_reference_workload

    jobs = load_reference_workload(reference_data / "trace-120jobs.tsv",
                                   reference_data / "throughputs-tacc.json",
                                   reference_data / "profiles-120jobs.json.gz")
    res = simulate(jobs, "shockwave", SimConfig(gpus=32, adaptation="reference"))
    m = res.as_dict()
    assert m["makespan_s"] <= 24_398
    assert m["worst_rho"] <= 1.71
    assert m["unfair_fraction"] <= 0.05
    assert m["avg_jct_s"] <= 9_960
    assert res.sim_wall_s <= 60
