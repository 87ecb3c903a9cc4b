"""shocksub submitting: sbatch found or not, its failures, and what it refuses before anything
is written or submitted (a script that is not there, text that is not UTF-8, a job script that
cannot be written whole, names and GPU counts no node can hold), with fake `sbatch` and `sinfo`
on PATH. The job scripts themselves, their golden files and their bash: test_shocksub.py."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from shockslurm.cli.shocksub import main
from shockslurm.errors import InputError
from shockslurm.slurm.submit import SubmitError, parse_job_id, sbatch_argv, submit

from .test_shocksub import MULTI, REPO, SINGLE, no_site_config  # noqa: F401 (a fixture)


def test_missing_sbatch_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(SubmitError, match="'sbatch' was not found on PATH"):
        submit(sbatch_argv(SINGLE, "s.sbatch"))
    result = CliRunner().invoke(main, ["--model", "ResNet-18", "--epochs", "1", "--script-dir",
                                       str(tmp_path / "scripts"), "--", "true"])
    assert result.exit_code == 1
    assert "'sbatch' was not found on PATH" in result.output
    assert len(list((tmp_path / "scripts").glob("shock-ResNet-18-*.sbatch"))) == 1


def _fake_sbatch(tmp_path: Path, body: str) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "sbatch").write_text("#!/bin/bash\n" + body)
    (bindir / "sbatch").chmod(stat.S_IRWXU)


def test_submit_with_fake_sbatch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    _fake_sbatch(tmp_path, 'printf "%s\\n" "$@" > "$(dirname "$0")/argv"\n'
                           'echo "sbatch: shockslurm: job tagged and held" >&2\necho "123;c1"\n')
    seen: list[str] = []
    assert submit(sbatch_argv(SINGLE, "/tmp/s.sbatch"), echo=seen.append) == 123
    assert seen == ["sbatch: shockslurm: job tagged and held"]
    recorded = (tmp_path / "bin" / "argv").read_text().splitlines()
    assert recorded == sbatch_argv(SINGLE, "/tmp/s.sbatch")[1:]
    result = CliRunner().invoke(main, ["--model", "ResNet-18", "--epochs", "1", "--script-dir",
                                       str(tmp_path / "scripts"), "--", "true"])
    assert result.exit_code == 0 and result.output.strip().endswith("123")


def test_sbatch_failure_carries_stderr(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    _fake_sbatch(tmp_path, 'echo "sbatch: error: invalid partition specified: nope" >&2\nexit 1\n')
    with pytest.raises(SubmitError, match="exit code 1: sbatch: error: invalid partition"):
        submit(sbatch_argv(SINGLE, "s.sbatch"))
    with pytest.raises(SubmitError, match="no job id"):
        parse_job_id("")


@pytest.fixture()
def recording_sbatch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                     no_site_config: Path) -> Path:
    """A fake sbatch on PATH that records its argv in the returned file (absent: never run);
    the test runs in tmp_path."""
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)
    _fake_sbatch(tmp_path, 'printf "%s\\n" "$@" > "$(dirname "$0")/argv"\necho 12345\n')
    return tmp_path / "bin" / "argv"


def _nothing_written_or_submitted(tmp_path: Path, sbatch_argv_file: Path) -> None:
    assert not sbatch_argv_file.exists(), "sbatch was run"
    assert not (tmp_path / "scripts").exists(), "a job script was written"
    assert not (tmp_path / "g.db").exists(), "the store was written"


@pytest.mark.parametrize("script, problem", [("nonexistent.py", "does not exist"),
                                             ("/nonexistent.py", "does not exist"),
                                             ("adir", "is a directory")])
def test_script_must_be_an_existing_file(tmp_path: Path, recording_sbatch: Path, script: str,
                                         problem: str) -> None:
    (tmp_path / "adir").mkdir()
    result = CliRunner().invoke(main, ["--model", "ResNet-18", "--epochs", "3", "--script-dir",
                                       str(tmp_path / "scripts"), "--script", script])
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--script'" in result.output and problem in result.output
    _nothing_written_or_submitted(tmp_path, recording_sbatch)


def test_script_relative_to_the_submit_directory_is_submitted(tmp_path: Path,
                                                               recording_sbatch: Path) -> None:
    (tmp_path / "train.py").write_text("print('training')\n")
    result = CliRunner().invoke(main, ["--model", "ResNet-18", "--epochs", "3", "--script-dir",
                                       str(tmp_path / "scripts"), "--script", "train.py"])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "12345"
    script = Path(recording_sbatch.read_text().splitlines()[-1])
    assert "srun --ntasks=1 --kill-on-bad-exit=1 python train.py &" in script.read_text()


NOT_UTF8 = os.fsdecode(b"\xff\xfe.py")      # what Python makes of non-UTF-8 argv bytes


@pytest.mark.parametrize("args, option", [
    (["--", "python", NOT_UTF8], "COMMAND"),
    (["--script", NOT_UTF8], "--script"),                 # an existing file (made below)
    (["--output", os.fsdecode(b"\xff"), "--", "true"], "--output"),
    (["--cluster", os.fsdecode(b"\xff"), "--db", "g.db", "--", "true"], "--cluster"),
    (["--db", os.fsdecode(b"g\xff.db"), "--", "true"], "--db"),
    (["--model", os.fsdecode(b"\xff"), "--samples-per-epoch", "10", "--batch-sizes", "4",
      "--", "true"], "--model"),
    (["--job-name", os.fsdecode(b"j\xff"), "--", "true"], "--job-name"),
    (["--dry-run", "--", "python", NOT_UTF8], "COMMAND"),  # the dry run refuses it too
])
def test_non_utf8_text_is_refused_before_anything_is_written(
        tmp_path: Path, recording_sbatch: Path, args: list[str], option: str) -> None:
    (tmp_path / NOT_UTF8).write_text("")
    result = CliRunner().invoke(main, ["--model", "ResNet-18", "--epochs", "3", "--script-dir",
                                       str(tmp_path / "scripts"), *args])
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{option}': not valid UTF-8" in result.output
    assert "\\xff" in result.output                    # the offending bytes, as typed
    _nothing_written_or_submitted(tmp_path, recording_sbatch)


def test_non_utf8_script_dir_is_refused(tmp_path: Path, recording_sbatch: Path) -> None:
    scripts = os.fsdecode(os.fsencode(tmp_path / "scripts") + b"\xff")
    result = CliRunner().invoke(main, ["--model", "ResNet-18", "--epochs", "3", "--script-dir",
                                       scripts, "--", "true"])
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--script-dir': not valid UTF-8" in result.output
    assert os.listdir(tmp_path) == ["bin"]
    assert not recording_sbatch.exists()


def test_script_that_cannot_be_written_whole_is_removed(tmp_path: Path,
                                                        recording_sbatch: Path) -> None:
    """A write that fails midway (here: the file size limit, as a full disk would) leaves no
    empty or cut job script and submits nothing; the error is a message, not a traceback."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        ["bash", "-c", 'ulimit -f 1 && exec "$@"', "-", sys.executable, "-m",
         "shockslurm.cli.shocksub", "--model", "ResNet-18", "--epochs", "3", "--script-dir",
         str(tmp_path / "scripts"), "--", "true"],
        env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "File too large" in proc.stderr and "Traceback" not in proc.stderr
    assert list((tmp_path / "scripts").iterdir()) == []
    assert not recording_sbatch.exists()


