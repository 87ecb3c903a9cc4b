"""The Dirichlet forecaster, dbar, calibration and the unknown-batch-size model."""

from __future__ import annotations

import math

import pytest

from shockslurm.forecast import (ForecastState, ProfileSummary, calibrate,
                                 dirichlet_remaining_time, duration_by_batch_size,
                                 epochs_completed, forecast, epoch_duration, observations)
from shockslurm.model import JobView


def view(bss, durs, done=0.0, bs=None, observed=None, run_time=0.0, ips=None, ipe=100):
    e = int(done)
    bs = bs if bs is not None else bss[min(e, len(bss) - 1)]
    return JobView(job_id=1, gang_size=1, arrival_s=0.0, num_epochs=len(bss), epochs_done=done,
                   batch_size=bs, iterations_per_s=ips if ips is not None else ipe / durs[0],
                   remaining_iterations=(len(bss) - done) * ipe, iterations_per_epoch=ipe,
                   observed_batch_sizes=tuple(bss[:e]) if observed is None else tuple(observed),
                   profile_batch_sizes=tuple(bss), profile_epoch_durations=tuple(durs),
                   exclusive_runtime_s=sum(durs), run_time_s=run_time, ran_last_round=False)


def test_uniform_prior_no_progress():
    # E = 4, support {32, 64}, obs = [32] (the epoch in progress): post = (2+1, 2) sum 5,
    # Ehat = (4*3/5, 4*2/5) = (2.4, 1.6); one observation at 32 -> (1.4, 1.6); rem_total 3.0,
    # inflated = max(floor(4.0), 4) = 4, R = (1.4*10 + 1.6*20) * 4 / 4 = 46
    r = dirichlet_remaining_time(4, 0, [32], {32: 10.0, 64: 20.0})
    assert r == pytest.approx(1.4 * 10 + 1.6 * 20)


def test_posterior_counts_and_clipping():
    # E = 6, e = 3, obs = [32, 32, 32, 64]: post = (3+3, 3+1) sum 10 -> Ehat (3.6, 2.4)
    # minus 3 at 32 -> 0.6 (3 decrements allowed: 3.6, 2.6, 1.6 >= 1), minus 1 at 64 -> 1.4
    r = dirichlet_remaining_time(6, 3, [32, 32, 32, 64], {32: 10.0, 64: 20.0})
    rem_total = 0.6 + 1.4
    inflated = max(math.floor(rem_total + 1), 3)
    assert r == pytest.approx((0.6 * 10 + 1.4 * 20) * 3 / inflated)
    # the decrement stops once the expectation is below 1
    r2 = dirichlet_remaining_time(4, 3, [32, 32, 32, 32], {32: 10.0, 64: 20.0})
    # post (2+4, 2) sum 8 -> Ehat (3, 1); 3 decrements at 32 (3, 2, 1 >= 1) -> 0; 64 stays 1
    assert r2 == pytest.approx((0 * 10 + 1 * 20) * 1 / max(math.floor(1 + 1), 1))
    # counts are accepted in place of the sequence
    assert dirichlet_remaining_time(6, 3, {32: 3, 64: 1}, {32: 10.0, 64: 20.0}) == \
        pytest.approx(r)


def test_finished_job_forecasts_one_second():
    assert dirichlet_remaining_time(5, 5, [32] * 5, {32: 10.0}) == 1.0


def test_single_batch_size_is_exact():
    # one batch size: R = (E - e - 1) * d (the epochs after the one in progress)
    r = dirichlet_remaining_time(10, 3, [64] * 4, {64: 7.0})
    assert r == pytest.approx(6 * 7.0)


def test_dbar():
    # the mean profiled duration of epochs 0..e, the one in progress included
    bss, durs = [32] * 4, [1.0, 10.0, 12.0, 30.0]
    assert forecast(view(bss, durs, done=1.5, run_time=6.0), ForecastState(1)).mean_epoch_s \
        == pytest.approx(5.5)
    assert forecast(view(bss, durs, done=3.5, run_time=38.0), ForecastState(1)).mean_epoch_s \
        == pytest.approx(53 / 4)


