"""Progress reports from a training job: samples/s, batch size, epoch progress, batch-size changes.

Sent from a background thread through a bounded queue, so training never waits: when the queue is
full the report is dropped and counted (`Reporter.dropped`); a failing sink is logged once and its
failures counted (`Reporter.failed`). Throughput reports are rate-limited (`min_interval_s`,
default 10 s); batch-size changes, checkpoints and epoch ends always go.

Where they go (`reporter_from_env`, rank 0 only):
- `$SHOCKSLURM_DB` set: straight into the store (`StoreSink`, rows as `records.add_rows`);
- else `$SHOCKSLURM_SPOOL` set: one JSON file per report there (`SpoolSink`), which the daemon
  ingests (`shockslurm.reports.ingest`);
- else nowhere (`Reporter(None)` keeps only counters).
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
from typing import Any, Callable, Protocol

from . import _env
from .records import SECRET_ENV, VERSION, sign, signing_key

log = logging.getLogger("shockslurm.train")


class Sink(Protocol):
    def send(self, report: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class SpoolSink:
    """One JSON file per report, written atomically (dot-named temporary + rename). The
    temporary is created exclusively and never through a symlink (the spool is shared); its
    mode is 0644 less the umask, so a daemon that does not run as root can read it too."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self._seq = itertools.count()
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
        self.sink = sink
        secret = secret if secret is not None else os.environ.get(SECRET_ENV)
        # Reports carry a signature, never the secret (nor, for legacy secrets, the HMAC key).
        self._key: str | None = signing_key(secret) if secret else None
        self.cluster = cluster or os.environ.get("SHOCKSLURM_CLUSTER") or "slurm"
        self.job_id = job_id if job_id is not None else _env.slurm_job_id()
        env_pk = os.environ.get("SHOCKSLURM_JOB_PK")
        self.job_pk = job_pk if job_pk is not None else (int(env_pk) if env_pk else None)
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


def reporter_from_env(**kwargs: Any) -> Reporter:
    """A Reporter for this process: rank 0 reports to $SHOCKSLURM_DB or $SHOCKSLURM_SPOOL."""
    sink: Sink | None = None
    if _env.rank() == 0:
        if os.environ.get("SHOCKSLURM_DB"):
            sink = StoreSink(os.environ["SHOCKSLURM_DB"])
        elif os.environ.get("SHOCKSLURM_SPOOL"):
            sink = SpoolSink(os.environ["SHOCKSLURM_SPOOL"])
    return Reporter(sink, **kwargs)
