"""`shockslurm bench live`'s arithmetic on hand-made poll timelines, its default workload, and
the stand-in job (a real subprocess: USR1 saves and exits 0, the next run resumes)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shockslurm.livebench.arms import daemon_argv
from shockslurm.livebench.report import markdown_table, measured_switch_s, predict
from shockslurm.livebench.timeline import (JobLine, Poll, Run, Sample, arm_metrics,
                                           completion_times, gpu_seconds, idle_gpu_seconds,
                                           job_rows, job_runs, plot_series, release_latencies,
                                           released_wait_gpu_seconds, spread,
                                           switch_costs)
from shockslurm.livebench.workload import StandinPlan, default_workload, scale, summary
from shockslurm.model import parse_cluster_shape
from shockslurm.sim.metrics import JobOutcome, compute_metrics

R, P, C = "RUNNING", "PENDING", "COMPLETED"


def polls(*rows: tuple[float, dict[int, tuple[str, int]]]) -> list[Poll]:
    return [Poll(t, {j: Sample(s, g) for j, (s, g) in jobs.items()}) for t, jobs in rows]


# Job 1 (4 GPUs) runs 0-10, is stopped (pending 10-12), runs 12-20 and completes.
# Job 2 (8 GPUs) waits 0-10, runs 10-16, completes; job 3 (2 GPUs) arrives at 2, never runs.
TIMELINE = polls(
    (0.0, {1: (R, 4), 2: (P, 8)}),
    (2.0, {1: (R, 4), 2: (P, 8), 3: (P, 2)}),
    (10.0, {1: (P, 4), 2: (R, 8), 3: (P, 2)}),
    (12.0, {1: (R, 4), 2: (R, 8), 3: (P, 2)}),
    (16.0, {1: (R, 4), 2: (C, 8), 3: (P, 2)}),
    (20.0, {1: (C, 4), 3: (P, 2)}),
)


def test_runs_follow_the_polls():
    assert job_runs(TIMELINE) == {1: [Run(0.0, 10.0), Run(12.0, 20.0)], 2: [Run(10.0, 16.0)]}


def test_a_job_still_running_has_an_open_run():
    runs = job_runs(polls((0.0, {5: (P, 1)}), (1.0, {5: (R, 1)}), (2.0, {5: (R, 1)})))
    assert runs == {5: [Run(1.0, None)]}
    assert runs[5][0].length(until=4.0) == 3.0


def test_completion_is_the_end_of_the_last_run_of_a_completed_job():
    # job 2 disappears after COMPLETED, job 1 ends COMPLETED; job 3 never completes
    assert completion_times(TIMELINE) == {1: 20.0, 2: 16.0}


def test_a_job_that_vanished_while_running_completed_but_a_cancelled_one_did_not():
    tl = polls((0.0, {1: (R, 1), 2: (R, 1)}), (1.0, {2: ("CANCELLED", 1)}))
    assert completion_times(tl) == {1: 1.0}


def test_gpu_seconds_multiply_run_length_by_gang():
    runs = job_runs(TIMELINE)
    assert gpu_seconds(runs, {1: 4, 2: 8}, until=20.0) == 4 * 18 + 8 * 6


def test_idle_gpu_seconds_by_cause():
    idle = idle_gpu_seconds(TIMELINE, capacity=10, until=20.0)
    # 0-2: 6 idle, job 2 (8) pending does not fit -> too big: 12
    # 2-10: 6 idle, job 3 (2) fits -> fits: 48
    # 10-12: 2 idle, job 3 (2) fits: 4;  12-16: 12 > 10 running -> 0 idle
    # 16-20: 6 idle, job 3 fits: 24
    assert idle == {"pending_fits": 48 + 4 + 24, "pending_too_big": 12.0, "no_pending": 0.0}


def test_switch_cost_is_usr1_to_the_successor_running():
    runs = {1: [Run(0.0, 10.0), Run(30.0, 40.0)], 2: [Run(11.5, 20.0)], 3: [Run(50.0, 60.0)]}
    signals = [(8.0, 1)]
    releases = [(10.5, 2), (8.0 + 25.0, 3)]   # job 3's release is a later round's
    (s,) = switch_costs(signals, releases, runs, round_s=20.0)
    assert (s.job_id, s.exit_s, s.successor_s) == (1, 2.0, 3.5)
    assert release_latencies(releases, runs) == [1.0, 17.0]
    assert released_wait_gpu_seconds(releases, runs, {2: 4, 3: 2}) == 1.0 * 4 + 17.0 * 2
    # job 3's release withdrawn by a hold at 34 s (the next round changed the plan), then
    # released again at 49 s: one start latency of 1 s, and 1 s + 1 s of waiting
    again = releases + [(49.0, 3)]
    assert release_latencies(again, runs, holds=[(34.0, 3)]) == [1.0, 1.0]
    assert released_wait_gpu_seconds(again, runs, {2: 4, 3: 2}, holds=[(34.0, 3)]) == \
        1.0 * 4 + 1.0 * 2 + 1.0 * 2


def test_a_stop_without_a_successor_has_no_switch_time():
    (s,) = switch_costs([(5.0, 1)], [], {1: [Run(0.0, 6.0)]}, round_s=10.0)
    assert s.exit_s == 1.0 and s.successor_s is None


def test_spread():
    assert spread([3.0, 1.0, 2.0]) == {"median": 2.0, "max": 3.0, "n": 3}
    assert spread([]) == {"median": None, "max": None, "n": 0}


def test_arm_metrics_are_the_simulators_definitions():
    lines = [JobLine(1, 0.0, 12.0, 4), JobLine(2, 0.0, 6.0, 8), JobLine(3, 2.0, 5.0, 2)]
    out = arm_metrics(lines, TIMELINE, capacity=10, until=20.0)
    expected = compute_metrics([JobOutcome(1, 0.0, 20.0, 12.0, 4),
                                JobOutcome(2, 0.0, 16.0, 6.0, 8)], 10, 4 * 18 + 8 * 6,
                               trace_jobs=3)
    assert out["completed"] == 2 and out["jobs"] == 3 and out["stops"] == 1
    assert out["makespan_s"] == pytest.approx(expected.makespan_s) == 20.0
    assert out["avg_jct_s"] == pytest.approx(18.0)
    assert out["utilization"] == pytest.approx(round(120 / 200, 4))
    assert out["worst_rho"] == pytest.approx(round(expected.worst_rho, 4))
    series = plot_series(lines, TIMELINE, 10, 20.0)
    assert len(series["timeline"]) == 3 and series["utilisation"][3][1:] == (12, 10)
    assert sorted(series["rho"]) == pytest.approx(sorted([20 / 12, 16 / 6]))


def test_job_rows_give_each_jobs_runs_and_outcome_in_workload_order():
    lines = [JobLine(1, 0.0, 12.0, 4, 7), JobLine(2, 0.0, 6.0, 8, 5), JobLine(3, 2.0, 5.0, 2, 6)]
    rows = job_rows(lines, TIMELINE, capacity=10, until=20.0)
    assert [r["job"] for r in rows] == [5, 6, 7]
    assert [r["slurm_job"] for r in rows] == [2, 3, 1]
    by_slurm = {r["slurm_job"]: r for r in rows}
    done = arm_metrics(lines, TIMELINE, capacity=10, until=20.0)
    assert by_slurm[1]["jct_s"] == 20.0 and by_slurm[2]["jct_s"] == 16.0
    assert max(r["rho"] for r in rows if "rho" in r) == pytest.approx(done["worst_rho"])
    assert "completion_s" not in by_slurm[3]          # never completed in the timeline
    assert all(end is None or end > start for r in rows for start, end in r["runs"])
    assert len(by_slurm[1]["runs"]) == 2              # stopped once: two runs


def test_default_workload_shape():
    jobs = default_workload(32)
    shape = summary(jobs, 32)
    assert len(jobs) >= 24
    assert {"static", "gns", "accordion"} <= set(shape["modes"])
    assert 1.3 <= shape["oversubscription"] <= 1.7
    assert shape["last_arrival_s"] == pytest.approx(shape["work_bound_s"] / 3, rel=0.01)
    assert any(len(set(j.batch_sizes)) > 1 for j in jobs)     # dynamic adaptation present
    for j in jobs:   # the spec stays consistent: durations follow the throughputs
        for b, d in zip(j.batch_sizes, j.epoch_durations):
            assert d == pytest.approx(j.epoch_duration_at(b))
    assert default_workload(32) == jobs                       # fixed seed


def test_scaling_keeps_specs_consistent_and_predictions_run():
    jobs = scale(default_workload(32)[:6], 0.1)
    j = jobs[0]
    assert j.epoch_durations[0] == pytest.approx(j.epoch_duration_at(j.batch_sizes[0]))
    nodes = parse_cluster_shape("4x8")
    native = predict(jobs, "native", nodes, 20.0, 0.0)
    shock = predict(jobs, "shockwave", nodes, 20.0, 3.0)
    assert [r["job"] for r in shock["per_job"]] == sorted(j.job_id for j in jobs)
    assert max(r["rho"] for r in shock["per_job"]) == pytest.approx(shock["worst_rho"], abs=1e-3)
    assert native["policy"] == "fifo" and native["restart_overhead_s"] == 0.0
    assert shock["policy"] == "shockwave" and shock["round_s"] == 20.0
    # the daemon knows each job from what shocksub declares, and so does the prediction
    assert shock["declared_profile"] is True and native["declared_profile"] is False
    arm = {"arm": "shockwave", "makespan_s": 100.0, "simulated": shock,
           "switch_usr1_to_successor_running_s": {"median": 3.0, "max": 4.0, "n": 2}}
    assert measured_switch_s(arm) == 3.0
    no_stops = {"arm": "fifo", "switch_usr1_to_successor_running_s": {"median": None, "n": 0},
                "release_to_running_s": {"median": 1.0, "max": 2.2, "n": 24}}
    assert measured_switch_s(no_stops) == 1.0          # Slurm's start latency, every start
    assert measured_switch_s({"arm": "native"}) == 0.0
    table = markdown_table([arm])
    assert "| makespan s, live (sim) | 100 (" in table and "3.0 / 4.0" in table


def test_standin_resumes_after_usr1(tmp_path: Path):
    """Stopped by USR1 1.5 s into its second epoch (3 s each), the stand-in saves its position
    and exits at once; run again, it starts there and runs only the rest. Times are the
    stand-in's own (its start line to its end), so a slow interpreter start does not count;
    the margins (1.5 s either side of the signal, 3 s on the rest) hold on a loaded machine."""
    plan = tmp_path / "plan.json"
    plan.write_text(StandinPlan((3.0, 3.0, 3.0), (32, 32, 64), 1000, 1).to_json())
    state = tmp_path / "state.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SHOCKSLURM_", "SLURM_"))}
    env["SHOCKSLURM_SPOOL"] = str(tmp_path / "spool")
    argv = [sys.executable, "-m", "shockslurm.livebench.standin", "--plan", str(plan),
            "--state", str(state), "--report-seconds", "0.1"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().startswith("start restart=0")
    time.sleep(4.5)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGUSR1)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and time.monotonic() - t0 < 10.0, out
    assert out.startswith("got SIGUSR1 at epoch 1"), out
    saved = json.loads(state.read_text())
    assert saved["epoch"] == 1 and 1.4 < saved["into_epoch_s"] < 3.0, saved
    again = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)
    assert again.stdout is not None
    first = again.stdout.readline()
    t1 = time.monotonic()
    rest, _ = again.communicate(timeout=30)
    took = time.monotonic() - t1
    assert first.startswith(f"start restart=0 epoch 1 +{saved['into_epoch_s']:.2f}s"), first
    assert again.returncode == 0 and "done at epoch 3" in rest, rest
    remaining = 3.0 * (3 - saved["epoch"]) - saved["into_epoch_s"]
    assert remaining - 0.2 <= took < remaining + 3.0    # only the rest of the plan ran
    reports = [json.loads(p.read_text()) for p in (tmp_path / "spool").glob("*.json")]
    kinds = {r["kind"] for r in reports}
    assert {"throughput", "epoch_done", "batch_size_change", "checkpoint"} <= kinds
    change = next(r for r in reports if r["kind"] == "batch_size_change")
    assert (change["old_batch_size"], change["new_batch_size"], change["epoch"]) == (32, 64, 2)
    assert not math.isnan(max(r["time_s"] for r in reports))


@pytest.mark.parametrize("policy", ["shockwave", "max_min_fairness", "fifo"])
def test_generated_daemon_config_is_valid(tmp_path: Path, policy: str):
    from shockslurm.livebench.arms import ArmSettings, daemon_config
    from shockslurm.ops.config import load_config

    path = tmp_path / "daemon.toml"
    path.write_text(daemon_config(policy, ArmSettings(workdir=tmp_path, round_seconds=7.5),
                                  tmp_path, "lbab12-x-"))
    cfg = load_config(path, {})
    assert (cfg.policy, cfg.round_seconds, cfg.job_name_prefix) == (policy, 7.5, "lbab12-x-")
    assert cfg.spool_dir == str(tmp_path / "spool") and cfg.metrics_port == 0
    if policy == "max_min_fairness":     # the Gavel gate is off, as in the prediction
        settings = cfg.policy_settings()
        assert settings.min_resolve_interval_s == 0 and not settings.idle_unallocated


def test_an_arm_is_done_when_every_job_finished():
    from shockslurm.livebench.arms import _all_done

    assert _all_done({1, 2}, 2, TIMELINE[:4]) == (False, [])     # still running
    assert _all_done({1}, 2, TIMELINE) == (False, [])           # one not submitted yet
    assert _all_done({1, 2}, 2, TIMELINE) == (True, [])         # 2 vanished after COMPLETED
    assert _all_done({1, 4}, 2, TIMELINE) == (False, [])        # 4 not seen by squeue yet
    failed = polls((0.0, {1: (R, 1)}), (1.0, {1: ("FAILED", 1)}))
    assert _all_done({1}, 1, failed) == (True, [1])


def test_a_restart_between_two_polls_is_a_new_run():
    """A job requeued and started again between two polls (a move) shows RUNNING at both: its
    higher restart count splits the run, so a USR1 before it is not charged the next run."""
    polls = [Poll(t, {1: Sample("RUNNING", 8, r)}) for t, r in
             [(0.0, 0), (10.0, 0), (11.0, 1), (100.0, 1)]] + [Poll(108.0, {1: Sample(
                 "COMPLETED", 8, 1)})]
    assert job_runs(polls)[1] == [Run(0.0, 11.0), Run(11.0, 108.0)]
    switch = switch_costs([(10.5, 1)], [], job_runs(polls), 15.0)[0]
    assert switch.exit_s == 0.5


def test_simulate_only_prints_each_arm_and_the_bounds_without_slurm(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from shockslurm.cli.main import cli

    out = tmp_path / "b.json"
    args = ["bench", "live", "--simulate-only", "--cluster", "4x8", "--seed", "11",
            "--arms", "native,shockwave", "--time-scale", "0.15", "--round-seconds", "15",
            "--json", str(out)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert [a["arm"] for a in doc["arms"]] == ["native", "shockwave"]
    native, shock = (a["simulated"] for a in doc["arms"])
    assert native["policy"] == "fifo" and shock["restart_overhead_s"] == 2.0
    assert native["keep_partial_iterations"] and shock["keep_partial_iterations"]
    # no schedule beats the bounds
    assert shock["worst_rho"] >= doc["bounds"]["worst_rho"] - 1e-9
    assert native["avg_jct_s"] >= doc["bounds"]["avg_jct_s"] - 1e-9
    assert min(native["makespan_s"], shock["makespan_s"]) >= doc["bounds"]["makespan_s"] - 1e-6
    assert "No scheduler does better than" in result.output
    other = CliRunner().invoke(cli, args[:6] + ["12"] + args[7:])     # another seed, another run
    assert json.loads(out.read_text())["bounds"] != doc["bounds"]
    assert other.exit_code == 0
    bad = CliRunner().invoke(cli, ["bench", "live", "--simulate-only", "--cluster", "4y8"])
    assert bad.exit_code != 0 and "4y8" in bad.output and "Traceback" not in bad.output
    # --plot was taken and nothing drawn (exit 0); the live arms' charts need live arms
    plots = CliRunner().invoke(cli, ["bench", "live", "--simulate-only", "--cluster", "4x8",
                                     "--plot", str(out.parent / "charts")])
    assert plots.exit_code == 2 and "--plot draws the live arms' timelines" in plots.output
    assert not (out.parent / "charts").exists()


def _run(arm: str, repeat: int, makespan: float, jct: float, rho: float, **extra: object
         ) -> dict[str, object]:
    return {"arm": arm, "repeat": repeat, "makespan_s": makespan, "avg_jct_s": jct,
            "worst_rho": rho, "stops": extra.get("stops", 0),
            "idle_gpu_s": {"pending_fits": extra.get("idle", 0.0)},
            "switch_usr1_to_successor_running_s": extra.get("switch"),
            "simulated": {"makespan_s": makespan + 1, "avg_jct_s": jct}}


REPEATED = [_run("native", 1, 400.0, 160.0, 1.8), _run("shockwave", 1, 340.0, 168.0, 1.4,
                                                          stops=12, idle=500.0,
                                                          switch={"median": 1.9, "max": 4.9}),
            _run("native", 2, 380.0, 150.0, 1.7), _run("shockwave", 2, 370.0, 150.0, 2.0,
                                                          stops=14, idle=700.0,
                                                          switch={"median": 2.9, "max": 7.1}),
            _run("native", 3, 370.0, 170.0, 1.9), _run("shockwave", 3, 350.0, 160.0, 1.5,
                                                          stops=13, idle=600.0, switch=None)]


def test_repeated_arms_give_medians_per_arm_in_the_table_shape():
    from shockslurm.livebench.repeats import arm_medians

    native, shock = arm_medians(REPEATED)
    assert (native["arm"], native["runs"], shock["runs"]) == ("native", 3, 3)
    assert native["makespan_s"] == 380.0 and shock["makespan_s"] == 350.0
    assert shock["avg_jct_s"] == 160.0 and shock["worst_rho"] == 1.5 and shock["stops"] == 13
    assert shock["range"]["makespan_s"] == {"median": 350.0, "min": 340.0, "max": 370.0}
    assert shock["idle_gpu_s"] == {"pending_fits": 600.0}
    # the switch spread: medians of the runs that measured one
    assert shock["switch_usr1_to_successor_running_s"] == {"median": 2.4, "max": 6.0}
    assert "switch_usr1_to_successor_running_s" not in native
    assert shock["simulated"]["makespan_s"] == 351.0
    assert shock["p99_jct_s"] is None           # no run measured it: no number made up
    table = markdown_table([native, shock])
    assert "| makespan s, live (sim) | 380 (381) | 350 (351) |" in table
    assert "2.4 / 6.0" in table


def test_ratios_to_native_are_paired_by_repeat():
    from shockslurm.livebench.repeats import paired_ratios, ratio_table

    ratios = paired_ratios(REPEATED)
    assert list(ratios) == ["shockwave"]
    mk = ratios["shockwave"]["makespan_s"]
    # per repeat 340/400, 370/380, 350/370: the median is the third (0.946), not the ratio of
    # the arms' medians (350/380 = 0.921)
    assert mk["median"] == round(350 / 370, 4) and mk["min"] == round(340 / 400, 4)
    assert mk["max"] == round(370 / 380, 4) and mk["n"] == 3
    jct = ratios["shockwave"]["avg_jct_s"]
    assert jct["median"] == 1.0 and jct["max"] == 1.05    # 168/160, 150/150, 160/170
    assert ratios["shockwave"]["p99_jct_s"]["median"] is None
    # a repeat without its native run counts no ratio
    partial = paired_ratios(REPEATED[:4] + REPEATED[5:])
    assert partial["shockwave"]["makespan_s"]["n"] == 2
    assert paired_ratios([r for r in REPEATED if r["arm"] != "native"]) == {}
    table = ratio_table(ratios)
    assert "| shockwave | 0.946 (0.850-0.974) |" in table


def test_a_slow_replay_is_predicted_and_an_impossible_one_refused_clearly() -> None:
    # At time scale 1 some iterations of the default workload last over a second: the native
    # arm's 1 s rounds keep each running job's part-done iteration (before, a traceback). Rounds
    # of 0.5 s under time scale 20 give no job a whole iteration in its shortest run.
    from click.testing import CliRunner

    from shockslurm.cli.main import cli

    base = ["bench", "live", "--simulate-only", "--cluster", "4x8"]
    slow = CliRunner().invoke(cli, base + ["--arms", "native", "--time-scale", "1"])
    assert slow.exit_code == 0, slow.output
    assert "worst rho" in slow.output
    bad = CliRunner().invoke(cli, base + ["--arms", "shockwave", "--time-scale", "20",
                                          "--round-seconds", "0.5"])
    assert bad.exit_code == 1 and "Traceback" not in bad.output
    assert "cannot simulate the workload: job" in bad.output and "never finish" in bad.output


def test_repeat_is_refused_for_a_simulation(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from shockslurm.cli.main import cli

    bad = CliRunner().invoke(cli, ["bench", "live", "--simulate-only", "--cluster", "4x8",
                                   "--repeat", "3"])
    assert bad.exit_code == 2 and "--repeat" in bad.output and "Traceback" not in bad.output
    zero = CliRunner().invoke(cli, ["bench", "live", "--simulate-only", "--cluster", "4x8",
                                    "--repeat", "0"])
    assert zero.exit_code == 2 and "--repeat" in zero.output


def test_an_arms_daemon_logs_its_debug_lines(tmp_path: Path) -> None:
    argv = daemon_argv("python3", tmp_path / "daemon.toml")
    assert argv[argv.index("--log-level") + 1] == "DEBUG"
    assert argv.index("--log-level") < argv.index("daemon")        # the global option
    assert argv[-2:] == ["--config", str(tmp_path / "daemon.toml")]
