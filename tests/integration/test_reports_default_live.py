"""Reports wired end to end by default, on the real Slurm test cluster (CPU torch).

A job submitted with `shocksub` and **no extra environment** trains with the helper
(`examples/train_mnist_like.py`: batch size 32, 32, then 64, 128); its throughput and batch-size
changes reach the store within one report interval and the daemon's view of the job (the
forecaster's input) is built from them.

"No extra environment", precisely: the submitter's environment names no report setting
(`SHOCKSLURM_SPOOL`, `SHOCKSLURM_DB`, `SHOCKSLURM_REPORT_SECRET`, `SHOCKSLURM_CLUSTER`: all
removed, and every `SLURM_*`), and the user passes no reporting option: only what a researcher
types (`--db` registers the job's spec and report key, as the docs say). The one variable set is
`SHOCKSLURM_CONFIG`, naming the site configuration file: it stands in for
/etc/shockslurm/shockslurm.toml, which a test on a shared machine must not install. Slurm copies
the submitter's environment into the job, so the job sees the same file; the spool reaches the
job through the `export SHOCKSLURM_SPOOL=...` line shocksub rendered from that file (checked in
the script). The daemon reads the same file (`load_config`) and runs in this process, so that
its per-round view of the job can be inspected (`build_daemon`, as `shockslurm daemon` wires it;
only this test's job is scheduled).

"Within one report interval": the trainer reports throughput every `REPORT_S` seconds and the
daemon ingests the spool at the start of every round (`round_seconds` = `REPORT_S`); a report
must be in the store by the end of the first round that starts after it was written.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy.orm import Session

from shockslurm.cli import status as status_cli
from shockslurm.daemon import build_daemon, load_config
from shockslurm.slurm.cli_backend import CliBackend
from shockslurm.store import open_store

from .helpers import (RoundRecorder, assert_view_from_reports, registration_pk,
                      run_to_completion, shocksub_training, store_rows)

torch = pytest.importorskip("torch")  # CI installs CPU torch (tests/run.sh); never skipped there

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train_mnist_like.py"
EPOCHS = 6                 # 64 + 64 + 32 + 3 x 16 = 208 steps; 32 -> 64 after step 128
STEP_SLEEP_S = 0.08        # ~17 s of training: the change lands several rounds in
REPORT_S = 2.0             # the trainer's throughput interval = the daemon's round
WAIT_BOUND_S = 4 * REPORT_S + 2.0   # report written -> in the store (2-5 s idle)
EPOCH_SECONDS = 30.0       # declared (deliberately wrong: the reports must win)
TIMEOUT_S = 150
REPORT_VARS = ("SHOCKSLURM_SPOOL", "SHOCKSLURM_DB", "SHOCKSLURM_REPORT_SECRET",
               "SHOCKSLURM_CLUSTER", "SHOCKSLURM_JOB_PK")


def _submitter_env(site_config: Path) -> dict[str, str]:
    """A researcher's environment: no report setting, the site configuration file named."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SHOCKSLURM_", "SLURM_")) and k not in ("RANK", "WORLD_SIZE")}
    assert not set(REPORT_VARS) & set(env)
    env.update(OMP_NUM_THREADS="1", SHOCKSLURM_CONFIG=str(site_config))
    return env


