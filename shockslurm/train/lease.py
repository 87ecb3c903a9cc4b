"""A cooperative lease: the training loop asks `should_stop()` and stops cleanly when told.

Why cooperative: a preempted or requeued job gets SIGTERM (or USR1 from `--signal=B:USR1@grace`
or from the meta-scheduler via `scancel --signal=USR1`), then SIGKILL after KillWait. Killing the
loop from a signal handler would tear a step or a checkpoint; so the handlers only set a flag,
and the loop polls it between steps, finishes the current step, checkpoints and exits 0.

What brings the job back is Slurm, not this module: the job was submitted with `--requeue`, and
the daemon requeues (or requeue-holds, then releases) it; Slurm starts it again with
SLURM_RESTART_COUNT incremented, and the helper resumes from the newest good checkpoint. The
helper itself never calls scontrol.

A stop is also requested by a file (an administrator's or a script's `touch`; the daemon
signals): `$SHOCKSLURM_STOP_FILE`, by default `$SLURM_SUBMIT_DIR/.shockslurm-stop-$SLURM_JOB_ID`.
It is looked at no more often than every `file_poll_s` seconds (a stat on a shared filesystem is
not free), and removed once a stop is taken, whatever asked for it (a signal before it, too:
`consume_stop_file`): left there, it would stop the requeued job (same job id) again at its
first step, every time.

Under srun and torchrun every rank has its own lease; when torch.distributed is initialised the
ranks agree (all-reduce MAX of the flag, `poll`) so that all of them stop at the same step.

Signals before the trainer exists: importing torch alone takes seconds, and an unhandled SIGUSR1
kills the process (exit 138). `install_signal_handlers` (run by `import shockslurm.train` inside
a Slurm job or under torchrun, see `early_signals_wanted`) puts a handler in place at once that
only records the signal; the first `Lease.install` takes the record over, so a signal that arrived
while torch was still loading stops the loop at its first step. It only replaces the default
disposition: a handler someone else installed is left alone.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any, Callable, Iterable

from . import _env

log = logging.getLogger("shockslurm.train")

DEFAULT_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)
EARLY_ENV = "SHOCKSLURM_EARLY_SIGNALS"

# -- early handlers: from `import shockslurm.train` until a Lease takes over (module state: one
# process has one set of signal dispositions)
_early_previous: dict[int, Any] = {}
_early_received: list[int] = []


def _early_handler(signum: int, _frame: FrameType | None) -> None:
    _early_received.append(signum)


def early_signals_wanted() -> bool:
    """Whether `import shockslurm.train` installs the early handlers: when $SHOCKSLURM_EARLY_SIGNALS
    says so ("1" / "0"), else inside a Slurm job ($SLURM_JOB_ID) or a torchrun worker
    ($TORCHELASTIC_RUN_ID), where a signal means "checkpoint and stop" rather than "die"."""
    explicit = os.environ.get(EARLY_ENV, "").strip()
    if explicit in ("0", "1"):
        return explicit == "1"
    return bool(os.environ.get("SLURM_JOB_ID") or os.environ.get("TORCHELASTIC_RUN_ID"))


def install_signal_handlers(signals: Iterable[int] = DEFAULT_SIGNALS) -> bool:
    """Record `signals` from now on (for the first `Lease.install` to honour) instead of dying of
    them. Main thread only; a signal whose disposition is not the default is left alone. True
    when the early handler is in place for any of them (now or from an earlier call)."""
    if threading.current_thread() is not threading.main_thread():
        return False
    signals = tuple(signals)
    for signum in signals:
        if signal.getsignal(signum) is signal.SIG_DFL:
            _early_previous[signum] = signal.signal(signum, _early_handler)
    return any(signal.getsignal(signum) is _early_handler for signum in signals)


def uninstall_signal_handlers() -> None:
    """Put the default dispositions back where the early handlers still are, and forget any
    signal they recorded."""
    for signum, previous in list(_early_previous.items()):
        if signal.getsignal(signum) is _early_handler:
            signal.signal(signum, previous)
        del _early_previous[signum]
    _early_received.clear()


def _take_early() -> int | None:
    """The first signal recorded before a Lease took over (and forget them all)."""
    if not _early_received:
        return None
    first = _early_received[0]
    _early_received.clear()
    return first


def default_stop_file() -> Path | None:
    explicit = os.environ.get("SHOCKSLURM_STOP_FILE")
    if explicit:
        return Path(explicit)
    submit_dir, job_id = os.environ.get("SLURM_SUBMIT_DIR"), os.environ.get("SLURM_JOB_ID")
    if submit_dir and job_id:
        return Path(submit_dir) / f".shockslurm-stop-{job_id}"
    return None


class Lease:
    """Signal flag + stop file (+ an optional extra predicate, e.g. a store flag)."""

    def __init__(self, *, signals: Iterable[int] = DEFAULT_SIGNALS,
                 stop_file: str | os.PathLike[str] | None | bool = True,
                 file_poll_s: float = 1.0, extra: Callable[[], bool] | None = None,
                 sync_ranks: bool = True) -> None:
        self.signals = tuple(signals)
        if stop_file is True:
            self.stop_file = default_stop_file()
        elif stop_file is False or stop_file is None:
            self.stop_file = None
        else:
            self.stop_file = Path(stop_file)
        self.file_poll_s = file_poll_s
        self.extra = extra
        self.sync_ranks = sync_ranks
        self.signal_received: int | None = None
        self.reason: str | None = None
        self._flag = False
        self._previous: dict[int, Any] = {}
        self._next_file_check = 0.0
        self._installed = False

    def consume_stop_file(self) -> None:
        """Remove the stop file, when there is one, once a stop is taken (every rank may call
        it), whatever asked for the stop: a signal that came first leaves the reason its own,
        and the file left there stopped the requeued job at its first step, every time."""
        if self.stop_file is not None and self._flag:
            try:
                self.stop_file.unlink(missing_ok=True)
            except OSError as exc:
                log.warning("shockslurm.train: cannot remove the stop file %s: %s; a requeued "
                            "run would stop again at once", self.stop_file, exc)

    # -- handlers
    def _handler(self, signum: int, _frame: FrameType | None) -> None:
        # Only set a flag: anything else (I/O, locks, logging) is unsafe in a handler.
        self._flag = True
        if self.signal_received is None:
            self.signal_received = signum

    def install(self) -> "Lease":
        """Install the handlers (main thread only; elsewhere a warning and no handlers)."""
        if self._installed:
            return self
        if threading.current_thread() is not threading.main_thread():
            log.warning("shockslurm.train: lease created outside the main thread; signals will "
                        "not stop training (only the stop file will)")
            self._installed = True
            self._adopt_early()
            return self
        for signum in self.signals:
            self._previous[signum] = signal.signal(signum, self._handler)
        self._installed = True
        self._adopt_early()
        return self

    def _adopt_early(self) -> None:
        """A signal that arrived before this lease (`install_signal_handlers`) is this lease's."""
        early = _take_early()
        if early is not None:
            self._handler(early, None)

    def close(self) -> None:
        """Put back the handlers that were there before `install`."""
        for signum, previous in self._previous.items():
            try:
                signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
            except (ValueError, TypeError):  # pragma: no cover - not the main thread
                pass
        self._previous.clear()
        self._installed = False

    def __enter__(self) -> "Lease":
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request_stop(self, reason: str = "requested") -> None:
        self._flag = True
        self.reason = self.reason or reason

    # -- the poll
    def _local(self) -> bool:
        if self._flag:
            if self.reason is None and self.signal_received is not None:
                self.reason = f"signal {signal.Signals(self.signal_received).name}"
            return True
        if self.stop_file is not None:
            now = time.monotonic()
            if now >= self._next_file_check:
                self._next_file_check = now + self.file_poll_s
                if self.stop_file.exists():
                    self.reason = f"stop file {self.stop_file}"
                    self._flag = True
                    return True
        if self.extra is not None and self.extra():
            self.reason = self.reason or "external stop flag"
            self._flag = True
            return True
        return False

    def should_stop(self) -> bool:
        """True once a stop was asked for (sticky). Collective when torch.distributed is up."""
        return self.poll()[0]

    def poll(self, save_due: bool = False) -> tuple[bool, bool]:
        """(stop, save due) agreed by all ranks in ONE all-reduce (MAX) when torch.distributed
        is up, so every rank stops, and checkpoints, at the same step: a rank's own clock
        (`every_seconds`) must not decide a collective save alone."""
        local = self._local()
        if not (self.sync_ranks and _env.distributed()):
            return local, save_due
        torch = sys.modules["torch"]
        dist = torch.distributed
        device = (torch.device("cuda", torch.cuda.current_device())
                  if dist.get_backend() == "nccl" else torch.device("cpu"))
        flags = torch.tensor([int(local), int(save_due)], dtype=torch.int32, device=device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        stop, due = (bool(int(v)) for v in flags.tolist())
        if stop and not local:
            self._flag = True
            self.reason = self.reason or "another rank stopped"
        return stop, due
