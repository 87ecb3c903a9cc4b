"""shockslurm.train.lease: signal flags, handler restore, the stop file."""

from __future__ import annotations

import os
import signal

import pytest

from shockslurm.train.lease import Lease, default_stop_file


@pytest.mark.parametrize("signum", [signal.SIGUSR1, signal.SIGTERM])
def test_signal_sets_flag_and_handlers_are_restored(signum):
    seen = []
    previous = signal.signal(signum, lambda s, f: seen.append(s))
    try:
        lease = Lease(stop_file=False).install()
        assert not lease.should_stop()
        os.kill(os.getpid(), signum)
        assert lease.should_stop() and lease.should_stop()      # sticky
        assert lease.signal_received == signum
        assert signal.Signals(signum).name in lease.reason
        lease.close()
        os.kill(os.getpid(), signum)                            # the old handler is back
        assert seen == [signum]
    finally:
        signal.signal(signum, previous)


def test_stop_file(tmp_path):
    stop = tmp_path / "stop"
    with Lease(stop_file=stop, file_poll_s=0.0) as lease:
        assert not lease.should_stop()
        stop.touch()
        assert lease.should_stop()
        assert str(stop) in lease.reason


def test_stop_file_polled_at_most_every_file_poll_s(tmp_path):
    stop = tmp_path / "stop"
    with Lease(stop_file=stop, file_poll_s=3600) as lease:
        assert not lease.should_stop()
        stop.touch()
        assert not lease.should_stop()          # not looked at again yet


def test_default_stop_file(monkeypatch, tmp_path):
    monkeypatch.delenv("SHOCKSLURM_STOP_FILE", raising=False)
    monkeypatch.delenv("SLURM_SUBMIT_DIR", raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert default_stop_file() is None
    monkeypatch.setenv("SLURM_SUBMIT_DIR", str(tmp_path))
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    assert default_stop_file() == tmp_path / ".shockslurm-stop-77"
    monkeypatch.setenv("SHOCKSLURM_STOP_FILE", str(tmp_path / "x"))
    assert default_stop_file() == tmp_path / "x"


def test_extra_predicate_and_request_stop():
    flag = {"stop": False}
    lease = Lease(stop_file=False, extra=lambda: flag["stop"])
    assert not lease.should_stop()
    flag["stop"] = True
    assert lease.should_stop() and lease.reason == "external stop flag"
    other = Lease(stop_file=False)
    other.request_stop("test")
    assert other.should_stop() and other.reason == "test"


def test_import_shockslurm_does_not_import_torch():
    import subprocess
    import sys
    code = ("import sys, shockslurm, shockslurm.train, shockslurm.reports.ingest, "
            "shockslurm.train.reports, shockslurm.train.lease; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_stop_file_is_removed_once_its_stop_is_taken(tmp_path):
    """Left in place, the stop file stopped the requeued job (same job id) at its first step,
    every time it was requeued."""
    torch = pytest.importorskip("torch")
    from shockslurm.train import ShockTrainer
    from shockslurm.train.reports import Reporter

    stop = tmp_path / ".shockslurm-stop-77"
    stop.touch()

    def trainer():
        model = torch.nn.Linear(1, 1)
        return ShockTrainer(model, None, ckpt_dir=tmp_path / "ck", every_seconds=None,
                            reporter=Reporter(None),
                            lease=Lease(stop_file=stop, file_poll_s=0.0))

    with trainer() as st:
        assert st.step() and st.stop_reason == f"stop file {stop}"
    assert not stop.exists()
    with trainer() as again:              # the requeued run trains on
        assert not any(again.step() for _ in range(3))


def test_a_stop_file_is_removed_when_a_signal_asked_for_the_stop_first(tmp_path):
    """The daemon's signal and an administrator's stop file both: the stop's reason is the
    signal, and the file (removed only for a stop it asked for itself) stopped the requeued
    job, same job id, at its first step forever."""
    stop = tmp_path / ".shockslurm-stop-77"
    stop.touch()
    lease = Lease(stop_file=stop, file_poll_s=0.0)
    lease._handler(signal.SIGUSR1, None)
    assert lease.poll() == (True, False) and lease.reason == "signal SIGUSR1"
    lease.consume_stop_file()
    assert not stop.exists()
    requeued = Lease(stop_file=stop, file_poll_s=0.0)
    assert requeued.poll() == (False, False)
    requeued.consume_stop_file()          # no stop taken: nothing to remove, nothing raised