def test_shocksub_job_reports_reach_the_store_and_the_forecast_by_default(tmp_path: Path,
                                                                          slurm_cluster):
    spool = tmp_path / "spool"
    spool.mkdir()
    spool.chmod(0o1733)                   # as the README installs it
    db = f"sqlite:///{tmp_path / 'store.db'}"
    site = tmp_path / "shockslurm.toml"
    site.write_text(f'[daemon]\nround_seconds = {REPORT_S}\ngrace_seconds = 3\n'
                    f'policy = "max_min_fairness"\npartitions = ["gpu"]\ndb = "{db}"\n'
                    f'spool_dir = "{spool}"\nmetrics_port = 0\n')
    backend = CliBackend()
    train_id = None
    try:
        argv = shocksub_training(
            tmp_path, db, gpus=1, name="shockrd-train", epochs=EPOCHS,
            epoch_seconds=EPOCH_SECONDS,
            command=[sys.executable, str(EXAMPLE), "--ckpt-dir", str(tmp_path / "ck"),
                     "--epochs", str(EPOCHS), "--seed", "7", "--threads", "1",
                     "--sleep", str(STEP_SLEEP_S), "--report-interval", str(REPORT_S)])
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=tmp_path,
                             env=_submitter_env(site))
        assert out.returncode == 0, out.stderr
        train_id = int(out.stdout.strip().splitlines()[-1])
        [script] = (tmp_path / "scripts").glob("shockrd-train-*.sbatch")
        assert f"SHOCK_SITE_SPOOL={spool}\n" in script.read_text()

        cfg = load_config(site)           # the daemon reads the same site file
        engine = open_store(db, create=True)
        with Session(engine) as s:
            pk = registration_pk(s, train_id)
        assert pk is not None
        lines: list[str] = []
        daemon = build_daemon(cfg, backend, engine=engine,
                              job_filter=lambda j: j.job_id == train_id, emit=lines.append)
        recorder = RoundRecorder(
            engine, daemon.cluster, train_id, lambda: pk,
            lambda view, changes: status_cli.collect(backend.jobs(), db, cfg.cluster)[0]
            if changes and view is not None else None)
        daemon.loop.observers.append(recorder)
        rounds = recorder.rounds     # per round: its start, end, the view and the store's rows
        output = run_to_completion(daemon, backend, train_id, tmp_path,
                                   f"shockrd-train-{train_id}.out", TIMEOUT_S, lines)
        # the job could report: it said nothing about its reports
        assert "progress reports go" not in output, output[-3000:]

        # (1) the store has the job's throughput and both batch-size changes
        samples, changes = store_rows(engine, pk)
        assert [(old, new) for _, old, new in changes] == [(32, 64), (64, 128)], changes
        assert len(samples) >= 3 and all(rate > 0 for _, rate, _ in samples), samples
        assert {bs for _, _, bs in samples} >= {32, 64}, samples

        # ... each within one report interval: in the store by the end of a round soon after
        # the job wrote it
        waits = recorder.report_waits(samples, changes)
        print(f"report -> store: max {max(waits):.2f} s over {len(waits)} reports "
              f"(rounds of {REPORT_S:g} s)")
        # about one round's wait plus its work (the first round after a report that had it);
        # the bound leaves a loaded machine's slow rounds room
        assert max(waits) <= WAIT_BOUND_S, waits

        # (2) the daemon's view of the job was built from the reports: its batch size, per-epoch
        # sizes and measured speed, and its forecast moved with them
        reported = [r for r in rounds if r["progress"] is not None
                    and r["progress"].source == "reports" and r["view"] is not None]
        assert reported, [(r["start"], r["progress"]) for r in rounds]
        grown = [r["view"] for r in reported if r["view"].batch_size > 32]
        assert grown, [(r["view"].batch_size, r["view"].epochs_done) for r in reported]
        v = grown[0]
        assert_view_from_reports(v, train_id, epochs=EPOCHS, epoch_seconds=EPOCH_SECONDS)

        # (3) `shockslurm status` shows when the job last reported
        rows = [row for r in rounds if r["status"] for row in r["status"]
                if row.job_id == train_id]
        assert rows and all(row.last_report_s is not None for row in rows), rows
        assert min(row.last_report_age_s for row in rows) <= WAIT_BOUND_S, rows
        print("views (epochs, bs, it/s, observed):",
              [(round(r["view"].epochs_done, 2), r["view"].batch_size,
                round(r["view"].iterations_per_s, 1), r["view"].observed_batch_sizes)
               for r in reported])
        print("status REPORTED:", [row.cells()[-1] for row in rows])
        engine.dispose()
    finally:
        if train_id is not None:
            subprocess.run(["scancel", str(train_id)], capture_output=True, timeout=30)
