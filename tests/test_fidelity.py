"""Our baselines against the reference simulator's published numbers (SHOCKWAVE.md).

Runs the 120-job trace on 32 GPUs for each baseline, in the default (`reference`) adaptation mode
of reference traces and in the `profile` mode, and checks makespan and average JCT within 5 %.
"""

from __future__ import annotations

import pytest

from shockslurm.sim.run import SimConfig, simulate
from shockslurm.workload.reference import load_reference_workload

REFERENCE = {  # policy: (makespan s, average JCT s)
    "max_min_fairness": (33_208, 11_274),
    "min_total_duration": (24_205, 19_807),
    "max_sum_throughput": (31_909, 9_655),
    "gandiva_fair": (32_367, 12_574),
    "allox": (32_629, 9_973),
    "finish_time_fairness": (32_329, 11_386),
}


@pytest.fixture(scope="module")
def jobs(reference_data):
    return load_reference_workload(reference_data / "trace-120jobs.tsv",
                                   reference_data / "throughputs-tacc.json",
                                   reference_data / "profiles-120jobs.json.gz")


@pytest.mark.slow
@pytest.mark.parametrize("adaptation", ["reference", "profile"])
@pytest.mark.parametrize("policy", sorted(REFERENCE))
def test_baseline_within_5_percent(jobs, policy: str, adaptation: str) -> None:
    result = simulate(jobs, policy, SimConfig(gpus=32, adaptation=adaptation))
    makespan, jct = REFERENCE[policy]
    assert len(result.outcomes) == 120
    assert result.metrics.makespan_s == pytest.approx(makespan, rel=0.05)
    assert result.metrics.avg_jct_s == pytest.approx(jct, rel=0.05)