def test_profiled_durations_are_exact():
    # epochs of 1.15 s (the reference keeps whole seconds: 1 s, a forecast 13 % short)
    bss = [4096] * 100
    f = forecast(view(bss, [1.15] * 100, done=10.5, run_time=12.075), ForecastState(1))
    assert f.remaining_s == pytest.approx(89 * 1.15)
    assert f.mean_epoch_s == pytest.approx(1.15)
    assert f.elapsed_profile_s == pytest.approx(10 * 1.15)
    # sub-second epochs too (whole seconds made 0.2 s a 1 s epoch)
    f = forecast(view([64] * 10, [0.2] * 10, done=2.5, run_time=0.5), ForecastState(1))
    assert f.remaining_s == pytest.approx(7 * 0.2)
    # a zero duration neither divides by zero nor forecasts nothing
    assert epoch_duration(0.0) > 0
    f = forecast(view([64] * 4, [0.0] * 4, done=1.0, run_time=1.0, ips=100.0), ForecastState(1))
    assert math.isfinite(f.remaining_s) and f.remaining_s > 0


def test_forecast_end_to_end():
    bss = [32, 32, 64, 64]
    durs = [10.0, 10.0, 20.0, 20.0]
    v = view(bss, durs, done=1.5, run_time=15.0)
    st = ForecastState(1)
    f = forecast(v, st)
    assert f.epochs_done == 1 == epochs_completed(v)
    assert observations(v) == [32, 32]
    assert f.mean_epoch_s == pytest.approx(10.0)
    assert f.elapsed_profile_s == pytest.approx(10.0)
    assert f.remaining_s == pytest.approx(dirichlet_remaining_time(4, 1, [32, 32],
                                                                   {32: 10.0, 64: 20.0}))
    assert st.calibration == 1.0


def test_profiled_epochs_in():
    summary = ProfileSummary.of(view([32, 64], [10.0, 20.0]))
    assert summary.epochs_in(20.0) == pytest.approx(1.5)
    assert summary.epochs_in(50.0) == pytest.approx(2 + 20 / 20)   # past the end: last pace
    assert summary.prefix_s(1) == pytest.approx(10.0)


def test_calibration_fires_above_40_percent():
    bss = [32] * 10
    durs = [100.0] * 10
    # 1000 s of running: the profile says 10 epochs. 7 done -> 30 % off: no calibration
    st = ForecastState(1)
    assert not calibrate(st, view(bss, durs, done=7.0, run_time=1000.0))
    assert st.calibration == 1.0
    # 5 done -> 50 % off: durations scaled by prof / meas = 2
    assert calibrate(st, view(bss, durs, done=5.0, run_time=1000.0))
    assert st.calibration == pytest.approx(2.0)
    f = forecast(view(bss, durs, done=5.0, run_time=1000.0), st)
    assert f.mean_epoch_s == pytest.approx(200.0)
    # within 40 % of the scaled profile: the factor stays
    assert not calibrate(st, view(bss, durs, done=6.5, run_time=1400.0))
    assert st.calibration == pytest.approx(2.0)
    # within 40 % of the profile but not of the factor: calibrated again (the reference keeps 2)
    assert calibrate(st, view(bss, durs, done=18.0, run_time=2000.0))
    assert st.calibration == pytest.approx(20 / 18)


def test_no_calibration_from_less_than_a_whole_epoch():
    """A live job's first seconds are start-up and report lag: 3 s into a 10 s epoch it has
    reported a tenth of an epoch, a third of the profile's pace. No factor is set from that,
    and one whole epoch later the job is measured at its pace."""
    bss, durs = [32] * 30, [10.0] * 30
    st = ForecastState(1)
    assert not calibrate(st, view(bss, durs, done=0.1, run_time=3.0))
    assert st.calibration == 1.0
    assert not calibrate(st, view(bss, durs, done=1.0, run_time=13.0))
    assert st.calibration == 1.0


