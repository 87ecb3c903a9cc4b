"""The Shockwave forecaster: Bayesian (Dirichlet) forecast of a job's remaining run time under
dynamic batch-size adaptation, the past-average epoch duration and throughput calibration.

Everything here is a pure function of a `JobView` plus a small per-job `ForecastState` (the
persistent calibration factor). Units: seconds and epochs.

Behaviour (see shared/design/SHOCKWAVE.md, "The predictor"):

- Profiled epoch durations are taken as declared (at least `MIN_EPOCH_S`, as every duration
  divides), then multiplied by the job's calibration factor (1 until calibration fires). The
  reference keeps them in whole seconds, at least 1 s; that made every epoch of a job whose
  epochs last about a second (the reference-like workloads' Recommendation jobs: 1.15 s, forecast
  1 s) or a few seconds (a time-scaled live workload) up to a third shorter or longer than
  declared, and a job's forecast as wrong. Exact durations: `docs/shockwave.md`, "Exact epoch
  durations".
- Observations: the batch size of every completed epoch (`observed_batch_sizes`) plus the current
  batch size for the epoch in progress, i.e. `e + 1` observations for `e = floor(epochs_done)`.
  (The reference reads these from the profile; we use what the job actually did.)
- Support: every batch size of the profile plus every observed one. Prior: uniform Dirichlet with
  total concentration `E`; posterior adds one count per observation.
- `remaining_time`: `Ehat_b = E * post_b / sum(post)`, minus one per observation at b while
  `Ehat_b >= 1`, `R = sum_b Ehat_b * d_b * (E - e) / max(E - e, floor(sum_b Ehat_b + 1))` with
  `d_b` the mean (calibrated) profiled duration of the epochs at b. A finished job forecasts 1 s.
  Like the reference, the forecast covers the epochs *after* the one in progress.
- A profile that never lowers its batch size (`ProfileSummary.rises_only`: the reference's GNS
  jobs, and Accordion jobs that leave their critical regime for good) forecasts over the batch
  sizes at or above the current one only: support, prior and observations alike. The reference
  keeps the batch sizes such a job has left behind in its forecast, so a job that grows its
  batch keeps expecting epochs at the sizes it will not return to (at the reference-like
  workloads' Recommendation jobs, the smaller and faster ones: forecasts about 10 % short for
  the whole job). Measured: `docs/shockwave.md`, "Forecasts over the batch sizes ahead".
- `Forecast.mean_epoch_s` (dbar): mean of the calibrated profile durations of epochs `0..e`
  (the epoch in progress included).
- Calibration: the job's own history since its arrival, once it has done at least one whole
  epoch. In `run_time_s` seconds of exclusive running the profile says it would have completed
  `prof` epochs (walking the profiled durations from epoch 0), the profile scaled by the current
  factor `expect` epochs; it actually completed `meas = epochs_done`. If `|meas - expect| /
  expect > 0.4` every profiled duration is scaled by `prof / meas`; otherwise the factor stays.
  The reference compares with the unscaled profile (`prof`), so a factor, once set, stays
  while the job runs within 40 % of its profile, however far that is from the factor; and it
  calibrates from the first fraction of an epoch. Live, a job's first seconds are start-up and
  report lag: the first reports of the live benchmark's jobs said a third of the profile's
  pace, and the factor of about 3 stayed while the job ran at 0.7-1.2x its profile (job 4's
  forecast 298 s for a 109 s job, still 185 s at epoch 11 of 30). 120-job trace, measured
  2026-11-28: makespan 24,387 s -> 23,527 s (avg JCT 8,269 -> 8,277 s, worst rho 1.12 ->
  1.10); the quality matrix (120/32-900/256, 5 seeds) and the live benchmark's simulated
  family do not move. The reference also extrapolates from simulation round 0 (a quirk that
  mis-measures late arrivals); we do not reproduce that.
- Batch sizes with no profiled duration (e.g. observed but not profiled): the epoch duration is
  `samples / bs / throughput(bs)`. Throughput in iterations/s is interpolated linearly in
  log-log between the known batch sizes (profiled ones, where it is `(samples/bs)/d_bs`, and the
  current batch size, measured); outside the known range it is extrapolated with the slope of the
  nearest segment clamped to [-1, 0] (iterations/s never rises with the batch size, samples/s
  never falls). With a single known batch size the slope is -1: samples/s is assumed constant,
  so the duration equals the known one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from .model import JobView, runs_of

CALIBRATION_TOLERANCE = 0.4
FINISHED_FORECAST_S = 1.0
MIN_EPOCH_S = 1e-3     # a profiled epoch shorter than this counts as this long


@dataclass
class ProfileSummary:
    """Per-job constants derived once from the profile, kept per run of equal (batch size,
    duration) epochs, so their size is the number of runs, not of epochs (a live job's
    profile is one run however many epochs it declares)."""

    ends: np.ndarray             # ends[k]: epochs up to the end of run k
    cum: np.ndarray              # cum[k]: profiled seconds up to the end of run k
    durations: np.ndarray        # durations[k]: profiled seconds of each epoch of run k
    by_bs: dict[int, tuple[float, int]]   # batch size -> (sum of durations, epochs)
    rises_only: bool = False     # several batch sizes, and none lower than the one before

    @classmethod
    def of(cls, view: JobView) -> "ProfileSummary":
        runs = _joint_runs(runs_of(view.profile_batch_sizes),
                           runs_of(view.profile_epoch_durations))
        by: dict[int, tuple[float, int]] = {}
        for b, d, n in runs:
            total, count = by.get(b, (0.0, 0))
            by[b] = (total + d * n, count + n)
        counts = np.array([n for _, _, n in runs], dtype=np.int64)
        durations = np.array([d for _, d, _ in runs], dtype=float)
        sizes = [b for b, _, _ in runs]
        rises = len(set(sizes)) > 1 and all(a <= b for a, b in zip(sizes, sizes[1:]))
        return cls(np.cumsum(counts), np.cumsum(durations * counts), durations, by, rises)

    def prefix_s(self, epochs: int) -> float:
        """Profiled seconds of the first `epochs` epochs (0 <= epochs <= E)."""
        if epochs <= 0 or len(self.ends) == 0:
            return 0.0
        k = int(np.searchsorted(self.ends, epochs, side="left"))
        if k >= len(self.ends):
            return float(self.cum[-1])
        before_e, before_s = (int(self.ends[k - 1]), float(self.cum[k - 1])) if k else (0, 0.0)
        return before_s + (epochs - before_e) * float(self.durations[k])

    def epochs_in(self, seconds: float) -> float:
        """Epochs the profile completes in `seconds` of exclusive running from epoch
        0, past its end at the last epoch's duration (the profile must not be empty)."""
        k = int(np.searchsorted(self.cum, seconds, side="right"))
        if k >= len(self.cum):
            return float(self.ends[-1]) + (seconds - float(self.cum[-1])) / float(
                self.durations[-1])
        before_e, before_s = (int(self.ends[k - 1]), float(self.cum[k - 1])) if k else (0, 0.0)
        return before_e + (seconds - before_s) / float(self.durations[k])


