"""Numbers on the command line: nan, inf, out-of-range and huge values are usage errors naming
the option (exit 2), read before any work, never a traceback, a hang or a memory blow-up
(`cli/options.py`: `FiniteFloat` and the shared bounds)."""

from __future__ import annotations

import math

import click
import pytest
from click.testing import CliRunner

from shockslurm.cli.main import cli
from shockslurm.cli.options import (GPUS, JOBS, JOBS_PER_HOUR, RESTART_OVERHEAD, ROUND_SECONDS,
                                    SEED, TIME_SCALE, FiniteFloat)

LIVE = ["bench", "live", "--simulate-only", "--cluster", "4x8"]
FAMILY = ["bench", "live-family", "--seeds", "10"]


@pytest.mark.parametrize("args, option", [
    # simulate
    (["simulate", "--round-seconds", "nan"], "--round-seconds"),
    (["simulate", "--round-seconds", "inf"], "--round-seconds"),
    (["simulate", "--round-seconds", "1e300"], "--round-seconds"),
    (["simulate", "--round-seconds", "0.1"], "--round-seconds"),
    (["simulate", "--restart-overhead", "nan"], "--restart-overhead"),
    (["simulate", "--restart-overhead", "1e400"], "--restart-overhead"),
    (["simulate", "--resolve-interval", "nan"], "--resolve-interval"),
    (["simulate", "--resolve-interval", "-inf"], "--resolve-interval"),
    (["simulate", "--resolve-interval", "1e300"], "--resolve-interval"),   # ran for ever
    (["simulate", "--gpus", "1000000000"], "--gpus"),
    (["simulate", "--cluster", "1x1000000000"], "--cluster"),
    (["simulate", "--cluster", "99999999999x1"], "--cluster"),
    (["simulate", "--cluster", "2x8,100000x1"], "--cluster"),
    # trace generate
    (["trace", "generate", "--jobs-per-hour", "nan", "--out", "{out}"], "--jobs-per-hour"),
    (["trace", "generate", "--jobs-per-hour", "1e-300", "--out", "{out}"], "--jobs-per-hour"),
    (["trace", "generate", "--jobs", "3", "--seed", "-5", "--out", "{out}"], "--seed"),
    (["trace", "generate", "--jobs", "99999999999", "--out", "{out}"], "--jobs"),
    # bench solver
    (["bench", "solver", "--jobs", "1", "--gpus", "1", "--repeats", "1", "--seed", "-1"],
     "--seed"),
    (["bench", "solver", "--gpus", "99999999999999999999"], "--gpus"),
    (["bench", "solver", "--jobs", "1", "--gpus", "1", "--json", "{tmp}/nodir/x.json"],
     "--json"),
    # bench switch-cost
    (["bench", "switch-cost", "--jobs-per-hour", "nan"], "--jobs-per-hour"),
    (["bench", "switch-cost", "--restart-overhead", "20,nan"], "--restart-overhead"),
    (["bench", "switch-cost", "--restart-overhead", "20,-1"], "--restart-overhead"),
    (["bench", "switch-cost", "--seeds", "1,-2"], "--seeds"),
    (["bench", "switch-cost", "--cluster", "1x1000000000"], "--cluster"),
    (["bench", "switch-cost", "--seeds", "1,2", "--jobs", "60000"], "'--seeds' / '--jobs'"),
    # bench live-family
    ([*FAMILY, "--round-seconds", "nan"], "--round-seconds"),
    ([*FAMILY, "--time-scale", "inf"], "--time-scale"),
    ([*FAMILY, "--time-scale", "1e300"], "--time-scale"),
    ([*FAMILY, "--time-scale", "1e-300"], "--time-scale"),
    ([*FAMILY, "--target", "nan"], "--target"),
    ([*FAMILY, "--restart-overhead", "inf"], "--restart-overhead"),
    (["bench", "live-family", "--seeds", "1-99999999999999"], "--seeds"),
    (["bench", "live-family", "--seeds", "0-99999999999999,99999999999999-0"], "--seeds"),
    ([*FAMILY, "--workers", "100000"], "--workers"),
    ([*FAMILY, "--cluster", "1x1000000000"], "--cluster"),
    # bench live --simulate-only
    ([*LIVE, "--time-scale", "nan"], "--time-scale"),
    ([*LIVE, "--time-scale", "1e-300"], "--time-scale"),
    ([*LIVE, "--round-seconds", "nan"], "--round-seconds"),
    ([*LIVE, "--grace-seconds", "inf"], "--grace-seconds"),
    ([*LIVE, "--arm-timeout", "nan"], "--arm-timeout"),
    (["bench", "live", "--simulate-only", "--cluster", "1x1000000000"], "--cluster"),
    # bench quality
    (["bench", "quality", "--sizes", "4/99999999999999999999"], "--sizes"),
    (["bench", "quality", "--sizes", "1000000/1"], "--sizes"),
    (["bench", "quality", "--workers", "1000"], "--workers"),
    (["bench", "quality", "--seeds", "99999999"], "--seeds"),
])
def test_bad_numbers_are_usage_errors_naming_the_option(tmp_path, args, option):
    args = [a.format(out=tmp_path / "w.jsonl", tmp=tmp_path) for a in args]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert "Invalid value for" in result.output and option in result.output, result.output
    assert isinstance(result.exception, SystemExit) and "Traceback" not in result.output
    assert not (tmp_path / "w.jsonl").exists()        # nothing ran


