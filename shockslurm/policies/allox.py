"""AlloX (alpha = 0.2), the "allox" baseline: min-cost matching of jobs to positions on workers.

Reproduces the reference's behaviour, quirks included:
- state ``prev_alloc``: a job whose previous fraction is exactly 1.0 is *fixed* (non-preemptive) and
  reserves one worker. Assigned jobs get ``1/sf``, so only 1-GPU jobs are ever fixed; a gang keeps
  its copied ``1/sf`` even when not re-picked and takes a single slot in the matching, so the
  capacity accounting is loose (the round scheduler's packing decides what really runs).
- candidates: the non-fixed jobs, oldest arrival first (stable), cut to
  ``max(int(alpha * count), free_workers)``.
- cost ``Q = [1 p | 2 p | ... | m p] + D`` with ``p[i, w] = R_i / T_i`` and ``D[i, :] = A_i``; D is a
  per-row constant that cannot change the optimum, but it is kept, with the same column order, so
  scipy's ``linear_sum_assignment`` breaks the many ties exactly as in the reference.
- on each worker the job with the largest multiplier block runs first and gets ``1/sf``.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from scipy.optimize import linear_sum_assignment

from ..model import JobView


class AlloX:
    """Shortest-remaining-time-style assignment with non-preemptive 1-GPU jobs."""

    name = "allox"

    def __init__(self, alpha: float = 0.2) -> None:
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 <= alpha <= 1:
            raise ValueError(f"alpha must be a number in [0, 1], got {alpha!r}")
        self.alpha = float(alpha)
        self.prev_alloc: dict[int, float] = {}

    def fractions(self, jobs: Sequence[JobView], gpus: int, now: float) -> dict[int, float]:
        by_id = {j.job_id: j for j in sorted(jobs, key=lambda j: j.job_id)}
        unalloc: list[int] = []
        fixed: list[int] = []
        for jid in by_id:
            if jid in self.prev_alloc and self.prev_alloc[jid] == 1.0:  # exact, as the reference
                fixed.append(jid)
            else:
                unalloc.append(jid)

        n = max(0, gpus - len(fixed))  # one slot per fixed job
        since = {jid: now - by_id[jid].arrival_s for jid in by_id}
        unalloc.sort(key=lambda jid: -since[jid])  # stable: ties keep job-id order
        unalloc = unalloc[: max(int(self.alpha * len(unalloc)), n)]
        m = len(unalloc)

        alloc = {jid: self.prev_alloc.get(jid, 0.0) for jid in by_id}
        if m > 0 and n > 0:
            for _w, jid in self._first_on_each_worker(unalloc, since, n, by_id):
                alloc[jid] = 1.0 / by_id[jid].gang_size
        self.prev_alloc = dict(alloc)
        return alloc

    @staticmethod
    def _first_on_each_worker(cands: list[int], since: dict[int, float], n: int,
                              by_id: dict[int, JobView]) -> list[tuple[int, int]]:
        m = len(cands)
        rem = np.array([float(by_id[j].remaining_iterations) for j in cands])
        thr = np.array([float(by_id[j].iterations_per_s) for j in cands])
        thr[thr == 0] = 1e-10
        p = np.repeat((rem / thr)[:, None], n, axis=1)           # m x n, identical workers
        q = np.concatenate([(k + 1) * p for k in range(m)], axis=1)
        d = np.repeat(np.array([since[j] for j in cands])[:, None], n * m, axis=1)
        rows, cols = linear_sum_assignment(q + d)
        per_worker: dict[int, list[tuple[int, int]]] = {}
        for r, c in zip(rows, cols):
            per_worker.setdefault(int(c) % n, []).append((cands[r], int(c) // n))
        # The largest multiplier block is the earliest position in execution order.
        return [(w, max(entries, key=lambda e: e[1])[0]) for w, entries in sorted(per_worker.items())]
