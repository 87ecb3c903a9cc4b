"""Fuzz `shockslurm.daemon.parse_config` with random TOML-like documents.

Contract: a valid `DaemonConfig` (usable values) or a `ConfigError` naming the key -- nothing else.
"""

from __future__ import annotations

import datetime as dt
import math
import tomllib

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from shockslurm.daemon import DaemonConfig, parse_config
from shockslurm.errors import ConfigError
from shockslurm.policies import REGISTRY

FUZZ = settings(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

DAEMON_KEYS = ["round_seconds", "policy", "grace_seconds", "partitions", "db", "backend",
               "cluster", "stop_timeout_seconds", "spool_dir"]
# [policy] keys: the PolicySettings fields and some policies' keyword arguments (and two
# removed ones, solver_threads and calibration_tolerance, now unknown).
POLICY_KEYS = ["min_resolve_interval_s", "idle_unallocated", "alpha", "k", "lam", "rhomax",
               "future_rounds", "resolve_every", "time_limit_s", "log_breakpoints",
               "progress_model", "fill_order", "solver_threads", "calibration_tolerance",
               "integer_rounds"]
# Everything TOML can hold (tomllib gives exactly these types).
TOML_SCALARS = st.one_of(
    st.booleans(), st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.datetimes(), st.dates(), st.times(),
    st.sampled_from(["", "gpu", "cli", "auto", "pyslurm", "fifo", "shockwave", "allox",
                     "forecast", 0, 1, -1, 0.0, 1e-300, 1e308, 120, 7.5]),
    st.sampled_from(sorted(REGISTRY)))
TOML_VALUES = st.recursive(
    TOML_SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=6)


def _table(keys: list[str]):
    return st.dictionaries(st.one_of(st.sampled_from(keys), st.text(max_size=8)), TOML_VALUES,
                           max_size=4)


DOCUMENTS = st.dictionaries(
    st.one_of(st.sampled_from(["daemon", "policy"]), st.text(max_size=8)),
    st.one_of(_table(DAEMON_KEYS), _table(POLICY_KEYS), TOML_VALUES), max_size=3)


def _key_exists(doc: dict, field: str) -> bool:
    """`field` names a table or key of `doc` ("daemon.round_seconds") or a known key."""
    if field in doc or field in ("daemon", "policy"):
        return True
    for table in ("daemon", "policy"):
        if field.startswith(table + "."):
            rest = field[len(table) + 1:]
            section = doc.get(table)
            return rest in DAEMON_KEYS + POLICY_KEYS or (isinstance(section, dict)
                                                          and rest in section)
    return False


def _check(doc: dict) -> None:
    try:
        cfg = parse_config(doc, source="fuzz.toml")
    except ConfigError as exc:
        assert exc.source == "fuzz.toml", str(exc)
        assert exc.field is not None and _key_exists(doc, exc.field), str(exc)
    else:
        assert isinstance(cfg, DaemonConfig)
        assert cfg.policy in REGISTRY and cfg.partitions and cfg.db and cfg.cluster
        for name in ("round_seconds", "stop_timeout_seconds"):
            value = getattr(cfg, name)
            assert math.isfinite(value) and value > 0, (name, value)
        assert math.isfinite(cfg.grace_seconds) and cfg.grace_seconds >= 0
        resolve = cfg.policy_options.get("min_resolve_interval_s", 0)
        assert math.isfinite(resolve) and resolve >= 0


@settings(FUZZ, max_examples=300)
@given(doc=DOCUMENTS)
@example(doc={})
@example(doc={"daemon": {"partitions": []}})
@example(doc={"daemon": {"round_seconds": True}})
@example(doc={"daemon": {"policy": ["fifo"]}})
@example(doc={"policy": {"idle_unallocated": 1}})
@example(doc={"daemon": 5})
def test_random_documents(doc):
    _check(doc)


@settings(FUZZ, max_examples=60)
@given(policy=st.sampled_from(sorted(REGISTRY)),
       options=st.dictionaries(st.sampled_from(["alpha", "unknown_knob", "min_resolve_interval_s",
                                                "idle_unallocated"]),
                               TOML_SCALARS, max_size=2))
def test_policy_options(policy, options):
    doc = {"daemon": {"policy": policy}, "policy": options}
    _check(doc)


@settings(FUZZ, max_examples=60)
@given(text=st.text(max_size=120))
def test_toml_text(text):
    """Whatever tomllib makes of arbitrary text goes through the same contract."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return
    _check(doc)


@pytest.mark.parametrize("doc", [
    {"daemon": {"round_seconds": float("nan")}},       # TOML `round_seconds = nan` is accepted
    {"daemon": {"round_seconds": float("inf")}},
    {"daemon": {"grace_seconds": float("nan")}},
    {"daemon": {"stop_timeout_seconds": float("inf")}},
    {"policy": {"min_resolve_interval_s": float("nan")}},
    {"daemon": {"policy": "shockwave"}, "policy": {"future_rounds": 0}},     # ValueError
    {"daemon": {"policy": "shockwave"}, "policy": {"progress_model": "x"}},  # ValueError
    {"daemon": {"policy": "shockwave"}, "policy": {"log_breakpoints": "abc"}},
], ids=["round-nan", "round-inf", "grace-nan", "stop-inf", "resolve-nan", "future-rounds-0",
        "progress-model", "breakpoints-str"])
def test_non_finite_numbers_and_refused_policy_options(doc):
    _check(doc)


def test_datetimes_are_not_numbers():
    with pytest.raises(ConfigError) as info:
        parse_config({"daemon": {"round_seconds": dt.datetime(2024, 1, 1)}})
    assert info.value.field == "daemon.round_seconds"