@pytest.mark.parametrize("kind, good, bad", [
    # every value the README, docs and tests use passes; the bounds' neighbours do not
    (ROUND_SECONDS, ["0.5", "15", "20", "120", "86400"], ["0.49", "86401", "nan", "inf"]),
    (RESTART_OVERHEAD, ["0", "2", "20", "60", "120", "86400"], ["-1", "86401", "nan"]),
    (TIME_SCALE, ["0.001", "0.15", "0.25", "1", "20", "100"], ["0.0009", "101", "-inf"]),
    (JOBS_PER_HOUR, ["0.72", "40", "100", "343", "100000"], ["0", "0.5", "1e6", "nan"]),
    (JOBS, ["1", "120", "460", "1000", "5000", "100000"], ["0", "100001"]),
    (GPUS, ["1", "32", "256", "2048", "100000"], ["0", "100001"]),
    (SEED, ["0", "10", str(2**70)], ["-1"]),
])
def test_the_bounds_take_every_documented_value(kind, good, bad):
    for text in good:
        read = int(text) if isinstance(kind, click.IntRange) else float(text)
        assert kind.convert(text, None, None) == read
    for text in bad:
        with pytest.raises(click.BadParameter):
            kind.convert(text, None, None)


def test_finite_float_names_the_value_and_keeps_the_range():
    with pytest.raises(click.BadParameter, match="'nan' is not a finite number"):
        FiniteFloat().convert("nan", None, None)
    with pytest.raises(click.BadParameter, match="not a finite number"):
        FiniteFloat(0, 10).convert("1e400", None, None)       # inf once read
    with pytest.raises(click.BadParameter, match="not in the range"):
        FiniteFloat(0, 10).convert("11", None, None)
    assert FiniteFloat(min=0).convert(2, None, None) == 2.0
    assert math.isclose(FiniteFloat(0, 1, min_open=True).convert("1e-300", None, None), 1e-300)


def test_bench_solver_writes_its_json_through_the_shared_writer(tmp_path):
    out = tmp_path / "s.json"
    result = CliRunner().invoke(cli, ["bench", "solver", "--jobs", "2", "--gpus", "2",
                                      "--repeats", "1", "--seed", "3", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert '"jobs": 2' in out.read_text()


def test_bench_round_without_slurm_is_an_error_line_and_submits_nothing(tmp_path, monkeypatch):
    """PATH is an empty directory: no Slurm command can run (nothing can be submitted)."""
    monkeypatch.setenv("PATH", str(tmp_path))
    result = CliRunner().invoke(cli, ["bench", "round", "--jobs", "1", "--yes"])
    assert result.exit_code == 1, result.output
    assert "Error: Slurm command(s) not found on PATH: sbatch" in result.output
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)
    bad = CliRunner().invoke(cli, ["bench", "round", "--jobs", "1", "--yes", "--policy", "foo"])
    assert bad.exit_code == 2 and "Invalid value for '--policy'" in bad.output
    assert "'foo' is not one of" in bad.output and "Traceback" not in bad.output


def test_a_pool_has_no_more_processes_than_tasks(monkeypatch):
    from shockslurm.sim import workers

    started: list[int] = []

    class Pool:
        def __init__(self, n: int) -> None:
            started.append(n)

        def __enter__(self) -> "Pool":
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def map(self, run, inputs):
            return map(run, inputs)

    monkeypatch.setattr(workers, "ProcessPoolExecutor", Pool)
    assert workers.map_ordered(abs, [-1, -2], workers=64) == [1, 2]
    assert workers.map_ordered(abs, [-3], workers=64) == [3]        # one task: no pool
    assert workers.map_ordered(abs, [], workers=8) == []
    assert started == [2]


def test_an_upper_case_jsonl_suffix_is_still_jsonl():
    from pathlib import Path

    from shockslurm.cli.trace import is_jsonl
    assert is_jsonl(Path("W.JSONL")) and is_jsonl(Path("w.Json")) and not is_jsonl(Path("t.tsv"))
