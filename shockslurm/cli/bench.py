"""`shockslurm bench ...`: speed and scale measurements, printed as JSON (never timed tests)."""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path
from typing import Any

import click

from ..errors import ShockslurmError
from ..policies import REGISTRY
from .options import gpus_option, jobs_option, json_option, seed_option
from .paths import write_output


@click.group("bench")
def bench_group() -> None:
    """Benchmarks; each prints its results as JSON (quality, switch-cost, live and
    live-family: Markdown tables, JSON with --json)."""


@bench_group.command("solver")
@jobs_option(900, "Active jobs in the synthetic snapshot.")
@gpus_option(256, "GPUs of the snapshot's cluster (one pool).")
@click.option("--repeats", type=click.IntRange(min=1), default=5, show_default=True)
@seed_option(0, "Seed of the snapshot's random jobs.")
@click.option("--identical", is_flag=True,
              help="All jobs identical and not started (a fresh sweep: the symmetric case).")
@json_option("Also write the JSON to this file.")
def bench_solver_cmd(jobs: int, gpus: int, repeats: int, seed: int, identical: bool,
                     json_out: Path | None) -> None:
    """Time single Shockwave re-solves on a synthetic snapshot of JOBS active jobs."""
    from ..policies.shockwave.bench import bench_solver

    result = bench_solver(jobs=jobs, gpus=gpus, repeats=repeats, seed=seed, identical=identical)
    _echo_json(result, json_out)


def _echo_json(result: dict[str, Any], json_out: Path | None) -> None:
    """The result as JSON on stdout, and in `json_out` (--json) when given."""
    text = json.dumps(result, indent=2)
    click.echo(text)
    if json_out is not None:
        write_output(json_out, text + "\n", "--json")


BENCH_SPEC = '{"batch_size":32,"epochs":5,"model":"ResNet-18"}'


def _sbatch_held(gpus: int, partition: str) -> tuple[int | None, str]:
    import subprocess

    argv = ["sbatch", "--parsable", f"--partition={partition}", "--job-name=shockbench",
            "--output=/dev/null", f"--gres=gpu:{gpus}", f"--comment=shock:spec={BENCH_SPEC}",
            "--hold", "--wrap", "sleep 600"]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, str(exc)
    if out.returncode != 0:
        return None, out.stderr.strip()
    return int(out.stdout.strip().split(";")[0]), ""


def _submit_held(jobs: int, partition: str, workers: int, ids: set[int]) -> list[str]:
    """Submit `jobs` held jobs; each id goes into `ids` as soon as sbatch answers, so that an
    interrupted submission still knows every job it made. Returns the sbatch errors."""
    from concurrent.futures import ThreadPoolExecutor

    def one(k: int) -> str:
        job_id, error = _sbatch_held(1 + k % 8, partition)
        if job_id is not None:
            ids.add(job_id)
        return error

    pool = ThreadPoolExecutor(workers)
    try:
        return [e for e in pool.map(one, range(jobs)) if e]
    finally:   # on an interrupt: submit nothing more, wait for the sbatch calls under way
        pool.shutdown(wait=True, cancel_futures=True)


def _cancel(ids: set[int]) -> None:
    import subprocess

    for chunk in range(0, len(ids), 500):
        part = sorted(ids)[chunk:chunk + 500]
        subprocess.run(["scancel", *map(str, part)], capture_output=True, timeout=120,
                       check=False)