@pytest.mark.parametrize("model", ["Res;Net", "M" * 60])    # a bad name; one 'shock-' makes long
def test_derived_job_name_error_names_the_model(model: str) -> None:
    result = CliRunner().invoke(main, ["--model", model, "--epochs", "3", "--samples-per-epoch",
                                       "10", "--batch-sizes", "4", "--dry-run", "--", "python",
                                       "x.py"])
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--model'" in result.output
    assert "used to build the job name" in result.output
    assert "'--job-name'" not in result.output
    result = CliRunner().invoke(main, ["--model", model, "--job-name", "a;b", "--epochs", "3",
                                       "--samples-per-epoch", "10", "--batch-sizes", "4",
                                       "--dry-run", "--", "python", "x.py"])
    assert result.exit_code == 2 and "Invalid value for '--job-name'" in result.output


def test_requests_no_node_can_hold_are_refused() -> None:
    from shockslurm.slurm.submit import check_fits
    from shockslurm.slurm.types import SlurmNode

    nodes = [SlurmNode(f"gpu0{i}", "idle", 8, 0, ("gpu", "urgent")) for i in range(1, 5)]
    check_fits(replace(MULTI, gpus=8, nodes=4, partition="gpu"), nodes)
    for changes, field in [({"gpus": 16}, "gpus"), ({"gpus": 4, "nodes": 5}, "nodes"),
                           ({"partition": "cpu"}, "partition")]:
        with pytest.raises(InputError) as err:
            check_fits(replace(MULTI, **changes), nodes)
        assert err.value.field == field


