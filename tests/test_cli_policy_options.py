"""`shockslurm simulate --policy-option KEY=VALUE` and `--policy-config FILE`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from shockslurm.cli.main import cli
from shockslurm.errors import ConfigError
from shockslurm.ops.config import parse_config


def _simulate(tmp_path: Path, *args: str) -> tuple[int, str, list[dict] | None]:
    out = tmp_path / "o.json"
    out.unlink(missing_ok=True)
    result = CliRunner().invoke(cli, ["simulate", "--no-progress", "--json", str(out), *args])
    data = json.loads(out.read_text()) if out.exists() else None
    if isinstance(data, dict):
        data = [data]
    return result.exit_code, result.output, data


def test_options_reach_the_policies_that_take_them(tmp_path: Path) -> None:
    code, _, default = _simulate(tmp_path, "--policy", "shockwave,allox")
    assert code == 0
    code, output, tuned = _simulate(tmp_path, "--policy", "shockwave,allox",
                                    "--policy-option", "future_rounds=5",
                                    "--policy-option", "alpha=1")
    assert code == 0, output
    assert "shockwave options: future_rounds=5" in output and "allox options: alpha=1" in output
    assert tuned[0]["policy_options"] == {"future_rounds": 5}
    assert tuned[1]["policy_options"] == {"alpha": 1}
    for before, after in zip(default, tuned):   # each option changed its policy's schedule
        assert before["avg_jct_s"] != after["avg_jct_s"], before["policy"]


@pytest.mark.parametrize("args, message", [
    (["--policy", "fifo,max_min_fairness", "--policy-option", "k=1"],
     "field 'policy.k': no chosen policy takes this option"),
    (["--policy", "shockwave", "--policy-option", "k=abc"],
     "field 'policy.k': the policy 'shockwave' refused it: k must be a finite number"),
    (["--policy", "shockwave", "--policy-option", "future_rounds=0"],
     "field 'policy.future_rounds'"),
    (["--policy", "allox", "--policy-option", "alpha=2"], "field 'policy.alpha'"),
    (["--policy", "fifo", "--policy-option", "min_resolve_interval_s=-1"],
     "field 'policy.min_resolve_interval_s'"),
    (["--policy", "fifo", "--policy-option", "future_rounds"], "expected KEY=VALUE"),
])
def test_bad_options_name_the_key(tmp_path: Path, args: list[str], message: str) -> None:
    code, output, _ = _simulate(tmp_path, *args)
    assert code != 0 and "Traceback" not in output
    assert "--policy-option" in output and message in output, output


def test_policy_config_file_is_the_daemons_policy_table(tmp_path: Path) -> None:
    """The [policy] table of a daemon config sets the Gavel gate like --resolve-interval and
    --no-idle-new-jobs, and shockwave options; --policy-option and explicit flags win."""
    conf = tmp_path / "shockslurm.toml"
    conf.write_text('[daemon]\npolicy = "fifo"\n[policy]\nmin_resolve_interval_s = 0\n'
                    'idle_unallocated = false\nfuture_rounds = 5\n')
    base = ["--policy", "max_sum_throughput,shockwave"]
    _, _, flags = _simulate(tmp_path, *base, "--resolve-interval", "0", "--no-idle-new-jobs",
                            "--policy-option", "future_rounds=5")
    code, output, from_file = _simulate(tmp_path, *base, "--policy-config", str(conf))
    assert code == 0, output
    assert "re-solve every 0 s" in output and "new jobs wait" not in output
    assert from_file == [dict(r, sim_wall_s=f["sim_wall_s"], solve_s=f["solve_s"])
                         for r, f in zip(flags, from_file)]
    _, output, _ = _simulate(tmp_path, *base, "--policy-config", str(conf),
                             "--resolve-interval", "500", "--policy-option", "future_rounds=7")
    assert "re-solve every 500 s" in output and "future_rounds=7" in output
    conf.write_text("[policy]\nfuture_rounds = 2.5\n")
    code, output, _ = _simulate(tmp_path, "--policy", "shockwave", "--policy-config", str(conf))
    assert code != 0 and f"{conf}, field 'policy.future_rounds'" in output, output
    conf.write_text("[policy\n")
    code, output, _ = _simulate(tmp_path, "--policy", "fifo", "--policy-config", str(conf))
    assert code != 0 and "not valid TOML" in output


@pytest.mark.parametrize("name", ["solver_threads", "calibration_tolerance"])
def test_removed_settings_are_unknown(name: str) -> None:
    """Neither was ever read (HiGHS runs on one thread for reproducible plans; the forecast's
    calibration tolerance is `forecast.CALIBRATION_TOLERANCE`): setting one is an error."""
    with pytest.raises(ConfigError) as err:
        parse_config({"daemon": {"policy": "shockwave"}, "policy": {name: 1}}, source="d.toml")
    assert err.value.field == f"policy.{name}" and "no chosen policy takes" in str(err.value)


def test_switch_cost_takes_policy_options(tmp_path: Path) -> None:
    """`bench switch-cost --policy-option`: the option reaches the policy (another schedule),
    the JSON says which; a key no chosen policy takes and a benchmark setting are refused."""
    runner = CliRunner()
    trace = tmp_path / "t.jsonl"
    assert runner.invoke(cli, ["trace", "generate", "--jobs", "12", "--seed", "3",
                               "--out", str(trace)]).exit_code == 0
    base = ["bench", "switch-cost", "--trace", str(trace), "--cluster", "2x4",
            "--restart-overhead", "20", "--policy", "shockwave"]
    runs = []
    for extra in ([], ["--policy-option", "future_rounds=2"]):
        out = tmp_path / "s.json"
        result = runner.invoke(cli, [*base, *extra, "--json", str(out)])
        assert result.exit_code == 0, result.output
        runs.append(json.loads(out.read_text()))
    assert runs[0]["policy_options"] == {}
    assert runs[1]["policy_options"] == {"shockwave": {"future_rounds": 2}}
    assert runs[0]["runs"][0]["avg_jct_s"] != runs[1]["runs"][0]["avg_jct_s"]
    bad = runner.invoke(cli, [*base[:-1], "fifo", "--policy-option", "k=1"])
    assert bad.exit_code != 0 and "field 'policy.k'" in bad.output
    gate = runner.invoke(cli, [*base, "--policy-option", "min_resolve_interval_s=0"])
    assert gate.exit_code != 0 and "the benchmark sets this itself" in gate.output
    assert "Traceback" not in bad.output + gate.output


def test_bench_live_passes_policy_options_to_the_daemon_and_the_prediction(tmp_path: Path
                                                                           ) -> None:
    from shockslurm.livebench.arms import ArmSettings, daemon_config
    from shockslurm.ops.config import load_config

    path = tmp_path / "daemon.toml"
    path.write_text(daemon_config("shockwave", ArmSettings(workdir=tmp_path), tmp_path, "lb-",
                                  {"tail_weight": 0.5, "fill_order": "rho",
                                   "log_breakpoints": [0, 0.5, 1]}))
    cfg = load_config(path, {})
    assert cfg.policy_options == {"tail_weight": 0.5, "fill_order": "rho",
                                  "log_breakpoints": [0, 0.5, 1]}
    runner = CliRunner()
    base = ["bench", "live", "--simulate-only", "--cluster", "4x8", "--seed", "12",
            "--arms", "native,shockwave", "--time-scale", "0.15", "--round-seconds", "15"]
    docs = []
    for extra in ([], ["--policy-option", "future_rounds=2"]):
        out = tmp_path / "b.json"
        result = runner.invoke(cli, [*base, *extra, "--json", str(out)])
        assert result.exit_code == 0, result.output
        docs.append(json.loads(out.read_text()))
    assert docs[1]["policy_options"] == {"shockwave": {"future_rounds": 2}}
    (native0, shock0), (native1, shock1) = ([a["simulated"] for a in d["arms"]] for d in docs)
    assert native0 == native1                      # native takes no option
    assert shock0["avg_jct_s"] != shock1["avg_jct_s"]
    alone = runner.invoke(cli, [*base[:-6], "--arms", "native", "--policy-option", "k=1"])
    assert alone.exit_code == 2 and "no policy arm" in alone.output
