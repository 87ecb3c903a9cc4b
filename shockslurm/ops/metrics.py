"""Prometheus metrics of the daemon (`prometheus_client`, one `CollectorRegistry` per daemon).

Every name starts with `shockslurm_`:

| metric | type | meaning |
|---|---|---|
| `shockslurm_rounds_total` | counter | rounds run (one row each in the store's `rounds`) |
| `shockslurm_round_duration_seconds` | histogram | wall time of a round: observe + solve + enact (grace and stop waits included) |
| `shockslurm_solve_duration_seconds` | histogram | the policy's `allocate` time |
| `shockslurm_managed_jobs{state}` | gauge | active managed jobs this daemon schedules, by Slurm state (PENDING, RUNNING, SUSPENDED, COMPLETING) |
| `shockslurm_gpus_allocated` | gauge | GPUs the latest round's plan gives to jobs |
| `shockslurm_gpus_schedulable` | gauge | GPUs the policy could hand out that round (usable GPUs of the managed partitions minus those held by jobs the daemon does not schedule) |
| `shockslurm_enactment_failures_total{action,reason}` | counter | failed Slurm calls, one per job the command named (as many as the store's intents with a non-zero return code); `action` is the verb (signal, requeuehold, hold, update, release), `reason` a coarse class of its stderr (invalid_job, job_state, permission, timeout, backend_error, other) |
| `shockslurm_idle_gpu_seconds_total{cause}` | counter | idle GPU-seconds measured from the daemon's squeue reads, by cause (README "Live on Slurm"): `switch` (GPUs a round's stops freed, until the jobs started in their place ran), `unplaceable` (a released job waited in Reason=Resources while GPUs were free), `waiting` (held jobs of ours could have used free GPUs: waiting for a round) |
| `shockslurm_forecast_abs_error_seconds` | histogram | |forecast - actual| remaining run time of completed jobs (below) |
| `shockslurm_last_round_timestamp_seconds` | gauge | Unix time of the latest round |
| `shockslurm_config_reloads_total{result}` | counter | SIGHUP reloads, `ok` or `error` |
| `shockslurm_outages_total{what}` | counter | outages begun: `slurm` (cannot be read or reached) or `store` (cannot record) |
| `shockslurm_outage_active{what}` | gauge | 1 while that outage lasts (no actions are taken), else 0 |
| `shockslurm_leader` | gauge | 1 while this daemon holds the store's leader lock (it alone acts), 0 while it stands by |
| `shockslurm_build_info{version,python}` | gauge | always 1; the labels name the running shockslurm and Python |
| `process_*`, `python_info` | | the daemon process's CPU seconds, memory, open files, start time (`prometheus_client`'s process and platform collectors) |

A gauge's name never ends in `_total` (Prometheus reserves it for counters; promtool flags it).

Forecast error, defined: the first round a job is seen RUNNING, the daemon records its forecast
remaining run time F = remaining iterations / iterations per second (the policy's view of the
job: reported progress and throughput when the job reports, else the spec's), and the run time
R0 it had then. When the job is later seen to end (COMPLETING, or gone from squeue) having been
RUNNING at the previous observation, its actual remaining run time is A = R_last - R0 + d/2,
where R_last is its run time at that previous observation and d the time between the two
observations (the end lies somewhere in between: A is known to +-d/2, i.e. half a round).
The histogram records |F - A|. Jobs that end while not running (cancelled while pending or held)
are not counted; a job cancelled while running is (the daemon cannot tell it from a completion
without another squeue read).
"""

from __future__ import annotations

import platform
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Mapping, cast

from prometheus_client import (CollectorRegistry, Counter, Gauge, Histogram, Info,
                               PlatformCollector, ProcessCollector)
from prometheus_client.exposition import generate_latest

from .. import __version__

if TYPE_CHECKING:   # types only: the metrics module imports no layer at run time
    from ..live.cluster import SlurmCluster
    from ..live.enact import Step
    from ..live.journaling import Journal, LiveJob
    from ..model import JobView, RoundPlan, Snapshot
    from ..slurm.types import CommandResult, SlurmJob

ACTIVE_STATES = ("PENDING", "RUNNING", "SUSPENDED", "COMPLETING")
OUTAGE_KINDS = ("slurm", "store")
DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
ERROR_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 43200)


