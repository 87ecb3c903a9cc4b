"""A plain `sbatch` job reports too, on the real Slurm test cluster (CPU torch).

The job is submitted with `sbatch` itself (no shocksub, no `--db`: no registration, no report
secret) to the managed partition `gpu`, where job_submit.lua tags it managed. It trains with the
helper (`examples/train_mnist_like.py`: batch size 32, 32, then 64, 128), which finds the spool in
the site configuration and writes unsigned reports. The daemon accepts them because the spool
files' owner is the user Slurm runs the job as (`reports/owned.py`): the job is registered on its
first report, its throughput and batch-size changes are in the store within one report interval,
and the daemon's view of the job is built from them. Everything else as in
`test_reports_default_live.py` (whose helpers this test uses).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from shockslurm.daemon import build_daemon, load_config
from shockslurm.slurm.cli_backend import CliBackend
from shockslurm.store import open_store
from shockslurm.store import repository as repo
from shockslurm.store.models import Job

from .helpers import RoundRecorder, run_to_completion, store_rows
from .test_reports_default_live import (EPOCHS, EXAMPLE, REPORT_S, STEP_SLEEP_S, TIMEOUT_S,
                                        WAIT_BOUND_S, _submitter_env)

torch = pytest.importorskip("torch")  # CI installs CPU torch (tests/run.sh); never skipped there

pytestmark = pytest.mark.slurm


def _pk(engine, job_id: int) -> int | None:
    with Session(engine) as s:
        return s.scalar(select(Job.id).where(Job.job_id == job_id)
                        .join(Job.run).where(repo.Run.kind == repo.REGISTRY_KIND))


def test_plain_sbatch_job_reports_reach_the_store_and_the_daemons_view(tmp_path: Path,
                                                                       slurm_cluster):
    spool = tmp_path / "spool"
    spool.mkdir()
    spool.chmod(0o1733)
    db = f"sqlite:///{tmp_path / 'store.db'}"
    site = tmp_path / "shockslurm.toml"
    site.write_text(f'[daemon]\nround_seconds = {REPORT_S}\ngrace_seconds = 3\n'
                    f'policy = "max_min_fairness"\npartitions = ["gpu"]\ndb = "{db}"\n'
                    f'spool_dir = "{spool}"\nmetrics_port = 0\n')
    script = tmp_path / "plain.sbatch"
    script.write_text(
        "#!/bin/bash\n"
        f"exec {sys.executable} {EXAMPLE} --ckpt-dir {tmp_path / 'ck'} --epochs {EPOCHS} "
        f"--seed 7 --threads 1 --sleep {STEP_SLEEP_S} --report-interval {REPORT_S}\n")
    backend = CliBackend()
    train_id = None
    try:
        out = subprocess.run(
            ["sbatch", "--parsable", "--partition", "gpu", "--gres", "gpu:1",
             "--job-name", "shockps-train", "--output", str(tmp_path / "%x-%j.out"),
             str(script)], capture_output=True, text=True, timeout=60, cwd=tmp_path,
            env=_submitter_env(site))
        assert out.returncode == 0, out.stderr
        train_id = int(out.stdout.strip().split(";")[0])
        engine = open_store(db, create=True)
        assert _pk(engine, train_id) is None            # nothing registered it
        cfg = load_config(site)
        lines: list[str] = []
        daemon = build_daemon(cfg, backend, engine=engine,
                              job_filter=lambda j: j.job_id == train_id, emit=lines.append)
        recorder = RoundRecorder(engine, daemon.cluster, train_id, lambda: _pk(engine, train_id))
        daemon.loop.observers.append(recorder)
        rounds = recorder.rounds
        run_to_completion(daemon, backend, train_id, tmp_path, f"shockps-train-{train_id}.out",
                          TIMEOUT_S, lines)
        assert not list((tmp_path / "spool.rejected").glob("*.reason")), \
            [p.read_text() for p in (tmp_path / "spool.rejected").glob("*.reason")]

        pk = _pk(engine, train_id)
        assert pk is not None
        with Session(engine) as s:
            job = s.get(Job, pk)
            assert job.report_key is None and job.owner      # registered by the daemon
        samples, changes = store_rows(engine, pk)
        assert [(old, new) for _, old, new in changes] == [(32, 64), (64, 128)], changes
        assert len(samples) >= 3 and {bs for _, _, bs in samples} >= {32, 64}, samples

        waits = recorder.report_waits(samples, changes)
        print(f"plain sbatch report -> store: max {max(waits):.2f} s over {len(waits)} reports "
              f"(rounds of {REPORT_S:g} s)")
        assert max(waits) <= WAIT_BOUND_S, waits

        reported = [r for r in rounds if r["progress"] is not None
                    and r["progress"].source == "reports" and r["view"] is not None]
        assert reported, [(r["start"], r["progress"]) for r in rounds]
        grown = [r["view"] for r in reported if r["view"].batch_size > 32]
        assert grown, [(r["view"].batch_size, r["view"].epochs_done) for r in reported]
        assert grown[0].iterations_per_s is not None
        print("views (epochs, bs, it/s):", [(round(r["view"].epochs_done, 2),
                                             r["view"].batch_size,
                                             round(r["view"].iterations_per_s or 0, 1))
                                            for r in reported])
        engine.dispose()
    finally:
        if train_id is not None:
            subprocess.run(["scancel", str(train_id)], capture_output=True, timeout=30)
