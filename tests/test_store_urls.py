"""Store URLs that cannot be used are refused with a `StoreError` naming the URL or path (its
password masked), through the store's functions and the CLI (`Error: ...`, exit 1), never a
traceback; nothing is left behind (no store file, no `-journal` beside a device, no file named
':memory:'). And `masking.mask` hides every password form a store URL can carry.

Nothing here connects anywhere but 127.0.0.1 port 1 (refused at once).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from shockslurm.cli import status as status_cli
from shockslurm.cli.main import cli
from shockslurm.masking import mask
from shockslurm.store import StoreError, StoreUnavailable, make_engine, open_store
from shockslurm.store.database import parse_url

from .test_status import JOBS

SECRET = "s3cret"


def _refused(url: str, message: str) -> None:
    """`url` is refused, naming `message`, by the store's functions and `shockslurm db upgrade`;
    no secret and no traceback in the output."""
    for opening in (parse_url, make_engine, open_store,
                    lambda u: open_store(u, create=True)):
        try:
            opening(url)
        except StoreError as exc:
            assert message in str(exc) and SECRET not in str(exc), (opening, str(exc))
        else:
            assert opening is parse_url, f"{opening} accepted {url!r}"
    _cli_refused(CliRunner().invoke(cli, ["db", "upgrade", "--db", url]), message)


def _cli_refused(result: Result, message: str) -> None:
    assert isinstance(result.exception, SystemExit), result.exception   # not a Python error
    assert result.exit_code == 1 and result.output.startswith("Error: "), result.output
    assert message in result.output, result.output
    assert SECRET not in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("url, message", [
    ("", "empty store URL"),
    ("  ", "empty store URL"),
    ("~nouser-shockslurm-xyz/x.db", "cannot expand '~nouser-shockslurm-xyz' in the store path "
                                    "'~nouser-shockslurm-xyz/x.db': no such user"),
    (f"postgresql://u:{SECRET}@127.0.0.1:abc/x",
     "not a database URL: postgresql://***@127.0.0.1:abc/x: the port is not a number"),
    (f"post gres://u:{SECRET}@h/x", "not a database URL: post gres://***@h/x"),
    (f"postgresql://u@h:abc/x?password={SECRET}", "postgresql://***@h:abc/x?***"),
    (f"mysql://u:{SECRET}@127.0.0.1/x", "unsupported store 'mysql' in mysql://u:***@127.0.0.1/x"),
])
def test_malformed_url(url: str, message: str) -> None:
    with pytest.raises(StoreError, match=re.escape(message)):
        parse_url(url)
    _refused(url, message)


def test_nul_byte(tmp_path: Path) -> None:
    for url in (f"{tmp_path}/x\0y.db", f"sqlite:///{tmp_path}/x\0y.db"):
        _refused(url, "x\\x00y.db' contains a NUL byte")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("driver", ["psycopg2", "asyncpg"])
def test_driver_not_installed(driver: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, driver, None)   # not installed, wherever the test runs
    url = f"postgresql+{driver}://u:{SECRET}@127.0.0.1:1/x"
    _refused(url, f"cannot use the store URL postgresql+{driver}://u:***@127.0.0.1:1/x: its "
                  f"driver {driver} is not installed; postgresql:// uses the installed psycopg 3 "
                  "driver")


def test_malformed_query_parameter(tmp_path: Path) -> None:
    (tmp_path / "x.db").write_bytes(b"")     # there, so that opening without create gets as far
    url = f"sqlite:///{tmp_path}/x.db?timeout=abc"
    _refused(url, f"cannot use the store URL {url}: a query parameter is malformed")
    assert [p.name for p in tmp_path.iterdir()] == ["x.db"]


@pytest.mark.parametrize("url", [f"postgresql://u@127.0.0.1:1/x?password={SECRET}",
                                 f"postgresql://u@127.0.0.1:1/x?a=1&PassWord={SECRET}",
                                 f"postgresql://u:{SECRET[:3]} {SECRET[3:]}@127.0.0.1:1/x",
                                 f"postgresql://u:{SECRET}@127.0.0.1:1/x"])
def test_password_masked_when_unreachable(url: str) -> None:
    """Port 1 refuses the connection: the error names the URL, every password `***`."""
    for opening in (open_store, lambda u: open_store(u, create=True)):
        with pytest.raises(StoreError, match=r"cannot reach the store postgresql\+psycopg://u") \
                as caught:
            opening(url)
        assert "***" in str(caught.value)
        assert SECRET not in str(caught.value) and SECRET[3:] not in str(caught.value)
    _cli_refused(CliRunner().invoke(cli, ["db", "upgrade", "--db", url]), "cannot reach the store")


def test_name_too_long_and_not_a_directory(tmp_path: Path) -> None:
    long = tmp_path / ("a" * 300 + ".db")
    _refused(str(long), f"cannot use the store file {long}: File name too long")
    (tmp_path / "f").write_text("")
    _refused(str(tmp_path / "f" / "x.db"), f"cannot use the store file {tmp_path}/f/x.db: "
                                           "Not a directory")
    assert [p.name for p in tmp_path.iterdir()] == ["f"]


def test_symbolic_link_loop(tmp_path: Path) -> None:
    loop = tmp_path / "loop.db"
    loop.symlink_to(loop)
    _refused(f"sqlite:///{loop}", f"cannot use the store file {loop}: Too many levels of symbolic "
                                  "links")
    with pytest.raises(StoreError, match="loop.db"):   # the bare path: resolving it fails first
        open_store(str(loop), create=True)
    _cli_refused(CliRunner().invoke(cli, ["db", "upgrade", "--db", str(loop)]), str(loop))
    assert [p.name for p in tmp_path.iterdir()] == ["loop.db"]


def test_not_a_regular_file(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.db"
    os.mkfifo(fifo)
    for path in (fifo, tmp_path):
        _refused(str(path), f"{path}: not a regular file")
        _refused(f"sqlite:///{path}", f"{path}: not a regular file")
    assert [p.name for p in tmp_path.iterdir()] == ["fifo.db"]   # no -journal, -wal, -shm


def test_dev_null_is_refused_and_left_alone() -> None:
    beside = [Path("/dev/null" + suffix) for suffix in ("-journal", "-wal", "-shm")]
    before = [p.exists() for p in beside]
    _refused("/dev/null", "/dev/null: not a regular file")
    assert [p.exists() for p in beside] == before


@pytest.mark.parametrize("url", ["sqlite:///:memory:", "sqlite://", ":memory:",
                                 "sqlite:///file::memory:?uri=true",
                                 "sqlite:///file:x?mode=memory&uri=true"])
def test_in_memory_store_refused(url: str, tmp_path: Path,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    _refused(url, "is in memory and would vanish on exit")
    assert list(tmp_path.iterdir()) == []      # no file named ':memory:'


def test_status_refuses_what_db_upgrade_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(status_cli, "read_slurm", lambda: list(JOBS))
    monkeypatch.delenv("SHOCKSLURM_CONFIG", raising=False)
    for url, message in (("sqlite://", "the store sqlite:// is in memory"),
                         ("/dev/null", "/dev/null: not a regular file"),
                         (f"postgresql://u@127.0.0.1:1/x?password={SECRET}", "password=***")):
        _cli_refused(CliRunner().invoke(cli, ["status", "--db", url]), message)


def test_no_traceback_from_the_console_command() -> None:
    proc = subprocess.run([sys.executable, "-m", "shockslurm.cli.main", "db", "upgrade", "--db",
                           "~nouser-shockslurm-xyz/x.db"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("Error: cannot expand '~nouser-shockslurm-xyz'"), proc.stderr


def test_bare_path_is_taken_as_is(tmp_path: Path) -> None:
    """`?` and `%` in a bare path are part of the file's name, not a query or an escape."""
    path = tmp_path / "a?timeout=x%20b.db"
    open_store(str(path), create=True).dispose()
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".db"] == [path.name]
    open_store(str(path)).dispose()


