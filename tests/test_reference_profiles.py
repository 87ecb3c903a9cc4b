"""Profiles from the reference's batch-size rules: a job alone under the rules, epoch by epoch."""

from __future__ import annotations

import statistics
from dataclasses import replace

import pytest

from shockslurm.sim.reference_profiles import (load_reference_trace, solo_schedule,
                                               with_reference_profile)
from shockslurm.sim.run import SimConfig, simulate
from shockslurm.workload.reference import load_reference_workload

from .conftest import make_spec

# ResNet-18 at 32 samples per batch, accordion: critical for its first 10 epochs, then 256
ACCORDION = dict(epochs=92, bs=32, samples=50000, mode="accordion",
                 throughput={32: 42.97497938, 256: 6.31952281})


def _alone(spec) -> float:
    """The job's run time alone in the simulator's reference mode."""
    result = simulate([spec], "fifo", SimConfig(gpus=spec.gang_size, adaptation="reference",
                                                restart_overhead_s=0.0))
    return result.outcomes[0].completion_s


def test_accordion_job_switches_after_its_critical_regime_with_the_rules_lag() -> None:
    spec = make_spec(**ACCORDION)
    schedule = solo_schedule(spec)
    assert len(schedule) == spec.num_epochs
    assert set(schedule) == {32, 256} and schedule[0] == 32
    first_large = schedule.index(256)
    # the rule asks for 256 after the round that passes epoch 10 (round 3: 15,468 iterations,
    # epoch 10 at 1,563 per epoch), the change lands when the next run ends (round 4, epoch 14)
    assert first_large == 14
    assert all(b == 256 for b in schedule[first_large:])


def test_reference_profile_predicts_the_run_alone() -> None:
    # declared small for every epoch, the job is far slower than the rules make it alone
    # (they switch to 256, an epoch then 2.2x faster, after 14 epochs); the profile the rules
    # give is its run alone
    spec = make_spec(**{**ACCORDION, "throughput": {32: 42.97497938, 256: 12.0}})
    alone = _alone(spec)
    assert spec.exclusive_runtime_s > 1.5 * alone
    profiled = with_reference_profile(spec)
    assert profiled.exclusive_runtime_s == pytest.approx(alone, rel=0.05)
    assert profiled.total_iterations == spec.total_iterations
    assert profiled.num_epochs == spec.num_epochs


def test_static_and_frozen_jobs_keep_their_batch_size() -> None:
    static = make_spec(epochs=5, bs=64)
    assert with_reference_profile(static) is static
    # ResNet-18 starting at 256 never changes under the rules (the reference rejects it)
    frozen = make_spec(epochs=6, bs=256, samples=50000, mode="gns",
                       throughput={256: 6.3, 512: 3.0}, schedule=[256] * 3 + [512] * 3)
    assert solo_schedule(frozen) == (256,) * 6


def test_a_job_slower_than_one_iteration_per_round_ends_the_walk() -> None:
    slow = make_spec(epochs=3, bs=32, samples=64, mode="gns", throughput={32: 1e-4, 64: 1e-4})
    assert solo_schedule(slow) == (32, 32, 32)


def test_the_safety_net_does_not_cut_the_run_short() -> None:
    # a profile far too short would end the run at 1.5x of it; the walk runs to the end
    spec = make_spec(**ACCORDION)
    short = replace(spec, epoch_durations=tuple(d / 100 for d in spec.epoch_durations))
    assert solo_schedule(short) == solo_schedule(spec)


@pytest.mark.slow
def test_the_120_job_traces_published_profiles_are_the_rules_alone(reference_data) -> None:
    """The reference's published profiles agree with its rules run alone (what this module
    assumes of a trace without them); our generic patterns do not."""
    paths = (reference_data / "trace-120jobs.tsv", reference_data / "throughputs-tacc.json")
    published = load_reference_workload(*paths, reference_data / "profiles-120jobs.json.gz")
    ruled = load_reference_trace(*paths)
    generic = load_reference_workload(*paths)
    adaptive = [i for i, j in enumerate(published) if j.mode != "static"]

    def ratios(jobs):
        return [jobs[i].exclusive_runtime_s / published[i].exclusive_runtime_s for i in adaptive]

    near = lambda values: sum(abs(r - 1) < 0.05 for r in values)    # noqa: E731
    assert len(adaptive) == 116
    assert near(ratios(ruled)) >= 100 and near(ratios(generic)) <= 90
    assert statistics.median(ratios(ruled)) == pytest.approx(1.0, abs=0.01)
    assert max(ratios(generic)) > 2 > max(ratios(ruled))
    # with the profile file, its profiles are kept as published
    kept = load_reference_trace(*paths, reference_data / "profiles-120jobs.json.gz")
    assert [j.batch_sizes for j in kept] == [j.batch_sizes for j in published]