def stderr_class(returncode: int, stderr: str) -> str:
    """A coarse, low-cardinality class of a failed Slurm call's stderr."""
    s = stderr.lower()
    if returncode == -1 or s.startswith(("oserror", "filenotfounderror", "timeoutexpired")):
        return "timeout" if "timeout" in s else "backend_error"
    if "invalid job id" in s or "invalid jobid" in s or "does not exist" in s:
        return "invalid_job"
    if "access" in s and "denied" in s or "permission" in s or "not authorized" in s \
            or "unauthorized" in s:
        return "permission"
    if "timed out" in s or "timeout" in s or "unable to contact" in s:
        return "timeout"
    if ("already" in s or "no longer" in s or "not pending" in s or "state" in s
            or "completing" in s or "finished" in s):
        return "job_state"
    return "other"


@dataclass
class _Forecast:
    forecast_s: float
    run_time_0: float
    last_run_time: float
    last_running: bool
    last_seen: float


class DaemonMetrics:
    """The daemon's metrics on their own registry (several daemons, or tests, side by side)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        Info("shockslurm_build", "The running shockslurm.", registry=r).info(
            {"version": __version__, "python": platform.python_version()})
        self._round_metrics(r)
        self._health_metrics(r)
        self._forecasts: dict[int, _Forecast] = {}

    def _round_metrics(self, r: CollectorRegistry) -> None:
        """What each round records: durations, jobs by state, GPUs."""
        self.rounds = Counter("shockslurm_rounds", "Rounds run.", registry=r)
        self.round_duration = Histogram("shockslurm_round_duration_seconds",
                                        "Wall time of a round (observe, solve, enact).",
                                        buckets=DURATION_BUCKETS, registry=r)
        self.solve_duration = Histogram("shockslurm_solve_duration_seconds",
                                        "Policy solve time per round.",
                                        buckets=DURATION_BUCKETS, registry=r)
        self.jobs = Gauge("shockslurm_managed_jobs", "Active managed jobs by Slurm state.",
                          ["state"], registry=r)
        for state in ACTIVE_STATES:
            self.jobs.labels(state=state).set(0)
        self.gpus_allocated = Gauge("shockslurm_gpus_allocated",
                                    "GPUs the latest round's plan allocates.", registry=r)
        self.gpus_schedulable = Gauge("shockslurm_gpus_schedulable",
                                      "GPUs the policy could allocate in the latest round.",
                                      registry=r)
        self.last_round = Gauge("shockslurm_last_round_timestamp_seconds",
                                "Unix time of the latest round.", registry=r)

    def _health_metrics(self, r: CollectorRegistry) -> None:
        """Failures, idle GPUs, forecast error, reloads, outages, leadership."""
        self.enactment_failures = Counter(
            "shockslurm_enactment_failures",
            "Failed Slurm calls, one per job named, by verb and stderr class.",
            ["action", "reason"], registry=r)
        self.idle_gpu_seconds = Counter(
            "shockslurm_idle_gpu_seconds",
            "Idle GPU-seconds by cause (switch, unplaceable, waiting; README: Metrics).",
            ["cause"], registry=r)
        for cause in ("switch", "unplaceable", "waiting"):
            self.idle_gpu_seconds.labels(cause=cause)
        self.forecast_error = Histogram(
            "shockslurm_forecast_abs_error_seconds",
            "|forecast - actual| remaining run time of completed jobs (README: Metrics).",
            buckets=ERROR_BUCKETS, registry=r)
        self.reloads = Counter("shockslurm_config_reloads", "Configuration reloads (SIGHUP).",
                               ["result"], registry=r)
        self.outages = Counter("shockslurm_outages", "Outages begun (slurm or store).",
                               ["what"], registry=r)
        self.outage_active = Gauge("shockslurm_outage_active",
                                   "1 while an outage lasts (no actions), else 0.", ["what"],
                                   registry=r)
        self.leader = Gauge("shockslurm_leader",
                            "1 while this daemon holds the leader lock (it alone acts), else 0.",
                            registry=r)
        for what in OUTAGE_KINDS:
            self.outages.labels(what=what)
            self.outage_active.labels(what=what).set(0)

    # ------------------------------------------------------------------ recording
    def record_round(self, *, now: float, round_duration_s: float, solve_s: float,
                     gpus_allocated: int, gpus_schedulable: int, states: Mapping[int, str],
                     views: Mapping[int, JobView]) -> None:
        """One round. `states`: Slurm state of every active managed job by job id; `views`:
        the snapshot's `JobView`s by job id (for the forecast)."""
        self.rounds.inc()
        self.round_duration.observe(max(0.0, round_duration_s))
        self.solve_duration.observe(max(0.0, solve_s))
        counts = dict.fromkeys(ACTIVE_STATES, 0)
        for state in states.values():
            counts[state] = counts.get(state, 0) + 1
        for state, n in counts.items():
            self.jobs.labels(state=state).set(n)
        self.gpus_allocated.set(gpus_allocated)
        self.gpus_schedulable.set(gpus_schedulable)
        self.last_round.set(now)
        self._track_forecasts(now, states, views)

    def _track_forecasts(self, now: float, states: Mapping[int, str],
                         views: Mapping[int, JobView]) -> None:
        for job_id, fc in list(self._forecasts.items()):
            state = states.get(job_id)
            if state is None or state == "COMPLETING":
                del self._forecasts[job_id]
                if fc.last_running:
                    actual = fc.last_run_time - fc.run_time_0 + (now - fc.last_seen) / 2
                    self.forecast_error.observe(abs(fc.forecast_s - actual))
                continue
            view = views.get(job_id)
            fc.last_running = state == "RUNNING"
            fc.last_seen = now
            if view is not None:
                fc.last_run_time = float(view.run_time_s)
        for job_id, view in views.items():
            if job_id in self._forecasts or states.get(job_id) != "RUNNING":
                continue
            ips = float(view.iterations_per_s)
            if ips > 0:
                self._forecasts[job_id] = _Forecast(
                    forecast_s=float(view.remaining_iterations) / ips,
                    run_time_0=float(view.run_time_s), last_run_time=float(view.run_time_s),
                    last_running=True, last_seen=now)

    def outage(self, what: str, active: bool) -> None:
        """An outage of `what` (slurm, store) begins (active) or ends."""
        if active:
            self.outages.labels(what=what).inc()
        self.outage_active.labels(what=what).set(1 if active else 0)

    def record_outcome(self, action: str, job_count: int, returncode: int, stderr: str) -> None:
        if returncode != 0:
            self.enactment_failures.labels(action=action,
                                           reason=stderr_class(returncode, stderr)).inc(
                max(1, job_count))

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # ------------------------------------------------------------------ serving
    def serve(self, address: str, port: int) -> Callable[[], None]:
        """Serve `/metrics` on address:port in a daemon thread; returns a function that stops
        it. Raises OSError when the port cannot be bound."""
        from prometheus_client import start_http_server

        started = start_http_server(port, addr=address, registry=self.registry)
        server = started[0] if isinstance(started, tuple) else None

        def stop() -> None:
            if server is not None:
                server.shutdown()
                server.server_close()
        return stop


