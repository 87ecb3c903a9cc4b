"""`shockslurm daemon` as a process, without Slurm on PATH (no test cluster needed): `--once`
exits non-zero when its round could not read Slurm and does not wait for a store it cannot
reach, signals in the start-up's wait for the store are handled as in a running daemon, and
its log lines carry syslog priorities under journald and are JSON only in JSON mode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace


def _once(tmp_path: Path, extra: str = "", env: dict[str, str] | None = None
          ) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "d.toml"
    config.write_text(f'[daemon]\ndb = "{tmp_path / "s.db"}"\nbackend = "cli"\n'
                      f'metrics_port = 0\nround_seconds = 5\n{extra}')
    empty = tmp_path / "bin"            # a PATH without squeue: Slurm cannot be read
    empty.mkdir(exist_ok=True)
    full_env = {k: v for k, v in os.environ.items() if k != "JOURNAL_STREAM"}
    full_env.update(PATH=str(empty), **(env or {}))
    return subprocess.run([sys.executable, "-m", "shockslurm.cli.main", "daemon", "--once",
                           "--config", str(config)], capture_output=True, text=True,
                          env=full_env, timeout=120)


def test_once_fails_when_slurm_cannot_be_read(tmp_path):
    out = _once(tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "--once: the round did not run: Slurm could not be read" in out.stderr
    assert "Slurm command not found: squeue" in out.stdout
    # outside journald: a timestamp, no priority prefix
    assert out.stdout.startswith("20") and "<3>" not in out.stdout


def test_once_fails_when_its_snapshot_was_too_old_to_enact():
    """A round whose snapshot was stale did nothing (it re-reads at the next round, which
    `--once` does not run): exit 1, where it exited 0."""
    import click
    import pytest

    from shockslurm.cli.daemon import _fail_if_down

    runner = SimpleNamespace(slurm_down_since=None, store_down_since=None, leading=True,
                             stale_rounds=0)
    _fail_if_down(runner)                       # a round that ran: exit 0
    runner.stale_rounds = 1
    with pytest.raises(click.ClickException, match="snapshot was too old to enact"):
        _fail_if_down(runner)


def test_journald_lines_carry_their_priority(tmp_path):
    out = _once(tmp_path, env={"JOURNAL_STREAM": "8:12345"})
    lines = out.stdout.splitlines()
    assert lines and all(line[:3] in ("<3>", "<4>", "<6>") for line in lines), lines
    errors = [line for line in lines if line.startswith("<3>")]
    assert len(errors) == 1 and "Slurm cannot be read" in errors[0]
    assert any(line.startswith("<6>shockslurm INFO") for line in lines)   # no timestamp
    forced_off = _once(tmp_path, 'journald = "no"\n', env={"JOURNAL_STREAM": "8:12345"})
    assert "<3>" not in forced_off.stdout and forced_off.returncode == 1


def test_json_mode_emits_only_json(tmp_path):
    out = _once(tmp_path, 'log_format = "json"\n')
    lines = out.stdout.splitlines()
    records = [json.loads(line) for line in lines]       # every line is JSON
    assert {"INFO", "ERROR"} <= {r["level"] for r in records}
    assert out.returncode == 1


def _log_a_traceback(message: str) -> None:
    """An ERROR record of `message` with the traceback of a ValueError('boom')."""
    import logging

    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("shockslurm.daemon").exception(message)


def test_every_logger_and_warning_goes_through_the_format():
    import io
    import logging
    import warnings

    from shockslurm.ops import logsetup

    stream = io.StringIO()
    logsetup.configure("json", stream=stream)
    try:
        logging.getLogger("sqlalchemy.pool").warning("a library's warning")
        logging.getLogger("sqlalchemy.pool").info("below WARNING: dropped")
        warnings.warn("a Python warning", UserWarning, stacklevel=1)
        logsetup.configure("text", journald="yes")
        _log_a_traceback("failed")
    finally:
        logsetup.remove()
    lines = stream.getvalue().splitlines()
    first = [json.loads(line) for line in lines[:2]]
    assert [(r["logger"], r["level"]) for r in first] == [("sqlalchemy.pool", "WARNING"),
                                                         ("py.warnings", "WARNING")]
    assert "a Python warning" in first[1]["msg"]
    rest = lines[2:]
    assert rest[0] == "<3>shockslurm ERROR shockslurm.daemon: failed"
    assert len(rest) > 2 and all(line.startswith("<3>") for line in rest)   # the traceback too
    assert rest[-1] == "<3>ValueError: boom"


def test_a_message_is_one_text_line_and_a_traceback_keeps_its_lines():
    """A message holding a newline (a Slurm command's multi-line stderr) or a terminal escape
    came out as several lines in the text format, the later ones without the record's prefix
    (one could pass for a record of its own); now it is one line with the characters escaped.
    A traceback still follows on lines of its own."""
    import io
    import logging

    from shockslurm.ops import logsetup

    stream = io.StringIO()
    logsetup.configure("text", stream=stream, journald="no")
    try:
        logging.getLogger("shockslurm.live").warning(
            "scancel failed: %s", "line one\nshockslurm INFO shockslurm.daemon: forged\x1b[2J")
        _log_a_traceback("failed\nagain")
    finally:
        logsetup.remove()
    lines = stream.getvalue().splitlines()
    assert lines[0].endswith("shockslurm WARNING shockslurm.live: scancel failed: line one\\n"
                             "shockslurm INFO shockslurm.daemon: forged\\x1b[2J"), lines
    assert lines[1].endswith("shockslurm ERROR shockslurm.daemon: failed\\nagain")
    assert lines[2] == "Traceback (most recent call last):" and lines[-1] == "ValueError: boom"


def test_the_global_log_level_can_only_add_debug_lines_to_the_daemons():
    import logging

    from shockslurm.ops.logsetup import daemon_level

    assert daemon_level(logging.DEBUG) == logging.DEBUG
    assert daemon_level(logging.WARNING) == logging.INFO    # the default: the heartbeat stays
    assert daemon_level(logging.NOTSET) == logging.INFO


UNREACHABLE = "postgresql://shock@127.0.0.1:1/none"     # nothing listens on port 1


def _daemon(tmp_path: Path, db: str) -> tuple[subprocess.Popen[str], Path]:
    """The daemon (not --once) on `db`, without Slurm on PATH, its output in a file."""
    config = tmp_path / "d.toml"
    config.write_text(f'[daemon]\ndb = "{db}"\nbackend = "cli"\nmetrics_port = 0\n'
                      'round_seconds = 5\n')
    (tmp_path / "bin").mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "JOURNAL_STREAM"}
    env.update(PATH=str(tmp_path / "bin"))
    log = tmp_path / "daemon.log"
    proc = subprocess.Popen([sys.executable, "-m", "shockslurm.cli.main", "daemon", "--config",
                             str(config)], stdout=log.open("w"), stderr=subprocess.STDOUT,
                            text=True, env=env)
    return proc, log


def _wait_for(log: Path, text: str, timeout_s: float = 60.0) -> None:
    import time
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if text in log.read_text():
            return
        time.sleep(0.2)
    raise AssertionError(f"{text!r} not in the log:\n{log.read_text()}")


def test_once_does_not_wait_for_a_store_it_cannot_reach(tmp_path):
    config = tmp_path / "d.toml"
    config.write_text(f'[daemon]\ndb = "{UNREACHABLE}"\nmetrics_port = 0\nround_seconds = 5\n')
    out = subprocess.run([sys.executable, "-m", "shockslurm.cli.main", "daemon", "--once",
                          "--config", str(config)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "Error:" in out.stderr and "127.0.0.1:1" in out.stderr
    assert "waiting for it" not in out.stdout and "Traceback" not in out.stderr


def test_signals_while_waiting_for_the_store(tmp_path):
    """SIGHUP in the start-up's wait starts again with the configuration re-read (here: a
    store that works); SIGTERM there ends the daemon with exit 0."""
    import signal
    proc, log = _daemon(tmp_path, UNREACHABLE)
    try:
        _wait_for(log, "waiting for it")
        (tmp_path / "d.toml").write_text(
            (tmp_path / "d.toml").read_text().replace(UNREACHABLE, str(tmp_path / "s.db")))
        proc.send_signal(signal.SIGHUP)
        _wait_for(log, "SIGHUP while waiting for the store: starting again")
        _wait_for(log, "Slurm command not found: squeue")      # it started: rounds run
        assert (tmp_path / "s.db").exists()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()
    finally:
        proc.kill()
    again = tmp_path / "again"
    again.mkdir()
    stopping, log2 = _daemon(again, UNREACHABLE)
    try:
        _wait_for(log2, "waiting for it")
        stopping.send_signal(signal.SIGTERM)
        assert stopping.wait(timeout=60) == 0, log2.read_text()
        assert "stopped during start-up" in log2.read_text()
        assert "Traceback" not in log2.read_text()
    finally:
        stopping.kill()


def test_an_invalid_file_at_a_sighup_while_waiting_for_the_store_keeps_the_one_read(tmp_path):
    """A SIGHUP in the start-up's wait with the file made invalid meanwhile ended the daemon
    (exit 1, and systemd restarting it every 10 s); now it is logged with the key named and
    the daemon goes on waiting with the configuration it read, as a reload keeps it later."""
    import signal
    proc, log = _daemon(tmp_path, UNREACHABLE)
    try:
        _wait_for(log, "waiting for it")
        (tmp_path / "d.toml").write_text(
            (tmp_path / "d.toml").read_text().replace("round_seconds = 5", "round_seconds = -1"))
        proc.send_signal(signal.SIGHUP)
        _wait_for(log, "the configuration re-read is invalid, keeping the one read before")
        assert "round_seconds" in log.read_text()
        _wait_for(log, "waiting for it")
        assert proc.poll() is None, log.read_text()                 # still waiting
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()
        assert "Traceback" not in log.read_text()
    finally:
        proc.kill()


def test_once_on_standby_says_no_round_ran(tmp_path):
    """A second daemon on the same store stands by; with --once that is a round not run."""
    leader, log = _daemon(tmp_path, str(tmp_path / "s.db"))
    try:
        _wait_for(log, "Slurm command not found: squeue")       # the leader is in its rounds
        out = _once(tmp_path)                                   # the same store, s.db
        assert out.returncode == 1, out.stdout + out.stderr
        assert "--once: the round did not run: this daemon is on standby" in out.stderr
    finally:
        leader.terminate()
        leader.wait(timeout=60)