def test_node_limits_are_checked_and_the_refusal_names_the_option() -> None:
    """`--exclude`, `--nodelist` and a `--constraint` the daemon reads narrow the nodes the
    check counts; the option that rules the last ones out (or the GPUs) is named. A constraint
    form the check does not read is left to sbatch."""
    from shockslurm.slurm.submit import check_fits
    from shockslurm.slurm.types import SlurmNode

    nodes = [SlurmNode("gpu01", "idle", 8, 0, ("gpu",), frozenset({"a100"}), frozenset({"a100"})),
             SlurmNode("gpu02", "idle", 4, 0, ("gpu",), frozenset({"v100"})),
             SlurmNode("gpu03", "idle", 4, 0, ("gpu",))]
    one = replace(SINGLE, gpus=8, partition="gpu")
    check_fits(replace(one, constraint="a100", exclude="gpu02"), nodes)
    check_fits(replace(one, gpu_type="a100"), nodes)
    check_fits(replace(one, constraint="[a100|v100]*1"), nodes)          # left to sbatch
    # a -w shorter than --nodes: Slurm adds nodes to it (22.05), the others count too
    two = replace(one, template="multi_node")
    check_fits(replace(two, gpus=4, nodes=2, nodelist="gpu03"), nodes)
    check_fits(replace(two, gpus=4, nodes=2, nodelist="gpu[01-02]"), nodes)
    for changes, field in [({"gpus": 8, "nodes": 2, "nodelist": "gpu01"}, "nodes"),
                           ({"gpus": 8, "nodes": 2, "nodelist": "gpu02"}, "nodelist"),
                           ({"gpus": 4, "nodes": 3, "nodelist": "gpu09"}, "nodelist")]:
        with pytest.raises(InputError) as err:
            check_fits(replace(two, **changes), nodes)
        assert err.value.field == field, changes
    for changes, field in [({"exclude": "gpu01"}, "gpus"), ({"exclude": "gpu[01-03]"}, "exclude"),
                           ({"nodelist": "gpu09"}, "nodelist"), ({"nodelist": "gpu02"}, "gpus"),
                           ({"constraint": "h100"}, "constraint"),
                           ({"constraint": "a100&v100"}, "constraint"),
                           ({"constraint": "v100|x"}, "gpus"),
                           ({"gpu_type": "h100"}, "gpu_type"),
                           ({"gpu_type": "a100", "exclude": "gpu01"}, "exclude")]:
        with pytest.raises(InputError) as err:
            check_fits(replace(one, **changes), nodes)
        assert err.value.field == field, changes


def test_node_limits_reach_sbatch_and_bad_ones_are_refused_by_name() -> None:
    result = CliRunner().invoke(main, ["--model", "ResNet-18", "--epochs", "1", "--constraint",
                                       "a100|h100", "--exclude", "gpu[01-02]", "-w", "gpu03",
                                       "--gpus", "2", "--gpu-type", "a100",
                                       "--dry-run", "--", "true"])
    assert result.exit_code == 0, result.output
    two = CliRunner().invoke(main, ["--model", "ResNet-18", "--epochs", "1", "--nodes", "2",
                                    "-w", "gpu[01-02]", "--dry-run", "--", "true"])
    assert two.exit_code == 0 and "#SBATCH --nodelist=gpu[01-02]\n" in two.output, two.output
    assert ("#SBATCH --gres=gpu:a100:2\n#SBATCH --constraint=a100|h100\n"
            "#SBATCH --exclude=gpu[01-02]\n"
            "#SBATCH --nodelist=gpu03\n") in result.output
    for args, option in [(["--constraint", "a100 h100"], "--constraint"),
                         (["--constraint", "$(id)"], "--constraint"),
                         (["--exclude", "gpu[01-"], "--exclude"),
                         (["-w", "gpu;rm"], "--nodelist"), (["--exclude", ""], "--exclude"),
                         (["--gpu-type", "a100:2"], "--gpu-type"),
                         (["-w", "gpu[01-02]"], "--nodelist")]:     # sbatch refuses -N1 -w 2
        result = CliRunner().invoke(main, ["--model", "ResNet-18", "--epochs", "1", *args,
                                           "--dry-run", "--", "true"])
        assert result.exit_code == 2 and f"'{option}'" in result.output, (args, result.output)


