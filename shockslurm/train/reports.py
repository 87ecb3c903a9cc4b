"""Progress reports from a training job: samples/s, batch size, epoch progress, batch-size changes.

Sent from a background thread through a bounded queue, so training never waits: when the queue is
full the report is dropped and counted (`Reporter.dropped`); a failing sink is logged once and its
failures counted (`Reporter.failed`). Throughput reports are rate-limited (`min_interval_s`,
default 10 s); batch-size changes, checkpoints and epoch ends always go.

Where they go (`reporter_from_env`, rank 0 only):
- `$SHOCKSLURM_DB` set: straight into the store (`StoreSink`, rows as `records.add_rows`);
- else `$SHOCKSLURM_SPOOL` set (the shocksub job script sets it to the site's spool): one JSON
  file per report there (`SpoolSink`), which the daemon ingests (`shockslurm.reports.ingest`);
- else the site's spool, `[daemon] spool_dir` of the daemon's configuration file
  (`$SHOCKSLURM_CONFIG`, else /etc/shockslurm/shockslurm.toml; `shockslurm.siteconfig`), so a
  plain `sbatch` job's reports reach the spool too (it must exist: the admin makes it, mode
  1733; the daemon keeps reports only of jobs registered in the store, `shocksub --db`);
- else nowhere (`Reporter(None)` keeps only counters).
A job (`$SLURM_JOB_ID` or `$SHOCKSLURM_JOB_PK` set) that cannot report says so once per run in
its log (a warning on stderr unless logging is configured otherwise) with the reason: no spool
configured, the spool missing or not writable, a site configuration that cannot be used; and
that its reports go unsigned when it has no report secret (not submitted with shocksub).
Training goes on either way.
The job is named by `$SHOCKSLURM_CLUSTER` (default "slurm", the daemon's cluster) and
`$SLURM_JOB_ID`, or directly by `$SHOCKSLURM_JOB_PK`. Every report is signed with
`$SHOCKSLURM_REPORT_SECRET` (an Ed25519 key set by the shocksub job script; `records` explains
the scheme);
without it reports go unsigned, which the daemon refuses unless `allow_unsigned_reports`. The
secret itself is never sent, logged or stored. No torch here.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol

from . import _env
from ..errors import ConfigError
from ..siteconfig import SPOOL_ENV, report_spool
from .records import SECRET_ENV, VERSION, sign, signing_key

DB_ENV = "SHOCKSLURM_DB"

log = logging.getLogger("shockslurm.train")


class Sink(Protocol):
    def send(self, report: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class SpoolSink:
    """One JSON file per report, written atomically (dot-named temporary + rename). The
    temporary is created exclusively and never through a symlink (the spool is shared); its
    mode is 0644 less the umask, so a daemon that does not run as root can read it too."""

    def __init__(self, directory: str | os.PathLike[str], *, create: bool = True) -> None:
        self.directory = Path(directory)
        self._seq = itertools.count()
        if create:
            self.directory.mkdir(parents=True, exist_ok=True)

    def send(self, report: dict[str, Any]) -> None:
        name = f"{time.time_ns():020d}-{os.getpid()}-{next(self._seq):06d}.json"
        tmp = self.directory / f".{name}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with open(fd, "w", encoding="utf-8") as fh:
            json.dump(report, fh, separators=(",", ":"))
        os.replace(tmp, self.directory / name)

    def close(self) -> None:
        pass


class StoreSink:
    """Rows straight into the store at `url` (one short transaction per report)."""

    def __init__(self, url: str, *, allow_unsigned: bool = False) -> None:
        self.url = url
        self.allow_unsigned = allow_unsigned
        self._engine: Any = None

    def send(self, report: dict[str, Any]) -> None:
        from sqlalchemy.orm import Session

        from ..store.database import open_store
        from .records import add_rows, check_report

        if self._engine is None:
            self._engine = open_store(self.url)
        with Session(self._engine) as session:
            # The same gate as the spool ingest: registered job, signature of its key.
            job_pk = check_report(session, report, allow_unsigned=self.allow_unsigned)
            add_rows(session, report, job_pk)
            session.commit()

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()


_STOP = object()


class Reporter:
    """Non-blocking reports through a background thread (rate-limited throughput)."""

    def __init__(self, sink: Sink | None, *, cluster: str | None = None,
                 job_id: int | None = None, job_pk: int | None = None,
                 min_interval_s: float = 10.0, queue_size: int = 256,
                 clock: Callable[[], float] = time.time, secret: str | None = None) -> None:
        self._key: str | None = None
        self.job_pk = job_pk
        try:
            # Reports carry a signature, never the secret (nor, for legacy secrets, the HMAC key).
            self._key = _checked_key(secret if secret is not None else os.environ.get(SECRET_ENV))
            if job_pk is None:
                self.job_pk = _job_pk_from_env()
        except ValueError as exc:
            _say_once(f"this job's progress reports are off: {exc}. Training goes on; the "
                      "scheduler estimates its progress from its run time")
            sink = None
        self.sink = sink
        self.cluster = cluster or os.environ.get("SHOCKSLURM_CLUSTER") or "slurm"
        self.job_id = job_id if job_id is not None else _env.slurm_job_id()
        self.min_interval_s = min_interval_s
        self.clock = clock
        self.sent = 0
        self.dropped = 0
        self.failed = 0
        self.rate_limited = 0
        self._last_throughput: float | None = None
        self._logged_failure = False
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=queue_size)
        self._thread: threading.Thread | None = None
        if sink is not None:
            self._thread = threading.Thread(target=self._run, name="shockslurm-reports",
                                            daemon=True)
            self._thread.start()

    # -- producer side (the training loop): never blocks
    def _base(self, kind: str) -> dict[str, Any]:
        return {"v": VERSION, "kind": kind, "cluster": self.cluster, "job_id": self.job_id,
                "job_pk": self.job_pk, "time_s": self.clock()}

    def _put(self, report: dict[str, Any]) -> bool:
        if self.sink is None:
            return False
        if self._key is not None:
            sign(report, self._key)
        try:
            self._queue.put_nowait(report)
            return True
        except queue.Full:
            self.dropped += 1
            return False

    def throughput(self, samples_per_s: float, batch_size: int, *, gpus: int | None = None,
                   **progress: Any) -> bool:
        """Queue a throughput sample unless one went less than `min_interval_s` ago."""
        now = self.clock()
        if self._last_throughput is not None and now - self._last_throughput < self.min_interval_s:
            self.rate_limited += 1
            return False
        self._last_throughput = now
        report = self._base("throughput")
        report.update(samples_per_s=float(samples_per_s), batch_size=int(batch_size),
                      gpus=int(gpus if gpus is not None else _env.job_gpus()), **progress)
        return self._put(report)

    def batch_size_change(self, old: int, new: int, **where: Any) -> bool:
        report = self._base("batch_size_change")
        report.update(old_batch_size=int(old), new_batch_size=int(new), **where)
        return self._put(report)

    def checkpoint(self, path: str, step: int, ok: bool = True) -> bool:
        report = self._base("checkpoint")
        report.update(path=str(path), step=int(step), ok=bool(ok))
        return self._put(report)

    def epoch_done(self, epoch: int, step: int, **more: Any) -> bool:
        report = self._base("epoch_done")
        report.update(epoch=int(epoch), step=int(step), **more)
        return self._put(report)

    # -- consumer side
    def _run(self) -> None:
        assert self.sink is not None
        while True:
            item = self._queue.get()
            try:
                if item is _STOP:
                    return
                try:
                    self.sink.send(item)
                    self.sent += 1
                except Exception as exc:
                    self.failed += 1
                    if not self._logged_failure:
                        self._logged_failure = True
                        log.warning("shockslurm.train: could not send a report (%s: %s); "
                                    "training goes on, further failures are only counted",
                                    type(exc).__name__, exc)
            finally:
                self._queue.task_done()

    def close(self, timeout: float = 5.0) -> None:
        """Send what is queued (waiting at most `timeout` seconds), then stop the thread."""
        if self._thread is None:
            return
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._queue.put(_STOP, timeout=max(0.0, deadline - time.monotonic()))
                break
            except queue.Full:
                break
        self._thread.join(max(0.0, deadline - time.monotonic()))
        if self._thread.is_alive():
            log.warning("shockslurm.train: %d report(s) still unsent after %.1f s; giving up",
                        self._queue.qsize(), timeout)
        elif self.sink is not None:
            try:
                self.sink.close()
            except Exception:  # pragma: no cover
                pass
        self._thread = None


def _checked_key(secret: str | None) -> str | None:
    """The signing key of `secret` (None without one), tried on a probe report so that a
    malformed secret is found here, not at the first report (ValueError naming it)."""
    if not secret:
        return None
    try:
        key = signing_key(secret)
        sign({"probe": 1}, key)
    except ValueError as exc:
        raise ValueError(f"the report secret (${SECRET_ENV}) is unusable: {exc}") from None
    return key


def _job_pk_from_env() -> int | None:
    """$SHOCKSLURM_JOB_PK as a number (None when unset; ValueError when not a number)."""
    text = os.environ.get("SHOCKSLURM_JOB_PK")
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"$SHOCKSLURM_JOB_PK is not a whole number: {text!r}") from None


def reporter_from_env(**kwargs: Any) -> Reporter:
    """A Reporter for this process: rank 0 reports to $SHOCKSLURM_DB, $SHOCKSLURM_SPOOL or the
    site's spool (see the module docstring); a job that cannot report says why, once."""
    sink: Sink | None = None
    if _env.rank() == 0:
        sink, why = sink_from_env(os.environ)
        if why is not None:
            _say_once(f"this job's progress reports go nowhere: {why}. Training goes on; the "
                      "scheduler estimates its progress from its run time")
        elif not (kwargs.get("secret") or os.environ.get(SECRET_ENV)):
            _say_once(f"this job's progress reports go unsigned (no ${SECRET_ENV}: the job was "
                      "not submitted with shocksub): the daemon refuses them unless the job "
                      "is registered without a report key and allow_unsigned_reports is on")
    return Reporter(sink, **kwargs)


