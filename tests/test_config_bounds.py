"""Bounds of the configuration: what `shockslurm config check` refuses is what the daemon,
shocksub and the jobs refuse, each refusal a clear error naming the place (the file and key, the
environment variable, the path), never a traceback.

- policy options that size a re-solve (`future_rounds`, `log_breakpoints`, the time limits) have
  documented upper bounds (a million rounds died of MemoryError in placement);
- the daemon's periods have a floor (1e-300 s rounds busy-looped on squeue) and its waits a
  ceiling (1e300 s overflows them);
- `spool_dir` (and `rejected_dir`) follow one rule, `siteconfig.check_directory`: absolute, no
  control characters;
- an unknown `SHOCKSLURM_DAEMON_*` variable is an error, as an unknown `[daemon]` key is;
- the file must be a regular file of at most 1 MiB, checked before it is read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from shockslurm.cli.main import cli
from shockslurm.errors import ConfigError
from shockslurm.ops import config as oc
from shockslurm.ops.keys import MAX_WAIT_SECONDS, MIN_PERIOD_SECONDS
from shockslurm.policies.shockwave.config import (MAX_FUTURE_ROUNDS, MAX_LOG_BREAKPOINTS,
                                                  MAX_TIME_LIMIT_S)
from shockslurm.siteconfig import MAX_CONFIG_BYTES, read_toml, report_spool

from .conftest import skip_unless_required

# every variable the configuration reads, unset (a developer's own SHOCKSLURM_* must not leak in)
CLEAN_ENV: dict[str, str | None] = {
    **{k: None for k in os.environ if k.startswith("SHOCKSLURM_")},
    "SHOCKSLURM_DB": None, "SHOCKSLURM_CONFIG": None,
    **{k.env: None for k in oc.KEYS if k.env}}


def _cli_check(path: Path | str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, ["config", "check", "--config", str(path)],
                              env={**CLEAN_ENV, **(env or {})})


def _refused(result: Result, *said: str) -> None:
    """`config check` exited 1 with an error line (no traceback) that says each of `said`."""
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output and result.output.startswith("Error: "), \
        result.output
    for text in said:
        assert text in result.output, (text, result.output)


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "s.toml"
    path.write_text(text)
    return path


def _parse_error(data: dict[str, Any], env: dict[str, str] | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        oc.parse_config(data, source="s.toml", env=env)
    return info.value


# --------------------------------------------------------------------------- 1. policy options
@pytest.mark.parametrize("option, value, said", [
    ("future_rounds", 1_000_000, f"future_rounds must be in 1..{MAX_FUTURE_ROUNDS}"),
    ("future_rounds", MAX_FUTURE_ROUNDS + 1, f"future_rounds must be in 1..{MAX_FUTURE_ROUNDS}"),
    ("future_rounds", 1e20, "future_rounds must be an integer"),
    ("future_rounds", 10 ** 400, f"future_rounds must be in 1..{MAX_FUTURE_ROUNDS}"),
    ("log_breakpoints", [i / MAX_LOG_BREAKPOINTS for i in range(MAX_LOG_BREAKPOINTS + 1)],
     f"at most {MAX_LOG_BREAKPOINTS} values"),
    ("time_limit_s", MAX_TIME_LIMIT_S + 1, "time_limit_s must be > 0 and <= 3600"),
    ("mip_time_limit_s", 1e20, "mip_time_limit_s must be > 0 and <= 3600"),
    ("k", 10 ** 400, "k must be a finite number"),      # math.isfinite raised OverflowError
    ("min_resolve_interval_s", 1e300, "must be a finite number >= 0, <= 86400"),   # ran for ever
    ("k", 1e308, "k must be <= 1e+06"),          # every market solve failed
    ("tail_weight", 1e7, "tail_weight must be <= 1e+06"),
    ("log_zero", -1e308, "log_zero must be >= -700"),
    ("log_zero", 0.5, "below the log of the first breakpoint after 0"),
    ("log_breakpoints", [0, 10 ** 400, 1], "log_breakpoints must be a list of finite numbers"),
], ids=["rounds-1e6", "rounds-over", "rounds-1e20", "rounds-huge-int", "breakpoints",
        "time-limit", "mip-time-limit", "k-huge-int", "resolve-gate", "k-huge", "tail-huge", "log-zero-low",
        "log-zero-high", "breakpoint-huge-int"])
def test_policy_options_that_size_a_resolve_are_bounded(tmp_path: Path, option: str,
                                                        value: Any, said: str) -> None:
    err = _parse_error({"policy": {option: value}})
    assert err.field == f"policy.{option}" and said in str(err), str(err)
    text = json.dumps(value)                            # a TOML value too (1e+20, [0, 0.5])
    _refused(_cli_check(_file(tmp_path, f"[policy]\n{option} = {text}\n")),
             "s.toml", f"field 'policy.{option}'", said)


def test_policy_option_bounds_accept_their_limits_and_the_documented_values() -> None:
    edge = [i / (MAX_LOG_BREAKPOINTS - 1) for i in range(MAX_LOG_BREAKPOINTS)]
    for options in ({"future_rounds": MAX_FUTURE_ROUNDS}, {"future_rounds": 40},
                    {"log_breakpoints": edge}, {"time_limit_s": MAX_TIME_LIMIT_S},
                    {"mip_time_limit_s": MAX_TIME_LIMIT_S},
                    {"mip_max_jobs": 100_000}):       # the README's integer-program run
        assert oc.parse_config({"policy": options}).policy_options == options


def test_a_policy_option_bound_from_the_environment_names_the_variable(tmp_path: Path) -> None:
    var = "SHOCKSLURM_POLICY_FUTURE_ROUNDS"
    _refused(_cli_check(_file(tmp_path, ""), {var: "1000000"}),
             f"environment variable {var}", "field 'policy.future_rounds'")


# --------------------------------------------------------------------------- 2. time settings
@pytest.mark.parametrize("key, value", [
    ("round_seconds", 1e-300), ("round_seconds", 0.4), ("round_seconds", 1e300),
    ("round_seconds", 10 ** 400), ("round_seconds", MAX_WAIT_SECONDS + 1),
    ("standby_retry_seconds", 1e-300), ("stop_timeout_seconds", 1e300),
    ("store_timeout_seconds", 1e300),
])
def test_daemon_periods_have_a_floor_and_waits_a_ceiling(tmp_path: Path, key: str,
                                                         value: float) -> None:
    err = _parse_error({"daemon": {key: value}})
    assert err.field == f"daemon.{key}" and "must be a finite number" in str(err), str(err)
    _refused(_cli_check(_file(tmp_path, f"[daemon]\n{key} = {value!r}\n")),
             "s.toml", f"field 'daemon.{key}'", "must be a finite number")


def test_time_bounds_are_documented_and_accept_their_limits() -> None:
    cfg = oc.parse_config({"daemon": {"round_seconds": MIN_PERIOD_SECONDS,
                                      "standby_retry_seconds": MIN_PERIOD_SECONDS,
                                      "stop_timeout_seconds": MAX_WAIT_SECONDS,
                                      "store_timeout_seconds": 0.3}})   # the store tests' value
    assert cfg.round_seconds == 0.5 and cfg.stop_timeout_seconds == MAX_WAIT_SECONDS
    assert oc.BY_NAME["daemon.round_seconds"].type_name == "number >= 0.5, <= 86400"
    assert oc.BY_NAME["daemon.standby_retry_seconds"].type_name == "number >= 0.5"
    assert oc.BY_NAME["daemon.grace_seconds"].type_name == "number >= 0, <= 86400"
    assert "| `daemon.round_seconds` | number >= 0.5, <= 86400 |" in oc.markdown_table()


def test_a_round_bound_from_the_environment_names_the_variable(tmp_path: Path) -> None:
    var = "SHOCKSLURM_DAEMON_ROUND_SECONDS"
    _refused(_cli_check(_file(tmp_path, ""), {var: "1e-300"}),
             f"environment variable {var}", "field 'daemon.round_seconds'", ">= 0.5")


# --------------------------------------------------------------------------- 3. spool_dir
@pytest.mark.parametrize("value, said", [
    ("spool", "must be an absolute path"),
    ("./spool", "must be an absolute path"),
    ("/x\x00y", "must not contain control characters"),
    ("/a\nb", "must not contain control characters"),
    (5, "must be a string"),
])
def test_one_spool_rule_for_config_check_the_daemon_and_the_jobs(tmp_path: Path, value: Any,
                                                                 said: str) -> None:
    path = tmp_path / "s.toml"
    path.write_text(f"[daemon]\nspool_dir = {json.dumps(value)}\n")   # JSON escapes are TOML's
    with pytest.raises(ConfigError) as daemon:           # the daemon and `config check`
        oc.load_config(path)
    with pytest.raises(ConfigError) as jobs:             # shocksub and the training helper
        report_spool({"SHOCKSLURM_CONFIG": str(path)})
    for err in (daemon.value, jobs.value):
        assert err.field == "daemon.spool_dir" and str(err).startswith(str(path)), str(err)
        assert said in str(err), str(err)
    assert str(daemon.value) == str(jobs.value)
    _refused(_cli_check(path), f"{path}, field 'daemon.spool_dir'", said)


def test_an_absolute_spool_is_taken_by_all(tmp_path: Path) -> None:
    path = _file(tmp_path, '[daemon]\nspool_dir = "/var/spool/shock"\n')
    assert oc.load_config(path).spool_dir == "/var/spool/shock"
    assert report_spool({"SHOCKSLURM_CONFIG": str(path)}).path == "/var/spool/shock"
    assert _cli_check(path).exit_code == 0


@pytest.mark.parametrize("data, env, place", [
    ({"daemon": {"rejected_dir": "rejected"}}, None, "s.toml"),
    ({}, {"SHOCKSLURM_DAEMON_SPOOL_DIR": "spool"},
     "environment variable SHOCKSLURM_DAEMON_SPOOL_DIR"),
    ({}, {"SHOCKSLURM_DAEMON_REJECTED_DIR": "/r\x7f"},
     "environment variable SHOCKSLURM_DAEMON_REJECTED_DIR"),
])
def test_the_directory_rule_covers_rejected_dir_and_the_environment(
        data: dict[str, Any], env: dict[str, str] | None, place: str) -> None:
    err = _parse_error(data, env)
    assert str(err).startswith(place) and err.field in ("daemon.spool_dir", "daemon.rejected_dir")


# --------------------------------------------------------------------------- 4. environment
def test_an_unknown_daemon_variable_is_an_error(tmp_path: Path) -> None:
    var = "SHOCKSLURM_DAEMON_ROUND_SECOND"
    err = _parse_error({}, {var: "5"})
    assert str(err).startswith(f"environment variable {var}: unknown key (known: ")
    assert "SHOCKSLURM_DAEMON_ROUND_SECONDS" in str(err)
    _refused(_cli_check(_file(tmp_path, "[daemon]\nround_seconds = 120\n"), {var: "5"}),
             f"environment variable {var}: unknown key")
    _refused(_cli_check(_file(tmp_path, ""), {"SHOCKSLURM_DAEMON_round_seconds": "5"}),
             "environment variable SHOCKSLURM_DAEMON_round_seconds: unknown key")


def test_other_shockslurm_variables_are_not_daemon_keys(tmp_path: Path) -> None:
    env = {"SHOCKSLURM_DB": str(tmp_path / "x.db"), "SHOCKSLURM_SPOOL": "relative",
           "SHOCKSLURM_REPORT_SECRET": "s", "SHOCKSLURM_JOB_PK": "1",
           "SHOCKSLURM_DAEMON_METRICS_PORT": "0", "SHOCKSLURM_DAEMONIC": "x"}
    result = _cli_check(_file(tmp_path, ""), env)
    assert result.exit_code == 0, result.output
    assert "metrics_port = 0    # SHOCKSLURM_DAEMON_METRICS_PORT" in result.output


# --------------------------------------------------------------------------- 5. the file
def test_an_empty_config_path_is_said() -> None:
    _refused(_cli_check(""), "path is empty")
    with pytest.raises(ConfigError, match="path is empty"):
        read_toml("")


@pytest.mark.parametrize("special", ["/dev/zero", "/dev/null"])
def test_a_device_is_refused_before_it_is_read(special: str) -> None:
    if not os.path.exists(special):
        skip_unless_required(f"no {special}")      # every Debian machine has both
    _refused(_cli_check(special), f"{special}: not a regular file")
    with pytest.raises(ConfigError, match="not a regular file"):
        report_spool({"SHOCKSLURM_CONFIG": special})


def test_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"not a regular file \(a directory\)"):
        read_toml(tmp_path)
    with pytest.raises(ConfigError, match="not a regular file"):
        report_spool({"SHOCKSLURM_CONFIG": str(tmp_path)})


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "c.toml"
    os.mkfifo(fifo)
    outcome: list[BaseException | None] = []

    def read() -> None:
        try:
            read_toml(fifo)
            outcome.append(None)
        except BaseException as exc:             # noqa: BLE001 - handed to the test
            outcome.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(10)
    assert not reader.is_alive(), "read_toml waits on a FIFO"
    assert isinstance(outcome[0], ConfigError) and "not a regular file" in str(outcome[0])
    # the command itself, in a process of its own (a hang is a timeout, not a stuck test)
    run = subprocess.run([sys.executable, "-m", "shockslurm.cli.main", "config", "check",
                          "--config", str(fifo)], capture_output=True, text=True, timeout=60,
                         env={k: v for k, v in os.environ.items()
                              if not k.startswith("SHOCKSLURM_")})
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    assert f"{fifo}: not a regular file" in run.stderr


def test_a_file_over_the_cap_is_refused_and_one_at_the_cap_read(tmp_path: Path) -> None:
    comment = "# padding\n"
    at_cap = "[daemon]\nround_seconds = 60\n"
    at_cap += "#" * (MAX_CONFIG_BYTES - len(at_cap) - 1) + "\n"
    path = _file(tmp_path, at_cap)
    assert path.stat().st_size == MAX_CONFIG_BYTES
    assert oc.load_config(path).round_seconds == 60
    path.write_text(at_cap + comment)
    _refused(_cli_check(path), f"{path}: larger than 1,048,576 bytes")
    with pytest.raises(ConfigError, match="larger than"):
        oc.read_policy_table(path)                      # `simulate --policy-config` too


def test_an_integer_too_long_to_parse_is_a_toml_error(tmp_path: Path) -> None:
    path = _file(tmp_path, f"[daemon]\nround_seconds = {'1' * 5000}\n")
    _refused(_cli_check(path), f"{path}: not valid TOML")
    var = "SHOCKSLURM_DAEMON_ROUND_SECONDS"
    _refused(_cli_check(_file(tmp_path, ""), {var: "1" * 5000}),
             f"environment variable {var}, field 'daemon.round_seconds': must be a number")


def test_values_nested_too_deep_are_refused_naming_the_file(tmp_path: Path) -> None:
    """Arrays nested some thousand deep made tomllib raise RecursionError: a traceback from
    `config check`, the daemon's start and every command that reads a configuration."""
    deep = "[" * 3000 + "]" * 3000
    path = _file(tmp_path, f"[daemon]\npartitions = {deep}\n")
    _refused(_cli_check(path), str(path), "nested too deep")
    with pytest.raises(ConfigError, match="nested too deep"):
        read_toml(path)


