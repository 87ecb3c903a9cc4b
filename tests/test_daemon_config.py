"""The daemon's TOML configuration: defaults, and errors that name the bad key."""

from __future__ import annotations

from pathlib import Path

import pytest

from shockslurm.daemon import DaemonConfig, load_config, parse_config
from shockslurm.errors import ConfigError


def test_defaults():
    cfg = parse_config({})
    assert cfg.round_seconds == 120 and cfg.policy == "shockwave" and cfg.grace_seconds == 30
    assert cfg.partitions == ("gpu",) and cfg.db == "/var/lib/shockslurm/shockslurm.db" and cfg.backend == "auto"
    assert cfg.policy_settings().round_s == 120
    assert cfg.spool_dir == ""
    assert parse_config({"daemon": {"spool_dir": "/var/spool/shock"}}).spool_dir == \
        "/var/spool/shock"


def test_policy_table_splits_settings_from_options(tmp_path: Path):
    path = tmp_path / "d.toml"
    path.write_text('[daemon]\nround_seconds = 6\npolicy = "max_min_fairness"\n'
                    'partitions = ["gpu", "urgent"]\n'
                    '[policy]\nmin_resolve_interval_s = 0\nidle_unallocated = false\n')
    cfg = load_config(path)
    assert cfg.round_seconds == 6.0 and cfg.partitions == ("gpu", "urgent")
    s = cfg.policy_settings()
    assert s.min_resolve_interval_s == 0 and s.idle_unallocated is False and s.options == ()


@pytest.mark.parametrize("data, key", [
    ({"daemon": {"round_seconds": 0}}, "daemon.round_seconds"),
    ({"daemon": {"round_seconds": "fast"}}, "daemon.round_seconds"),
    ({"daemon": {"grace_seconds": -1}}, "daemon.grace_seconds"),
    ({"daemon": {"policy": "nope"}}, "daemon.policy"),
    ({"daemon": {"partitions": []}}, "daemon.partitions"),
    ({"daemon": {"partitions": "gpu"}}, "daemon.partitions"),
    ({"daemon": {"backend": "rest"}}, "daemon.backend"),
    ({"daemon": {"db": ""}}, "daemon.db"),
    ({"daemon": {"spool_dir": 3}}, "daemon.spool_dir"),
    ({"daemon": {"round_secs": 5}}, "daemon.round_secs"),
    ({"deamon": {}}, "deamon"),
    ({"policy": {"min_resolve_interval_s": -3}}, "policy.min_resolve_interval_s"),
    ({"policy": {"idle_unallocated": "no"}}, "policy.idle_unallocated"),
    ({"daemon": {"policy": "fifo"}, "policy": {"no_such_option": 1}}, "policy.no_such_option"),
])
def test_errors_name_the_key(data, key):
    with pytest.raises(ConfigError) as err:
        parse_config(data, source="d.toml")
    assert err.value.field == key
    assert f"field '{key}'" in str(err.value) and "d.toml" in str(err.value)


def test_bad_toml_and_missing_file(tmp_path: Path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[daemon\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.toml")


def test_dataclass_is_frozen():
    with pytest.raises(AttributeError):
        DaemonConfig().round_seconds = 3  # type: ignore[misc]


def test_churn_limits_follow_the_round_unless_set():
    from shockslurm.daemon.build import churn_limits
    limits = churn_limits(parse_config({"daemon": {"round_seconds": 30}}))
    assert limits.min_run_seconds == 45 and limits.finish_window_seconds == 60
    limits = churn_limits(parse_config({"daemon": {"round_seconds": 30, "min_run_seconds": 0,
                                                   "finish_window_seconds": 5}}))
    assert limits.min_run_seconds == 0 and limits.finish_window_seconds == 5
    with pytest.raises(ConfigError) as err:
        parse_config({"daemon": {"finish_window_seconds": -1}}, source="d.toml")
    assert err.value.field == "daemon.finish_window_seconds"
