"""Running one arm of the live benchmark on a real Slurm cluster.

`run_arm` submits the (time-scaled) workload at its arrival times, polls `squeue --json` every
`POLL_S` for the arm's jobs (named `<prefix><workload job id>`), waits until every job has
completed (or `timeout_s`), and returns the arm's numbers (`timeline.arm_metrics`). Whatever
happens (an error, Ctrl-C), every job whose name carries the arm's prefix is cancelled and the
daemon stopped.

- `native`: plain `sbatch` on `native_partition` (one the job_submit plugin leaves alone), no
  hold: Slurm schedules.
- a policy: the real daemon, `shockslurm daemon --config FILE` as a subprocess, with a generated
  configuration (the arm's policy, `round_seconds`, SQLite store and report spool in the arm's
  directory, `job_name_prefix` so that it schedules this arm's jobs only); jobs go through
  `shocksub` (held, registered in the store with their report key). After the arm, the store's
  intents give the USR1 and release times (`timeline.switch_costs`).
"""

from __future__ import annotations

import os
import secrets
import shlex
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..errors import ShockslurmError
from ..model import JobSpec
from ..ops.config import toml_value
from ..slurm.cli_backend import CliBackend
from ..slurm.types import JobState
from .timeline import (JobLine, Poll, Sample, arm_metrics, completion_times, job_rows,
                       job_runs, plot_series, release_latencies, released_wait_gpu_seconds,
                       spread, switch_costs)
from .workload import StandinPlan

NATIVE = "native"
POLL_S = 0.5
SUBMIT_WORKERS = 4
SUBMIT_TIMEOUT_S = 120
DAEMON_STOP_S = 30
FAILED_STATES = {s.value for s in JobState if s.finished and s is not JobState.COMPLETED}


class ArmError(ShockslurmError):
    """An arm could not run (a submission refused, the daemon died)."""


@dataclass(frozen=True)
class ArmSettings:
    workdir: Path
    round_seconds: float = 20.0
    grace_seconds: float = 10.0
    managed_partition: str = "gpu"
    native_partition: str = "urgent"
    timeout_s: float = 1800.0
    python: str = sys.executable
    node_names: tuple[str, ...] = ()      # the cluster's nodes (a job's limits exclude the rest)


def daemon_config(policy: str, settings: ArmSettings, arm_dir: Path, prefix: str,
                  options: Mapping[str, Any] | None = None) -> str:
    """The arm's daemon configuration (TOML); `options` go to its `[policy]` table."""
    gate = ("" if policy in ("shockwave", "fifo") else
            "min_resolve_interval_s = 0\nidle_unallocated = false\n")
    given = "".join(f"{k} = {toml_value(v)}\n" for k, v in sorted((options or {}).items()))
    return (f"[daemon]\npolicy = \"{policy}\"\nround_seconds = {settings.round_seconds}\n"
            f"grace_seconds = {settings.grace_seconds}\nstop_timeout_seconds = 60\n"
            f"partitions = [\"{settings.managed_partition}\"]\nbackend = \"cli\"\n"
            f"db = \"{arm_dir / 'store.db'}\"\nspool_dir = \"{arm_dir / 'spool'}\"\n"
            f"job_name_prefix = \"{prefix}\"\nmetrics_port = 0\n\n[policy]\n{gate}{given}")


def standin_argv(python: str, plan: Path, state: Path) -> list[str]:
    return [python, "-m", "shockslurm.livebench.standin", "--plan", str(plan),
            "--state", str(state)]


def node_limits(job: JobSpec, settings: ArmSettings) -> list[str]:
    """A job limited to some nodes (`JobSpec.allowed_nodes`) as Slurm takes it: `--exclude` of
    the cluster's other nodes (`-w` would put it on all of them)."""
    if job.allowed_nodes is None:
        return []
    if not settings.node_names:
        raise ArmError(f"job {job.job_id} is limited to nodes, but the arm was not told the "
                       "cluster's (ArmSettings.node_names)")
    others = sorted(set(settings.node_names) - job.allowed_nodes)
    return [f"--exclude={','.join(others)}"] if others else []


