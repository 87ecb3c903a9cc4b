"""When the daemon's rounds start, with the wall clock stepped or a round held up (`pacing`):
the waits run on the monotonic clock, and a round that starts off its boundary's rhythm is its
own boundary. The runner of `test_event_rounds` (fake backend, real SQLite store), its wall
clock `offset` seconds from its monotonic one; polling is off, so each wait is one whole wait."""

from __future__ import annotations

import logging

from . import test_crash_safety as cs
from .test_crash_safety import engine  # noqa: F401 (a fixture)
from .test_event_rounds import ROUND_S, _full_cluster, _runner

HOUR = 3600.0


class SteppedClock:
    """The wall clock: the monotonic time `t[0]` plus `offset[0]`."""

    def __init__(self, t: list[float], offset: list[float]) -> None:
        self.t, self.offset = t, offset

    def now(self) -> float:
        return self.t[0] + self.offset[0]

    def sleep_until(self, t: float) -> None:
        raise AssertionError("the runner waits on its wake-up, never on the clock")


def _starts(engine, step_s: float = 0.0, first_round_s: float = 0.0, rounds: int = 3):
    """The monotonic start of each round, and the runner: the wall clock steps by `step_s`
    10 s into the first wait; the first round takes `first_round_s`."""
    offset = [0.0]

    def at(now: float) -> None:
        if now >= cs.NOW + 10:
            offset[0] = step_s
    runner, t, _ = _runner(engine, _full_cluster(), at, event_poll_seconds=0)
    runner.daemon.loop.clock = SteppedClock(t, offset)
    starts: list[float] = []
    attempt = runner.attempt

    def timed():
        starts.append(t[0])
        if len(starts) == 1:
            t[0] += first_round_s
        return attempt()
    runner.attempt = timed                   # type: ignore[method-assign]
    assert runner.run(max_rounds=rounds) == rounds
    return starts, runner


def test_a_wall_clock_stepped_back_holds_no_round_back(engine, caplog):
    caplog.set_level(logging.WARNING, "shockslurm.daemon")
    starts, runner = _starts(engine, step_s=-HOUR)
    assert starts == [cs.NOW, cs.NOW + ROUND_S, cs.NOW + 2 * ROUND_S]
    # the second round (an hour before its boundary on the wall clock) counts from itself
    assert runner.boundary == cs.NOW + 2 * ROUND_S - HOUR
    assert [r.message for r in caplog.records if "off its boundary" in r.message] == [
        "this round starts -3600.0 s off its boundary (the wall clock stepped, or the daemon "
        "was held up); the next boundaries count from it"]


def test_a_wall_clock_stepped_forward_runs_no_rounds_back_to_back(engine):
    starts, runner = _starts(engine, step_s=HOUR)
    assert starts == [cs.NOW, cs.NOW + ROUND_S, cs.NOW + 2 * ROUND_S]
    assert runner.boundary == cs.NOW + 2 * ROUND_S + HOUR


def test_a_round_longer_than_two_rounds_is_followed_by_one_round_not_a_catch_up(engine):
    starts, runner = _starts(engine, first_round_s=70.0)
    assert starts == [cs.NOW, cs.NOW + 70, cs.NOW + 70 + ROUND_S]


def test_a_round_late_by_less_than_a_round_keeps_the_rhythm(engine, caplog):
    caplog.set_level(logging.WARNING, "shockslurm.daemon")
    starts, runner = _starts(engine, first_round_s=40.0)
    assert starts == [cs.NOW, cs.NOW + 40, cs.NOW + 2 * ROUND_S]
    assert runner.boundary == cs.NOW + 2 * ROUND_S
    assert not [r for r in caplog.records if "off its boundary" in r.message]
