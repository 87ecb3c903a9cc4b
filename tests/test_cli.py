from __future__ import annotations

import json

from click.testing import CliRunner

from shockslurm.cli.main import cli

KEYS = {"policy", "makespan_s", "avg_jct_s", "p99_jct_s", "worst_rho", "median_rho",
        "unfair_fraction", "utilization", "sim_wall_s"}


def test_simulate_default_workload_prints_a_table(tmp_path) -> None:
    out = tmp_path / "o.json"
    result = CliRunner().invoke(cli, ["simulate", "--policy", "fifo,gandiva_fair", "--json",
                                      str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "makespan s" in result.output and "gandiva_fair" in result.output
    data = json.loads(out.read_text())
    assert [d["policy"] for d in data] == ["fifo", "gandiva_fair"]
    assert KEYS <= set(data[0]) and data[0]["makespan_s"] > 0


def test_generate_then_simulate(tmp_path) -> None:
    trace = tmp_path / "w.jsonl"
    runner = CliRunner()
    assert runner.invoke(cli, ["trace", "generate", "--jobs", "12", "--out", str(trace)]).exit_code == 0
    result = runner.invoke(cli, ["simulate", "--trace", str(trace), "--gpus", "4", "--policy",
                                 "max_min_fairness", "--json", str(tmp_path / "o.json")])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "o.json").read_text())["policy"] == "max_min_fairness"


def test_bad_input_is_a_clear_error(tmp_path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"model": "ResNet-18", "gpus": -1}\n')
    result = CliRunner().invoke(cli, ["simulate", "--trace", str(bad), "--gpus", "4",
                                      "--policy", "fifo"])
    assert result.exit_code != 0
    assert "bad.jsonl, line 1" in result.output
    result = CliRunner().invoke(cli, ["simulate", "--policy", "nope"])
    assert result.exit_code != 0 and "unknown policy nope" in result.output


def test_gang_larger_than_cluster_is_rejected(tmp_path) -> None:
    trace = tmp_path / "w.jsonl"
    trace.write_text('{"model": "LM", "gpus": 8, "arrival_s": 0, "epochs": 2, "schedule": [[0, 10]]}\n')
    result = CliRunner().invoke(cli, ["simulate", "--trace", str(trace), "--gpus", "4",
                                      "--policy", "fifo"])
    assert result.exit_code != 0 and "need more GPUs" in result.output


def test_gavel_quirks_can_be_turned_off_for_the_baselines(tmp_path) -> None:
    """--resolve-interval 0 --no-idle-new-jobs: a baseline re-solves every round and new jobs
    get idle GPUs at once, which changes its schedule; the header says which mode ran."""
    runs = {}
    for name, extra in (("gavel", []), ("eager", ["--resolve-interval", "0",
                                                  "--no-idle-new-jobs"])):
        out = tmp_path / f"{name}.json"
        result = CliRunner().invoke(cli, ["simulate", "--policy", "max_sum_throughput",
                                          "--no-progress", "--json", str(out), *extra])
        assert result.exit_code == 0, result.output
        runs[name] = (result.output.splitlines()[0], json.loads(out.read_text()))
    assert "re-solve every 1000 s, new jobs wait for it" in runs["gavel"][0]
    assert "re-solve every 0 s" in runs["eager"][0] and "wait" not in runs["eager"][0]
    assert runs["eager"][1]["avg_jct_s"] < runs["gavel"][1]["avg_jct_s"]