@pytest.mark.parametrize("text, masked", [
    ("postgresql+psycopg://user:pw@host/db", "postgresql+psycopg://user:***@host/db"),
    ("postgresql://u:p ss@127.0.0.1/x", "postgresql://u:***@127.0.0.1/x"),
    ("store postgresql://u@127.0.0.1:1/x?password=s3cret failed",
     "store postgresql://u@127.0.0.1:1/x?password=*** failed"),
    ("postgresql://u@h/x?a=1&PASSWORD=s3cret&b=2", "postgresql://u@h/x?a=1&PASSWORD=***&b=2"),
    ('"postgresql://u@h/x?password=s3cret"', '"postgresql://u@h/x?password=***"'),  # TOML value
    ("a postgresql://u:a@h/x\nand postgresql://v:b c@h/y",
     "a postgresql://u:***@h/x\nand postgresql://v:***@h/y"),
    ("postgresql://user@host/db", "postgresql://user@host/db"),
    ("postgresql://host:5432/db\nmail me@example.org",     # a password stops at the line's end
     "postgresql://host:5432/db\nmail me@example.org"),
    ("/var/lib/shockslurm/x.db", "/var/lib/shockslurm/x.db"),
])
def test_mask(text: str, masked: str) -> None:
    assert mask(text) == masked


def test_a_file_that_is_no_database_is_refused_not_waited_for(tmp_path):
    """The daemon waits for an unavailable store (locked, unreachable), not for a file that
    is no SQLite database: that is a `StoreError`, which ends the start-up with its message."""
    text = tmp_path / "notes.db"
    text.write_text("not a database\n")
    with pytest.raises(StoreError, match="file is not a database") as refused:
        open_store(str(text), create=True, timeout_s=2)
    assert not isinstance(refused.value, StoreUnavailable)
    assert text.read_text() == "not a database\n"


@pytest.mark.parametrize("port", ["70000", "0"])
def test_a_port_out_of_range_is_refused_not_waited_for(port):
    with pytest.raises(StoreError, match="the port is not in 1..65535") as refused:
        parse_url(f"postgresql://u:s3cret@127.0.0.1:{port}/x")
    assert not isinstance(refused.value, StoreUnavailable) and "s3cret" not in str(refused.value)


@pytest.mark.parametrize("args", [["db", "upgrade"], ["report", "--out", "plots"],
                                  ["db", "prune", "--older-than", "30"]])
def test_a_version_table_of_two_rows_is_a_damaged_store(tmp_path, monkeypatch, args):
    """A hand-edited alembic_version of two rows ended every store command in alembic's
    CommandError traceback; now one Error line names the store."""
    import sqlite3

    monkeypatch.chdir(tmp_path)
    open_store("s.db", create=True).dispose()
    with sqlite3.connect("s.db") as conn:
        conn.execute("INSERT INTO alembic_version VALUES ('0004')")
    result = CliRunner().invoke(cli, [*args, "--db", "s.db"])
    assert result.exit_code == 1, result.output
    assert result.output.startswith("Error: the store ") and "s.db cannot be used: its " \
        "alembic_version table holds more than one revision" in result.output, result.output
    assert "Traceback" not in result.output
