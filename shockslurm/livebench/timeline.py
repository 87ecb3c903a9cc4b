"""The live benchmark's arithmetic: pure functions of the `squeue --json` poll timeline.

A watcher polls every 0.5 s; each `Poll` holds the arm's jobs as seen then (`Sample`: state,
GPUs). From the polls:
- `job_runs`: each job's runs, [first poll seen RUNNING, first poll seen not RUNNING or gone);
- `completion_times`: a job is complete at the end of its last run when its last sample is
  COMPLETED (or it vanished from squeue after running);
- `gpu_seconds`: GPU-seconds held (runs x gang), the utilisation's numerator;
- `idle_gpu_seconds`: capacity left idle while the arm still had work, by cause: `pending_fits`
  (a pending job of the arm asked no more GPUs than were idle: lost to switches, placement or
  waiting for a round), `pending_too_big` (jobs waited but none would fit), `no_pending`;
- `switch_costs`: for each USR1 the daemon sent (its store intents), the time until the
  stopped job left RUNNING and until a job released in the same round was RUNNING;
- `arm_metrics`: makespan, JCT, rho, utilisation exactly as the simulator defines them
  (`sim.metrics.compute_metrics`), with the trace's arrivals as arrival times.

Times are seconds on one clock (the bench uses seconds since the arm started).
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median
from typing import Iterable, Mapping, Sequence

from ..sim.metrics import JobOutcome, compute_metrics, static_rho

RUNNING = "RUNNING"
COMPLETED = "COMPLETED"
PENDING = "PENDING"


@dataclass(frozen=True)
class Sample:
    state: str
    gpus: int
    restarts: int | None = None         # Slurm's restart count (None: not read)


@dataclass(frozen=True)
class Poll:
    t: float
    jobs: Mapping[int, Sample]          # job id -> its sample (the arm's jobs squeue listed)


@dataclass(frozen=True)
class Run:
    start: float
    end: float | None                   # None: still running at the last poll

    def length(self, until: float) -> float:
        return (self.end if self.end is not None else until) - self.start


@dataclass(frozen=True)
class Switch:
    job_id: int                         # the stopped job
    signal_s: float                     # when USR1 went out
    exit_s: float | None                # USR1 -> the job left RUNNING
    successor_s: float | None           # USR1 -> a job released in that round was RUNNING


def job_runs(polls: Sequence[Poll]) -> dict[int, list[Run]]:
    """Each job's RUNNING intervals as the polls saw them (in time order). A job seen RUNNING
    with a higher restart count than its open run's is a new run (it was requeued and started
    again between two polls, e.g. a move): the old run ends there."""
    runs: dict[int, list[Run]] = {}
    open_since: dict[int, float] = {}
    restarts: dict[int, int | None] = {}
    for poll in sorted(polls, key=lambda p: p.t):
        for job_id in list(open_since):
            seen = poll.jobs.get(job_id)
            if seen is None or seen.state != RUNNING or _restarted(restarts[job_id], seen):
                runs.setdefault(job_id, []).append(Run(open_since.pop(job_id), poll.t))
        for job_id, sample in poll.jobs.items():
            if sample.state == RUNNING and job_id not in open_since:
                open_since[job_id] = poll.t
                restarts[job_id] = sample.restarts
    for job_id, start in open_since.items():
        runs.setdefault(job_id, []).append(Run(start, None))
    return runs


def _restarted(before: int | None, now: Sample) -> bool:
    return before is not None and now.restarts is not None and now.restarts > before


def completion_times(polls: Sequence[Poll]) -> dict[int, float]:
    """Job id -> completion time, for the jobs that completed."""
    ordered = sorted(polls, key=lambda p: p.t)
    last_seen: dict[int, Sample] = {}
    for poll in ordered:
        last_seen.update(poll.jobs)
    vanished = {j for j in last_seen if ordered and j not in ordered[-1].jobs}
    done: dict[int, float] = {}
    for job_id, runs in job_runs(ordered).items():
        final = runs[-1]
        if final.end is None:
            continue
        if last_seen[job_id].state == COMPLETED or (job_id in vanished
                                                     and last_seen[job_id].state == RUNNING):
            done[job_id] = final.end
    return done


def gpu_seconds(runs: Mapping[int, Sequence[Run]], gpus: Mapping[int, int],
                until: float) -> float:
    """GPU-seconds the jobs held: each run's length times its job's GPUs."""
    return sum(run.length(until) * gpus[job_id] for job_id, job_runs_ in runs.items()
               for run in job_runs_)


def idle_gpu_seconds(polls: Sequence[Poll], capacity: int, *,
                     until: float | None = None) -> dict[str, float]:
    """Idle GPU-seconds by cause, each poll's view held until the next poll (or `until`)."""
    ordered = sorted(polls, key=lambda p: p.t)
    out = {"pending_fits": 0.0, "pending_too_big": 0.0, "no_pending": 0.0}
    for k, poll in enumerate(ordered):
        end = ordered[k + 1].t if k + 1 < len(ordered) else (until if until is not None
                                                             else poll.t)
        span = max(0.0, end - poll.t)
        running = sum(s.gpus for s in poll.jobs.values() if s.state == RUNNING)
        pending = [s.gpus for s in poll.jobs.values() if s.state == PENDING]
        idle = max(0, capacity - running)
        if not idle or not span:
            continue
        cause = ("no_pending" if not pending else
                 "pending_fits" if min(pending) <= idle else "pending_too_big")
        out[cause] += idle * span
    return out