def _joint_runs(bs_runs: Sequence[tuple[int, int]], d_runs: Sequence[tuple[float, int]]
                ) -> list[tuple[int, float, int]]:
    """Runs (batch size, duration, epochs) of two run-length sequences of equal length
    (the profile's batch sizes and durations)."""
    out: list[tuple[int, float, int]] = []
    i = j = 0
    left_b = bs_runs[0][1] if bs_runs else 0
    left_d = d_runs[0][1] if d_runs else 0
    while i < len(bs_runs) and j < len(d_runs):
        n = min(left_b, left_d)
        b, d = int(bs_runs[i][0]), epoch_duration(d_runs[j][0])
        if out and out[-1][0] == b and out[-1][1] == d:
            out[-1] = (b, d, out[-1][2] + n)
        else:
            out.append((b, d, n))
        left_b, left_d = left_b - n, left_d - n
        if left_b == 0:
            i += 1
            left_b = bs_runs[i][1] if i < len(bs_runs) else 0
        if left_d == 0:
            j += 1
            left_d = d_runs[j][1] if j < len(d_runs) else 0
    return out


@dataclass
class ForecastState:
    """What the forecaster remembers about one job between rounds."""

    job_id: int
    calibration: float = 1.0      # multiplier on the profiled epoch durations
    calibrations: int = 0         # how many times calibration fired
    profile: ProfileSummary | None = None
    obs_seen: int = 0             # observed epochs already counted
    obs_counts: dict[int, int] = field(default_factory=dict)

    def summary(self, view: JobView) -> ProfileSummary:
        if self.profile is None:
            self.profile = ProfileSummary.of(view)
        return self.profile

    def counts(self, view: JobView, e: int) -> dict[int, int]:
        """Counts of the batch sizes of completed epochs 0..e-1 (incremental)."""
        obs = view.observed_batch_sizes
        if len(obs) < self.obs_seen:          # history rewritten: recount
            self.obs_seen, self.obs_counts = 0, {}
        for b, n in runs_of(obs[self.obs_seen:]):
            self.obs_counts[int(b)] = self.obs_counts.get(int(b), 0) + n
        self.obs_seen = len(obs)
        if len(obs) <= e:
            return dict(self.obs_counts)
        c = dict(self.obs_counts)             # more history than whole epochs: trim the tail
        for b, n in runs_of(obs[e:]):
            c[int(b)] -= n
        return c


