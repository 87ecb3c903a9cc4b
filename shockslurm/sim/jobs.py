"""A simulated job: iteration-accurate progress across rounds, batch-size changes included.

Progress is counted in iterations at the current batch size, as the reference simulator does:
a round of `L` seconds runs `int(throughput * L)` iterations (capped by what remains) and a
batch-size change rescales the counts so that the epoch count is preserved.

Two adaptation modes say *when* the batch size changes:
- `profile` (default): the job follows its declared per-epoch schedule; the change happens at
  the epoch boundary, within the run, as a job that follows its schedule does it live (the
  run's work is a sequence of segments, one per batch size: `plan_run`).
- `reference`: the reference simulator's own rules (`reference_rules`), with its one-run lag and
  its rounding up of the epoch in progress. Use it to compare with the reference's numbers.
"""

from __future__ import annotations

import copy
import math
from bisect import bisect_right
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Mapping

from ..model import JobSpec, RunLength, runs_of
from . import reference_rules

ADAPTATION_MODES = ("profile", "reference")


Segment = tuple[int, int]
"""(batch size, iterations) of one stretch of a run at one batch size."""


@dataclass(frozen=True)
class Run:
    """The work of one dispatch: its segments in order (more than one only where the job's
    schedule changes its batch size during the run, profile mode) and the seconds they take."""

    segments: tuple[Segment, ...]
    seconds: float
    completes: bool = False          # the job has no work left after it

    def within(self, seconds: float, throughput: Mapping[int, float]) -> "Run":
        """The part of this run done in its first `seconds` (whole iterations)."""
        out: list[Segment] = []
        left = seconds
        for bs, n in self.segments:
            take = n if n / throughput[bs] <= left else min(n, int(throughput[bs] * left))
            if take > 0:
                out.append((bs, take))
            left -= take / throughput[bs]
            if take < n or left <= 0:
                break
        return Run(tuple(out), seconds - max(0.0, left),
                   self.completes and tuple(out) == self.segments)


