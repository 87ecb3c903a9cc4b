"""Per-job state that does not grow with what a job declares: `model.RunLength`, the forecaster
on run-length profiles (the same numbers as on tuples), the reported batch-size history, and
one daemon round with a job at the epoch cap (small) or beyond it (never viewed, flagged)."""

from __future__ import annotations

import json
import logging
import math
import tracemalloc
from dataclasses import astuple, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shockslurm.forecast import ForecastState, ProfileSummary, epoch_duration, forecast
from shockslurm.limits import MAX_EPOCHS
from shockslurm.model import JobView, RunLength, runs_of
from shockslurm.policies import make_policy
from shockslurm.reports.reported_progress import observed_batch_sizes
from shockslurm.live.cluster import SlurmCluster

from .test_enact import job
from .test_live import FakeBackend

PROPS = settings(deadline=None, derandomize=True, database=None, max_examples=150)
RUNS = st.lists(st.tuples(st.sampled_from([16, 32, 64, 128]), st.integers(0, 6)), max_size=8)


# ------------------------------------------------------------------ RunLength
@PROPS
@given(runs=RUNS, start=st.integers(-40, 40), stop=st.integers(-40, 40))
def test_run_length_behaves_like_its_tuple(runs, start, stop):
    flat = tuple(v for v, n in runs for _ in range(n))
    rl = RunLength(runs)
    assert rl == flat and flat == rl and list(rl) == list(flat) and len(rl) == len(flat)
    assert rl[start:stop] == flat[start:stop]
    assert isinstance(rl[start:stop], RunLength)
    assert rl[::2] == flat[::2]
    for i in range(-len(flat), len(flat)):
        assert rl[i] == flat[i]
    assert runs_of(rl) == runs_of(flat)
    assert len(rl.runs) <= len(runs)
    assert rl != flat + (1,)


def test_run_length_index_errors_and_size():
    rl = RunLength.repeat(32, 10 ** 9)
    assert len(rl) == 10 ** 9 and rl[-1] == 32 and rl.runs == ((32, 10 ** 9),)
    for bad in (10 ** 9, -10 ** 9 - 1):
        try:
            rl[bad]
        except IndexError:
            pass
        else:
            raise AssertionError(f"index {bad} did not raise")
    assert RunLength() == () and len(RunLength([(5, 0)])) == 0


# ------------------------------------------------------------------ the forecaster
def _view(batch_sizes, durations, observed, epochs_done, run_time_s) -> JobView:
    n = len(batch_sizes)
    return JobView(job_id=1, gang_size=1, arrival_s=0.0, num_epochs=n, epochs_done=epochs_done,
                   batch_size=batch_sizes[min(int(epochs_done), n - 1)], iterations_per_s=3.0,
                   remaining_iterations=100.0, iterations_per_epoch=10,
                   observed_batch_sizes=observed, profile_batch_sizes=batch_sizes,
                   profile_epoch_durations=durations, exclusive_runtime_s=sum(durations),
                   run_time_s=run_time_s, ran_last_round=True)


PROFILES = st.lists(st.tuples(st.sampled_from([16, 32, 64]),
                              st.sampled_from([0.3, 1.0, 2.5, 7.0, 60.0]),
                              st.integers(1, 5)), min_size=1, max_size=6)


@PROPS
@given(profile=PROFILES, done_frac=st.floats(0, 1), time_frac=st.floats(0, 2))
def test_forecast_on_run_length_profiles_equals_the_tuple_forecast(profile, done_frac,
                                                                   time_frac):
    bss = tuple(b for b, _, n in profile for _ in range(n))
    durs = tuple(d for _, d, n in profile for _ in range(n))
    done = done_frac * (len(bss) - 0.01)
    observed = bss[:int(done)]
    run_time = time_frac * sum(durs)
    flat = _view(bss, durs, observed, done, run_time)
    compact = _view(RunLength((b, n) for b, _, n in profile),
                    RunLength((d, n) for _, d, n in profile), RunLength((b, 1) for b in observed),
                    done, run_time)
    # the per-run summary against the per-epoch definition
    summary = ProfileSummary.of(compact)
    exact = [epoch_duration(d) for d in durs]
    for i in range(len(durs) + 1):
        assert summary.prefix_s(i) == pytest.approx(math.fsum(exact[:i]), rel=1e-12, abs=1e-9)
    a, b = astuple(forecast(flat, ForecastState(1))), astuple(forecast(compact, ForecastState(1)))
    assert all(x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(a, b)), (a, b)


