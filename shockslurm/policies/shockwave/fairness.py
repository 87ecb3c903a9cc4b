"""A job's finish-time fairness target: the time-weighted average of its estimates.

Every re-solve on an arrival or a completion gives each job a new estimate of its fair finish
time (`planner.Shockwave._resolve`); its target is the average of those estimates, each weighted
by the rounds it stayed the latest, blended with the latest by `momentum`. A long-lived job in a
busy cluster sees thousands of re-solves, so the estimates are not kept: `FairnessSeries` holds
running sums, constant in size and in the cost of a target, however many there were.
"""

from __future__ import annotations

import math


class FairnessSeries:
    """The estimates `(round, finish time)` of one job, added in round order, as the rounds'
    weighted sum of all but the latest, the latest, and the first round and estimate."""

    __slots__ = ("first_round", "first", "last_round", "last", "_closed", "_empty")

    def __init__(self) -> None:
        self.first_round = self.last_round = 0
        self.first = self.last = math.nan
        self._closed = 0.0      # sum of (rounds it stayed the latest) x estimate, all but the last
        self._empty = True

    def __bool__(self) -> bool:
        return not self._empty

    def add(self, round_index: int, estimate: float) -> None:
        """Record this round's estimate (rounds never go back)."""
        if self._empty:
            self._empty = False
            self.first_round, self.first = round_index, estimate
        else:
            self._closed = math.fsum((self._closed, (round_index - self.last_round) * self.last))
        self.last_round, self.last = round_index, estimate

    def target(self, now_round: int, momentum: float) -> float:
        """`momentum` x the estimates' average weighted by the rounds each stayed the latest (up
        to `now_round`; the first estimate alone while no round has passed) + (1 - `momentum`)
        x the latest."""
        span = now_round - self.first_round
        if span <= 0:
            average = self.first
        else:
            average = math.fsum((self._closed, (now_round - self.last_round) * self.last)) / span
        return momentum * average + (1.0 - momentum) * self.last
