"""The daemon as operators run it, on the real Slurm test cluster: `shockslurm daemon --config`
as a subprocess (config derived from contrib/shockslurm.toml), Prometheus metrics scraped while it
runs and checked against the store, SIGHUP reload (valid and invalid), SIGTERM clean exit.

Only jobs whose name starts with this test's unique prefix are scheduled (`[daemon]
job_name_prefix`), so other managed jobs on the shared test cluster are left alone.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from shockslurm.ops.config import toml_value
from shockslurm.slurm.cli_backend import CliBackend
from shockslurm.slurm.types import JobState
from shockslurm.store import open_store
from shockslurm.store.models import EnactmentIntent, Job, JobEvent, PlanEntry, Round, Run

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).resolve().parent / "worker.py"
GPUS = [8, 8, 8, 8]
TARGETS = [50, 60, 40, 70]          # units of 0.2 s


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_config(path: Path, doc: dict) -> None:
    lines = []
    for section, table in doc.items():
        lines.append(f"[{section}]")
        lines += [f"{k} = {toml_value(v)}" for k, v in table.items()]
    path.write_text("\n".join(lines) + "\n")


def _scrape(port: int) -> dict[tuple[str, tuple], float]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(body.decode()) for s in fam.samples}


def _store_numbers(engine) -> tuple[int, int, int]:
    with Session(engine) as s:
        run_id = s.scalar(select(Run.id).where(Run.kind == "live")
                          .where(Run.policy == "max_min_fairness").order_by(Run.id.desc()))
        if run_id is None:
            return 0, 0, 0
        rounds = s.scalar(select(func.count()).select_from(Round).where(Round.run_id == run_id))
        latest = s.scalar(select(Round.id).where(Round.run_id == run_id)
                          .order_by(Round.round_index.desc()))
        gpus = s.scalar(select(func.coalesce(func.sum(PlanEntry.gpus), 0))
                        .where(PlanEntry.round_id == latest)) if latest else 0
        failed = s.scalar(select(func.count()).select_from(EnactmentIntent).join(Round)
                          .where(Round.run_id == run_id)
                          .where(EnactmentIntent.return_code.is_not(None))
                          .where(EnactmentIntent.return_code != 0))
        return int(rounds), int(gpus), int(failed)


def _wait_log(log: Path, text: str, timeout: float, proc: subprocess.Popen) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        content = log.read_text()
        if text in content:
            return content
        if proc.poll() is not None:
            break
        time.sleep(0.3)
    raise AssertionError(f"{text!r} not in the daemon's log:\n{log.read_text()}")


def _completed_events(engine) -> set[int]:
    """Slurm job ids with a `completed` event in the store."""
    with Session(engine) as s:
        return set(s.scalars(select(Job.job_id).join(JobEvent, JobEvent.job_pk == Job.id)
                             .where(JobEvent.kind == "completed")))


def test_daemon_operations(tmp_path: Path, slurm_cluster):
    prefix = f"opsit{os.getpid()}x{int(time.time()) % 100000}-"
    db = str(tmp_path / "store.db")
    port = _free_port()
    doc = tomllib.loads((ROOT / "contrib" / "shockslurm.toml").read_text())
    doc["daemon"].update(db=db, round_seconds=4, grace_seconds=2, stop_timeout_seconds=20,
                         metrics_port=port, metrics_address="127.0.0.1", backend="cli",
                         policy="max_min_fairness", job_name_prefix=prefix)
    doc["policy"] = {"min_resolve_interval_s": 0, "idle_unallocated": False}
    cfg_path = tmp_path / "shockslurm.toml"
    _write_config(cfg_path, doc)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOCKSLURM_")}
    check = subprocess.run([sys.executable, "-m", "shockslurm.cli.main", "config", "check",
                            "--config", str(cfg_path)], capture_output=True, text=True, env=env)
    assert check.returncode == 0, check.stderr
    (tmp_path / "state").mkdir()
    ours: list[int] = []
    log = tmp_path / "daemon.log"
    proc = None
    try:
        for k, (g, t) in enumerate(zip(GPUS, TARGETS)):
            argv = [sys.executable, "-m", "shockslurm.cli.shocksub", "--gpus", str(g),
                    "--partition", "gpu", "--job-name", f"{prefix}{k}", "--model", "ResNet-18",
                    "--epochs", str(t // 10), "--epoch-seconds", "2", "--grace-seconds", "60",
                    "--output", str(tmp_path / "%x-%j.out"),
                    "--script-dir", str(tmp_path / "scripts"), "--db", db, "--",
                    sys.executable, str(WORKER), "--target", str(t),
                    "--state", str(tmp_path / "state")]
            out = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=tmp_path,
                                 env=env)
            assert out.returncode == 0, out.stderr
            ours.append(int(out.stdout.strip().splitlines()[-1]))

        with open(log, "w") as fh:
            proc = subprocess.Popen([sys.executable, "-m", "shockslurm.cli.main", "daemon",
                                     "--config", str(cfg_path)], stdout=fh,
                                    stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
        _wait_log(log, "round 1:", 60, proc)
        engine = open_store(db)

        # Metrics agree with the store (scraped between rounds: retry until a quiet window).
        matched = None
        for _ in range(40):
            before = _scrape(port)
            rounds, gpus, failed = _store_numbers(engine)
            after = _scrape(port)
            r = before[("shockslurm_rounds_total", ())]
            if r == after[("shockslurm_rounds_total", ())] == rounds and rounds >= 2:
                matched = (before, rounds, gpus, failed)
                break
            time.sleep(0.5)
        assert matched is not None, log.read_text()
        m, rounds, gpus, failed = matched
        assert m[("shockslurm_gpus_allocated", ())] == gpus
        assert m[("shockslurm_round_duration_seconds_count", ())] == rounds
        assert m[("shockslurm_solve_duration_seconds_count", ())] == rounds
        assert 0 < m[("shockslurm_gpus_schedulable", ())] <= slurm_cluster.gpus
        failures = sum(v for (name, _), v in m.items()
                       if name == "shockslurm_enactment_failures_total")
        assert failures == failed
        states = {dict(lbl)["state"]: v for (name, lbl), v in m.items()
                  if name == "shockslurm_managed_jobs"}
        assert sum(states.values()) <= len(ours)

        # SIGHUP with an invalid file: the old configuration stays.
        good = cfg_path.read_text()
        cfg_path.write_text(good.replace("round_seconds = 4", "round_seconds = -1"))
        proc.send_signal(signal.SIGHUP)
        content = _wait_log(log, "configuration reload failed", 30, proc)
        assert "daemon.round_seconds" in content and proc.poll() is None
        # SIGHUP with a valid change: applied.
        cfg_path.write_text(good.replace("round_seconds = 4", "round_seconds = 3"))
        proc.send_signal(signal.SIGHUP)
        _wait_log(log, "configuration reloaded: daemon.round_seconds=3", 30, proc)

        # Let the jobs finish (completions feed the forecast-error histogram).
        backend = CliBackend()
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            states_now = {j.job_id: j.state for j in backend.jobs() if j.job_id in ours}
            if all(s.finished for s in states_now.values()):
                break
            time.sleep(2)
        completed = {j for j, st in states_now.items() if st is JobState.COMPLETED}
        deadline = time.monotonic() + 60         # the rounds after the last completion see it
        while time.monotonic() < deadline and not completed <= _completed_events(engine):
            time.sleep(1)
        final = _scrape(port)
        assert final[("shockslurm_rounds_total", ())] > rounds
        assert final[("shockslurm_forecast_abs_error_seconds_count", ())] >= 1, log.read_text()

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()
        content = log.read_text()
        assert "stopped after" in content and "Traceback" not in content
        rounds, _, failed = _store_numbers(engine)
        assert final[("shockslurm_rounds_total", ())] <= rounds
        # every job that COMPLETED while the daemon ran has its `completed` event (the rho chart)
        recorded = _completed_events(engine)
        assert completed and recorded & set(ours) == completed, (completed, recorded)
        engine.dispose()
        print(content)

        # status and report on the store of this real run: a table and non-trivial PNGs
        status = subprocess.run([sys.executable, "-m", "shockslurm.cli.main", "status", "--db", db,
                                 "--json"], capture_output=True, text=True, env=env, timeout=60)
        assert status.returncode == 0, status.stderr
        report_dir = tmp_path / "report"
        report = subprocess.run([sys.executable, "-m", "shockslurm.cli.main", "report", "--db", db,
                                 "--out", str(report_dir)], capture_output=True, text=True,
                                env=env, timeout=120)
        assert report.returncode == 0, report.stderr
        pngs = sorted(report_dir.glob("*.png"))
        assert any("timeline" in p.name for p in pngs) and any("utilisation" in p.name for p in pngs)
        assert (report_dir / "rho-by-policy.png") in pngs
        import matplotlib.image as mpimg
        import numpy as np
        for png in pngs:
            assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
            pixels = mpimg.imread(png)[..., :3].reshape(-1, 3)
            assert len(np.unique(pixels, axis=0)) > 8, png
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        if ours:
            subprocess.run(["scancel", *map(str, ours)], capture_output=True, timeout=30)