def native_argv(job: JobSpec, name: str, settings: ArmSettings, arm_dir: Path,
                command: Sequence[str]) -> list[str]:
    return ["sbatch", "--parsable", f"--partition={settings.native_partition}",
            f"--job-name={name}", f"--gres=gpu:{job.gang_size}", *node_limits(job, settings),
            f"--output={arm_dir / 'out' / '%x-%j.out'}", "--wrap", shlex.join(command)]


def shocksub_argv(job: JobSpec, name: str, settings: ArmSettings, arm_dir: Path,
                  command: Sequence[str]) -> list[str]:
    ladder = ",".join(str(b) for b in job.batch_size_ladder)
    return [settings.python, "-m", "shockslurm.cli.shocksub", "--gpus", str(job.gang_size),
            "--partition", settings.managed_partition, "--job-name", name,
            "--model", job.model, "--epochs", str(job.num_epochs),
            "--samples-per-epoch", str(job.samples_per_epoch), "--batch-sizes", ladder,
            "--batch-size", str(job.initial_batch_size), "--mode", job.mode,
            *node_limits(job, settings),
            "--epoch-seconds", f"{job.declared_epoch_s:.3f}", "--grace-seconds", "60",
            "--output", str(arm_dir / "out" / "%x-%j.out"),
            "--script-dir", str(arm_dir / "scripts"), "--db", str(arm_dir / "store.db"),
            "--", *command]


def _submit(argv: list[str], env: dict[str, str], cwd: Path) -> int:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=SUBMIT_TIMEOUT_S,
                         env=env, cwd=cwd, check=False)
    if out.returncode != 0:
        raise ArmError(f"submission failed ({shlex.join(argv[:6])} ...): "
                       f"{out.stderr.strip()[-500:]}")
    return int(out.stdout.strip().splitlines()[-1].split(";")[0])


class Watcher:
    """Polls `squeue --json` every POLL_S for the jobs whose name starts with `prefix`."""

    def __init__(self, prefix: str, t0: float, backend: CliBackend | None = None) -> None:
        self.prefix = prefix
        self.t0 = t0
        self.backend = backend or CliBackend()
        self.polls: list[Poll] = []
        self.names: dict[int, str] = {}
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="livebench-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def poll_once(self) -> Poll | None:
        before = time.time()
        try:
            jobs = self.backend.jobs()
        except ShockslurmError:
            self.errors += 1
            return None
        t = (before + time.time()) / 2 - self.t0
        ours = {j.job_id: Sample(j.state.value, j.gpus, j.restart_count) for j in jobs
                if j.name.startswith(self.prefix)}
        for j in jobs:
            if j.job_id in ours:
                self.names[j.job_id] = j.name
        poll = Poll(t, ours)
        self.polls.append(poll)
        return poll

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.poll_once()
            self._stop.wait(max(0.0, POLL_S - (time.monotonic() - started)))


def cancel_prefix(prefix: str, backend: CliBackend | None = None) -> list[int]:
    """scancel every unfinished job whose name starts with `prefix`; their ids."""
    try:
        jobs = (backend or CliBackend()).jobs()
    except ShockslurmError:
        return []
    ids = [j.job_id for j in jobs if j.name.startswith(prefix) and not j.state.finished]
    if ids:
        subprocess.run(["scancel", *map(str, ids)], capture_output=True, timeout=60,
                       check=False)
    return ids


def _all_done(submitted: set[int], expected: int, polls: Sequence[Poll]) -> tuple[bool, list[int]]:
    """(every job submitted and finished, the ids that finished other than COMPLETED)."""
    if len(submitted) < expected or not polls:
        return False, []
    last = polls[-1].jobs
    failed = [j for j in submitted if j in last and last[j].state in FAILED_STATES]
    finished = all(j not in last or last[j].state in FAILED_STATES | {"COMPLETED"}
                   for j in submitted)
    seen_running = {j for p in polls for j, s in p.jobs.items() if s.state == "RUNNING"}
    return finished and all(j in seen_running or j in last for j in submitted), failed