def _interrupt_on_signals() -> dict[signal.Signals, Any]:
    """SIGTERM and SIGHUP interrupt like Ctrl-C (so the submitted jobs are cancelled);
    returns the previous handlers."""
    def interrupt(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    return {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}


def bench_round(jobs: int, policy: str, partition: str, workers: int = 8) -> dict[str, object]:
    """Submit `jobs` held managed jobs, run ONE daemon round on them (real reads, dry-run
    actions), cancel them, also when interrupted (Ctrl-C, SIGTERM, SIGHUP). Only the submitted
    jobs are scheduled (`job_filter`), so other jobs on the cluster neither distort the numbers
    nor receive an action."""
    import time

    from ..daemon.runner import build_daemon, parse_config
    from ..slurm.backend import make_backend
    from ..slurm.dryrun import DryRunBackend

    ids: set[int] = set()
    previous = _interrupt_on_signals()
    try:
        t0 = time.perf_counter()
        errors = _submit_held(jobs, partition, workers, ids)
        submit_s = time.perf_counter() - t0
        cfg = parse_config({"daemon": {"policy": policy, "partitions": [partition],
                                       "grace_seconds": 0, "backend": "cli"},
                            "policy": ({"min_resolve_interval_s": 0, "idle_unallocated": False}
                                       if policy != "shockwave" and policy != "fifo" else {})})
        backend = DryRunBackend(make_backend("cli"), echo=None)
        daemon = build_daemon(cfg, backend, job_filter=lambda j: j.job_id in ids, emit=lambda _: None)
        cluster = daemon.cluster
        timings: dict[str, float] = {}
        observe = cluster.observe

        def timed_observe(now: float):
            t = time.perf_counter()
            snap = observe(now)
            timings["observe_s"] = time.perf_counter() - t
            return snap

        cluster.observe = timed_observe  # type: ignore[method-assign]
        t1 = time.perf_counter()
        snapshot = daemon.loop.run_round()
        wall = time.perf_counter() - t1
        solve = daemon.loop.stats.solve_s
        actions = backend.actions
        return {
            "jobs": jobs, "submitted": len(ids), "submit_errors": errors[:3],
            "submit_wall_s": round(submit_s, 3), "active_in_snapshot": len(snapshot.jobs),
            "gpus": snapshot.gpus, "policy": policy,
            "reads": backend.calls["jobs"] + backend.calls["nodes"],
            "action_calls": len(actions),
            "actions": [_summary(a) for a in actions],
            "round_wall_s": round(wall, 4), "solve_s": round(solve, 4),
            "observe_s": round(timings.get("observe_s", 0.0), 4),
            "round_wall_excluding_solve_s": round(wall - solve, 4),
        }
    finally:
        _cancel(ids)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _summary(argv: tuple[str, ...]) -> str:
    """`scontrol release (16 jobs)`: the command without its (long) job list."""
    words = [a for a in argv if not a[:1].isdigit() and not a.startswith("JobId=")]
    jobs = sum(len(a.split(",")) for a in argv if a[:1].isdigit()) or \
        sum(1 for a in argv if a.startswith("JobId="))
    return f"{' '.join(words)} ({jobs} jobs)"


@bench_group.command("round")
@jobs_option(1000, "Held managed jobs to submit to the live cluster.")
@click.option("--policy", type=click.Choice(tuple(REGISTRY)), default="shockwave",
              show_default=True, help="The policy of the round.")
@click.option("--partition", default="gpu", show_default=True)
@json_option("Also write the JSON to this file.")
@click.option("--yes", is_flag=True, help="Submit without asking for confirmation.")
def bench_round_cmd(jobs: int, policy: str, partition: str, json_out: Path | None,
                    yes: bool) -> None:
    """One live daemon round over JOBS pending jobs (real reads, dry-run actions); the
    submitted jobs are cancelled afterwards, also when interrupted."""
    if not yes:
        click.confirm(f"Submit {jobs} held jobs (job name shockbench) to partition "
                      f"{partition!r} of the live cluster? They are cancelled at the end",
                      abort=True)
    missing = [c for c in ("sbatch", "squeue", "sinfo", "scancel") if shutil.which(c) is None]
    if missing:     # nothing is submitted
        raise click.ClickException(f"Slurm command(s) not found on PATH: {', '.join(missing)}")
    try:
        result = bench_round(jobs, policy, partition)
    except ShockslurmError as exc:      # the submitted jobs are cancelled by then
        raise click.ClickException(str(exc)) from None
    _echo_json(result, json_out)


from .bench_quality import quality_cmd  # noqa: E402  (after the group it joins)

bench_group.add_command(quality_cmd)