@pytest.mark.parametrize("line, said", [
    ('db = "mysql://x"', "unsupported store 'mysql'"),
    ('db = "sqlite://"', "is in memory and would vanish on exit"),
    ('db = "postgresql+psycopg://u:hunter2@127.0.0.1:99999/x"', "the port is not in 1..65535"),
    ('partitions = ["a,b"]', "a list of several, not one joined by commas"),
    ('partitions = ["gp u;rm"]', "each of letters, digits and . _ -"),
])
def test_a_store_url_or_partition_the_daemon_cannot_use_is_refused_by_config_check(
        tmp_path: Path, line: str, said: str) -> None:
    """`config check` said "valid" for a store URL `db prune` and the daemon then refused, and
    for partition names squeue would take as several (`a,b`) or none: now refused by name."""
    result = _cli_check(_file(tmp_path, f"[daemon]\n{line}\n"))
    _refused(result, f"field 'daemon.{line.split()[0]}'", said)
    assert "hunter2" not in result.output
    good = _cli_check(_file(tmp_path, '[daemon]\ndb = "postgresql+psycopg://u:p@127.0.0.1/x"\n'
                                      'partitions = ["gpu", "gpu-b.2"]\n'))
    assert good.exit_code == 0, good.output


def test_a_refused_value_is_cut_short_in_the_message(tmp_path: Path) -> None:
    """A refused value was echoed whole: a 6,000-character option or key filled the terminal
    with brackets. Now the message shows at most 200 characters of it."""
    deep = "[" * 3000 + "]" * 3000
    result = CliRunner().invoke(cli, ["simulate", "--policy", "shockwave", "--policy-option",
                                      f"log_breakpoints={deep}"])
    assert result.exit_code == 1 and "log_breakpoints must be a list of finite numbers, got " \
        "<str of length 6000>" in result.output, result.output[:500]
    path = _file(tmp_path, "[daemon]\npartitions = [" + ", ".join(['"a,b"'] * 500) + "]\n")
    refused = _cli_check(path)
    _refused(refused, "field 'daemon.partitions'", "got <list of length 500>")
    assert len(refused.output) < 600, len(refused.output)


@pytest.mark.parametrize("value, said", [
    ("", "must be a non-empty string"),
    ("a\u0000b\nc", "must be printable"),
    ("x" * 65, "at most 64 characters"),
])
def test_a_cluster_name_is_printable_and_short(tmp_path: Path, value: str, said: str) -> None:
    """`config check` took any non-empty cluster name, a NUL (which PostgreSQL cannot store)
    and a newline (printed across lines) included; shocksub's --cluster even "". Now one rule
    for both (`siteconfig.check_cluster`)."""
    path = tmp_path / "s.toml"
    path.write_text(f"[daemon]\ncluster = {json.dumps(value)}\n")
    _refused(_cli_check(path), f"{path}, field 'daemon.cluster'", said)
