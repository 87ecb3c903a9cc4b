from __future__ import annotations

import json

import pytest

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
    # "jobs [0] need more GPUs than the cluster has (4)" named neither the gangs nor what to
    # change; now each job with its GPUs, and the options that size the cluster
    assert result.exit_code == 1, result.output
    assert ("the workload's jobs 0 (8 GPUs) ask for more GPUs than the cluster has (4): give a "
            "larger cluster (--gpus, --cluster)") in result.output


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


def test_simulate_on_nodes(tmp_path) -> None:
    out = tmp_path / "r.json"
    result = CliRunner().invoke(cli, ["simulate", "--policy", "fifo", "--cluster", "2x4",
                                      "--no-progress", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "8 GPUs on nodes 2x4," in result.output
    data = json.loads(out.read_text())
    assert data["cluster"] == "2x4" and data["gpus"] == 8
    pooled = CliRunner().invoke(cli, ["simulate", "--policy", "fifo", "--gpus", "8",
                                      "--no-progress", "--json", str(out)])
    assert pooled.exit_code == 0 and json.loads(out.read_text())["cluster"] == "pool"


def test_simulate_fill_on_completion(tmp_path) -> None:
    out = tmp_path / "r.json"
    result = CliRunner().invoke(cli, ["simulate", "--policy", "fifo", "--gpus", "8",
                                      "--fill-on-completion", "--no-progress", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "freed GPUs filled at once" in result.output
    live_like = json.loads(out.read_text())
    assert live_like["fill_on_completion"] is True
    assert live_like["keep_partial_iterations"] is True      # live jobs never notice a round
    plain = CliRunner().invoke(cli, ["simulate", "--policy", "fifo", "--gpus", "8",
                                     "--no-progress", "--json", str(out)])
    assert plain.exit_code == 0
    assert {"fill_on_completion", "keep_partial_iterations"}.isdisjoint(
        json.loads(out.read_text()))


@pytest.mark.parametrize("args, message", [
    (["--cluster", "4x"], "Invalid value for --cluster: bad cluster group '4x'"),
    (["--cluster", "2x0"], "Invalid value for --cluster"),
    (["--cluster", "2x4", "--gpus", "8"], "either --gpus (one pool) or --cluster"),
])
def test_bad_cluster_is_named(args, message) -> None:
    result = CliRunner().invoke(cli, ["simulate", "--policy", "fifo", *args])
    assert result.exit_code == 2 and message in result.output
    assert "Traceback" not in result.output


def test_switch_cost_bench_prints_medians(tmp_path) -> None:
    runner = CliRunner()
    traces = []
    for seed in (1, 2, 3):
        trace = tmp_path / f"w{seed}.jsonl"
        assert runner.invoke(cli, ["trace", "generate", "--jobs", "8", "--seed", str(seed),
                                   "--out", str(trace)]).exit_code == 0
        traces += ["--trace", str(trace)]
    out = tmp_path / "s.json"
    result = runner.invoke(cli, ["bench", "switch-cost", *traces, "--cluster", "2x4",
                                 "--restart-overhead", "0,120", "--policy", "fifo",
                                 "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "| fifo | 0 |" in result.output and "| fifo | 120 |" in result.output
    data = json.loads(out.read_text())
    assert len(data["runs"]) == 6 and [m["workloads"] for m in data["medians"]] == [3, 3]
    cheap, dear = data["medians"]
    spans = sorted(r["makespan_s"] for r in data["runs"] if r["restart_overhead_s"] == 0)
    assert cheap["makespan_s"] == spans[1]            # the median of three
    assert dear["makespan_s"] >= cheap["makespan_s"]  # switches only cost time
    bad = runner.invoke(cli, ["bench", "switch-cost", "--restart-overhead", "x"])
    assert bad.exit_code == 2 and "--restart-overhead" in bad.output


def test_bench_round_asks_before_submitting(tmp_path, monkeypatch):
    """Without --yes nothing is submitted unless the user agrees (no sbatch on PATH here: had it
    gone on, the output would show sbatch's absence)."""
    monkeypatch.setenv("PATH", str(tmp_path))
    result = CliRunner().invoke(cli, ["bench", "round", "--jobs", "1000"], input="n\n")
    assert result.exit_code == 1 and "Aborted!" in result.output
    assert "Submit 1000 held jobs (job name shockbench) to partition 'gpu'" in result.output
    assert "sbatch" not in result.output and "submitted" not in result.output

