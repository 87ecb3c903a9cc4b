"""`shockslurm bench live-family`: seeds, the per-seed rows against direct predictions and the
bounds, the summary's arithmetic, the same rows from a process pool, and bad input."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from shockslurm.cli.main import cli
from shockslurm.livebench.family import (FamilySettings, family_rows, family_table, parse_seeds,
                                         seed_row, spread, summarise)
from shockslurm.livebench.report import predict, workload_bounds
from shockslurm.livebench.workload import default_workload, scale
from shockslurm.model import parse_cluster_shape

NODES = parse_cluster_shape("4x8")


def test_seeds_read_ranges_and_single_seeds_once_each_in_order():
    assert parse_seeds("10-12") == [10, 11, 12]
    assert parse_seeds(" 15, 10-11 ,11,3") == [15, 10, 11, 3]
    for bad, says in [("a", "'a'"), ("12-10", "12-10"), ("", "''"), ("1,,2", "''"),
                      ("-3", "'-3'"), ("1-2-3", "'1-2-3'")]:
        with pytest.raises(ValueError, match=says):
            parse_seeds(bad)


def test_spread_gives_median_geometric_mean_range_and_the_count_at_or_below_a_target():
    s = spread([0.5, None, 2.0, 1.0], target=1.0)
    assert s == {"median": 1.0, "geomean": 1.0, "min": 0.5, "max": 2.0, "n": 3,
                 "at_or_below": 2}
    assert spread([0.25, 4.0, 1.0])["geomean"] == pytest.approx(1.0)
    assert "at_or_below" not in spread([1.0])
    assert spread([0.0, 1.0])["geomean"] is None           # no geometric mean through 0
    assert spread([None])["median"] is None and spread([], 1.0)["at_or_below"] == 0


def _row(seed: int, mine: float, bound: float, gang: int) -> dict:
    metrics = {"makespan_s": mine, "avg_jct_s": mine, "p99_jct_s": mine, "worst_rho": mine,
               "median_rho": mine, "utilization": mine}
    return {"seed": seed, "ratios": {"shockwave": metrics},
            "bound_ratios": {"makespan_s": bound, "avg_jct_s": bound, "worst_rho": bound},
            "arms": {"native": {"worst_job": {"job": 1, "gang": 1}},
                     "shockwave": {"worst_job": {"job": 2, "gang": gang}}}}


def test_summary_and_table_over_hand_made_seeds():
    rows = [_row(1, 0.6, 0.5, 8), _row(2, 0.9, 0.55, 8), _row(3, 0.8, 0.7, 4)]
    summary = summarise(rows, target=0.67)
    worst = summary["ratios"]["shockwave"]["worst_rho"]
    assert worst["median"] == 0.8 and worst["at_or_below"] == 1 and worst["n"] == 3
    assert worst["geomean"] == pytest.approx((0.6 * 0.9 * 0.8) ** (1 / 3), abs=1e-4)
    assert summary["bound_ratios"]["worst_rho"]["at_or_below"] == 2
    assert summary["worst_job_gangs"] == {"native": {"1": 3}, "shockwave": {"4": 1, "8": 2}}
    table = family_table(summary, "native")
    assert "| shockwave | 0.800 / 0.756 (0.600-0.900)" in table
    assert "seeds at or below 0.67x native" in table and "| 1 of 3 |" in table
    assert "at or below" not in family_table(summarise(rows), "native")


def test_a_seeds_row_is_the_direct_prediction_its_ratios_and_its_bounds():
    settings = FamilySettings(nodes=NODES, arms=("native", "shockwave"))
    row = seed_row(11, settings)
    jobs = scale(default_workload(32, seed=11), 0.15)
    native = predict(jobs, "native", NODES, 15.0, 2.0)
    shock = predict(jobs, "shockwave", NODES, 15.0, 2.0)
    assert row["arms"]["native"]["worst_rho"] == native["worst_rho"]
    assert row["arms"]["shockwave"]["makespan_s"] == shock["makespan_s"]
    assert row["ratios"]["shockwave"]["avg_jct_s"] == pytest.approx(
        shock["avg_jct_s"] / native["avg_jct_s"])
    assert row["bounds"] == workload_bounds(jobs, 32)
    worst = row["arms"]["shockwave"]["worst_job"]
    assert worst["rho"] == max(r["rho"] for r in shock["per_job"])
    assert worst["gang"] == next(j.gang_size for j in jobs if j.job_id == worst["job"])
    # no arm beats what no scheduler beats
    for key in ("makespan_s", "avg_jct_s", "worst_rho"):
        assert row["bound_ratios"][key] <= row["ratios"]["shockwave"][key] + 1e-9
        assert row["bound_ratios"][key] <= 1.0 + 1e-9


def test_the_reference_arm_must_be_among_the_arms():
    with pytest.raises(ValueError, match="'native' is not among the arms"):
        FamilySettings(nodes=NODES, arms=("shockwave", "fifo"))


def test_the_command_prints_the_summary_and_a_pool_gives_the_same_rows(tmp_path: Path):
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    base = ["bench", "live-family", "--seeds", "12,13", "--arms", "native,shockwave",
            "--target", "0.8"]
    serial = CliRunner().invoke(cli, base + ["--json", str(one)])
    pooled = CliRunner().invoke(cli, base + ["--workers", "2", "--json", str(two)])
    assert serial.exit_code == 0 and pooled.exit_code == 0, serial.output + pooled.output
    doc = json.loads(one.read_text())
    assert doc == json.loads(two.read_text())
    assert [r["seed"] for r in doc["per_seed"]] == [12, 13]
    ratios = [r["ratios"]["shockwave"]["worst_rho"] for r in doc["per_seed"]]
    summary = doc["summary"]["ratios"]["shockwave"]["worst_rho"]
    assert summary["geomean"] == pytest.approx(math.sqrt(ratios[0] * ratios[1]), abs=1e-4)
    assert summary["at_or_below"] == sum(r <= 0.8 for r in ratios)
    assert "| shockwave |" in serial.output and "seeds at or below 0.8x native" in serial.output


@pytest.mark.parametrize("args, says", [
    (["--seeds", "9-x"], "--seeds"),
    (["--arms", "shockwave,fifo"], "'native' is not among the arms"),
    (["--arms", "native,nosuch"], "nosuch"),
    (["--cluster", "4y8"], "4y8"),
    (["--target", "0"], "--target"),
    (["--policy-option", "round_s=3", "--arms", "native,shockwave"], "round_s"),
])
def test_bad_input_is_a_clear_usage_error(args: list[str], says: str):
    result = CliRunner().invoke(cli, ["bench", "live-family", "--seeds", "10"] + args)
    assert result.exit_code in (1, 2) and says in result.output, result.output
    assert "Traceback" not in result.output


def test_an_unwritable_json_path_is_refused_before_any_simulation(tmp_path: Path):
    blocked = tmp_path / "file"
    blocked.write_text("")
    result = CliRunner().invoke(cli, ["bench", "live-family", "--seeds", "10",
                                      "--json", str(blocked / "out.json")])
    assert result.exit_code == 2 and "--json" in result.output
    assert "seed 10" not in result.output