@dataclass
class SimJob:
    spec: JobSpec
    adaptation: str = "profile"
    batch_size: int = 0
    total_iterations: int = 0
    iterations_done: int = 0
    run_time_s: float = 0.0           # useful seconds on GPUs (after restart overheads)
    completion_s: float | None = None
    pending_bs: int | None = None     # reference mode: flagged change, applied after next run
    safety_net: bool = True           # the reference's end at 1.5x the exclusive time
    observed_batch_sizes: RunLength = RunLength()     # run-length: O(changes) per epoch
    batch_size_changes: list[tuple[float, int, int]] = field(default_factory=list)
    # Derived once from the (frozen) spec, so that a round costs the same at epoch 10 as at
    # epoch 10**6: the profile's exclusive run time (a sum over every epoch) and its schedule as
    # runs of one batch size (first epoch of each run, and its batch size).
    _exclusive_s: float = field(default=0.0, init=False, repr=False, compare=False)
    _run_starts: tuple[int, ...] = field(default=(), init=False, repr=False, compare=False)
    _run_sizes: tuple[int, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.adaptation not in ADAPTATION_MODES:
            raise ValueError(f"unknown adaptation mode '{self.adaptation}' "
                             f"(known: {', '.join(ADAPTATION_MODES)})")
        self.batch_size = self.spec.initial_batch_size
        self.total_iterations = self.spec.iterations
        self._exclusive_s = self.spec.exclusive_runtime_s
        runs = runs_of(self.spec.batch_sizes)
        self._run_sizes = tuple(bs for bs, _ in runs)
        self._run_starts = tuple(accumulate((n for _, n in runs[:-1]), initial=0))

    # ------------------------------------------------------------------ derived quantities
    @property
    def iterations_per_epoch(self) -> int:
        return self.spec.iterations_per_epoch(self.batch_size)

    @property
    def throughput(self) -> float:
        return self.spec.throughput[self.batch_size]

    @property
    def remaining_iterations(self) -> int:
        return self.total_iterations - self.iterations_done

    @property
    def epochs_done(self) -> float:
        return min(self.iterations_done / self.iterations_per_epoch, float(self.spec.num_epochs))

    @property
    def done(self) -> bool:
        return self.completion_s is not None

    @property
    def exclusive_runtime_s(self) -> float:
        """The spec's exclusive run time (`JobSpec.exclusive_runtime_s`), summed once."""
        return self._exclusive_s

    # ------------------------------------------------------------------ a round of work
    def iterations_for(self, seconds: float) -> int:
        """Iterations the job may run at its current batch size in `seconds`."""
        return max(0, min(int(self.throughput * seconds), self.remaining_iterations))

    def plan_run(self, seconds: float) -> Run:
        """The work the job does in a run of `seconds`: in reference mode one segment at its
        batch size; in profile mode up to each epoch boundary where its schedule changes the
        batch size, then on at the new one (the job itself is not changed)."""
        if self.adaptation == "reference":
            n = self.iterations_for(seconds)
            return Run(((self.batch_size, n),), n / self.throughput,
                       n >= self.remaining_iterations)
        job = copy.copy(self)
        job.batch_size_changes = []
        segments: list[Segment] = []
        left = seconds
        while left > 0 and job.remaining_iterations > 0:
            n = min(job.iterations_for(left), job._iterations_to_change())
            if n <= 0:
                break
            segments.append((job.batch_size, n))
            left -= n / job.throughput
            job._advance(n, 0.0)
        return Run(tuple(segments), seconds - max(0.0, left), job.remaining_iterations <= 0)

    def _iterations_to_change(self) -> int:
        """Iterations at the current batch size until the schedule wants another (profile mode;
        the remaining iterations when it never does)."""
        # The first epoch after the current one whose batch size differs from the current batch
        # size: found among the schedule's runs of equal batch sizes (O(log runs), where a scan
        # of the epochs made a long job's simulation quadratic).
        start = int(self.epochs_done) + 1
        if start >= self.spec.num_epochs:
            return self.remaining_iterations
        run = bisect_right(self._run_starts, start) - 1
        if self._run_sizes[run] != self.batch_size:
            epoch = start
        elif run + 1 < len(self._run_starts):
            epoch = self._run_starts[run + 1]     # neighbouring runs differ in batch size
        else:
            return self.remaining_iterations
        return max(1, epoch * self.iterations_per_epoch - self.iterations_done)

    def record_run(self, iterations: int | Run, exec_s: float, end_s: float) -> None:
        """Account a finished run (its iterations at the current batch size, or a `Run`'s
        segments) that held the GPUs usefully for `exec_s`."""
        segments = (iterations.segments if isinstance(iterations, Run)
                    else ((self.batch_size, iterations),))
        self.run_time_s += exec_s
        # each segment ends when the ones after it have run (a switch is logged then)
        after = [n / self.spec.throughput[bs] for bs, n in segments]
        for k, (_, n) in enumerate(segments):
            last = k == len(segments) - 1
            at = end_s - sum(after[k + 1:])
            if self._advance(n, at, switch=last or self.adaptation != "reference"):
                if not last:
                    self.completion_s = end_s
                return

    def _advance(self, iterations: int, end_s: float, *, switch: bool = True) -> bool:
        """Add `iterations` at the current batch size, then (with `switch`) change the batch
        size where the mode says; True when the job is complete."""
        before = self.epochs_done
        self.iterations_done += iterations
        finished_epochs = int(self.epochs_done) - int(before)
        if finished_epochs > 0:
            self.observed_batch_sizes = self.observed_batch_sizes.extended(self.batch_size,
                                                                           finished_epochs)
        if self.remaining_iterations <= 0 or self.over_deadline():
            self.completion_s = end_s
            return True
        if not switch:
            return False
        if self.adaptation == "reference":
            if self.pending_bs is not None:
                self._switch(self.pending_bs, end_s, keep_partial=False)
                self.pending_bs = None
                if self.remaining_iterations <= 0:   # the switch's rounding-up ended the job
                    self.completion_s = end_s
                    return True
        else:
            epoch = min(int(self.epochs_done), self.spec.num_epochs - 1)
            wanted = self.spec.batch_sizes[epoch]
            if wanted != self.batch_size:
                self._switch(wanted, end_s, keep_partial=True)
        return False

    def over_deadline(self) -> bool:
        """The reference ends a job that has run 1.5x its whole exclusive time (a safety net,
        unless `safety_net` is off)."""
        return self.safety_net and self.run_time_s > int(int(self._exclusive_s) * 1.5)

    def update_flags(self) -> None:
        """Reference mode: ask the reference's rule whether a change is wanted (after a round)."""
        if self.adaptation != "reference" or self.pending_bs is not None:
            return
        s = self.spec
        wanted = reference_rules.wanted_change(s.mode, s.model, s.initial_batch_size, s.gang_size,
                                               self.batch_size, self.iterations_done,
                                               s.samples_per_epoch)
        if wanted is None:
            return
        if not reference_rules.change_allowed(s.model, s.initial_batch_size):
            return
        if wanted in s.throughput:
            self.pending_bs = wanted

    def _switch(self, new_bs: int, now: float, *, keep_partial: bool) -> None:
        """Change batch size, rescaling iteration counts so that the epoch count is preserved.

        `keep_partial` keeps the exact fraction of the epoch in progress; without it the epoch in
        progress counts as complete (the reference simulator's rounding up).
        """
        old_ipe, new_ipe = self.iterations_per_epoch, self.spec.iterations_per_epoch(new_bs)
        epochs_total = math.ceil(self.total_iterations / old_ipe)
        scaled = math.ceil(self.total_iterations * self.batch_size / new_bs)
        if math.ceil(scaled / new_ipe) != epochs_total:
            scaled = new_ipe * epochs_total
        if keep_partial:
            done = round(self.iterations_done / old_ipe * new_ipe)
        else:
            done = math.ceil(self.iterations_done / old_ipe) * new_ipe
        self.batch_size_changes.append((now, self.batch_size, new_bs))
        self.batch_size, self.total_iterations, self.iterations_done = new_bs, scaled, done