Events = list[tuple[float, int]]     # (seconds since t0, Slurm job id)


def _daemon_events(db: Path, t0: float) -> tuple[Events, Events, Events, int]:
    """USR1 signals, releases and holds as (seconds since t0, Slurm job id), and the rounds
    run."""
    from sqlalchemy import func, select
    from sqlalchemy.orm import Session

    from ..store.database import open_store
    from ..store.models import EnactmentIntent, Job, Round, stamp_seconds

    engine = open_store(str(db))
    try:
        with Session(engine) as session:
            # calls that succeeded only: a failed USR1 reached no job (it keeps running)
            rows = session.execute(select(EnactmentIntent.action, EnactmentIntent.created_at,
                                          Job.job_id)
                                   .join(Job, Job.id == EnactmentIntent.job_pk)
                                   .where(EnactmentIntent.return_code == 0)).all()
            rounds = session.scalar(select(func.count()).select_from(Round)) or 0
    finally:
        engine.dispose()

    def seconds(when) -> float:
        return stamp_seconds(when) - t0

    signals = sorted((seconds(t), int(j)) for a, t, j in rows if a == "signal")
    releases = sorted((seconds(t), int(j)) for a, t, j in rows if a == "release")
    holds = sorted((seconds(t), int(j)) for a, t, j in rows if a == "hold")
    return signals, releases, holds, int(rounds)


def daemon_argv(python: str, config: Path) -> list[str]:
    """The arm's daemon command: its debug lines too (each Shockwave re-solve's inputs per job,
    so that a live decision can be taken apart afterwards)."""
    return [python, "-m", "shockslurm.cli.main", "--log-level", "DEBUG", "daemon",
            "--config", str(config)]