def sink_from_env(env: Mapping[str, str]) -> tuple[Sink | None, str | None]:
    """The sink this process reports to and, when there is none, why not."""
    if env.get(DB_ENV):
        return StoreSink(env[DB_ENV]), None
    if env.get(SPOOL_ENV):
        return _spool_sink(env[SPOOL_ENV], f"${SPOOL_ENV}", create=True)
    try:
        site = report_spool(env)
    except ConfigError as exc:
        return None, f"the site configuration cannot be used ({exc})"
    if site.path is None:
        return None, f"no spool configured (${SPOOL_ENV} and ${DB_ENV} are unset; {site.origin})"
    # The site's spool is the admin's (mode 1733): never created by a job.
    return _spool_sink(site.path, site.origin, create=False)


def _spool_sink(path: str, origin: str, *, create: bool) -> tuple[Sink | None, str | None]:
    """A `SpoolSink` on `path` if this process can add files there, else why not."""
    where = f"the spool {path} (from {origin})"
    try:
        sink = SpoolSink(path, create=create)
    except OSError as exc:
        return None, f"{where} cannot be created ({exc.strerror or exc})"
    if not os.path.isdir(path):
        return None, f"{where} does not exist or is not a directory"
    if not os.access(path, os.W_OK | os.X_OK):
        return None, f"{where} is not writable by this job's user"
    return sink, None


_said: set[str] = set()      # what this process has said about its reports (each thing once)


def _say_once(message: str) -> None:
    """Log `message` once per process, where the job's log shows it (stderr by default)."""
    if message in _said:
        return
    _said.add(message)
    if _env.slurm_job_id() is None and not os.environ.get("SHOCKSLURM_JOB_PK"):
        log.debug("shockslurm.train: %s", message)      # not a job: nothing to report for
        return
    log.warning("shockslurm.train: %s", message)
