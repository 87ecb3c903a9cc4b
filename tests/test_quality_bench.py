"""`shockslurm bench quality`: the pure aggregation on hand-made rows, and one tiny matrix end to
end through the command line."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from shockslurm.cli.main import cli
from shockslurm.policies import REGISTRY
from shockslurm.sim.bounds import makespan_bound
from shockslurm.sim.quality import (Case, cases, makespan_floor, parse_sizes, sim_config,
                                    solo_runtimes, workload)
from shockslurm.sim.quality_summary import (UNGATED, frontier_points, layout_cut, objective_drop,
                                            placement_loss, ratio, ratio_table, resolve_times,
                                            size_summary)
from shockslurm.sim.run import RoundRecord, simulate
from shockslurm.workload.reference_like import catalogue_throughputs


def rec(info: dict[str, Any], gpus_used: int = 0, solve_s: float = 0.0) -> RoundRecord:
    return RoundRecord(0.0, 1, (), gpus_used, solve_s, info)


def row(policy: str, seed: int, gate: str = UNGATED, size: str = "10/4", **metrics: float
        ) -> dict[str, Any]:
    base = {"makespan_s": 100.0, "avg_jct_s": 50.0, "worst_rho": 2.0, "unfair_fraction": 0.1,
            "resolve_median_s": 0.1, "resolve_max_s": 0.2, "pack_loss": 0.0,
            "round_loss": 0.0, "placement_loss": 0.0, "fallbacks": 0, "objective_drop": 0.0,
            "layout_cut": 0.0, "makespan_floor_s": 80.0, "makespan_over_floor": 1.25}
    return {"size": size, "seed": seed, "policy": policy, "gate": gate, **base, **metrics}


def test_parse_sizes_reads_pairs_and_names_a_bad_entry() -> None:
    assert parse_sizes("120/32, 220/64") == [(120, 32), (220, 64)]
    for bad in ("120x32", "120/0", "a/3", ""):
        with pytest.raises(ValueError):
            parse_sizes(bad)


def test_cases_run_gated_policies_with_and_without_the_gate_and_the_others_once() -> None:
    matrix = cases([(10, 4)], [1, 2], ["shockwave", "max_min_fairness"],
                   gated=lambda p: REGISTRY[p].gavel)
    assert [(c.seed, c.policy, c.gate) for c in matrix] == [
        (1, "shockwave", UNGATED), (1, "max_min_fairness", "gate"),
        (1, "max_min_fairness", "nogate"), (2, "shockwave", UNGATED),
        (2, "max_min_fairness", "gate"), (2, "max_min_fairness", "nogate")]


def test_cases_carry_each_policys_options() -> None:
    matrix = cases([(10, 4)], [1], ["shockwave", "fifo"], gated=lambda p: REGISTRY[p].gavel,
                   options={"shockwave": {"tail_weight": 10.0, "k": 0.01}})
    assert [(c.policy, c.options) for c in matrix] == [
        ("shockwave", (("k", 0.01), ("tail_weight", 10.0))), ("fifo", ())]


def test_sim_config_sets_the_gate_and_splits_nodes() -> None:
    gate = sim_config(Case(10, 16, 1, "max_min_fairness", "gate"))
    nogate = sim_config(Case(10, 16, 1, "max_min_fairness", "nogate", node_gpus=8))
    assert (gate.settings.min_resolve_interval_s, gate.settings.idle_unallocated) == (1000.0, True)
    assert gate.cluster == "pool"
    assert (nogate.settings.min_resolve_interval_s, nogate.settings.idle_unallocated) == (0.0, False)
    assert nogate.cluster == "2x8" and nogate.adaptation == "reference"


def test_resolve_times_keep_only_rounds_that_resolved_unless_the_policy_never_says() -> None:
    rounds = [rec({"resolved": True}, solve_s=1.0), rec({"resolved": False}, solve_s=0.5),
              rec({"resolved": True}, solve_s=3.0)]
    assert resolve_times(rounds) == [1.0, 3.0]
    assert resolve_times([rec({}, solve_s=0.2), rec({}, solve_s=0.4)]) == [0.2, 0.4]


def test_placement_loss_combines_the_pack_loss_and_the_round_trim() -> None:
    gangs = {1: 2, 2: 4}
    rounds = [rec({"planned_gpu_rounds": 100, "packed_gpu_rounds": 90, "plan_gpus": 8,
                   "plan_gpus_lost": 2}),
              rec({"plan_gpus": 8, "plan_gpus_lost": 0, "unplaced": [1]})]
    loss = placement_loss(rounds, gangs)
    assert loss["pack_loss"] == pytest.approx(0.10)
    assert loss["round_loss"] == pytest.approx(4 / 16)
    assert loss["placement_loss"] == pytest.approx(1 - 0.9 * 0.75)


def test_placement_loss_of_a_baseline_counts_unplaced_jobs_against_its_allocation() -> None:
    rounds = [rec({"unplaced": [2]}, gpus_used=4), rec({}, gpus_used=8)]
    loss = placement_loss(rounds, {2: 4})
    assert loss == {"pack_loss": 0.0, "round_loss": pytest.approx(4 / 16),
                    "placement_loss": pytest.approx(4 / 16)}


def test_layout_cut_is_the_share_of_the_first_solve_the_layout_could_not_hold() -> None:
    rounds = [rec({"uncapped_gpu_rounds": 100, "layout_cut_gpu_rounds": 6}),
              rec({"uncapped_gpu_rounds": 50, "layout_cut_gpu_rounds": 0}),
              rec({"resolved": False}), rec({"plan_gpus": 8, "plan_gpus_lost": 0})]
    assert layout_cut(rounds) == pytest.approx(6 / 150)
    assert layout_cut([rec({})]) == 0.0


def test_objective_drop_is_the_median_relative_loss_of_the_placed_plan() -> None:
    rounds = [rec({"objective": -2.0, "objective_placed": -2.2}),
              rec({"objective": -1.0, "objective_placed": -1.0}),
              rec({"objective": -4.0, "objective_placed": -5.0}),
              rec({"objective": float("nan"), "objective_placed": -1.0}),
              rec({"resolved": False})]
    assert objective_drop(rounds) == pytest.approx(0.10)
    assert objective_drop([rec({})]) == 0.0


def test_ratio_is_baseline_over_reference_with_zero_handled() -> None:
    assert ratio(3.0, 2.0) == 1.5
    assert ratio(0.0, 0.0) == 1.0
    assert math.isinf(ratio(0.2, 0.0))


def test_ratio_table_takes_medians_of_per_seed_ratios_against_the_same_workload() -> None:
    rows = [row("shockwave", 1, makespan_s=100.0), row("shockwave", 2, makespan_s=200.0),
            row("shockwave", 3, makespan_s=100.0),
            row("fifo", 1, makespan_s=150.0), row("fifo", 2, makespan_s=200.0),
            row("fifo", 3, makespan_s=300.0),
            row("fifo", 4, makespan_s=900.0)]          # no shockwave run: left out
    (entry,) = ratio_table(rows)
    assert entry["policy"] == "fifo" and entry["seeds"] == 3
    assert entry["makespan_s_ratio"] == pytest.approx(1.5)   # median of 1.5, 1.0, 3.0
    assert entry["makespan_s"] == 200.0
    assert entry["worst_rho_ratio"] == 1.0


def test_ratio_table_compares_unfair_fractions_by_difference_not_ratio() -> None:
    rows = [row("shockwave", 1, unfair_fraction=0.0), row("shockwave", 2, unfair_fraction=0.01),
            row("shockwave", 3, unfair_fraction=0.0),
            row("fifo", 1, unfair_fraction=0.3), row("fifo", 2, unfair_fraction=0.21),
            row("fifo", 3, unfair_fraction=0.0)]
    (entry,) = ratio_table(rows)
    assert "unfair_fraction_ratio" not in entry          # x / 0 = inf said nothing
    assert entry["unfair_fraction_gap"] == pytest.approx(0.2)   # median of 0.3, 0.2, 0.0
    assert entry["unfair_fraction"] == pytest.approx(0.21)
    assert all(math.isfinite(v) for v in entry.values() if isinstance(v, float))


def test_ratio_table_keeps_gates_and_sizes_apart() -> None:
    rows = [row("shockwave", 1), row("shockwave", 1, size="20/8"),
            row("max_min_fairness", 1, gate="gate", worst_rho=4.0),
            row("max_min_fairness", 1, gate="nogate", worst_rho=6.0),
            row("max_min_fairness", 1, gate="gate", size="20/8", worst_rho=3.0)]
    got = {(e["size"], e["gate"]): e["worst_rho_ratio"] for e in ratio_table(rows)}
    assert got == {("10/4", "gate"): 2.0, ("10/4", "nogate"): 3.0, ("20/8", "gate"): 1.5}


def test_size_summary_reports_the_reference_medians_maxima_and_fallbacks() -> None:
    rows = [row("shockwave", 1, resolve_max_s=0.5, placement_loss=0.02, fallbacks=1),
            row("shockwave", 2, resolve_max_s=2.5, placement_loss=0.06),
            row("shockwave", 3, resolve_max_s=1.0, placement_loss=0.04),
            row("fifo", 1, resolve_max_s=99.0)]
    (s,) = size_summary(rows)
    assert s["seeds"] == 3 and s["resolve_max_s"] == 2.5
    assert s["placement_loss"] == 0.04 and s["placement_loss_max"] == 0.06
    assert s["fallbacks"] == 1


def test_ratio_table_and_size_summary_carry_the_makespan_floor() -> None:
    rows = [row("shockwave", 1, makespan_floor_s=90.0, makespan_over_floor=1.1),
            row("shockwave", 2, makespan_floor_s=70.0, makespan_over_floor=1.3),
            row("shockwave", 3, makespan_floor_s=80.0, makespan_over_floor=1.2),
            row("fifo", 1, makespan_over_floor=1.5), row("fifo", 2, makespan_over_floor=1.9),
            row("fifo", 3, makespan_over_floor=1.4)]
    (s,) = size_summary(rows)
    assert (s["makespan_floor_s"], s["makespan_over_floor"]) == (80.0, 1.2)
    (entry,) = ratio_table(rows)
    assert entry["makespan_over_floor"] == 1.5


@pytest.mark.parametrize("seed", [1, 2])
def test_no_policy_ends_the_matrix_workload_below_its_makespan_floor(seed: int) -> None:
    case = Case(16, 4, seed, "fifo", UNGATED)
    jobs = workload(case.jobs, case.gpus, case.seed, catalogue_throughputs())
    floor = makespan_floor(jobs, case)
    for policy in ("fifo", "max_min_fairness", "shockwave"):
        got = simulate(jobs, policy, sim_config(Case(16, 4, seed, policy, "nogate"))).metrics
        assert got.makespan_s >= floor - 1e-6, policy
    # in the reference mode the reference's batch-size rules set a job's pace, not its profile:
    # some job runs faster or slower alone than its exclusive time says, so that is no floor
    alone = solo_runtimes(jobs, case)
    assert any(abs(alone[j.job_id] - j.exclusive_runtime_s) > 1.0 for j in jobs)
    assert floor != pytest.approx(makespan_bound(jobs, case.gpus))


def test_frontier_points_label_gates() -> None:
    rows = [row("shockwave", 1, makespan_s=10.0, worst_rho=1.0),
            row("max_min_fairness", 1, gate="nogate", makespan_s=12.0, worst_rho=3.0)]
    assert frontier_points(rows, "10/4") == [("shockwave", 10.0, 1.0),
                                             ("max_min_fairness (nogate)", 12.0, 3.0)]


def test_bench_quality_runs_a_tiny_matrix_end_to_end_and_the_same_in_a_process_pool(
        tmp_path: Path) -> None:
    out, plots = tmp_path / "q.json", tmp_path / "plots"
    result = CliRunner().invoke(cli, ["bench", "quality", "--sizes", "12/4", "--seeds", "2",
                                      "--policies", "max_min_fairness,fifo", "--json",
                                      str(out), "--plot", str(plots)])
    assert result.exit_code == 0, result.output
    assert "| max_min_fairness | nogate |" in result.output
    doc = json.loads(out.read_text())
    assert doc["policies"] == ["shockwave", "max_min_fairness", "fifo"]
    assert len(doc["runs"]) == 2 * 4          # per seed: shockwave, fifo, mmf gate + nogate
    (summary,) = doc["summary"]
    assert summary["size"] == "12/4" and summary["fallbacks"] == 0
    assert 0.0 <= summary["placement_loss"] < 1.0
    assert summary["makespan_floor_s"] > 0 and summary["makespan_over_floor"] >= 1.0
    assert "makespan (theirs) / floor" in result.output
    assert "| unfair (theirs) | unfair gap (points) |" in result.output
    assert "inf" not in result.output.split("| policy |")[1]
    assert (plots / "quality-12x4.png").stat().st_size > 1000
    again = CliRunner().invoke(cli, ["bench", "quality", "--sizes", "12/4", "--seeds", "2",
                                     "--policies", "max_min_fairness,fifo", "--workers", "2",
                                     "--json", str(tmp_path / "again.json")])
    assert again.exit_code == 0, again.output
    strip = ("resolve_median_s", "resolve_max_s", "sim_wall_s")
    runs = [{k: v for k, v in r.items() if k not in strip} for r in doc["runs"]]
    runs2 = [{k: v for k, v in r.items() if k not in strip}
             for r in json.loads((tmp_path / "again.json").read_text())["runs"]]
    assert runs == runs2


def test_bench_quality_passes_policy_options_to_the_policies_that_take_them(
        tmp_path: Path) -> None:
    base = ["bench", "quality", "--sizes", "16/4", "--seeds", "1", "--policies", "fifo"]
    plain = CliRunner().invoke(cli, base + ["--json", str(tmp_path / "plain.json")])
    pushed = CliRunner().invoke(cli, base + ["--policy-option", "k=1",
                                             "--json", str(tmp_path / "k.json")])
    assert plain.exit_code == 0 and pushed.exit_code == 0, pushed.output
    assert "shockwave options: k=1" in pushed.output
    doc = json.loads((tmp_path / "k.json").read_text())
    assert doc["policy_options"] == {"shockwave": {"k": 1}}
    mine = [r for r in doc["runs"] if r["policy"] == "shockwave"]
    before = [r for r in json.loads((tmp_path / "plain.json").read_text())["runs"]
              if r["policy"] == "shockwave"]
    assert mine[0]["makespan_s"] != before[0]["makespan_s"]   # the option reached the market


def test_bench_quality_refuses_an_option_no_policy_takes_and_the_matrix_settings() -> None:
    base = ["bench", "quality", "--sizes", "12/4", "--seeds", "1", "--policies", "fifo"]
    for bad, words in (("nope=1", "policy.nope"), ("round_s=60", "policy.round_s")):
        result = CliRunner().invoke(cli, base + ["--policy-option", bad])
        assert result.exit_code != 0 and words in result.output, result.output
        assert "Traceback" not in result.output


def test_bench_quality_refuses_bad_sizes_and_policies() -> None:
    bad = CliRunner().invoke(cli, ["bench", "quality", "--sizes", "12x4"])
    assert bad.exit_code != 0 and "--sizes" in bad.output and "Traceback" not in bad.output
    bad = CliRunner().invoke(cli, ["bench", "quality", "--sizes", "12/4", "--policies", "nope"])
    assert bad.exit_code != 0 and "unknown policy nope" in bad.output