class MetricsObserver:
    """`RoundObserver` feeding `DaemonMetrics` from a `SlurmCluster` (public attributes only:
    `jobs`); `clock` must be the loop's clock (the round started at `snapshot.now`)."""

    def __init__(self, metrics: DaemonMetrics, cluster: SlurmCluster,
                 clock: Callable[[], float] = time.time) -> None:
        self.metrics = metrics
        self.cluster = cluster
        self.clock = clock

    def on_round(self, snapshot: Snapshot, plan: RoundPlan, solve_s: float) -> None:
        now = self.clock()
        states = {jid: live.slurm.state.value for jid, live in self.cluster.jobs.items()}
        self.metrics.record_round(
            now=snapshot.now, round_duration_s=now - snapshot.now, solve_s=solve_s,
            gpus_allocated=plan.gpus_used(snapshot), gpus_schedulable=snapshot.gpus,
            states=states,
            views={v.job_id: v for v in snapshot.jobs})
        stats = getattr(self.cluster, "last_stats", None)
        for cause in ("switch", "unplaceable", "waiting"):
            idle = getattr(stats, f"idle_{cause}_gpu_s", 0.0)
            if idle > 0:
                self.metrics.idle_gpu_seconds.labels(cause=cause).inc(idle)


class MetricsJournal:
    """Wraps a `live.journaling.Journal` (or None) to count failed calls by verb and stderr class."""

    def __init__(self, inner: Journal | None, metrics: DaemonMetrics) -> None:
        self.inner = inner
        self.metrics = metrics

    def begin_round(self, snapshot: Snapshot, plan: RoundPlan,
                    jobs: Mapping[int, LiveJob]) -> None:
        if self.inner is not None:
            self.inner.begin_round(snapshot, plan, jobs)

    def intent(self, step: Step) -> object:
        handle = self.inner.intent(step) if self.inner is not None else None
        return (handle, step)

    def outcome(self, handle: object, result: CommandResult) -> None:
        inner_handle, step = cast("tuple[object, Step]", handle)   # what `intent` returned
        if self.inner is not None:
            self.inner.outcome(inner_handle, result)
        self.metrics.record_outcome(step.action, len(step.job_ids), result.returncode,
                                    result.stderr or "")

    def job_ended(self, job: LiveJob, final: SlurmJob | None, now: float) -> None:
        if self.inner is not None:
            self.inner.job_ended(job, final, now)
