"""A wake-up a signal handler may ring (gunicorn's self-pipe). A `threading.Event` is not safe
there: a handler runs between two bytecodes of the main thread, which may be inside the Event's
own `wait` holding the lock that `set` then waits for, forever. Ringing writes one byte to a
non-blocking pipe and takes no lock; waiting is a `poll` of the pipe's other end."""

from __future__ import annotations

import os
import select
import weakref


def _close(*fds: int) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


class Wakeup:
    """`set`, `clear` and `wait` as a `threading.Event` has them, with a `set` that is safe in
    a signal handler and from any thread. Set, it stays set until `clear`."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        self._poll = select.poll()
        self._poll.register(self._read, select.POLLIN)
        self._closer = weakref.finalize(self, _close, self._read, self._write)

    def set(self) -> None:
        try:
            os.write(self._write, b"\0")
        except OSError:     # full (BlockingIOError): already set; closed: nobody to wake
            pass

    def clear(self) -> None:
        try:
            while os.read(self._read, 4096):
                pass
        except OSError:     # drained (BlockingIOError), or closed
            pass

    def is_set(self) -> bool:
        return self.wait(0.0)

    def wait(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for `set`; True when it is set."""
        return bool(self._poll.poll(max(0.0, timeout) * 1000.0))

    def close(self) -> None:
        self._closer()
