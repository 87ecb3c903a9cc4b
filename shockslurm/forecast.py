"""The Shockwave forecaster: Bayesian (Dirichlet) forecast of a job's remaining run time under
dynamic batch-size adaptation, the past-average epoch duration and throughput calibration.

Everything here is a pure function of a `JobView` plus a small per-job `ForecastState` (the
persistent calibration factor). Units: seconds and epochs.

Behaviour (see shared/design/SHOCKWAVE.md, "The predictor"):

- Profiled epoch durations are rounded to whole seconds with a floor of 1 s, then multiplied by
  the job's calibration factor (1 until calibration fires).
- Observations: the batch size of every completed epoch (`observed_batch_sizes`) plus the current
  batch size for the epoch in progress, i.e. `e + 1` observations for `e = floor(epochs_done)`.
  (The reference reads these from the profile; we use what the job actually did.)
- Support: every batch size of the profile plus every observed one. Prior: uniform Dirichlet with
  total concentration `E`; posterior adds one count per observation.
- `remaining_time`: `Ehat_b = E * post_b / sum(post)`, minus one per observation at b while
  `Ehat_b >= 1`, `R = sum_b Ehat_b * d_b * (E - e) / max(E - e, floor(sum_b Ehat_b + 1))` with
  `d_b` the mean (calibrated) profiled duration of the epochs at b. A finished job forecasts 1 s.
  Like the reference, the forecast covers the epochs *after* the one in progress.
- `mean_epoch_duration` (dbar): mean of the calibrated profile durations of epochs `0..e`
  (the epoch in progress included).
- Calibration: the job's own history since its arrival. In `run_time_s` seconds of exclusive
  running the profile says it would have completed `prof` epochs (walking the profiled durations
  from epoch 0); it actually completed `meas = epochs_done`. If `|meas - prof| / prof > 0.4`
  every profiled duration is scaled by `prof / meas`. Otherwise the previous factor stays (as in
  the reference, a calibration persists). The reference instead extrapolates from simulation
  round 0 (a quirk that mis-measures late arrivals); we do not reproduce that.
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

from .model import JobView

CALIBRATION_TOLERANCE = 0.4
FINISHED_FORECAST_S = 1.0


@dataclass
class ProfileSummary:
    """Per-job constants derived once from the profile (rounded durations, prefix sums)."""

    rounded: np.ndarray          # rounded profiled durations, seconds
    cumsum: np.ndarray           # cumsum[i] = sum(rounded[:i]), len E + 1
    by_bs: dict[int, tuple[float, int]]   # batch size -> (sum of rounded durations, epochs)

    @classmethod
    def of(cls, view: JobView) -> "ProfileSummary":
        r = np.asarray(rounded_durations(view.profile_epoch_durations), dtype=float)
        by: dict[int, list] = {}
        bs = np.asarray(view.profile_batch_sizes, dtype=np.int64)
        for b in np.unique(bs):
            m = bs == b
            by[int(b)] = (float(r[m].sum()), int(m.sum()))
        return cls(r, np.concatenate([[0.0], np.cumsum(r)]), by)


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
        for b in obs[self.obs_seen:]:
            self.obs_counts[int(b)] = self.obs_counts.get(int(b), 0) + 1
        self.obs_seen = len(obs)
        if len(obs) <= e:
            return dict(self.obs_counts)
        c = dict(self.obs_counts)             # more history than whole epochs: trim the tail
        for b in obs[e:]:
            c[int(b)] -= 1
        return c


# ---------------------------------------------------------------------------------- durations
def rounded_durations(durations: Sequence[float]) -> list[float]:
    """Profiled durations as the reference keeps them: whole seconds, at least 1 s."""
    return [float(max(1, round(d))) for d in durations]


def calibrated_durations(view: JobView, state: ForecastState | None = None) -> list[float]:
    f = state.calibration if state is not None else 1.0
    return [d * f for d in rounded_durations(view.profile_epoch_durations)]


def epochs_completed(view: JobView) -> int:
    """The reference's `epoch_progress`: whole epochs done."""
    return min(int(math.floor(view.epochs_done + 1e-9)), view.num_epochs)


def mean_epoch_duration(durations: Sequence[float], e: int) -> float:
    """dbar: mean duration of epochs 0..e (the one in progress included), clipped to the job."""
    upto = min(e, len(durations) - 1) + 1
    return sum(durations[:upto]) / upto


def profiled_epochs_in(durations: Sequence[float], seconds: float) -> float:
    """Epochs the profile completes in `seconds` of exclusive running from epoch 0."""
    acc = 0.0
    for i, d in enumerate(durations):
        if acc + d > seconds:
            return i + (seconds - acc) / d
        acc += d
    last = durations[-1] if durations else 1.0
    return len(durations) + (seconds - acc) / last


def calibrate(state: ForecastState, view: JobView,
              tolerance: float = CALIBRATION_TOLERANCE) -> bool:
    """Update the state's calibration factor from the job's own history; True if it fired."""
    if view.run_time_s <= 0 or view.epochs_done <= 0 or not view.profile_epoch_durations:
        return False
    cs = state.summary(view).cumsum
    i = int(np.searchsorted(cs, view.run_time_s, side="right")) - 1   # whole epochs in time
    if i >= len(cs) - 1:
        last = cs[-1] - cs[-2]
        prof = (len(cs) - 1) + (view.run_time_s - cs[-1]) / last
    else:
        prof = i + (view.run_time_s - cs[i]) / (cs[i + 1] - cs[i])
    meas = float(view.epochs_done)
    if prof <= 0 or abs(meas - prof) / prof <= tolerance:
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
    support = sorted(set(known) | {b for b, c in counts.items() if c > 0})
    d_at = duration_by_batch_size(view, known, support, f)
    upto = min(e, E - 1) + 1
    dbar = summ.cumsum[upto] * f / upto
    return Forecast(e, float(dbar), dirichlet_remaining_time(E, e, counts, d_at),
                    float(summ.cumsum[min(e, E)] * f))