class DaemonProcess:
    """`shockslurm daemon --config FILE` as a subprocess, its output in the arm's log."""

    def __init__(self, python: str, config: Path, log: Path, env: dict[str, str]) -> None:
        self._log = open(log, "ab")
        self.proc = subprocess.Popen(daemon_argv(python, config), stdout=self._log,
                                     stderr=subprocess.STDOUT, env=env)

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise ArmError(f"the daemon exited with code {self.proc.returncode} "
                           f"(see {self._log.name})")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(DAEMON_STOP_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


def _prepare(arm_dir: Path) -> None:
    for sub in ("plans", "state", "out", "scripts"):
        (arm_dir / sub).mkdir(parents=True, exist_ok=True)
    spool = arm_dir / "spool"
    spool.mkdir(exist_ok=True)
    spool.chmod(0o1733)        # as the README asks of a spool: users add, cannot list


def run_arm(arm: str, jobs: Sequence[JobSpec], settings: ArmSettings, capacity: int, *,
            echo: Callable[[str], None] = lambda _: None,
            options: Mapping[str, Any] | None = None) -> dict[str, object]:
    """Run `jobs` (real seconds) as arm `arm` (a policy arm with the policy's `options`) and
    return its numbers."""
    arm_dir = settings.workdir / arm
    _prepare(arm_dir)
    prefix = f"lb{secrets.token_hex(2)}-{arm.replace('_', '')[:8]}-"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOCKSLURM_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(__file__).resolve().parents[2]),
                                                    os.environ.get("PYTHONPATH", "")) if p)
    managed = arm != NATIVE
    if managed:
        env["SHOCKSLURM_SPOOL"] = str(arm_dir / "spool")
    daemon: DaemonProcess | None = None
    watcher: Watcher | None = None
    lines: dict[int, JobLine] = {}
    lock = threading.Lock()
    stopping = threading.Event()
    pool: ThreadPoolExecutor | None = None
    try:
        if managed:
            config = arm_dir / "daemon.toml"
            config.write_text(daemon_config(arm, settings, arm_dir, prefix, options))
            daemon = DaemonProcess(settings.python, config, arm_dir / "daemon.log", env)
        t0 = time.time()
        watcher = Watcher(prefix, t0)
        watcher.start()
        echo(f"{arm}: {len(jobs)} jobs, prefix {prefix}, logs in {arm_dir}")

        def submit(job: JobSpec) -> None:
            # (threading's waits take at most TIMEOUT_MAX seconds; the arm timeout ends sooner)
            if stopping.wait(min(threading.TIMEOUT_MAX,
                                 max(0.0, t0 + job.arrival_s - time.time()))):
                return          # the arm is being torn down: submit nothing more
            name = f"{prefix}{job.job_id}"
            plan = arm_dir / "plans" / f"{name}.json"
            plan.write_text(StandinPlan.of(job).to_json())
            command = standin_argv(settings.python, plan, arm_dir / "state" / f"{name}.json")
            build = shocksub_argv if managed else native_argv
            job_id = _submit(build(job, name, settings, arm_dir, command), env, arm_dir)
            with lock:
                lines[job_id] = JobLine(job_id, job.arrival_s, job.exclusive_runtime_s,
                                        job.gang_size, job.job_id)

        ordered = sorted(jobs, key=lambda j: (j.arrival_s, j.job_id))
        pool = ThreadPoolExecutor(SUBMIT_WORKERS)
        futures = [pool.submit(submit, j) for j in ordered]
        done = False
        failed: list[int] = []
        while time.time() < t0 + settings.timeout_s and not done:
            time.sleep(1.0)
            if daemon is not None:
                daemon.check_alive()
            for f in futures:
                if f.done() and f.exception() is not None:
                    raise f.exception()  # type: ignore[misc]
            with lock:
                submitted = set(lines)
            done, failed = _all_done(submitted, len(jobs), watcher.polls)
        until = time.time() - t0
        watcher.stop()
        result: dict[str, object] = {"arm": arm, "prefix": prefix, "started_unix": round(t0, 3),
                                     "wall_s": round(until, 1),
                                     "timed_out": not done, "failed_jobs": sorted(failed),
                                     "squeue_polls": len(watcher.polls),
                                     "squeue_errors": watcher.errors}
        result.update(arm_metrics(list(lines.values()), watcher.polls, capacity, until))
        result["series"] = plot_series(list(lines.values()), watcher.polls, capacity, until)
        result["per_job"] = job_rows(list(lines.values()), watcher.polls, capacity, until)
        if daemon is not None:
            daemon.stop()
            result.update(_switch_numbers(arm_dir / "store.db", t0, watcher.polls,
                                          settings.round_seconds, capacity))
        return result
    finally:
        stopping.set()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)   # a submission under way finishes
        if watcher is not None:
            watcher.stop()
        if daemon is not None:
            daemon.stop()
        cancelled = cancel_prefix(prefix)
        if cancelled:
            echo(f"{arm}: cancelled {len(cancelled)} leftover job(s)")


def _switch_numbers(db: Path, t0: float, polls: Sequence[Poll], round_s: float,
                    capacity: int) -> dict[str, object]:
    """The daemon arm's stops and starts: the store's intents against the poll timeline."""
    signals, releases, holds, rounds = _daemon_events(db, t0)
    runs = job_runs(polls)
    switches = switch_costs(signals, releases, runs, round_s)
    gpus = {job_id: s.gpus for p in polls for job_id, s in p.jobs.items()}
    waited = released_wait_gpu_seconds(releases, runs, gpus, holds)
    done = completion_times(polls)
    makespan = max(done.values()) if done else 0.0     # the arm's jobs arrive from t0 on
    return {"released_wait_gpu_s": round(waited, 1),
            "released_wait_share": round(waited / (capacity * makespan), 4) if makespan else None,
            "daemon_rounds": rounds, "signals": len(signals), "releases": len(releases),
            "switch_usr1_to_exit_s": spread([s.exit_s for s in switches
                                             if s.exit_s is not None]),
            "switch_usr1_to_successor_running_s": spread(
                [s.successor_s for s in switches if s.successor_s is not None]),
            "release_to_running_s": spread(release_latencies(releases, runs, holds))}
