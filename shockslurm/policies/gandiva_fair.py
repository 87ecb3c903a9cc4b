"""Gandiva-fair as the reference runs it (its *proportional* variant): ``x_i = min(1, G/m)``.

The reference computes ``G/m`` per job and normalises each row by ``max(row_sum, 1)``; with one GPU
type that is ``min(1, G/m)`` for every job, and the gang size is ignored (a gang gets the same *time*
fraction as a 1-GPU job, unlike max-min fairness). So the sum of ``sf_i x_i`` can exceed ``G`` when
gangs are present; we reproduce that rather than "fix" it, the round scheduler packs what fits.
"""

from __future__ import annotations

from typing import Sequence

from ..model import JobView


class GandivaFair:
    """Equal time fraction for every active job, no solver and no state."""

    name = "gandiva_fair"

    def fractions(self, jobs: Sequence[JobView], gpus: int, now: float) -> dict[int, float]:
        if not jobs:
            return {}
        share = min(1.0, gpus / len(jobs))
        return {j.job_id: share for j in sorted(jobs, key=lambda j: j.job_id)}