# ---------------------------------------------------------------------------------- durations
def epoch_duration(declared: float) -> float:
    """A profiled epoch's duration as the forecast uses it: as declared, at least `MIN_EPOCH_S`."""
    return max(float(declared), MIN_EPOCH_S)


def epochs_completed(view: JobView) -> int:
    """The reference's `epoch_progress`: whole epochs done."""
    return min(int(math.floor(view.epochs_done + 1e-9)), view.num_epochs)


def calibrate(state: ForecastState, view: JobView,
              tolerance: float = CALIBRATION_TOLERANCE) -> bool:
    """Update the state's calibration factor from the job's own history; True if it fired."""
    if view.run_time_s <= 0 or not view.profile_epoch_durations:
        return False
    meas = float(view.epochs_done)
    if meas < 1:
        return False
    summary = state.summary(view)
    prof = summary.epochs_in(view.run_time_s)
    expect = summary.epochs_in(view.run_time_s / state.calibration)
    if prof <= 0 or expect <= 0 or abs(meas - expect) / expect <= tolerance:
        return False
    state.calibration = prof / meas
    state.calibrations += 1
    return True


# ---------------------------------------------------------------------- unknown batch sizes
def _interp_loglog(points: Mapping[int, float], bs: int) -> float:
    """Iterations/s at `bs` from known (batch size -> iterations/s) points, log-log."""
    xs = sorted(points)
    lx = [math.log(x) for x in xs]
    ly = [math.log(points[x]) for x in xs]
    t = math.log(bs)
    if len(xs) == 1:
        return math.exp(ly[0] - (t - lx[0]))
    if t <= lx[0]:
        i = 0
    elif t >= lx[-1]:
        i = len(xs) - 2
    else:
        i = max(k for k in range(len(xs) - 1) if lx[k] <= t)
    slope = (ly[i + 1] - ly[i]) / (lx[i + 1] - lx[i])
    if t < lx[0] or t > lx[-1]:
        slope = min(0.0, max(-1.0, slope))
        anchor = 0 if t < lx[0] else len(xs) - 1
        return math.exp(ly[anchor] + slope * (t - lx[anchor]))
    return math.exp(ly[i] + slope * (t - lx[i]))


def profile_means(view: JobView, durations: Sequence[float]) -> dict[int, float]:
    """Mean duration of the profile's epochs at each of its batch sizes."""
    sums: dict[int, list[float]] = {}
    for b, d in zip(view.profile_batch_sizes, durations):
        acc = sums.setdefault(int(b), [0.0, 0])
        acc[0] += d
        acc[1] += 1
    return {b: acc[0] / acc[1] for b, acc in sums.items()}


