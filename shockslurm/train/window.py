"""`ThroughputWindow`: the samples/s a training loop reports, measured over its training time.

The scheduler takes a job's reported rate as its speed at that batch size, so time that is not
training is left out of the window: a checkpoint being written (`excluding`, the write's time
on the window's own clock) and the loop's own code between epochs (`idle`, at the next epoch's
start: evaluation, LR schedulers). The window runs on over epochs otherwise, so epochs shorter
than the report interval are reported too; a new batch size starts a new window (`reset`), so a
rate is never of two batch sizes. A plain loop's window (`ShockTrainer` without `epochs()` or
`batches()`) begins at its first step, which is not counted: what came before it (the model and
data set up, a checkpoint loaded, the first step's warm-up) is no training time. No torch here.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Callable, Iterator


class ThroughputWindow:
    """Samples counted over training time; a rate (samples/s) once it has lasted `interval_s`."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.perf_counter, *,
                 begin_at_first_step: bool = False) -> None:
        self.interval_s = interval_s
        self.clock = clock
        self.start = self.last = clock()     # the window's start; the last step counted
        self.samples = 0
        # False until the first step (or `idle`, `reset`) when it begins there
        self.begun = not begin_at_first_step

    def reset(self) -> None:
        """Start a new, empty window now."""
        self.start = self.last = self.clock()
        self.samples = 0
        self.begun = True

    def add(self, samples: int) -> float | None:
        """Count a step's `samples`. Once the window has lasted `interval_s`: its rate, and a new
        window starts; else None."""
        now = self.clock()
        if not self.begun:           # this step's time began with the process: not counted
            self.start = self.last = now
            self.begun = True
            return None
        self.samples += samples
        self.last = now
        elapsed = now - self.start
        if elapsed <= 0 or elapsed < self.interval_s:
            return None
        rate = self.samples / elapsed
        self.start, self.samples = now, 0
        return rate

    def exclude(self, seconds: float) -> None:
        """Leave out `seconds` spent since the last step on something else (a checkpoint)."""
        seconds = max(0.0, seconds)
        self.start += seconds
        self.last += seconds

    @contextmanager
    def excluding(self) -> Iterator[None]:
        """Leave out the time the `with` body takes (a checkpoint's write), on `clock`."""
        began = self.clock()
        try:
            yield
        finally:
            self.exclude(self.clock() - began)

    def idle(self) -> None:
        """Leave out the time since the last step (or the window's start, less what was
        excluded already): the loop was not training (between epochs). A window not begun
        begins now."""
        if not self.begun:
            self.reset()
            return
        self.exclude(self.clock() - self.last)