def switch_costs(signals: Iterable[tuple[float, int]], releases: Iterable[tuple[float, int]],
                 runs: Mapping[int, Sequence[Run]], round_s: float) -> list[Switch]:
    """For each USR1 (time, job id): how long until the stopped job left RUNNING, and until a
    job released within `round_s` after the signal (the same round's start) was RUNNING."""
    released = sorted(releases)
    out: list[Switch] = []
    for t_sig, job_id in sorted(signals):
        exit_s = next((r.end - t_sig for r in runs.get(job_id, ())
                       if r.end is not None and r.end >= t_sig and r.start <= t_sig), None)
        starts = [r.start for t_rel, rel in released if t_sig <= t_rel <= t_sig + round_s
                  and rel != job_id for r in runs.get(rel, ()) if r.start >= t_rel]
        out.append(Switch(job_id, t_sig, exit_s,
                          min(starts) - t_sig if starts else None))
    return out


def release_latencies(releases: Iterable[tuple[float, int]],
                      runs: Mapping[int, Sequence[Run]],
                      holds: Iterable[tuple[float, int]] = ()) -> list[float]:
    """Release -> RUNNING of each released job (Slurm's own start latency under the daemon);
    a release that a hold withdrew before the job ran (a later round changed the plan) is
    not a start."""
    return [wait for _, wait, started in _release_waits(releases, runs, holds) if started]


def released_wait_gpu_seconds(releases: Iterable[tuple[float, int]],
                              runs: Mapping[int, Sequence[Run]],
                              gpus: Mapping[int, int],
                              holds: Iterable[tuple[float, int]] = ()) -> float:
    """GPU-seconds that released jobs held in reserve while not yet RUNNING: each release's
    wait for its start (or for the hold that withdrew it) times the job's GPUs (the GPUs the
    plan gave it sat idle meanwhile)."""
    gangs = dict(gpus)
    return sum(wait * gangs.get(job_id, 0)
               for job_id, wait, _ in _release_waits(releases, runs, holds))


def _release_waits(releases: Iterable[tuple[float, int]], runs: Mapping[int, Sequence[Run]],
                   holds: Iterable[tuple[float, int]]) -> list[tuple[int, float, bool]]:
    """(job id, wait, whether it ended in a start) for each release followed by the job's
    start or by a hold of it, whichever came first."""
    held: dict[int, list[float]] = {}
    for t_hold, job_id in holds:
        held.setdefault(job_id, []).append(t_hold)
    out = []
    for t_rel, job_id in releases:
        start = min((r.start for r in runs.get(job_id, ()) if r.start >= t_rel), default=None)
        hold = min((t for t in held.get(job_id, ()) if t >= t_rel), default=None)
        if hold is not None and (start is None or hold < start):
            out.append((job_id, hold - t_rel, False))
        elif start is not None:
            out.append((job_id, start - t_rel, True))
    return out


def spread(values: Sequence[float]) -> dict[str, float | int | None]:
    """Median and max of `values` (None when empty), and their count."""
    vals = [float(v) for v in values]
    return {"median": round(median(vals), 2) if vals else None,
            "max": round(max(vals), 2) if vals else None, "n": len(vals)}


