"""Output options into a place that cannot be written stop the command before any work, with an
error naming the option (`report --db` on a missing store: tests/test_report.py)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from shockslurm.cli.main import cli


@pytest.fixture()
def blocker(tmp_path):
    """A regular file: nothing can be created beneath it, not even by root."""
    path = tmp_path / "a-file"
    path.write_text("x")
    return path


@pytest.mark.parametrize("args, option", [
    (["simulate", "--policy", "fifo", "--json", "{bad}/out.json"], "--json"),
    (["simulate", "--policy", "fifo", "--plot", "{bad}/plots"], "--plot"),
    (["trace", "generate", "--jobs", "3", "--out", "{bad}/w.jsonl"], "--out"),
    (["report", "--db", "{db}", "--out", "{bad}/plots"], "--out"),
    (["bench", "switch-cost", "--seeds", "1", "--json", "{bad}/s.json"], "--json"),
    # the shared option shapes (cli/options.py): the benches check as simulate does
    (["bench", "quality", "--seeds", "1", "--json", "{bad}/q.json"], "--json"),
    (["bench", "quality", "--seeds", "1", "--plot", "{bad}/plots"], "--plot"),
    (["bench", "live", "--json", "{bad}/l.json"], "--json"),
    (["bench", "live", "--plot", "{bad}/plots"], "--plot"),
])
def test_unwritable_output_fails_before_the_run(blocker, tmp_path, args, option):
    args = [a.format(bad=blocker, db=tmp_path / "x.db") for a in args]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{option}'" in result.output
    assert "is not a directory" in result.output
    assert isinstance(result.exception, SystemExit)      # a usage error, not a traceback
    # nothing ran: no policy table was printed
    assert "makespan" not in result.output


def test_json_output_that_is_a_directory(tmp_path):
    result = CliRunner().invoke(cli, ["simulate", "--policy", "fifo", "--json", str(tmp_path)])
    assert result.exit_code == 2
    assert "Invalid value for '--json'" in result.output and "is a directory" in result.output


def test_writable_outputs_are_written(tmp_path):
    out = tmp_path / "new-dir"          # created by --plot
    result = CliRunner().invoke(cli, ["trace", "generate", "--jobs", "3",
                                      "--out", str(tmp_path / "w.jsonl")])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(cli, ["simulate", "--trace", str(tmp_path / "w.jsonl"),
                                      "--gpus", "4", "--policy", "fifo", "--no-progress",
                                      "--json", str(tmp_path / "r.json"), "--plot", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "r.json").read_text())["policy"] == "fifo"
    assert any(out.glob("*.png"))



def test_no_solver_banner_on_stdout(tmp_path):
    """HiGHS prints a banner on stdout at its first instance unless told not to in time
    (`market._QuietHighs`); in a fresh process, stdout holds our output only."""
    import subprocess
    import sys

    def shockslurm(*args: str) -> str:
        out = subprocess.run([sys.executable, "-m", "shockslurm.cli.main", *args],
                             capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-2000:]
        return out.stdout

    shockslurm("trace", "generate", "--jobs", "8", "--out", "w.jsonl")
    stdout = shockslurm("simulate", "--policy", "shockwave", "--gpus", "4", "--trace", "w.jsonl")
    assert "shockwave" in stdout and "HiGHS" not in stdout, stdout[:400]


def test_a_workload_named_gz_is_written_compressed_and_read_back(tmp_path, reference_data):
    """`trace generate --out X.jsonl.gz` wrote plain text under the .gz name (then refused as
    "Not a gzipped file"), the TSV likewise, and `simulate --trace real.jsonl.gz` took a
    compressed JSONL for a reference trace ("needs --throughputs"). Now a workload file named
    .gz is gzip, written and read, JSONL or TSV by the name before the .gz."""
    import gzip

    runner = CliRunner()
    tacc = str(reference_data / "throughputs-tacc.json")
    jsonl, tsv = tmp_path / "w.JSONL.gz", tmp_path / "r.tsv.gz"
    for args in (["--jobs", "5", "--out", str(jsonl)],
                 ["--like", "reference", "--jobs", "5", "--throughputs", tacc, "--out", str(tsv)]):
        result = runner.invoke(cli, ["trace", "generate", *args])
        assert result.exit_code == 0, result.output
    assert len(gzip.decompress(jsonl.read_bytes()).decode().splitlines()) == 5
    assert len(gzip.decompress(tsv.read_bytes()).decode().splitlines()) == 5
    plain = tmp_path / "w.jsonl"
    plain.write_bytes(gzip.decompress(jsonl.read_bytes()))
    outputs = []
    for args in (["--trace", str(jsonl)], ["--trace", str(plain)],
                 ["--trace", str(tsv), "--throughputs", tacc]):
        result = runner.invoke(cli, ["simulate", *args, "--gpus", "4", "--policy", "fifo",
                                     "--json", str(tmp_path / "out.json")])
        assert result.exit_code == 0, result.output
        outputs.append(json.loads((tmp_path / "out.json").read_text())["makespan_s"])
    assert outputs[0] == outputs[1]
