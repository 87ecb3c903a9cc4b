"""One leader per store and cluster: a lock the daemon holds before it takes any action.

Two daemons started on one store (by mistake, or as a high-availability pair) must not both
enact. The lock lives with the store, so whoever can reach the store can see who leads:

- PostgreSQL: a session advisory lock (`pg_try_advisory_lock`) on a key derived from the
  cluster name, held on a dedicated connection (autocommit, never returned to a pool). The
  server releases it when that session ends, so a leader killed with SIGKILL, or whose
  connection drops, frees it at once; one whose host vanished (power, network) within
  seconds, as the session keeps TCP keepalives on the server's side too. Who holds it is
  read from `pg_locks` joined with `pg_stat_activity`: the holder sets its `application_name`
  to `shockslurm leader pid=.. since=.. host=..`.
- SQLite: an exclusive `flock` on the file `<db>.leader` (`lock_file`: one per cluster) beside
  the store, opened without following symlinks. The kernel releases it when the process
  dies. The holder writes `{"host", "pid", "since"}` into the file; a reader trusts it only
  while the file is locked (a shared `flock` probe that fails). A lock file that was replaced
  or deleted under the holder counts as lost (its inode no longer matches), so two holders
  cannot coexist.

`LeaderLock.acquire` tries once without waiting; `still_held` is the cheap check made before
every action; `holder` reads who leads (for `shockslurm status`), None when nobody does.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool

from ..errors import ShockslurmError
from ..siteconfig import DEFAULT_CLUSTER
from .database import (StoreError, StoreUnavailable, describe, make_engine, parse_url,
                       sqlite_path)

LOCK_SUFFIX = ".leader"
PLAIN_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
APP_NAME_RE = re.compile(r"^shockslurm leader pid=(\d+) since=(\d+) host=(.*)$")
MAX_INFO_BYTES = 4096


@dataclass(frozen=True)
class LeaderInfo:
    """Who leads: the host and process id of the daemon holding the lock, and since when (Unix
    seconds)."""

    host: str
    pid: int
    since: float

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.since))
        return f"pid {self.pid} on {self.host} since {when}"


class LeaderLock(Protocol):
    def acquire(self) -> bool:
        """Try to take the lock without waiting; True when this process holds it (now or
        already). Raises `StoreUnavailable` when the store cannot be reached."""

    def still_held(self) -> bool:
        """Whether this process still holds the lock (False once it was lost)."""

    def release(self) -> None: ...

    def holder(self) -> LeaderInfo | None:
        """The current leader, None when nobody holds the lock."""

    def dispose(self) -> None:
        """Release the lock (if held) and every resource."""


def this_process(now: float | None = None) -> LeaderInfo:
    return LeaderInfo(host=socket.gethostname(), pid=os.getpid(),
                      since=float(int(time.time() if now is None else now)))


def advisory_key(cluster: str) -> int:
    """The signed 64-bit advisory-lock key of a cluster name."""
    digest = hashlib.sha256(f"shockslurm leader {cluster}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


# --------------------------------------------------------------------------- SQLite: flock
class FileLeaderLock:
    """`flock` on `<db>.leader` (see the module)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._fd: int | None = None
        self.info: LeaderInfo | None = None

    def _open(self, flags: int) -> int:
        return os.open(self.path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)

    def acquire(self) -> bool:
        if self.still_held():
            return True
        self.release()
        try:
            fd = self._open(os.O_RDWR | os.O_CREAT)
        except OSError as exc:
            raise StoreUnavailable(f"cannot open the leader lock {self.path}: "
                                   f"{exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return False
            raise StoreUnavailable(f"cannot lock {self.path}: {exc.strerror or exc}") from None
        info = this_process()
        data = json.dumps({"host": info.host, "pid": info.pid, "since": info.since}).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
        os.fsync(fd)
        self._fd, self.info = fd, info
        return True

    def still_held(self) -> bool:
        if self._fd is None:
            return False
        try:
            return os.fstat(self._fd).st_ino == os.stat(self.path, follow_symlinks=False).st_ino
        except OSError:       # deleted under us: another daemon may lock a new file
            return False

    def release(self) -> None:
        fd, self._fd, self.info = self._fd, None, None
        if fd is not None:
            os.close(fd)      # closing the descriptor releases the flock

    def dispose(self) -> None:
        self.release()

    def holder(self) -> LeaderInfo | None:
        if self.still_held():
            return self.info
        try:
            fd = self._open(os.O_RDONLY)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreError(f"cannot read the leader lock {self.path}: "
                             f"{exc.strerror or exc}") from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise
                return _parse_info(os.pread(fd, MAX_INFO_BYTES, 0))
            return None        # nobody holds it: what the file says is stale
        finally:
            os.close(fd)


def _parse_info(raw: bytes) -> LeaderInfo:
    try:
        data = json.loads(raw.decode("utf-8"))
        return LeaderInfo(host=str(data["host"]), pid=int(data["pid"]),
                          since=float(data["since"]))
    except (ValueError, KeyError, TypeError):
        return LeaderInfo(host="?", pid=0, since=0.0)   # held, but the writer had not finished


# --------------------------------------------------------------------------- PostgreSQL
class AdvisoryLeaderLock:
    """`pg_try_advisory_lock` on a dedicated connection (see the module)."""

    def __init__(self, url: str, cluster: str, *, timeout_s: float) -> None:
        # the client's keepalives and TCP timeout (`postgresql_timeouts`): a connection whose
        # server vanished is noticed within a few timeouts; the server's side
        # (`_server_keepalives`) notices a vanished leader
        self._keepalive_idle_s = max(1, int(timeout_s))
        self._engine: Engine = make_engine(url, timeout_s=timeout_s, poolclass=NullPool)
        self.key = advisory_key(cluster)
        unsigned = self.key & 0xFFFF_FFFF_FFFF_FFFF
        self._classid, self._objid = unsigned >> 32, unsigned & 0xFFFF_FFFF
        self._conn: Connection | None = None
        self.info: LeaderInfo | None = None

    def acquire(self) -> bool:
        if self.still_held():
            return True
        self.release()
        try:
            conn = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            try:
                got = conn.execute(text("SELECT pg_try_advisory_lock(:k)"),
                                   {"k": self.key}).scalar()
                if not got:
                    conn.close()
                    return False
                info = this_process()
                name = f"shockslurm leader pid={info.pid} since={int(info.since)} " \
                       f"host={info.host}"[:63]
                conn.execute(text("SELECT set_config('application_name', :n, false)"),
                             {"n": name})
                self._server_keepalives(conn)
            except BaseException:
                conn.close()
                raise
        except SQLAlchemyError as exc:
            raise StoreUnavailable(f"cannot take the leader lock: {describe(exc)}") from None
        self._conn, self.info = conn, info
        return True

    def _server_keepalives(self, conn: Connection) -> None:
        """The server's side of the session probes it as the client's does: a leader whose
        host vanished (power, network) loses its session, and so the lock, within seconds,
        not at the server OS's keepalive (some 2 h on Linux), so that a standby takes over."""
        for name, value in (("tcp_keepalives_idle", self._keepalive_idle_s),
                            ("tcp_keepalives_interval", 1), ("tcp_keepalives_count", 3)):
            conn.execute(text("SELECT set_config(:name, :value, false)"),
                         {"name": name, "value": str(value)})

    def still_held(self) -> bool:
        if self._conn is None:
            return False
        try:
            self._conn.execute(text("SELECT 1"))
            return True
        except SQLAlchemyError:        # the session ended: the server released the lock
            self.release()
            return False

    def release(self) -> None:
        conn, self._conn, self.info = self._conn, None, None
        if conn is not None:
            try:
                conn.close()           # ending the session releases the advisory lock
            except SQLAlchemyError:
                pass

    def holder(self) -> LeaderInfo | None:
        if self.still_held():
            return self.info
        query = text(
            "SELECT a.application_name, a.client_hostname, host(a.client_addr), "
            "extract(epoch from a.backend_start) FROM pg_locks l "
            "JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 "
            "AND l.classid = :c AND l.objid = :o "
            "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())")
        try:
            with self._engine.connect() as conn:
                row = conn.execute(query, {"c": self._classid, "o": self._objid}).first()
        except SQLAlchemyError as exc:
            raise StoreUnavailable(f"cannot read the leader lock: {describe(exc)}") from None
        if row is None:
            return None
        app, client_host, client_addr, started = row
        m = APP_NAME_RE.match(app or "")
        if m:
            return LeaderInfo(host=m.group(3), pid=int(m.group(1)), since=float(m.group(2)))
        return LeaderInfo(host=client_host or client_addr or "?", pid=0,
                          since=float(started or 0))

    def dispose(self) -> None:
        self.release()
        self._engine.dispose()


def describe_leader(url: str, cluster: str, *, timeout_s: float = 5.0) -> str:
    """One line for `shockslurm status`: who leads `cluster` on the store at `url`."""
    lock = leader_lock(url, cluster, timeout_s=timeout_s)
    try:
        info = lock.holder()
    finally:
        lock.dispose()
    if info is None:
        return f"leader: none (no daemon holds the leader lock of cluster {cluster!r})"
    return f"leader: {info.describe()} (cluster {cluster!r})"


def leader_lock(url: str, cluster: str, *, timeout_s: float) -> LeaderLock:
    """The leader lock of the store at `url` for `cluster`."""
    parsed = parse_url(url)
    if parsed.get_backend_name() == "postgresql":
        return AdvisoryLeaderLock(url, cluster, timeout_s=timeout_s)
    path = sqlite_path(parsed)
    if path is None:        # a file: URI, which SQLite opens itself
        raise StoreError(f"the store {url!r} has no file to put a leader lock beside")
    return FileLeaderLock(lock_file(str(path), cluster))


def lock_file(db: str, cluster: str) -> str:
    """The SQLite leader lock's file for `cluster`: `<db>.leader` for the default cluster (as
    every daemon before 2026-12-02 locked), `<db>.<cluster>.leader` for another (its name when
    it is a plain one, else a digest of it), so daemons of two clusters on one store both lead."""
    if cluster == DEFAULT_CLUSTER:
        return db + LOCK_SUFFIX
    name = cluster if PLAIN_NAME_RE.match(cluster) else \
        hashlib.sha256(cluster.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{db}.{name}{LOCK_SUFFIX}"


class LeadershipLost(ShockslurmError):
    """This process no longer holds the leader lock: it must not act."""
