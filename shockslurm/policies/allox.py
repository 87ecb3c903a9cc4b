"""AlloX (alpha = 0.2), the "allox" baseline: min-cost matching of jobs to positions on workers.

Reproduces the reference's behaviour, quirks included:
- state ``prev_alloc``: a job whose previous fraction is exactly 1.0 is *fixed* (non-preemptive) and
  reserves one worker. Assigned jobs get ``1/sf``, so only 1-GPU jobs are ever fixed; a gang keeps
  its copied ``1/sf`` even when not re-picked and takes a single slot in the matching, so the
  capacity accounting is loose (the round scheduler's packing decides what really runs).
- candidates: the non-fixed jobs, oldest arrival first (stable), cut to
  ``max(int(alpha * count), free_workers)``.
- cost ``Q = [1 p | 2 p | ... | m p] + D`` with ``p[i, w] = R_i / T_i`` and ``D[i, :] = A_i``; D is a
  per-row constant that cannot change the optimum, but it is kept (added as the reference adds
  it), with the same column order, so scipy's ``linear_sum_assignment`` breaks the many ties
  exactly as in the reference.
- on each worker the job with the largest multiplier block runs first and gets ``1/sf``.

The cost matrix has ``m x n m`` entries (m candidates, n free workers): 2,048 of each at 5,000
jobs on 2,048 GPUs would take 69 GB. Above ``MATCHING_MAX_CELLS`` the optimum is read off the
program's structure instead. The workers are identical and a job's cost grows with its
multiplier, so an optimal matching gives the largest multipliers to the shortest jobs, and the
jobs that run first on their worker are then the ``n`` shortest (all ``m`` when ``m <= n``).
Which of several equally good matchings scipy picks is a tie only it decides: where they differ,
this path takes the shortest jobs, earlier candidates first among equal ones.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from scipy.optimize import linear_sum_assignment

from ..model import JobView

MATCHING_MAX_CELLS = 150_000_000
"""Largest cost matrix (entries; 1.2 GB of float64) built for scipy's matching: every size of
`bench quality` up to 2,000 jobs on 512 GPUs stays on it."""


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
            chosen = (self._first_on_each_worker(unalloc, since, n, by_id)
                      if m * n * m <= MATCHING_MAX_CELLS else self._shortest(unalloc, n, by_id))
            for jid in chosen:
                alloc[jid] = 1.0 / by_id[jid].gang_size
        self.prev_alloc = dict(alloc)
        return alloc

    @staticmethod
    def _time_left(cands: list[int], by_id: dict[int, JobView]) -> np.ndarray:
        """Each candidate's remaining iterations over its throughput (the matching's `R/T`)."""
        rem = np.array([float(by_id[j].remaining_iterations) for j in cands])
        thr = np.array([float(by_id[j].iterations_per_s) for j in cands])
        thr[thr == 0] = 1e-10
        left: np.ndarray = rem / thr
        return left

    @classmethod
    def _shortest(cls, cands: list[int], n: int, by_id: dict[int, JobView]) -> list[int]:
        """The matching's first job on each worker, from its structure (module docstring): the
        `n` candidates with the least time left, earlier candidates first among equals."""
        order = np.argsort(cls._time_left(cands, by_id), kind="stable")[:n]
        return [cands[int(i)] for i in order]

    @classmethod
    def _first_on_each_worker(cls, cands: list[int], since: dict[int, float], n: int,
                              by_id: dict[int, JobView]) -> list[int]:
        m = len(cands)
        left = cls._time_left(cands, by_id)[:, None]       # the same on every worker
        cost = np.empty((m, n * m))                          # built in place: one matrix
        for k in range(m):
            cost[:, k * n:(k + 1) * n] = (k + 1) * left
        cost += np.array([since[j] for j in cands])[:, None]
        rows, cols = linear_sum_assignment(cost)
        per_worker: dict[int, list[tuple[int, int]]] = {}
        for r, c in zip(rows, cols):
            per_worker.setdefault(int(c) % n, []).append((cands[r], int(c) // n))
        # The largest multiplier block is the earliest position in execution order.
        return [max(entries, key=lambda e: e[1])[0] for _, entries in sorted(per_worker.items())]
