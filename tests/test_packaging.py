"""What the package declares matches what it imports: the Python it needs, and a base install
(researchers: shocksub and the training helper's reports) without the daemon's dependencies."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# Import names of everything outside the base install (extras daemon, store, torch, lightning).
NOT_BASE = ("sqlalchemy", "alembic", "psycopg", "numpy", "scipy", "cvxpy", "highspy", "ecos",
            "matplotlib", "prometheus_client", "torch", "lightning")


def _minimum_python() -> tuple[int, int]:
    found = re.fullmatch(r">=\s*(\d+)\.(\d+)", PYPROJECT["project"]["requires-python"])
    assert found, PYPROJECT["project"]["requires-python"]
    return int(found.group(1)), int(found.group(2))


def test_requires_python_covers_tomllib():
    """tomllib is new in 3.11: a package importing it cannot claim an older Python."""
    users = [p for p in (ROOT / "shockslurm").rglob("*.py")
             if re.search(r"^\s*import tomllib|^\s*from tomllib", p.read_text(), re.M)]
    assert users, "tomllib is no longer imported: requires-python may be lowered"
    assert _minimum_python() >= (3, 11)
    assert PYPROJECT["tool"]["mypy"]["python_version"] == "%d.%d" % _minimum_python()


def test_base_dependencies_are_the_researchers():
    base = {re.split(r"[<>=\[ ]", d)[0] for d in PYPROJECT["project"]["dependencies"]}
    assert base == {"click", "cryptography"}
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert "shockslurm[daemon]" in extras["test"] and "shockslurm[store]" in extras["daemon"]


BLOCKED_RUN = """
import importlib.abc, os, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in NOT_BASE:
            raise ImportError('not in the base install: ' + name)
sys.meta_path.insert(0, Block())
from click.testing import CliRunner
from shockslurm.cli.main import cli
from shockslurm.cli.shocksub import main as shocksub
from shockslurm.slurm.job_script import new_report_secret
from shockslurm.train.reports import Reporter, SpoolSink
r = CliRunner().invoke(cli, ['--help'])
assert r.exit_code == 0, r.output
r = CliRunner().invoke(shocksub, ['--gpus', '1', '--model', 'ResNet-18', '--epochs', '2',
                                  '--dry-run', '--', 'true'])
assert r.exit_code == 0 and 'sbatch' in r.output, r.output
rep = Reporter(SpoolSink(SPOOL), cluster='c', job_id=7, secret=new_report_secret())
rep.throughput(10.0, 32)
rep.close()
print('ok', len(os.listdir(SPOOL)))
"""


def test_base_install_runs_without_daemon_dependencies(tmp_path):
    """shockslurm --help, shocksub and signed spool reports with every non-base module
    unimportable."""
    code = f"NOT_BASE = {NOT_BASE!r}; SPOOL = {str(tmp_path)!r}" + BLOCKED_RUN
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["ok", "1"]


def test_run_sh_checks_types_first_and_stops_the_cluster_it_started():
    """The order CI relies on: mypy, pytest, the cluster stopped (unless kept), the docker
    smoke, the live smoke on Slurm 24.11 and its cluster stopped."""
    script = (ROOT / "tests" / "run.sh").read_text()
    steps = [script.index(s) for s in ("-m mypy", "-m pytest", "SHOCKSLURM_KEEP_CLUSTER:-0",
                                         "testcluster.sh stop", "bash docker/smoke.sh",
                                         "bash docker/versions.sh 24.11\n",
                                         "bash docker/versions.sh 24.11 --stop")]
    assert steps == sorted(steps)
    assert 'cluster_was_up" = 1' in script          # a cluster someone else started stays up


def test_the_unit_runs_the_venv_and_the_store_lies_in_its_state_directory():
    """Debian 12 installs into /opt/shockslurm/venv (PEP 668); the default store is under the
    unit's StateDirectory."""
    from shockslurm.ops.config import parse_config

    unit = (ROOT / "contrib" / "systemd" / "shockslurm.service").read_text()
    assert "\nExecStart=/opt/shockslurm/venv/bin/shockslurm daemon " in unit
    assert "\nStateDirectory=shockslurm\n" in unit
    assert parse_config({}).db == "/var/lib/shockslurm/shockslurm.db"
    readme = (ROOT / "README.md").read_text()
    assert "python3 -m venv /opt/shockslurm/venv" in readme
