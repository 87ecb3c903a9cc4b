"""Our documented batch-size adaptation patterns, used when a trace has no per-epoch profile.

The reference trace only says *that* a job adapts (`gns` or `accordion`); its per-epoch profile
file says *how*. Without that file we generate the pattern with these rules (deterministic, so a
trace always means the same workload):

- `static`: the initial batch size for every epoch.
- `accordion`: Accordion keeps a small batch during the "critical regime" at the start of
  training and uses a large one afterwards. The first `ceil(0.3 * E)` epochs keep the initial
  batch size; the rest use the largest size of the ladder that is at most 8x the initial one.
- `gns`: gradient-noise-scale driven training doubles the batch size as the noise scale grows.
  The batch size doubles (while the ladder has the doubled size) after 50 % and again after
  90 % of the epochs.
"""

from __future__ import annotations

import math
from typing import Sequence

ACCORDION_CRITICAL_FRACTION = 0.3
ACCORDION_MAX_FACTOR = 8
GNS_DOUBLING_POINTS = (0.5, 0.9)


def batch_size_schedule(mode: str, epochs: int, initial: int, ladder: Sequence[int]) -> list[int]:
    """Batch size of every epoch for a job of `epochs` epochs starting at `initial`."""
    if epochs <= 0:
        raise ValueError("a job needs at least one epoch")
    sizes = sorted(set(ladder) | {initial})
    if mode == "static":
        return [initial] * epochs
    if mode == "accordion":
        critical = math.ceil(ACCORDION_CRITICAL_FRACTION * epochs)
        large = max(b for b in sizes if b <= initial * ACCORDION_MAX_FACTOR)
        return [initial] * critical + [large] * (epochs - critical)
    if mode == "gns":
        schedule, bs = [], initial
        points = [math.floor(p * epochs) for p in GNS_DOUBLING_POINTS]
        for e in range(epochs):
            if e in points and bs * 2 in sizes:
                bs *= 2
            schedule.append(bs)
        return schedule
    raise ValueError(f"unknown adaptation mode '{mode}' (known: static, gns, accordion)")
