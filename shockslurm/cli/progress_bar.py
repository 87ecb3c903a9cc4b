"""A progress line on a terminal (stderr) that appears only once a run has taken a couple of seconds."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class DelayedProgress:
    """Call with the fraction done; draws `label [#####     ] 42%` after `delay_s` seconds."""

    def __init__(self, label: str, *, delay_s: float = 2.0, stream: TextIO | None = None,
                 width: int = 30) -> None:
        self.label = label
        self.delay_s = delay_s
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self._t0 = time.monotonic()
        self._drawn = False
        self._last = -1

    def __call__(self, fraction: float) -> None:
        if not self.stream.isatty() or time.monotonic() - self._t0 < self.delay_s:
            return
        pct = int(max(0.0, min(1.0, fraction)) * 100)
        if pct == self._last:
            return
        self._last = pct
        filled = pct * self.width // 100
        self.stream.write(f"\r{self.label} [{'#' * filled}{' ' * (self.width - filled)}] {pct:3d}%")
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