@dataclass(frozen=True)
class JobLine:
    """One job of the workload as the arm ran it."""

    job_id: int                 # Slurm's
    arrival_s: float            # the workload's (scaled) arrival
    exclusive_s: float          # the workload's (scaled) exclusive run time
    gpus: int
    workload_job: int = -1      # the workload's job id (-1: not known)


def completed_outcomes(lines: Sequence[JobLine], done: Mapping[int, float]) -> list[JobOutcome]:
    """The jobs of `lines` that completed (`done`: `completion_times`), as the simulator's
    outcomes, in `lines` order."""
    return [JobOutcome(line.job_id, line.arrival_s, done[line.job_id], line.exclusive_s,
                       line.gpus) for line in lines if line.job_id in done]


def arm_metrics(lines: Sequence[JobLine], polls: Sequence[Poll], capacity: int,
                until: float) -> dict[str, object]:
    """The arm's numbers, defined as the simulator's (`sim.metrics`)."""
    runs = job_runs(polls)
    done = completion_times(polls)
    outcomes = completed_outcomes(lines, done)
    used = gpu_seconds({j: runs.get(j, []) for j in done}, {l.job_id: l.gpus for l in lines},
                       until)
    out: dict[str, object] = {"jobs": len(lines), "completed": len(outcomes),
                              "stops": sum(max(0, len(runs.get(l.job_id, [])) - 1)
                                           for l in lines)}
    if outcomes:
        metrics = compute_metrics(outcomes, capacity, used, trace_jobs=len(lines))
        out.update({k: round(v, 4) if isinstance(v, float) else v
                    for k, v in metrics.as_dict().items() if k != "jobs"})
    ours = {l.job_id for l in lines}
    end = max(done.values()) if done else until
    out["idle_gpu_s"] = {k: round(v, 1) for k, v in idle_gpu_seconds(
        [Poll(p.t, {j: s for j, s in p.jobs.items() if j in ours}) for p in polls
         if p.t <= end], capacity, until=end).items()}
    return out


def job_rows(lines: Sequence[JobLine], polls: Sequence[Poll], capacity: int,
             until: float) -> list[dict[str, object]]:
    """Each job as the arm ran it, in workload order: its ids, gang, arrival, exclusive run
    time, runs ([start, end], end None while running), and when it completed its completion,
    JCT and rho (the simulator's static form, as `arm_metrics`), to set beside the simulated
    jobs (`report.predict`'s `per_job`)."""
    runs = job_runs(polls)
    outcomes = completed_outcomes(lines, completion_times(polls))
    rho = dict(zip((o.job_id for o in outcomes), static_rho(outcomes, capacity, len(lines))))
    by_id = {o.job_id: o for o in outcomes}
    rows: list[dict[str, object]] = []
    for line in sorted(lines, key=lambda l: (l.workload_job, l.job_id)):
        row: dict[str, object] = {
            "job": line.workload_job, "slurm_job": line.job_id, "gpus": line.gpus,
            "arrival_s": round(line.arrival_s, 2), "exclusive_s": round(line.exclusive_s, 2),
            "runs": [[round(r.start, 2), None if r.end is None else round(r.end, 2)]
                     for r in runs.get(line.job_id, [])]}
        outcome = by_id.get(line.job_id)
        if outcome is not None:
            row.update(completion_s=round(outcome.completion_s, 2),
                       jct_s=round(outcome.jct_s, 2), rho=round(float(rho[line.job_id]), 4))
        rows.append(row)
    return rows


def plot_series(lines: Sequence[JobLine], polls: Sequence[Poll], capacity: int,
                until: float) -> dict[str, list]:
    """What `ops.plots` draws of an arm: (label, start, width, GPUs) bars per run,
    (time, GPUs running, capacity) steps per poll, and each completed job's rho."""
    ours = {l.job_id: l for l in lines}
    runs = job_runs(polls)
    bars = [(f"job {job_id}", r.start, r.length(until), ours[job_id].gpus)
            for job_id, rs in runs.items() if job_id in ours for r in rs]
    steps = [(p.t, sum(s.gpus for j, s in p.jobs.items() if j in ours and s.state == RUNNING),
              capacity) for p in sorted(polls, key=lambda p: p.t)]
    outcomes = completed_outcomes(lines, completion_times(polls))
    rho = [float(r) for r in static_rho(outcomes, capacity, len(lines))] if outcomes else []
    return {"timeline": bars, "utilisation": steps, "rho": rho}
