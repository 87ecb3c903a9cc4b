"""The one-second rule (`live/credentials.py`): a job stopped in the current wall-clock second
is not released onto a node it may share with where it ran until that second has passed."""

from __future__ import annotations

import pytest

from shockslurm.live.credentials import MARGIN_S, RecentDepartures


def _left(job_id: int = 7, at: float = 100.30, nodes=("gpu01",)) -> RecentDepartures:
    d = RecentDepartures()
    d.left({job_id: nodes}, at)
    return d


def test_unpinned_restart_in_the_same_second_waits_for_the_next():
    assert _left().wait_s([7], {}, 100.50) == pytest.approx(0.50 + MARGIN_S)


def test_restart_on_the_same_node_waits_but_another_node_does_not():
    assert _left().wait_s([7], {7: ("gpu01", "gpu02")}, 100.9) == pytest.approx(0.1 + MARGIN_S)
    assert _left().wait_s([7], {7: ("gpu03",)}, 100.9) == 0.0


def test_a_later_second_or_another_job_needs_no_wait():
    assert _left().wait_s([7], {}, 101.0 + MARGIN_S) == 0.0
    assert _left().wait_s([8], {}, 100.5) == 0.0


def test_unknown_old_nodes_wait_and_the_wait_is_bounded():
    d = _left(nodes=())
    assert d.wait_s([7], {7: ("gpu03",)}, 100.5) == pytest.approx(0.5 + MARGIN_S)
    assert 0 < _left(at=100.999).wait_s([7], {}, 99.0) <= 1.0 + MARGIN_S   # clock stepped back


def test_departures_are_forgotten_once_their_second_has_passed():
    d = _left()
    assert d.wait_s([7], {}, 102.0) == 0.0
    assert d.wait_s([7], {}, 100.5) == 0.0      # forgotten, even if asked with an older clock
