"""Outputs under faults: a write that fails (a file size limit, a directory at a chart's name)
leaves the file already there untouched and is one error line naming the option and the path,
never a traceback (`shockslurm.atomic`); `report` on a damaged store names the run and the
damaged row; a store URL that is not UTF-8 is refused, its password hidden."""

from __future__ import annotations

import os
import resource
import signal
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from shockslurm.atomic import NamedPath, OutputWriteError, atomic_write, write_file
from shockslurm.cli.main import cli
from shockslurm.ops.runs import RunDamaged
from shockslurm.store.database import StoreError, parse_url
from shockslurm.workload.jsonl import read_jobs, write_jobs

WORKLOAD = "\n".join([
    '{"model": "ResNet-18", "gpus": 1, "arrival_s": 0, "epochs": 3, "schedule": [[0, 32]]}',
    '{"model": "ResNet-18", "gpus": 2, "arrival_s": 10, "epochs": 2, "schedule": [[0, 32]]}',
    '{"model": "ResNet-18", "gpus": 1, "arrival_s": 20, "epochs": 3, "schedule": [[0, 32]]}',
]) + "\n"
OLD = ("precious old content\n" * 130).encode()   # 2.7 KB, more than the limit below
LIMIT = 1024                                        # bytes any one file may grow to


@pytest.fixture()
def small(tmp_path: Path) -> Path:
    path = tmp_path / "small.jsonl"
    path.write_text(WORKLOAD)
    return path


def _limited(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """`shockslurm ARGS` with files limited to LIMIT bytes and SIGXFSZ ignored, so a write past
    it fails with EFBIG (root is bound by it too)."""
    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))

    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", MPLCONFIGDIR=str(cwd / ".mpl"))
    return subprocess.run([sys.executable, "-m", "shockslurm.cli.main", *args], cwd=cwd,
                          env=env, preexec_fn=limit, capture_output=True, text=True,
                          timeout=300)


def _left(directory: Path) -> list[str]:
    """Temporary files left behind by a failed write."""
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


@pytest.mark.parametrize("option, args", [
    ("--json", ["simulate", "--trace", "small.jsonl", "--gpus", "4", "--no-progress",
                "--policy", "fifo,max_min_fairness", "--json"]),
    ("--out", ["trace", "generate", "--jobs", "60", "--out"]),
])
def test_a_failed_write_keeps_the_old_file(small: Path, option: str, args: list[str]) -> None:
    out = small.parent / "keep.out"
    out.write_bytes(OLD)
    done = _limited([*args, out.name], small.parent)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert out.read_bytes() == OLD
    assert "Traceback" not in done.stderr
    assert f"Error: {option} {out.name}: cannot write: File too large" in done.stderr, done.stderr
    assert _left(small.parent) == []


