"""One apply path: `build_daemon` applies its configuration with `Daemon.apply`, and a SIGHUP
reload (queued by the handler, run between rounds) applies the re-read file the same way. Every
key the table marks reloadable reaches the running daemon; restart keys keep their running value;
an invalid file keeps the running configuration; the policy (stateful) is rebuilt only when its
inputs change. Fake Slurm backend (no Slurm action is taken), no store."""

from __future__ import annotations

import logging
import signal
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from shockslurm.daemon import RUNTIME_KEYS, DaemonRunner, build_daemon, load_config
from shockslurm.daemon.pacing import event_poll_s
from shockslurm.ops.keys import BY_NAME, DaemonConfig

from .test_crash_safety import Backend, daemon


def _state(runner: DaemonRunner) -> tuple[Any, ...]:
    """What of the running daemon a reloadable key may change."""
    d = runner.daemon
    c = d.cluster
    poll = event_poll_s(runner.cfg.event_poll_seconds, None, runner.leading, runner.poll_read_s)
    return (d.loop.round_s, c.round_s, c.grace_seconds, c.stop_timeout_s, c.churn,
            c.max_snapshot_age_s, id(d.loop.policy), poll, runner._lead_s(), runner.cfg)


def _other(name: str, value: Any) -> Any:
    """A valid value of the key `daemon.<name>` other than `value`."""
    key = BY_NAME[f"daemon.{name}"]
    if key.kind == "choice":
        return next(c for c in key.choices if c != value)
    return 7.0 if value is None else value + 1


def _quiet(_line: str) -> None:
    pass


def _write(path: Path, daemon_table: str) -> Path:
    path.write_text(f"[daemon]\n{daemon_table}\n")
    return path


def test_every_reloadable_key_reaches_the_running_daemon():
    formats: list[str] = []
    runner = DaemonRunner(daemon(None, Backend([])), on_log_format=formats.append)
    assert RUNTIME_KEYS, "the table marks no key reloadable"
    for name in sorted(RUNTIME_KEYS):
        before, old = _state(runner), runner.cfg
        changed = runner.apply(replace(old, **{name: _other(name, getattr(old, name))}))
        assert changed == [f"daemon.{name}"], name
        after = _state(runner)
        moved = [i for i, (a, b) in enumerate(zip(before[:-1], after[:-1])) if a != b]
        if name == "log_format":
            assert formats == [runner.cfg.log_format] and not moved
        else:
            assert moved, f"daemon.{name} changed but nothing in the daemon did"


def test_the_policy_is_rebuilt_only_when_its_inputs_change():
    runner = DaemonRunner(daemon(None, Backend([])))
    policy = runner.daemon.loop.policy
    runner.apply(replace(runner.cfg, grace_seconds=1.0))
    assert runner.daemon.loop.policy is policy
    runner.apply(replace(runner.cfg, policy_options={"idle_unallocated": False}))
    assert runner.daemon.loop.policy is not policy


def test_start_up_and_reload_give_the_same_daemon(tmp_path: Path):
    """A daemon built with B equals one built with A and reloaded to B."""
    a = _write(tmp_path / "a.toml", 'round_seconds = 10\npolicy = "fifo"')
    b = _write(tmp_path / "b.toml", 'round_seconds = 30\npolicy = "max_min_fairness"\n'
                                    'grace_seconds = 2\nmax_preemptions_per_day = 3')
    reloaded = DaemonRunner(build_daemon(load_config(a), Backend([]), emit=_quiet),
                            load=lambda: load_config(b))
    assert reloaded.reload()
    fresh = DaemonRunner(build_daemon(load_config(b), Backend([]), emit=_quiet))
    strip = lambda s: s[:6] + s[7:]     # noqa: E731 (the policy objects differ by identity)
    assert strip(_state(reloaded)) == strip(_state(fresh))
    assert type(reloaded.daemon.loop.policy) is type(fresh.daemon.loop.policy)