def duration_by_batch_size(view: JobView, known: Mapping[int, float], support: Sequence[int],
                           calibration: float = 1.0) -> dict[int, float]:
    """Mean epoch duration at each batch size of `support`: `known` (the profile's calibrated
    per-batch-size means) where there is one, else the log-log throughput model."""
    missing = [b for b in support if b not in known]
    if not missing:
        return {b: known[b] for b in support}
    samples = float(view.iterations_per_epoch * view.batch_size)  # samples per epoch (approx.)
    points = {b: (samples / b) / d for b, d in known.items() if d > 0}
    if view.batch_size not in points and view.iterations_per_s > 0:
        points[view.batch_size] = view.iterations_per_s / calibration  # measured, calibrated scale
    out = dict(known)
    for b in missing:
        if points:
            out[b] = (samples / b) / _interp_loglog(points, b)
        else:  # nothing known at all: the current rate
            out[b] = view.iterations_per_epoch / max(view.iterations_per_s, 1e-9) * calibration
    return {b: out[b] for b in support}


# ------------------------------------------------------------------------ the Dirichlet model
def observations(view: JobView) -> list[int]:
    """Batch sizes of epochs 0..e (the one in progress is the current batch size)."""
    e = epochs_completed(view)
    obs = [int(b) for b in view.observed_batch_sizes[:e]]
    if len(obs) < e:  # history shorter than the progress (should not happen): pad from profile
        obs += [int(b) for b in view.profile_batch_sizes[len(obs):e]]
    if e < view.num_epochs:
        obs.append(int(view.batch_size))
    return obs


def dirichlet_remaining_time(num_epochs: int, e: int, obs: Sequence[int] | Mapping[int, int],
                             duration_at: Mapping[int, float]) -> float:
    """The forecast of SHOCKWAVE_POLICY.md §2.3, in seconds (pure). `obs`: the batch sizes of
    epochs 0..e, or their counts; `duration_at` gives the support and the mean epoch duration at
    each batch size."""
    E = num_epochs
    remaining = E - e
    if remaining <= 0 or E <= 0:
        return FINISHED_FORECAST_S
    counts: dict[int, int] = {}
    if isinstance(obs, Mapping):
        counts = {int(b): int(c) for b, c in obs.items() if c > 0}
    else:
        for b in obs:
            counts[int(b)] = counts.get(int(b), 0) + 1
    support = sorted(set(duration_at) | set(counts))
    prior = E / len(support)
    post = {b: prior + counts.get(b, 0) for b in support}
    csum = sum(post.values())
    ehat = {}
    for b in support:
        x = E * post[b] / csum
        # one expected epoch off per observation at b, while the expectation is still >= 1
        ehat[b] = x - min(counts.get(b, 0), max(0, math.floor(x))) if x >= 1 else x
    rem_total = sum(ehat.values())
    inflated = max(int(math.floor(rem_total + 1)), remaining)
    r = sum(ehat[b] * duration_at[b] for b in support)
    return max(0.0, r * remaining / inflated)


def at_or_above(batch_size: int, known: Mapping[int, float], counts: Mapping[int, int]
                ) -> tuple[dict[int, float], dict[int, int]]:
    """The profiled durations and observation counts at `batch_size` or larger: what the
    forecast of a job whose profile never lowers its batch size keeps."""
    return ({b: d for b, d in known.items() if b >= batch_size},
            {b: c for b, c in counts.items() if b >= batch_size})


@dataclass(frozen=True)
class Forecast:
    """What the market needs of one job at one solve."""

    epochs_done: int            # e, whole epochs
    mean_epoch_s: float         # dbar
    remaining_s: float          # R (epochs after the one in progress)
    elapsed_profile_s: float    # calibrated profile time of the completed epochs


def forecast(view: JobView, state: ForecastState) -> Forecast:
    """Calibrate, then forecast one job (profile-derived sums are cached in `state`)."""
    calibrate(state, view)
    summ = state.summary(view)
    f = state.calibration
    E = view.num_epochs
    e = epochs_completed(view)
    counts = state.counts(view, e)
    if e < E:
        counts[int(view.batch_size)] = counts.get(int(view.batch_size), 0) + 1
    known = {b: s * f / c for b, (s, c) in summ.by_bs.items()}
    if summ.rises_only:
        known, counts = at_or_above(int(view.batch_size), known, counts)
    support = sorted(set(known) | {b for b, c in counts.items() if c > 0})
    d_at = duration_by_batch_size(view, known, support, f)
    upto = min(e, E - 1) + 1
    dbar = summ.prefix_s(upto) * f / upto
    return Forecast(e, float(dbar), dirichlet_remaining_time(E, e, counts, d_at),
                    float(summ.prefix_s(min(e, E)) * f))