def test_a_controller_that_lists_no_nodes_does_not_refuse_the_job(
        tmp_path: Path, recording_sbatch: Path) -> None:
    """sinfo answering with errors only (slurmctld down): the request cannot be checked, which
    is said, and sbatch decides (here: it takes the job)."""
    sinfo = tmp_path / "bin" / "sinfo"
    sinfo.write_text('#!/bin/bash\necho \'{"errors": [{"error": "Unspecified error", '
                     '"errno": -1}], "sinfo": []}\'\n')
    sinfo.chmod(stat.S_IRWXU)
    result = CliRunner().invoke(main, ["--model", "ResNet-18", "--epochs", "3", "--script-dir",
                                       str(tmp_path / "scripts"), "--", "python", "x.py"])
    assert result.exit_code == 0, result.output
    assert "12345" in result.output and recording_sbatch.exists()
    assert "cannot check the request against the cluster: sinfo listed no nodes" in result.output


def test_a_dry_run_previews_a_script_that_is_not_here(tmp_path: Path,
                                                      recording_sbatch: Path) -> None:
    """`--dry-run` away from the code (a login node) still prints the job script."""
    result = CliRunner().invoke(main, ["--model", "ResNet-18", "--epochs", "3", "--dry-run",
                                       "--script", "elsewhere/train.py"])
    assert result.exit_code == 0, result.output
    assert "elsewhere/train.py" in result.output and not recording_sbatch.exists()


@pytest.mark.parametrize("store, problem", [("adir", "not a regular file"),
                                            ("junk.db", "cannot"),
                                            ("mysql://h/x", "unsupported store")])
def test_a_store_that_cannot_be_used_stops_shocksub_before_submitting(
        tmp_path: Path, recording_sbatch: Path, store: str, problem: str) -> None:
    """`--db` was opened after sbatch had taken the job: exit 0, a warning, and the job's
    report key never stored (the daemon then refused its reports). Now nothing is submitted."""
    (tmp_path / "adir").mkdir()
    (tmp_path / "junk.db").write_bytes(b"not a database, " * 512)
    for dry in ([], ["--dry-run"]):
        if dry and store == "junk.db":
            continue                    # a dry run checks the URL only: it opens nothing
        result = CliRunner().invoke(main, ["--model", "ResNet-18", "--epochs", "3",
                                           "--script-dir", str(tmp_path / "scripts"),
                                           "--db", store, *dry, "--", "true"])
        assert result.exit_code == 2, result.output
        assert "Invalid value for '--db'" in result.output and problem in result.output, \
            result.output
        assert "Traceback" not in result.output
        assert not recording_sbatch.exists() and not (tmp_path / "scripts").exists()


def test_a_store_damaged_inside_is_said_after_the_submission(tmp_path: Path,
                                                             recording_sbatch: Path) -> None:
    """A store that opens but fails when written (here: its jobs table dropped by hand) is
    found only when the job is registered: the job is in Slurm (its id printed, exit 0) and
    the failure is one line naming the store, not a traceback."""
    import sqlite3

    from shockslurm.store import open_store

    open_store(str(tmp_path / "s.db"), create=True).dispose()
    with sqlite3.connect(tmp_path / "s.db") as conn:
        conn.execute("PRAGMA foreign_keys = OFF")
        conn.execute("DROP TABLE jobs")
    result = CliRunner().invoke(main, ["--model", "ResNet-18", "--epochs", "3", "--script-dir",
                                       str(tmp_path / "scripts"), "--db", "s.db", "--", "true"])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "12345"
    assert ("shocksub: job 12345 submitted but not registered in the store: the store "
            f"sqlite:///{tmp_path / 's.db'} cannot be used: no such table: jobs") in result.output
    assert "Traceback" not in result.output