def test_unknown_batch_size_model():
    bss = [32, 32, 128, 128]
    durs = [100.0, 100.0, 40.0, 40.0]
    v = view(bss, durs, ipe=10_000 // 32)
    known = {32: 100.0, 128: 40.0}
    d = duration_by_batch_size(v, known, [32, 64, 128, 256], 1.0)
    assert d[32] == 100.0 and d[128] == 40.0
    samples = float(v.iterations_per_epoch * v.batch_size)
    # iterations/s interpolated in log-log between 32 and 128
    t32, t128 = samples / 32 / 100.0, samples / 128 / 40.0
    t64 = math.exp((math.log(t32) + math.log(t128)) / 2)
    assert d[64] == pytest.approx(samples / 64 / t64)
    assert 40.0 < d[64] < 100.0
    # extrapolation: slope of the last segment clamped to [-1, 0] -> never faster per sample
    # than the known trend, never a crash
    slope = (math.log(t128) - math.log(t32)) / (math.log(128) - math.log(32))
    slope = min(0.0, max(-1.0, slope))
    t256 = math.exp(math.log(t128) + slope * math.log(2))
    assert d[256] == pytest.approx(samples / 256 / t256)
    # a single known batch size: samples/s constant, same epoch duration
    v1 = view([32] * 3, [50.0] * 3)
    assert duration_by_batch_size(v1, {32: 50.0}, [32, 512], 1.0)[512] == pytest.approx(50.0)


def test_observed_batch_size_outside_profile_does_not_crash():
    bss = [32] * 4
    v = view(bss, [10.0] * 4, done=2.2, bs=64, observed=[32, 64], ips=5.0, ipe=10_000 // 64)
    f = forecast(v, ForecastState(1))
    assert f.remaining_s > 0 and math.isfinite(f.remaining_s)


def test_profile_that_only_rises():
    assert ProfileSummary.of(view([32, 32, 64, 128], [1.0] * 4)).rises_only
    assert not ProfileSummary.of(view([32, 64, 64, 32], [1.0] * 4)).rises_only   # comes back
    assert not ProfileSummary.of(view([64] * 4, [1.0] * 4)).rises_only           # static


def test_rising_profile_forecasts_over_the_sizes_ahead():
    # a GNS-like job at its last batch size: the smaller, faster sizes it left behind are not
    # in its forecast (the reference's would expect epochs at 32 too and come out shorter)
    bss, durs = [32, 32, 64, 64, 64, 64], [5.0, 5.0, 20.0, 20.0, 20.0, 20.0]
    f = forecast(view(bss, durs, done=3.5, run_time=35.0), ForecastState(1))
    assert f.remaining_s == pytest.approx(dirichlet_remaining_time(6, 3, {64: 2}, {64: 20.0}))
    reference = dirichlet_remaining_time(6, 3, {32: 2, 64: 2}, {32: 5.0, 64: 20.0})
    assert f.remaining_s > reference
    # still at the first size: every size of the profile is ahead, as before
    f0 = forecast(view(bss, durs, done=1.5, run_time=7.5), ForecastState(1))
    assert f0.remaining_s == pytest.approx(
        dirichlet_remaining_time(6, 1, {32: 2}, {32: 5.0, 64: 20.0}))


def test_profile_that_comes_back_keeps_every_size():
    # an Accordion-like job that returns to its small batch: the sizes behind it stay
    bss, durs = [32, 64, 64, 64, 32, 32], [5.0, 20.0, 20.0, 20.0, 5.0, 5.0]
    f = forecast(view(bss, durs, done=3.5, run_time=50.0), ForecastState(1))
    assert f.remaining_s == pytest.approx(
        dirichlet_remaining_time(6, 3, {32: 1, 64: 3}, {32: 5.0, 64: 20.0}))
