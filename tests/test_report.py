"""`shockslurm simulate --plot` and `shockslurm report`: real PNG files with real content, from
the SimResult in memory and from the runs read back from the store."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from sqlalchemy import select
from sqlalchemy.orm import Session

from shockslurm.cli.main import cli
from shockslurm.ops.plots import RunSeries, write_run_plots
from shockslurm.store import open_store
from shockslurm.store.models import Job, JobEvent

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
POLICIES = ["fifo", "max_min_fairness"]


def _check_png(path: Path, min_colours: int = 8) -> None:
    import matplotlib.image as mpimg

    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, path
    assert len(data) > 5_000, (path, len(data))
    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[0] > 200 and img.shape[1] > 300
    pixels = img.reshape(-1, img.shape[-1])
    colours = np.unique((pixels * 255).round().astype(np.uint8), axis=0)
    assert len(colours) > min_colours, (path, len(colours))   # not a blank (single-colour) image


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    tmp = tmp_path_factory.mktemp("report")
    db = f"sqlite:///{tmp / 'runs.db'}"
    result = CliRunner().invoke(cli, ["simulate", "--policy", ",".join(POLICIES), "--db", db,
                                      "--plot", str(tmp / "sim-plots"), "--no-progress",
                                      "--json", str(tmp / "o.json")])
    assert result.exit_code == 0, result.output
    return tmp, result.output.splitlines()


def test_simulate_plot_writes_valid_pngs(simulated: tuple[Path, list[str]]) -> None:
    tmp, lines = simulated
    printed = [Path(line) for line in lines if line.endswith(".png")]
    names = {p.name for p in printed}
    for policy in POLICIES:
        assert f"{policy}-timeline.png" in names and f"{policy}-utilisation.png" in names
    assert "rho-by-policy.png" in names
    for path in printed:
        assert path.parent == tmp / "sim-plots"
        _check_png(path)


def test_simulation_records_completion_and_exclusive_runtime(
        simulated: tuple[Path, list[str]]) -> None:
    tmp, _ = simulated
    engine = open_store(str(tmp / "runs.db"))
    with Session(engine) as s:
        jobs = s.scalar(select(Job.id).limit(1))
        events = list(s.scalars(select(JobEvent).where(JobEvent.kind == "completed")))
    engine.dispose()
    assert jobs is not None
    assert len(events) == 2 * 60          # every job of both runs finished
    assert all(json.loads(e.detail)["exclusive_runtime_s"] > 0 for e in events)


def test_report_from_store_matches_the_simulator(simulated: tuple[Path, list[str]]) -> None:
    tmp, _ = simulated
    out = tmp / "report"
    result = CliRunner().invoke(cli, ["report", "--db", str(tmp / "runs.db"), "--out", str(out)])
    assert result.exit_code == 0, result.output
    printed = [Path(p) for p in result.output.split()]
    assert {p.name for p in printed} == {
        "run-1-fifo-timeline.png", "run-1-fifo-utilisation.png",
        "run-2-max_min_fairness-timeline.png", "run-2-max_min_fairness-utilisation.png",
        "rho-by-policy.png"}
    for path in printed:
        assert path.exists()
        _check_png(path)
    # rho recomputed from the store is the simulator's own metric
    from shockslurm.ops.runs import from_store

    metrics = {d["policy"]: d for d in json.loads((tmp / "o.json").read_text())}
    engine = open_store(str(tmp / "runs.db"))
    with Session(engine) as s:
        for run_id, policy in ((1, "fifo"), (2, "max_min_fairness")):
            series = from_store(s, run_id)
            assert len(series.rho) == 60
            assert max(series.rho) == pytest.approx(metrics[policy]["worst_rho"], rel=1e-9)
            assert float(np.median(series.rho)) == pytest.approx(metrics[policy]["median_rho"],
                                                                  rel=1e-9)
            assert series.timeline and all(w > 0 for _, _, w, _ in series.timeline)
            assert all(0 <= used <= total == 8 for _, used, total in series.utilisation)
    engine.dispose()


def test_report_one_run_and_unknown_run(simulated: tuple[Path, list[str]]) -> None:
    tmp, _ = simulated
    runner = CliRunner()
    result = runner.invoke(cli, ["report", "--db", str(tmp / "runs.db"), "--out",
                                 str(tmp / "one"), "--run", "2"])
    assert result.exit_code == 0, result.output
    assert sorted(Path(p).name for p in result.output.split()) == [
        "rho-by-policy.png", "run-2-max_min_fairness-timeline.png",
        "run-2-max_min_fairness-utilisation.png"]
    result = runner.invoke(cli, ["report", "--db", str(tmp / "runs.db"), "--out",
                                 str(tmp / "none"), "--run", "99"])
    assert result.exit_code == 1 and "no run 99" in result.output


def test_report_on_missing_store_is_a_clear_error(tmp_path: Path) -> None:
    db = tmp_path / "nope.db"
    result = CliRunner().invoke(cli, ["report", "--db", str(db), "--out", str(tmp_path / "o")])
    assert result.exit_code == 1 and f"no store at {db}" in result.output
    assert not db.exists()          # opening it must not leave an empty store behind


def _damaged_copy(simulated: tuple[Path, list[str]], tmp_path: Path, how: str) -> Path:
    """A copy of the simulated store with its plan entries dropped (a table changed by hand),
    or with that table's first page overwritten by zeros (a damaged file)."""
    import shutil
    import sqlite3

    copy = tmp_path / "copy.db"
    shutil.copy(simulated[0] / "runs.db", copy)
    if how == "dropped":
        with sqlite3.connect(copy) as conn:
            conn.execute("PRAGMA foreign_keys = OFF")
            conn.execute("DROP TABLE plan_entries")
    else:
        with sqlite3.connect(copy) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            size = conn.execute("PRAGMA page_size").fetchone()[0]
            root = conn.execute("SELECT rootpage FROM sqlite_master "
                                "WHERE name = 'plan_entries'").fetchone()[0]
        with open(copy, "r+b") as fh:       # the table's first page: zeros
            fh.seek((root - 1) * size)
            fh.write(bytes(size))
    return copy


