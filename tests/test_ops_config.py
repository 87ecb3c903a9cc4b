"""`shockslurm config check` and the configuration table: every documented bad case exits
non-zero naming the key; the environment wins over the file; secrets are masked; the README
table and contrib/shockslurm.toml are what `KEYS` produces."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from shockslurm.cli.main import cli
from shockslurm.ops import config as oc

ROOT = Path(__file__).resolve().parents[1]
CLEAN_ENV = {k: None for k in ("SHOCKSLURM_DB", "SHOCKSLURM_CONFIG")} | {
    k.env: None for k in oc.KEYS if k.env}


def _check(tmp_path: Path, text: str, env: dict | None = None):
    path = tmp_path / "s.toml"
    path.write_text(text)
    return CliRunner().invoke(cli, ["config", "check", "--config", str(path)],
                              env={**CLEAN_ENV, **(env or {})})


@pytest.mark.parametrize("text, key", [
    ('[daemon]\nround_seconds = "fast"\n', "daemon.round_seconds"),           # wrong type
    ("[daemon]\nround_seconds = 0\n", "daemon.round_seconds"),                # zero, > 0 needed
    ("[daemon]\nstop_timeout_seconds = -5\n", "daemon.stop_timeout_seconds"),  # negative
    ("[daemon]\ngrace_seconds = -1\n", "daemon.grace_seconds"),
    ("[daemon]\nround_seconds = nan\n", "daemon.round_seconds"),              # NaN
    ("[daemon]\ngrace_seconds = inf\n", "daemon.grace_seconds"),
    ("[policy]\nmin_resolve_interval_s = nan\n", "policy.min_resolve_interval_s"),
    ("[daemon]\nround_secs = 5\n", "daemon.round_secs"),                      # unknown key
    ("[deamon]\nround_seconds = 5\n", "deamon"),                              # unknown table
    ('[daemon]\npolicy = "nope"\n', "daemon.policy"),                         # unknown policy
    ('[daemon]\npolicy = "fifo"\n[policy]\nno_such_option = 1\n', "policy.no_such_option"),
    ('[daemon]\npolicy = "shockwave"\n[policy]\nfuture_rounds = 0\n', "policy.future_rounds"),
    ('[policy]\nidle_unallocated = "no"\n', "policy.idle_unallocated"),
    ('[daemon]\nlog_format = "xml"\n', "daemon.log_format"),                  # bad log_format
    ("[daemon]\nmetrics_port = 70000\n", "daemon.metrics_port"),              # port range
    ("[daemon]\nmetrics_port = -1\n", "daemon.metrics_port"),
    ("[daemon]\nmetrics_port = 80.5\n", "daemon.metrics_port"),
    ("[daemon]\nmetrics_address = \"\"\n", "daemon.metrics_address"),
    ("[daemon]\njob_name_prefix = 3\n", "daemon.job_name_prefix"),
    ('[daemon]\npartitions = "gpu"\n', "daemon.partitions"),
    ('[daemon]\nbackend = "rest"\n', "daemon.backend"),
    ('[daemon]\ndb = ""\n', "daemon.db"),
])
def test_bad_config_exits_naming_the_key(tmp_path: Path, text: str, key: str):
    result = _check(tmp_path, text)
    assert result.exit_code != 0, result.output
    assert f"field '{key}'" in result.output and "s.toml" in result.output, result.output


def test_bad_environment_value_names_key_and_variable(tmp_path: Path):
    result = _check(tmp_path, "", {"SHOCKSLURM_DAEMON_ROUND_SECONDS": "-3"})
    assert result.exit_code != 0
    assert "SHOCKSLURM_DAEMON_ROUND_SECONDS" in result.output
    assert "field 'daemon.round_seconds'" in result.output


def test_missing_and_malformed_file(tmp_path: Path):
    result = CliRunner().invoke(cli, ["config", "check", "--config", str(tmp_path / "no.toml")],
                                env=CLEAN_ENV)
    assert result.exit_code != 0 and "cannot read" in result.output
    assert _check(tmp_path, "[daemon\n").exit_code != 0


def test_default_path_and_config_env(tmp_path: Path, monkeypatch):
    assert oc.config_path(None, {}) == Path("/etc/shockslurm/shockslurm.toml")
    assert oc.config_path(None, {"SHOCKSLURM_CONFIG": "/x.toml"}) == Path("/x.toml")
    assert oc.config_path("/y.toml", {"SHOCKSLURM_CONFIG": "/x.toml"}) == Path("/y.toml")
    path = tmp_path / "c.toml"
    path.write_text("[daemon]\nround_seconds = 9\n")
    result = CliRunner().invoke(cli, ["config", "check"],
                                env={**CLEAN_ENV, "SHOCKSLURM_CONFIG": str(path)})
    assert result.exit_code == 0, result.output
    assert "round_seconds = 9    # " + str(path) in result.output


def test_environment_overrides_win(tmp_path: Path):
    text = '[daemon]\ndb = "/var/lib/a.db"\nround_seconds = 60\npartitions = ["gpu"]\n'
    result = _check(tmp_path, text, {
        "SHOCKSLURM_DB": "postgresql+psycopg://shock:s3cret@db.example/shock",
        "SHOCKSLURM_DAEMON_ROUND_SECONDS": "15", "SHOCKSLURM_DAEMON_METRICS_PORT": "0",
        "SHOCKSLURM_DAEMON_PARTITIONS": "gpu,urgent", "SHOCKSLURM_DAEMON_LOG_FORMAT": "json"})
    assert result.exit_code == 0, result.output
    out = result.output
    assert "round_seconds = 15    # SHOCKSLURM_DAEMON_ROUND_SECONDS" in out
    assert "metrics_port = 0    # SHOCKSLURM_DAEMON_METRICS_PORT" in out
    assert 'partitions = ["gpu", "urgent"]' in out and 'log_format = "json"' in out
    assert 'db = "postgresql+psycopg://shock:***@db.example/shock"    # SHOCKSLURM_DB' in out
    assert "s3cret" not in out
    # the specific variable wins over the shorthand
    cfg = oc.parse_config({}, env={"SHOCKSLURM_DB": "a.db", "SHOCKSLURM_DAEMON_DB": "b.db"})
    assert cfg.db == "b.db"
    # parse_config without env ignores the environment
    assert oc.parse_config({}).db == "/var/lib/shockslurm/shockslurm.db"


def test_masking():
    assert oc.mask("postgresql+psycopg://user:pw@host/db") == \
        "postgresql+psycopg://user:***@host/db"
    assert oc.mask("connect to postgresql://u:p%40ss@h:5432/d failed") == \
        "connect to postgresql://u:***@h:5432/d failed"
    assert oc.mask("postgresql+psycopg://user@host/db") == "postgresql+psycopg://user@host/db"
    assert oc.mask("/var/lib/shockslurm/x.db") == "/var/lib/shockslurm/x.db"


def test_masking_in_logs():
    import io
    import json
    import logging

    from shockslurm.ops import logsetup

    stream = io.StringIO()
    logsetup.configure("json", stream=stream)
    try:
        logging.getLogger("shockslurm.daemon").info("store %s", "postgresql://a:secret@h/d",
                                                    extra={"fields": {"round": 3}})
        logsetup.configure("text")
        logging.getLogger("shockslurm.daemon").warning("again postgresql://a:secret@h/d")
    finally:
        logsetup.remove()
    lines = stream.getvalue().splitlines()
    obj = json.loads(lines[0])
    assert obj["msg"] == "store postgresql://a:***@h/d" and obj["round"] == 3
    assert "secret" not in stream.getvalue() and "a:***@h/d" in lines[1]


def test_every_key_documented_and_defaults_valid():
    cfg = oc.parse_config({})
    for key in oc.KEYS:
        assert key.doc and key.type_name
        if key.section == "daemon":
            value = getattr(cfg, key.name)
            assert value == (tuple(key.default) if isinstance(key.default, list)
                             else key.default), key.name
    assert cfg.metrics_port == 9814 and cfg.metrics_address == "127.0.0.1"
    assert cfg.log_format == "text" and cfg.job_name_prefix == ""


def test_contrib_example_is_generated_and_valid():
    text = (ROOT / "contrib" / "shockslurm.toml").read_text()
    assert text == oc.example_toml(), "regenerate: shockslurm config example > contrib/..."
    cfg = oc.parse_config(tomllib.loads(text))
    assert cfg.db == "/var/lib/shockslurm/shockslurm.db"
    for key in oc.KEYS:
        assert key.name in text


def test_readme_table_is_generated():
    readme = (ROOT / "README.md").read_text()
    assert oc.markdown_table() in readme, "regenerate: shockslurm config keys"


def test_systemd_unit_references_the_config():
    unit = (ROOT / "contrib" / "systemd" / "shockslurm.service").read_text()
    assert "--config /etc/shockslurm/shockslurm.toml" in unit
    assert oc.DEFAULT_PATH in unit and "ExecReload=/bin/kill -HUP $MAINPID" in unit


def test_policy_options_from_the_environment(tmp_path: Path):
    """SHOCKSLURM_POLICY_<OPTION> sets a [policy] option (TOML-parsed), wins over the file and is
    shown with its origin; a bad value or an unknown option names the variable."""
    text = '[daemon]\npolicy = "shockwave"\n[policy]\nfuture_rounds = 10\n'
    result = _check(tmp_path, text, {"SHOCKSLURM_POLICY_FUTURE_ROUNDS": "30",
                                     "SHOCKSLURM_POLICY_TAIL_DRAIN_FACTOR": "1.3",
                                     "SHOCKSLURM_POLICY_MIN_RESOLVE_INTERVAL_S": "0"})
    assert result.exit_code == 0, result.output
    out = result.output
    assert "future_rounds = 30    # SHOCKSLURM_POLICY_FUTURE_ROUNDS" in out
    assert "tail_drain_factor = 1.3    # SHOCKSLURM_POLICY_TAIL_DRAIN_FACTOR" in out
    assert "min_resolve_interval_s = 0" in out
    cfg = oc.parse_config({"daemon": {"policy": "shockwave"}},
                          env={"SHOCKSLURM_POLICY_FUTURE_ROUNDS": "30"})
    assert cfg.policy_options["future_rounds"] == 30
    for env, named in (({"SHOCKSLURM_POLICY_MIN_RESOLVE_INTERVAL_S": "-1"},
                        "SHOCKSLURM_POLICY_MIN_RESOLVE_INTERVAL_S"),
                       ({"SHOCKSLURM_POLICY_FUTURE_ROUNDS": "0"},
                        "SHOCKSLURM_POLICY_FUTURE_ROUNDS"),
                       ({"SHOCKSLURM_POLICY_NO_SUCH_KNOB": "1"}, "SHOCKSLURM_POLICY_NO_SUCH_KNOB")):
        bad = _check(tmp_path, text, env)
        assert bad.exit_code != 0 and named in bad.output, (env, bad.output)