def test_reload_keeps_restart_keys_and_bad_files(tmp_path: Path, caplog):
    path = _write(tmp_path / "d.toml", 'round_seconds = 10\npartitions = ["gpu"]')
    runner = DaemonRunner(daemon(None, Backend([]), round_seconds=10),
                          load=lambda: load_config(path))
    caplog.set_level(logging.INFO, logger="shockslurm.daemon")
    _write(path, 'round_seconds = 20\npartitions = ["urgent"]')
    assert runner.reload()
    assert runner.cfg.partitions == ("gpu",) and runner.daemon.cluster.partitions == ("gpu",)
    assert runner.cfg.round_seconds == 20 and runner.daemon.loop.round_s == 20
    assert "daemon.partitions changed but need a restart" in caplog.text
    assert "configuration reloaded: daemon.round_seconds=20" in caplog.text
    _write(path, 'round_seconds = 20\npartitions = ["urgent"]\n[policy]\nfuture_rounds = 12')
    caplog.clear()
    assert runner.reload()          # was logged as `policy=shockwave`, naming no option
    assert "configuration reloaded: policy.future_rounds=12" in caplog.text, caplog.text
    _write(path, "round_seconds = -1")
    assert not runner.reload()
    assert runner.cfg.round_seconds == 20
    assert "field 'daemon.round_seconds'" in caplog.text


def test_the_signal_handler_only_queues_the_reload(tmp_path: Path):
    path = _write(tmp_path / "d.toml", "round_seconds = 10")
    runner = DaemonRunner(daemon(None, Backend([]), round_seconds=10),
                          load=lambda: load_config(path))
    old = signal.getsignal(signal.SIGHUP)
    try:
        runner.install_signals()
        _write(path, "round_seconds = 40")
        signal.raise_signal(signal.SIGHUP)
        assert runner.reload_requested and runner.cfg.round_seconds == 10
        runner.run(max_rounds=1)              # the loop takes the queued reload first
        assert not runner.reload_requested and runner.daemon.loop.round_s == 40
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT
                          else signal.SIG_DFL)
        signal.signal(signal.SIGHUP, old)


@pytest.mark.parametrize("name", sorted(RUNTIME_KEYS))
def test_reloadable_keys_are_daemon_config_fields(name: str):
    assert name in DaemonConfig.__dataclass_fields__ and BY_NAME[f"daemon.{name}"].reload


def test_the_run_record_holds_every_daemon_key_and_masks_secrets() -> None:
    import json

    from shockslurm.daemon.build import run_config
    from shockslurm.ops.config import DAEMON_KEYS, parse_config

    cfg = parse_config({"daemon": {"db": "postgresql://u:hunter2@127.0.0.1/test",
                                   "round_seconds": 30}})
    record = run_config(cfg, "cli")
    assert set(record) == {k.name for k in DAEMON_KEYS} | {"backend", "policy_options"}
    assert record["round_seconds"] == 30 and record["backend"] == "cli"
    assert "hunter2" not in json.dumps(record)          # stored as JSON, password masked


def test_a_reload_reaches_the_run_row(tmp_path: Path) -> None:
    """The run row's configuration was the one the daemon started with for ever: after a
    reload to 20 s rounds, run listings and `report` still read 10 s. Now the next round's
    transaction writes what a reload applied (host and pid kept)."""
    from sqlalchemy.orm import Session

    from shockslurm.store import open_store
    from shockslurm.store.models import Run

    engine = open_store(str(tmp_path / "s.db"), create=True)
    path = _write(tmp_path / "d.toml", 'round_seconds = 10\npolicy = "fifo"')
    runner = DaemonRunner(daemon(engine, Backend([]), round_seconds=10),
                          load=lambda: load_config(path))
    runner.run(max_rounds=1)
    _write(path, 'round_seconds = 20\npolicy = "fifo"\n[policy]\nmin_resolve_interval_s = 0')
    assert runner.reload()
    runner.run(max_rounds=1)

    def stored() -> dict[str, Any]:
        with Session(engine) as s:
            (run,) = s.query(Run).all()
            return dict(run.config)
    config = stored()
    assert config["round_seconds"] == 20 and config["policy_options"] == {
        "min_resolve_interval_s": 0}
    assert config["pid"] > 0 and config["host"] and config["backend"]
    engine.dispose()