@pytest.mark.parametrize("how, said", [("dropped", "no such table: plan_entries"),
                                       ("zeroed", "malformed")])
def test_report_on_a_damaged_store_names_it_in_one_line(
        simulated: tuple[Path, list[str]], tmp_path: Path, how: str, said: str) -> None:
    """A database error met in a damaged store, or in one whose tables were changed by hand,
    was a SQLAlchemy traceback; now an `Error:` line naming the store and the driver's word."""
    copy = _damaged_copy(simulated, tmp_path, how)
    result = CliRunner().invoke(cli, ["report", "--db", str(copy), "--out", str(tmp_path / "o")])
    assert result.exit_code == 1, result.output
    assert result.output.startswith(f"Error: the store sqlite:///{copy} cannot be used: "), \
        result.output
    assert said in result.output and "damaged or was changed outside shockslurm" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_plots_without_data_still_render(tmp_path: Path) -> None:
    """A live run with no completion events has no rho chart; empty runs still draw a frame."""
    paths = list(write_run_plots([RunSeries("run 7 shockwave", "shockwave")], tmp_path))
    assert [p.name for p in paths] == ["run-7-shockwave-timeline.png",
                                       "run-7-shockwave-utilisation.png"]
    for p in paths:
        _check_png(p, min_colours=2)


def test_a_chart_that_cannot_be_written_leaves_those_written_before_it_listed(
        simulated: tuple[Path, list[str]], tmp_path: Path) -> None:
    """A directory where the second chart goes: the first is listed (it was written) before the
    error naming the second; the list used to come only once every chart was written."""
    tmp, _ = simulated
    out = tmp_path / "charts"
    (out / "run-1-fifo-utilisation.png").mkdir(parents=True)
    result = CliRunner().invoke(cli, ["report", "--db", f"sqlite:///{tmp / 'runs.db'}",
                                      "--out", str(out), "--run", "1"])
    assert result.exit_code == 1, result.output
    first, *rest = result.output.splitlines()
    assert first == str(out / "run-1-fifo-timeline.png"), result.output
    _check_png(Path(first))
    assert rest and "run-1-fifo-utilisation.png" in rest[0] and rest[0].startswith("Error:"), \
        result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
