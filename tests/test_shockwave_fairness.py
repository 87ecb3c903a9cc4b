"""A job's fairness target from its running sums (`FairnessSeries`) is the time-weighted average
of every estimate it had, computed from the whole list as the planner did until 2026-11-30,
and the series stays the same size however many re-solves a long-lived job sees."""

from __future__ import annotations

import math
import sys

from hypothesis import given, strategies as st

from shockslurm.policies.shockwave.fairness import FairnessSeries


def target_from_list(series: list[tuple[int, float]], now_round: int, momentum: float) -> float:
    """The definition: each estimate weighted by the rounds it stayed the latest (the first
    alone while no round has passed), blended with the latest."""
    rounds = [r for r, _ in series] + [now_round]
    gaps = [b - a for a, b in zip(rounds, rounds[1:])]
    span = sum(gaps)
    average = (series[0][1] if span <= 0
               else math.fsum(g * f for g, (_, f) in zip(gaps, series)) / span)
    return momentum * average + (1.0 - momentum) * series[-1][1]


estimates = st.lists(st.tuples(st.integers(0, 50), st.floats(1.0, 1e7)), min_size=1, max_size=40)


@given(estimates, st.integers(0, 50), st.floats(0.0, 1.0))
def test_the_running_target_is_the_lists_weighted_average(steps, extra, momentum):
    series: list[tuple[int, float]] = []
    running = FairnessSeries()
    assert not running
    round_index = 0
    for gap, estimate in steps:
        round_index += gap
        series.append((round_index, estimate))
        running.add(round_index, estimate)
        assert running
        now = round_index + extra
        assert math.isclose(running.target(now, momentum),
                            target_from_list(series, now, momentum), rel_tol=1e-12)


def test_a_series_keeps_its_size_through_many_re_solves():
    running = FairnessSeries()
    running.add(0, 100.0)
    size = sys.getsizeof(running)
    for r in range(1, 20_000):
        running.add(r, 100.0 + r % 7)
    assert sys.getsizeof(running) == size
    assert not hasattr(running, "__dict__")
    assert 100.0 < running.target(20_000, 0.9) < 107.0


def test_a_nan_estimate_is_kept_as_one():
    running = FairnessSeries()
    running.add(0, math.nan)
    assert running and math.isnan(running.target(3, 0.5))


def test_a_single_estimate_is_its_own_target():
    running = FairnessSeries()
    running.add(5, 1234.5)
    assert running.target(5, 0.9) == 1234.5
    assert running.target(9, 0.9) == 1234.5
