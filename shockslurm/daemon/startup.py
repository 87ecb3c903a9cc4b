"""Signals during the daemon's start-up, before the runner's handlers are in place (gunicorn's
rule: a handler only records). The start-up can wait a long time for the store; a SIGHUP then
starts it again with the configuration re-read (the admin fixed `db`), SIGTERM or SIGINT ends
it with exit 0, as they end a running daemon. A signal recorded after the wait is handed on to
the runner (`hand_over`), so none is lost between the two sets of handlers."""

from __future__ import annotations

import signal
from typing import Any

from ..errors import ShockslurmError
from .wakeup import Wakeup

HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class StartupInterrupted(ShockslurmError):
    """A signal ended the start-up's wait: `signum` says which."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"start-up interrupted by {signal.Signals(signum).name}")
        self.signum = signum

    @property
    def reload(self) -> bool:
        """SIGHUP: start again with the configuration re-read."""
        return self.signum == signal.SIGHUP


class StartupSignals:
    """Records TERM, INT and HUP during start-up; `sleep` wakes on one. The handler only sets
    an attribute and rings a `Wakeup`: it takes no lock."""

    def __init__(self) -> None:
        self.pending: int | None = None     # the last signal recorded, not yet taken
        self._wake = Wakeup()

    def install(self) -> None:
        for signum in HANDLED:
            signal.signal(signum, self._record)

    def _record(self, signum: int, _frame: Any = None) -> None:
        # a stop outranks a reload recorded before it, and is never replaced by one
        if self.pending in (signal.SIGTERM, signal.SIGINT) and signum == signal.SIGHUP:
            return
        self.pending = signum
        self._wake.set()

    def sleep(self, seconds: float) -> None:
        """Wait `seconds`, or until a signal is recorded."""
        self._wake.clear()
        if self.pending is None:
            self._wake.wait(seconds)

    def check(self) -> None:
        """Raise `StartupInterrupted` for a recorded signal (taking it)."""
        if self.pending is not None:
            signum, self.pending = self.pending, None
            raise StartupInterrupted(signum)

    def hand_over(self, stop: Any, reload: Any) -> None:
        """Pass a signal recorded since the last `check` to the runner's handlers."""
        signum, self.pending = self.pending, None
        if signum in (signal.SIGTERM, signal.SIGINT):
            stop(signum)
        elif signum == signal.SIGHUP:
            reload(signum)
