"""`shockslurm --help` stays fast: the top-level command imports no subcommand's heavy
dependencies (the store, the solvers, the simulator), and its command list is the commands' own."""

from __future__ import annotations

import subprocess
import sys

from click.testing import CliRunner

from shockslurm.cli.main import COMMANDS, cli, load_command

HEAVY = ("alembic", "cvxpy", "sqlalchemy", "numpy", "scipy", "matplotlib", "prometheus_client")


def test_help_imports_no_heavy_module():
    code = ("import sys; from shockslurm.cli.main import cli\n"
            "try:\n    cli(['--help'], prog_name='shockslurm')\nexcept SystemExit:\n    pass\n"
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_summaries_are_the_commands_own():
    for name, (_, summary) in COMMANDS.items():
        command = load_command(name)
        assert command.name == name
        assert command.get_short_help_str(limit=10**6) == summary, name


def test_help_lists_every_command_and_runs_one():
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    for name in COMMANDS:
        assert f"  {name} " in result.output
    result = CliRunner().invoke(cli, ["nosuch"])
    assert result.exit_code == 2 and "No such command 'nosuch'" in result.output
    result = CliRunner().invoke(cli, ["bench", "--help"])
    assert result.exit_code == 0 and "switch-cost" in result.output


def test_output_that_cannot_be_written_is_an_error_line_not_a_traceback():
    """stdout on a full disk (/dev/full): `Error: cannot write the output: ...`, exit 1."""
    import subprocess
    import sys
    for argv in (["-m", "shockslurm.cli.main", "config", "example"],
                 ["-m", "shockslurm.cli.shocksub", "--model", "ResNet-18", "--epochs", "3",
                  "--dry-run", "--", "python", "x.py"]):
        with open("/dev/full", "w") as full:
            out = subprocess.run([sys.executable, *argv], stdout=full, stderr=subprocess.PIPE,
                                 text=True, timeout=60)
        assert out.returncode == 1, out.stderr
        assert "Error: cannot write the output: No space left on device" in out.stderr
        assert "Traceback" not in out.stderr
