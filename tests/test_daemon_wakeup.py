"""The daemon's wake-up (daemon/wakeup.py): rung from a signal handler or another thread, it
wakes a wait at once, stays set until cleared, and never blocks or takes a lock, even when rung
far more often than anyone waits. The runner and the start-up's signals ring it."""

from __future__ import annotations

import os
import signal
import threading
import time

from shockslurm.daemon.startup import StartupSignals
from shockslurm.daemon.wakeup import Wakeup


def _ring_in(seconds: float, handler) -> None:
    signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, seconds)


def test_a_signal_handler_wakes_a_wait_at_once():
    wake = Wakeup()
    old = signal.getsignal(signal.SIGALRM)
    try:
        _ring_in(0.2, lambda *_: wake.set())
        start = time.monotonic()
        assert wake.wait(30.0) is True
        assert time.monotonic() - start < 5.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        wake.close()


def test_set_stays_until_clear_and_a_timeout_is_false():
    wake = Wakeup()
    assert wake.wait(0.05) is False and not wake.is_set()
    wake.set()
    assert wake.is_set() and wake.wait(10.0) is True and wake.wait(0) is True
    wake.clear()
    assert not wake.is_set() and wake.wait(0.01) is False
    wake.close()
    wake.set()                           # closed: nobody to wake, no error


def test_ringing_far_more_than_a_pipe_holds_never_blocks():
    wake = Wakeup()
    done = threading.Event()

    def ring() -> None:
        for _ in range(200_000):         # a pipe holds 64 KiB: a blocking write would hang
            wake.set()
        done.set()
    thread = threading.Thread(target=ring, daemon=True)
    thread.start()
    assert done.wait(60), "set() blocked on a full pipe"
    assert wake.wait(0)
    wake.clear()
    assert not wake.is_set()
    wake.close()


def test_another_thread_wakes_a_wait():
    wake = Wakeup()
    threading.Timer(0.1, wake.set).start()
    assert wake.wait(30.0) is True
    wake.close()


def test_the_handlers_take_no_lock_and_wake_the_sleep():
    """The start-up's handler rings the wake-up: a SIGHUP ends its sleep at once (it used to
    poll in slices), and the recorded signal is there to take."""
    signals = StartupSignals()
    old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        signals.install()
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGHUP)).start()
        start = time.monotonic()
        signals.sleep(30.0)
        assert time.monotonic() - start < 5.0
        assert signals.pending == signal.SIGHUP
        signals.sleep(0.05)             # a signal already recorded: no wait at all
    finally:
        for signum, handler in old.items():
            signal.signal(signum, handler)
