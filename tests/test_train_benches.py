"""The training helper's two benchmarks run end to end on the CPU (`python -m ...`): their JSON
and its arithmetic. Their figures are in README "Training helper", measured, not asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")  # CI installs CPU torch (tests/run.sh)

from .train_job import job_env  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def _run(*argv: str) -> dict:
    res = subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True,
                         timeout=300, env=job_env(), cwd=REPO)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout)


def test_restart_bench_times_a_real_stop_and_resume(tmp_path: Path):
    out = _run("shockslurm.train.restart_bench", "--repeats", "2", "--tmp-dir", str(tmp_path))
    assert out["model"] == "mlp" and out["device"] == "cpu" and len(out["runs"]) == 2
    for run in out["runs"]:
        parts = run["import_s"] + run["device_s"] + run["build_s"] + run["load_s"]
        assert 0 < parts + run["first_step_s"] <= run["start_s"] + 0.05   # spawn -> first step
        assert run["switch_s"] == pytest.approx(run["stop_s"] + run["start_s"] + run["warmup_s"])
        assert run["stop_s"] > 0 and run["load_s"] > 0 and run["checkpoint_bytes"] > 100_000
    assert out["median"]["switch_s"] == pytest.approx(
        sorted(r["switch_s"] for r in out["runs"])[0] / 2 + sorted(
            r["switch_s"] for r in out["runs"])[1] / 2, rel=1e-3)
    assert not list(tmp_path.iterdir()), "the benchmark left checkpoints behind"


def test_step_overhead_bench_reports_its_figures():
    out = _run("shockslurm.train.bench", "--repeats", "2", "--steps", "20", "--hidden", "64")
    assert out["device"] == "cpu" and out["repeats"] == 2
    assert out["step_ms_plain"] > 0 and out["step_ms_helper"] > 0 and out["checkpoint_bytes"] > 0
