"""`shockslurm trace generate --like reference`: the reference generator's distributions."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from shockslurm.cli.main import cli
from shockslurm.workload.reference import read_throughputs, read_trace
from shockslurm.workload.reference_like import (JOB_TYPES, ReferenceLikeConfig,
                                                catalogue_throughputs, generate_reference_like)

N = 4000


@pytest.fixture(scope="module", params=[0, 1])
def drawn(request):
    return generate_reference_like(ReferenceLikeConfig(jobs=N, seed=request.param),
                                   catalogue_throughputs())


def _share(values, value) -> float:
    return sum(v == value for v in values) / len(values)


def test_gang_sizes_follow_the_reference_mix(drawn) -> None:
    distributed = {m for m, _, d in JOB_TYPES if d}
    gangs = [j.line.gang_size for j in drawn if j.line.model in distributed]
    for gang, p, tol in ((1, 0.6, 0.04), (2, 0.3, 0.04), (4, 0.09, 0.025), (8, 0.01, 0.008)):
        assert abs(_share(gangs, gang) - p) <= tol, (gang, _share(gangs, gang))
    assert all(j.line.gang_size == 1 for j in drawn if j.line.model == "Recommendation")
    models = Counter(j.line.model for j in drawn)
    assert abs(models["Recommendation"] / N - 5 / 21) <= 0.03   # 5 of the 21 job types
    assert abs(models["ResNet-50"] / N - 3 / 21) <= 0.03


def test_durations_modes_and_lengths(drawn) -> None:
    cfg = ReferenceLikeConfig()
    grid = np.round(cfg.duration_grid_s())
    durations = np.array([j.duration_s for j in drawn])
    assert set(durations) <= set(grid)
    index = np.searchsorted(grid, durations)
    for (lo, hi), (_, p) in zip(cfg.tier_bounds(), cfg.duration_tiers):
        share = float(np.mean((index >= lo) & (index < hi)))
        assert abs(share - p) <= max(0.03, p / 3), (lo, hi, share)
    modes = [j.line.mode for j in drawn]
    assert abs(_share(modes, "gns") - 0.5) <= 0.04
    static = [j for j in drawn if j.line.mode == "static"]   # only short would-be accordions
    assert static and all(j.duration_s < 1000 for j in static)
    table = catalogue_throughputs()
    for j in drawn[:200]:
        rate = table[(j.line.job_type, j.line.gang_size)]
        assert j.line.total_steps == int(j.duration_s * rate)


def test_arrivals_are_poisson(drawn) -> None:
    arrivals = np.array([j.line.arrival_s for j in drawn])
    assert arrivals[0] == 0 and np.all(np.diff(arrivals) >= 0)
    gaps = np.diff(arrivals)
    assert abs(gaps.mean() - 42.0) <= 0.06 * 42.0
    assert abs(gaps.std() / gaps.mean() - 1.0) <= 0.1        # exponential: CV = 1
    counts = np.bincount((arrivals // 600).astype(int))[:-1]  # jobs per 10 minutes
    assert abs(counts.var() / counts.mean() - 1.0) <= 0.35   # Poisson: variance = mean


def test_the_published_trace_lies_on_these_distributions(reference_data: Path) -> None:
    """Every duration of the reference's 120-job trace is on our duration grid, and its
    lengths are int(duration x throughput) as we compute them."""
    grid = set(np.round(ReferenceLikeConfig().duration_grid_s()))
    table = read_throughputs(reference_data / "throughputs-tacc.json")
    text = (reference_data / "trace-120jobs.tsv").read_text().splitlines()
    for line, tl in zip(text, read_trace(reference_data / "trace-120jobs.tsv")):
        duration = int(line.split("\t")[10])
        assert duration in grid
        assert abs(tl.total_steps - int(duration * table[(tl.job_type, tl.gang_size)])) <= 1
        assert tl.gang_size == 1 or tl.model != "Recommendation"


def _generate(tmp_path: Path, name: str, *extra: str) -> tuple[Path, str]:
    out = tmp_path / name
    result = CliRunner().invoke(cli, ["trace", "generate", "--like", "reference", "--jobs", "40",
                                      "--seed", "5", "--out", str(out), *extra])
    assert result.exit_code == 0, result.output
    return out, result.output


def test_same_seed_same_workload(tmp_path: Path) -> None:
    a, _ = _generate(tmp_path, "a.jsonl")
    b, _ = _generate(tmp_path, "b.jsonl")
    assert a.read_bytes() == b.read_bytes()
    result = CliRunner().invoke(cli, ["trace", "generate", "--like", "reference", "--jobs", "40",
                                      "--seed", "6", "--out", str(tmp_path / "c.jsonl")])
    assert result.exit_code == 0 and (tmp_path / "c.jsonl").read_bytes() != a.read_bytes()
    more = generate_reference_like(ReferenceLikeConfig(jobs=60, seed=5), catalogue_throughputs())
    fewer = generate_reference_like(ReferenceLikeConfig(jobs=40, seed=5), catalogue_throughputs())
    assert more[:40] == fewer                 # one stream per field: --jobs keeps the first jobs


def _simulate(*args: str) -> str:
    result = CliRunner().invoke(cli, ["simulate", "--no-progress", "--gpus", "8", "--policy",
                                      "fifo,shockwave", *args])
    assert result.exit_code == 0, result.output
    return result.output


def test_generated_workloads_simulate(tmp_path: Path, reference_data: Path) -> None:
    jsonl, output = _generate(tmp_path, "w.jsonl")
    assert "built-in catalogue's throughput model" in output
    assert len(jsonl.read_text().splitlines()) == 40
    row = json.loads(jsonl.read_text().splitlines()[0])
    assert row["mode"] in ("static", "accordion", "gns") and row["iterations"] > 0
    assert "adaptation=reference" in _simulate("--trace", str(jsonl), "--adaptation", "reference")
    throughputs = reference_data / "throughputs-tacc.json"
    tsv, _ = _generate(tmp_path, "w.tsv", "--throughputs", str(throughputs))
    assert len(read_trace(tsv)) == 40
    out = _simulate("--trace", str(tsv), "--throughputs", str(throughputs))
    assert "40 jobs, 8 GPUs" in out and "adaptation=reference" in out


def test_a_tsv_needs_the_throughput_file(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["trace", "generate", "--like", "reference",
                                      "--out", str(tmp_path / "w.tsv")])
    assert result.exit_code != 0 and "--throughputs" in result.output
    assert not (tmp_path / "w.tsv").exists()