# ------------------------------------------------------------------ reported history
def _naive_observed(epoch_bs, done, completed, current, initial):
    """The per-epoch loop `observed_batch_sizes` replaced."""
    out, previous = [], initial
    for e in range(done):
        size = epoch_bs.get(e) or (previous if e < completed else current)
        out.append(size)
        previous = size
    return tuple(out)


@PROPS
@given(epoch_bs=st.dictionaries(st.integers(0, 30), st.one_of(st.none(), st.sampled_from([8, 16])),
                                max_size=10),
       done=st.integers(0, 35), position_ahead=st.booleans())
def test_reported_history_is_run_length_and_equals_the_per_epoch_rule(epoch_bs, done,
                                                                       position_ahead):
    completed = (max(epoch_bs) + 1) if epoch_bs else 0
    got = observed_batch_sizes(epoch_bs, done, completed, 64, 32)
    assert got == _naive_observed(epoch_bs, done, completed, 64, 32)
    assert len(got.runs) <= 2 * len(epoch_bs) + 2


def test_reported_history_of_a_million_epochs_is_a_few_runs():
    got = observed_batch_sizes({0: 32, 999_998: 64}, MAX_EPOCHS, 999_999, 64, 32)
    assert len(got) == MAX_EPOCHS and got.runs == ((32, 999_998), (64, 2))


# ------------------------------------------------------------------ one daemon round
def _spec_job(job_id: int, epochs: float):
    spec = json.dumps({"model": "ResNet-18", "epochs": epochs, "samples_per_epoch": 50_000,
                       "batch_sizes": [32, 64], "batch_size": 32})
    return replace(job(job_id, gpus=1), comment=f"shock:spec={spec};shock:managed")


def _round_allocations(epochs: float) -> tuple[int, int, SlurmCluster]:
    """Peak bytes traced while one round observes and plans (shockwave) one job declaring
    `epochs` epochs, and the number of views."""
    c = SlurmCluster(FakeBackend([_spec_job(1, epochs)]), grace_seconds=0,
                     sleep=lambda s: None)
    policy = make_policy("shockwave")
    tracemalloc.start()
    try:
        snap = c.observe(2000.0)
        policy.allocate(snap)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak, len(snap.jobs), c


def test_a_job_at_the_epoch_cap_costs_what_a_small_one_costs(caplog):
    """Before: the view held two per-epoch tuples and the forecaster per-epoch arrays (a job at
    10^6 epochs grew the round by 67 MB, at 10^7 by 617 MB, 10^9 ran out of memory). Now the
    profile is one run whatever the epochs."""
    small, n_small, _ = _round_allocations(10)
    capped, n_capped, c = _round_allocations(MAX_EPOCHS)
    assert n_small == n_capped == 1
    view = c.observe(2010.0).jobs[0]
    assert view.num_epochs == MAX_EPOCHS and len(view.profile_batch_sizes) == MAX_EPOCHS
    assert isinstance(view.profile_epoch_durations, RunLength)
    assert len(view.profile_epoch_durations.runs) == 1
    assert capped < small + 256 * 1024, (small, capped)
    assert capped < 4 * 1024 * 1024

    caplog.set_level(logging.WARNING)
    beyond, n_beyond, c = _round_allocations(1e9)
    assert n_beyond == 0 and list(c.bad_specs.values()) == [
        "bad spec: comment, field 'epochs': must be an integer in 1..1000000, got 1000000000"]
    assert beyond < 4 * 1024 * 1024


def test_run_length_extended_merges_and_leaves_the_original():
    base = RunLength([(32, 3)])
    longer = base.extended(32, 2).extended(64, 1).extended(64, 0)
    assert longer.runs == ((32, 5), (64, 1)) and base == (32, 32, 32)
    assert list(longer) == [32] * 5 + [64]


def test_a_simulated_jobs_history_is_its_batch_size_changes_long():
    """SimJob keeps the batch size of every completed epoch run-length: a job of many epochs
    at two batch sizes holds two runs (a tuple grew by concatenation, quadratic in epochs)."""
    from shockslurm.sim.jobs import SimJob

    from .conftest import make_spec
    epochs = 20_000
    spec = make_spec(schedule=[32] * (epochs // 2) + [64] * (epochs // 2), samples=64,
                     throughput={32: 100.0, 64: 100.0})
    job = SimJob(spec)
    clock = 0.0
    while not job.done:
        run = job.plan_run(60.0)
        clock += 60.0
        job.record_run(run, run.seconds, clock)
        job.update_flags()
    assert isinstance(job.observed_batch_sizes, RunLength)
    assert job.observed_batch_sizes.runs == ((32, epochs // 2), (64, epochs // 2))
