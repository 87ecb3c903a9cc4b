"""The two policy contracts.

- `Policy` (in `engine`): a snapshot in, a `RoundPlan` (jobs that run this round) out. Shockwave
  and FIFO implement it directly.
- `AllocationPolicy`: Gavel's contract. Throughputs in, a *fractional* allocation out: for each
  active job the fraction of time it should hold its whole gang, with
  `sum(gang * fraction) <= gpus` and every fraction in [0, 1]. `GavelRounds` turns those fractions
  into whole-gang choices round by round.

Allocation policies may keep state between calls (Themis' isolated-time account, AlloX's
non-preemptive assignments); it lives on the policy object and is documented there.
"""

from __future__ import annotations

from typing import Mapping, Protocol, Sequence

import numpy as np

from ..model import JobView

Fractions = Mapping[int, float]


class AllocationPolicy(Protocol):
    name: str

    def fractions(self, jobs: Sequence[JobView], gpus: int, now: float) -> dict[int, float]:
        """Time fraction in [0, 1] for every job in `jobs` (keyed by job id)."""


def clip_fractions(job_ids: Sequence[int], values: np.ndarray | None) -> dict[int, float]:
    """Solver output -> fractions clipped to [0, 1] (solvers return tiny negatives and 1+eps)."""
    if values is None:
        return {j: 0.0 for j in job_ids}
    flat = np.clip(np.asarray(values, dtype=float).reshape(-1), 0.0, 1.0)
    return {j: float(v) for j, v in zip(job_ids, flat)}