def test_the_same_write_succeeds_without_the_limit(small: Path) -> None:
    out = small.parent / "keep.jsonl"
    out.write_bytes(OLD)
    out.chmod(0o640)
    result = CliRunner().invoke(cli, ["trace", "generate", "--jobs", "60", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert len(read_jobs(out)) == 60
    assert stat.S_IMODE(out.stat().st_mode) == 0o640      # the replaced file's mode is kept
    assert _left(small.parent) == []


def test_simulate_plot_onto_a_directory_is_an_error_naming_it(small: Path) -> None:
    plots = small.parent / "plotx"
    (plots / "rho-by-policy.png").mkdir(parents=True)
    result = CliRunner().invoke(cli, ["simulate", "--trace", str(small), "--gpus", "4",
                                      "--policy", "fifo", "--no-progress", "--plot", str(plots)])
    assert result.exit_code == 1, result.output
    assert not isinstance(result.exception, IsADirectoryError)
    assert (f"Error: --plot {plots}: cannot write {plots / 'rho-by-policy.png'}: Is a directory"
            in result.output), result.output
    assert (plots / "rho-by-policy.png").is_dir()
    assert _left(plots) == []


@pytest.fixture()
def store(small: Path) -> Path:
    """A store holding two simulated runs of the small workload (1: fifo, 2: max_min)."""
    db = small.parent / "runs.db"
    result = CliRunner().invoke(cli, ["simulate", "--trace", str(small), "--gpus", "4",
                                      "--policy", "fifo,max_min_fairness", "--no-progress",
                                      "--db", str(db)])
    assert result.exit_code == 0, result.output
    return db


def test_report_onto_a_directory_is_an_error_naming_it(store: Path) -> None:
    out = store.parent / "rpx"
    (out / "run-1-fifo-timeline.png").mkdir(parents=True)
    result = CliRunner().invoke(cli, ["report", "--db", str(store), "--out", str(out)])
    assert result.exit_code == 1, result.output
    assert (f"Error: --out {out}: cannot write {out / 'run-1-fifo-timeline.png'}: "
            f"Is a directory" in result.output), result.output
    assert _left(out) == []


def test_report_replaces_charts_whole(store: Path) -> None:
    out = store.parent / "rp"
    out.mkdir()
    (out / "run-1-fifo-timeline.png").write_bytes(b"old chart")
    result = CliRunner().invoke(cli, ["report", "--db", str(store), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert (out / "run-1-fifo-timeline.png").read_bytes()[:4] == b"\x89PNG"
    assert _left(out) == []


@pytest.mark.parametrize("update, damage", [
    ("UPDATE runs SET config='not json' WHERE id=1", "runs.config is not JSON"),
    ("UPDATE runs SET config='[1,2]' WHERE id=1", "runs.config is not a JSON object"),
    ("""UPDATE runs SET config='{"gpus":"abc"}' WHERE id=1""", "runs.config gpus is 'abc'"),
    ("UPDATE rounds SET time_s='abc' WHERE run_id=1", "time_s is 'abc', not a number"),
    ("UPDATE plan_entries SET job_pk=99999 WHERE id=(SELECT min(id) FROM plan_entries)",
     "plan_entries row 1 (round row 1) names job_pk 99999, which is no job of this run"),
    ("UPDATE jobs SET gang_size='x' WHERE run_id=1", "gang_size is 'x'"),
    # until 2026-12-02 drawn: a plan of 99,999,999,999 GPUs
    ("UPDATE plan_entries SET gpus=99999999999 WHERE id=(SELECT min(id) FROM plan_entries)",
     "plan_entries row 1 gpus is 99999999999, not a whole number in 0..100,000"),
    ("UPDATE job_events SET time_s='x' WHERE job_pk IN (SELECT id FROM jobs WHERE run_id=1)",
     "time_s is 'x', not a number"),
])
def test_report_on_a_damaged_run_names_it(store: Path, update: str, damage: str) -> None:
    with sqlite3.connect(store) as db:
        assert db.execute(update).rowcount > 0
    out = store.parent / "rp"
    result = CliRunner().invoke(cli, ["report", "--db", str(store), "--out", str(out)])
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit), result.exception   # not a traceback
    assert "Error: run 1 cannot be reported: damaged in the store: " in result.stderr
    assert damage in result.stderr, result.output
    # the undamaged run is drawn all the same, the damaged one not at all
    drawn = sorted(p.name for p in out.iterdir())
    assert drawn == ["rho-by-policy.png", "run-2-max_min_fairness-timeline.png",
                     "run-2-max_min_fairness-utilisation.png"]
    assert sorted(result.stdout.split()) == [str(out / name) for name in drawn]
    # asked for alone, it is all there is to draw: exit 1, nothing written
    alone = CliRunner().invoke(cli, ["report", "--db", str(store), "--run", "1", "--out",
                                     str(store.parent / "rp1")])
    assert alone.exit_code == 1 and "Error: run 1 cannot be reported" in alone.stderr
    assert not (store.parent / "rp1").exists() or not any((store.parent / "rp1").iterdir())


def test_damaged_run_is_a_lookup_error() -> None:
    assert issubclass(RunDamaged, LookupError)


@pytest.mark.parametrize("run", ["99999999999999999999999", "9223372036854775808", "0", "-1"])
def test_report_run_beyond_a_63_bit_integer(store: Path, run: str) -> None:
    result = CliRunner().invoke(cli, ["report", "--db", str(store), "--run", run, "--out",
                                      str(store.parent / "rp")])
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    assert f"Error: no run {run} in the store (run ids are 1 to 9223372036854775807)" \
        in result.output


@pytest.mark.parametrize("url, shown", [
    ("postgresql+psycopg://\udcff@127.0.0.1:1/db", "postgresql+psycopg://"),
    ("postgresql+psycopg://user:s\udcffcret@127.0.0.1:1/db", "127.0.0.1:1/db"),
    ("/tmp/store-\udcff.db", "/tmp/store-\\xff.db"),
])
def test_store_url_that_is_not_utf8(url: str, shown: str) -> None:
    with pytest.raises(StoreError, match="is not valid UTF-8") as caught:
        parse_url(url)
    assert shown in str(caught.value)
    assert "cret" not in str(caught.value)          # the password stays hidden
    str(caught.value).encode("utf-8")               # printable


def test_simulate_db_url_that_is_not_utf8(small: Path) -> None:
    result = CliRunner().invoke(cli, ["simulate", "--trace", str(small), "--gpus", "4",
                                      "--policy", "fifo", "--no-progress", "--db",
                                      "postgresql+psycopg://u:pa\udcffss@127.0.0.1:1/db"])
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Error: the store URL 'postgresql+psycopg://u:***@127.0.0.1:1/db' is not valid " \
        "UTF-8" in result.output, result.output


# -------------------------------------------------------------- the helper itself
def test_atomic_write_failure_keeps_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    path.write_bytes(OLD)

    def half(fh) -> None:
        fh.write(b"partial")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        atomic_write(path, half)
    assert path.read_bytes() == OLD and _left(tmp_path) == []
    with pytest.raises(OutputWriteError, match=r"^--json .*f\.json: cannot write: No space"):
        write_file(NamedPath.given(path, "--json"), half)
    assert path.read_bytes() == OLD and _left(tmp_path) == []


def test_atomic_write_new_file_follows_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        atomic_write(tmp_path / "new", b"x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o640


def test_atomic_write_follows_a_link_and_writes_a_fifo_in_place(tmp_path: Path) -> None:
    target = tmp_path / "real.json"
    target.write_bytes(OLD)
    link = tmp_path / "link.json"
    link.symlink_to(target)
    atomic_write(link, b"new")
    assert link.is_symlink() and target.read_bytes() == b"new"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE)
    atomic_write(fifo, b"through the pipe")
    assert reader.communicate(timeout=30)[0] == b"through the pipe"
    assert stat.S_ISFIFO(fifo.stat().st_mode)


def test_write_jobs_names_the_option_it_came_from(tmp_path: Path, small: Path) -> None:
    jobs = read_jobs(small)
    where = tmp_path / "gone"
    with pytest.raises(OutputWriteError, match=r"^--out .*gone/w\.jsonl: cannot write: "):
        write_jobs(jobs, NamedPath.given(where / "w.jsonl", "--out"))
    with pytest.raises(OutputWriteError, match=r"^/.*gone/w\.jsonl: cannot write: "):
        write_jobs(jobs, str(where / "w.jsonl"))
    write_jobs(jobs, tmp_path / "w.jsonl")
    assert [j.job_id for j in read_jobs(tmp_path / "w.jsonl")] == [0, 1, 2]


def test_a_file_in_a_read_only_directory_is_refused_before_the_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """It is replaced by a file written beside it, which that directory would refuse (the
    directory's refusal is simulated: root may write anywhere)."""
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "o.jsonl").write_text("old\n")
    access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: Path(p) != locked and access(p, mode))
    result = CliRunner().invoke(cli, ["trace", "generate", "--jobs", "3", "--out",
                                      str(locked / "o.jsonl")])
    assert result.exit_code == 2, result.output
    assert f"cannot replace it: its directory {locked} is not writable" in result.output
    assert (locked / "o.jsonl").read_text() == "old\n"


def test_no_torch_for_the_command_line_writer() -> None:
    code = ("import sys, shockslurm.atomic, shockslurm.cli.paths; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"



def test_dev_stdout_is_written_in_place_not_replaced(tmp_path):
    """`--json /dev/stdout > out.txt`: resolved, /dev/stdout is out.txt, which must stay the
    file the shell opened (replacing it would send the rest of stdout to a deleted file)."""
    out = tmp_path / "out.txt"
    code = ("from shockslurm.atomic import atomic_write; "
            "atomic_write('/dev/stdout', b'{}\\n'); print('after', flush=True)")
    with out.open("wb") as fh:
        inode = os.fstat(fh.fileno()).st_ino
        subprocess.run([sys.executable, "-c", code], stdout=fh, check=True, timeout=60)
    assert out.stat().st_ino == inode
    assert out.read_text() == "{}\nafter\n"


def test_a_reference_tsv_that_fails_keeps_the_old_file(small: Path, reference_data: Path) -> None:
    """`trace generate --like reference` writes its TSV whole or not at all."""
    out = small.parent / "keep.tsv"
    out.write_bytes(OLD)
    done = _limited(["trace", "generate", "--like", "reference", "--jobs", "60", "--throughputs",
                     str(reference_data / "throughputs-tacc.json"), "--out", out.name],
                    small.parent)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert out.read_bytes() == OLD
    assert f"Error: --out {out.name}: cannot write: File too large" in done.stderr, done.stderr
    assert _left(small.parent) == []


def test_bench_quality_plot_onto_a_directory_is_an_error_naming_it(tmp_path: Path) -> None:
    plots = tmp_path / "plots"
    (plots / "quality-12x4.png").mkdir(parents=True)
    result = CliRunner().invoke(cli, ["bench", "quality", "--sizes", "12/4", "--seeds", "1",
                                      "--policies", "fifo", "--plot", str(plots)])
    assert result.exit_code == 1, result.output
    assert (f"{plots}: cannot write {plots / 'quality-12x4.png'}: Is a directory"
            in result.output), result.output
    assert "Traceback" not in result.output and _left(plots) == []


@pytest.mark.parametrize("args, output, input_option", [
    (["simulate", "--trace", "small.jsonl", "--gpus", "4", "--policy", "fifo", "--db", "s.db",
      "--json", "s.db"], "s.db", "--db"),
    (["simulate", "--trace", "small.jsonl", "--gpus", "4", "--policy", "fifo", "--json",
      "./small.jsonl"], "small.jsonl", "--trace"),
    (["simulate", "--trace", "small.jsonl", "--gpus", "4", "--policy", "fifo", "--json",
      "link.jsonl"], "small.jsonl", "--trace"),          # the same file by another name
    (["bench", "live", "--simulate-only", "--workload", "small.jsonl", "--json",
      "small.jsonl"], "small.jsonl", "--workload"),
    (["trace", "generate", "--like", "reference", "--throughputs", "t.json", "--out",
      "t.json"], "t.json", "--throughputs"),
    (["bench", "switch-cost", "--trace", "small.jsonl", "--restart-overhead", "20",
      "--policy", "fifo", "--json", "small.jsonl"], "small.jsonl", "--trace"),
    (["bench", "quality", "--seeds", "1", "--sizes", "5/2", "--policies", "fifo",
      "--throughputs", "t.json", "--json", "t.json"], "t.json", "--throughputs"),
])
def test_an_output_that_is_an_input_is_refused_before_anything_is_written(
        small: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], output: str,
        input_option: str) -> None:
    """`simulate --json X --db X` wrote its JSON over the store of every recorded run, and
    `--json`/`--out` onto the workload or the throughputs replaced them; now a usage error
    naming both options, the file untouched."""
    from shockslurm.store import open_store

    monkeypatch.chdir(small.parent)
    open_store("s.db", create=True).dispose()
    Path("t.json").write_text('{"x": 1}\n')
    Path("link.jsonl").symlink_to("small.jsonl")
    before = {name: Path(name).read_bytes() for name in ("s.db", "small.jsonl", "t.json")}
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert f"is the file of {input_option}: writing it would replace it" in result.output
    assert {name: Path(name).read_bytes() for name in before} == before


def test_only_a_sqlite_store_has_a_file_an_output_could_replace(tmp_path: Path) -> None:
    """`simulate` took the database name of a PostgreSQL URL for a file: `--db
    postgresql+psycopg://u@127.0.0.1/test --json test` was refused as if `test` were the
    store's file. `check_url` names a file for SQLite stores only."""
    from shockslurm.store.database import check_url

    assert check_url(str(tmp_path / "s.db")) == tmp_path / "s.db"
    assert check_url(f"sqlite:///{tmp_path / 's.db'}") == tmp_path / "s.db"
    assert check_url("postgresql+psycopg://u@127.0.0.1/test") is None
    with pytest.raises(StoreError, match="in memory"):
        check_url("sqlite://")
