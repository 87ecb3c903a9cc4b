"""Engines for the store, and the checks that turn database failures into clear `StoreError`s.

Why: several processes write one store at once (the daemon, `shocksub`, reports from inside
training jobs), so SQLite runs in WAL mode with a generous busy timeout and every transaction
starts with BEGIN IMMEDIATE (a deferred transaction that later wants to write can fail at once
with "database is locked" whatever the timeout). The schema version comes from Alembic's own
table, so a store written by a newer shockslurm is refused instead of silently misread.

How long a statement may wait is `timeout_s` (`make_engine`, `open_store`): SQLite's busy
timeout, and PostgreSQL's `lock_timeout` and `statement_timeout` (plus the connect timeout), so a
locked or hung store fails fast with an error instead of stalling its caller. Command-line tools
keep `DEFAULT_TIMEOUT_S`; the daemon uses `[daemon] store_timeout_seconds` (a few seconds), so a
round never waits long on a store it then cannot use. `StoreUnavailable` (a `StoreError`) is
what a locked, unreachable or timed-out store raises at start; `is_unavailable` tells such
driver errors apart from bad data.

A store URL that cannot be used (empty, malformed, a driver not installed, a SQLite path that is
not a regular file, an in-memory store, which would vanish on exit) is a `StoreError` naming it,
every password in it shown as `***` (`_safe`), before anything is created or connected.
"""

from __future__ import annotations

import math
import os
import re
import stat
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import create_engine, event
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.engine.url import URL
from sqlalchemy.exc import (ArgumentError, DBAPIError, DisconnectionError, InterfaceError,
                            NoSuchModuleError, OperationalError, SQLAlchemyError)
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from ..errors import ShockslurmError, is_utf8, raw_text
from ..masking import mask

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
DEFAULT_TIMEOUT_S = 30.0
SUPPORTED = ("sqlite", "postgresql")
INSTALLED = {"sqlite": "sqlite3", "postgresql": "psycopg 3"}   # the default driver of each


class StoreError(ShockslurmError):
    """The store cannot be used: unreachable, malformed URL, read-only, or the wrong schema."""


class StoreUnavailable(StoreError):
    """The store cannot be used right now (locked, unreachable, timed out): worth a retry."""


# SQLite primary result codes that mean "not now" (busy, locked, I/O, cannot open, protocol)
SQLITE_UNAVAILABLE = {5, 6, 10, 14, 15}


def is_unavailable(exc: BaseException) -> bool:
    """Whether a database error says the store is unavailable (locked, unreachable, timed out,
    connection lost) rather than refusing the data or lacking a table."""
    if isinstance(exc, (InterfaceError, DisconnectionError, PoolTimeoutError)):
        return True
    if not isinstance(exc, OperationalError):
        return False
    code = getattr(exc.orig, "sqlite_errorcode", None)   # sqlite3 (Python >= 3.11)
    if code is not None:
        return code & 0xFF in SQLITE_UNAVAILABLE
    return True     # PostgreSQL: connection lost, lock or statement timeout, server shut down


def parse_url(url: str) -> URL:
    """A SQLAlchemy URL from `url`; a bare path (no `://`) means a SQLite file, taken as is
    (`?`, `%` and `#` are part of its name). A URL that cannot be used is a `StoreError` naming
    it, its password hidden."""
    if not url.strip():
        raise StoreError("empty store URL; give a SQLite file path, sqlite:///PATH or "
                         "postgresql://USER@HOST/DB")
    if "\0" in url:
        raise StoreError(f"the store URL {_shown(url)!r} contains a NUL byte")
    if not is_utf8(url):     # bytes that are no UTF-8, from the command line
        raise StoreError(f"the store URL '{raw_text(_shown(url), 200)}' is not valid UTF-8")
    if "://" not in url:
        return URL.create("sqlite", database=_bare_path(url))
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise StoreError(f"not a database URL: {_shown(url)}; use a SQLite path/sqlite:///PATH "
                         "or postgresql://USER@HOST/DB") from None
    except ValueError:   # the only value make_url converts
        raise StoreError(f"not a database URL: {_shown(url)}: the port is not a number") from None
    if parsed.port is not None and not 1 <= parsed.port <= 65535:
        raise StoreError(f"not a database URL: {_safe(parsed)}: the port is not in 1..65535")
    if parsed.get_backend_name() not in SUPPORTED:
        raise StoreError(f"unsupported store {parsed.get_backend_name()!r} in {_safe(parsed)}; use "
                         "a SQLite path/sqlite:///PATH or postgresql+psycopg://USER@HOST/DB")
    if parsed.get_backend_name() == "postgresql" and parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")  # psycopg 3 is the driver we ship
    return parsed


def _bare_path(path: str) -> str:
    """The absolute path of a bare SQLite path (`~` expanded); `:memory:` stays as it is."""
    if path == ":memory:":
        return path
    try:
        expanded = Path(path).expanduser()
    except RuntimeError:   # ~name of no such user (no home directory to expand)
        raise StoreError(f"cannot expand {path.split('/')[0]!r} in the store path {path!r}: "
                         "no such user") from None
    try:
        return str(expanded.resolve())
    except (RuntimeError, OSError) as exc:   # a symbolic link loop (Python < 3.13)
        raise StoreError(f"cannot resolve the store path {path!r}: {exc}") from None


def _safe(url: URL) -> str:
    """`url` fit for a message: the password of its user information and of a `password` query
    parameter (any case) shown as `***`; no %-escapes (`sqlite:///:memory:`)."""
    return unquote(mask(url.render_as_string(hide_password=True)))


def _shown(url: str) -> str:
    """A store URL as given, fit for a message (`_safe`); one SQLAlchemy cannot parse keeps
    only its scheme, host and path: its user information and query, where a password may
    hide, become `***`."""
    if "://" not in url:
        return url          # a path
    try:
        return _safe(make_url(url))
    except (ArgumentError, ValueError):
        scheme, _, rest = url.partition("://")
        userinfo, at, tail = rest.rpartition("@")
        if "?" in userinfo:     # an `@` in the query: where the user information ends is unsure
            return f"{scheme}://***"
        where, question, _ = tail.partition("?")
        return f"{scheme}://{'***@' if at else ''}{where}{'?***' if question else ''}"


def sqlite_path(url: URL) -> Path | None:
    """The file of a SQLite store URL; None for a `file:` URI, which SQLite opens itself.

    An in-memory store (`sqlite://`, `:memory:`, `mode=memory`) is refused: it vanishes when
    the process exits, taking what was written with it.
    """
    db = url.database
    if not db or db == ":memory:" or db.startswith("file::memory:") or \
            url.query.get("mode") == "memory":
        raise StoreError(f"the store {_safe(url)} is in memory and would vanish on exit; give a "
                         "SQLite file path or a PostgreSQL URL")
    return None if db.startswith("file:") else Path(db)


def check_url(url: str) -> Path | None:
    """The file of a SQLite store URL (None for PostgreSQL or a `file:` URI); a `StoreError`
    unless `url` has a form this code opens (not in memory). Nothing is looked at."""
    parsed = parse_url(url)
    return sqlite_path(parsed) if parsed.get_backend_name() == "sqlite" else None


def _check_sqlite_file(url: URL) -> None:
    """Refuse a SQLite file that is not a regular file or cannot be written, or whose directory
    cannot be written (WAL needs both), before SQLite touches it.

    Permission bits are checked as well as `os.access`, because root passes `os.access` on a
    file whose owner made it read-only on purpose.
    """
    path = sqlite_path(url)
    if path is None:
        return
    mode = _mode(path)
    if mode is not None:
        if not stat.S_ISREG(mode):
            raise StoreError(f"{path}: not a regular file (the store is a SQLite database file)")
        if not os.access(path, os.W_OK) or not mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):
            raise StoreError(f"the store file {path} is read-only; make it writable or use "
                             "another --db")
    parent = path.parent
    if not parent.is_dir():
        raise StoreError(f"cannot create the store {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise StoreError(f"the store directory {parent} is read-only (SQLite's WAL needs to "
                         "create files beside the store)")


def _mode(path: Path) -> int | None:
    """The file mode of `path` (None when it does not exist); a path that cannot be looked at
    (name too long, not a directory on the way, no permission) is a `StoreError` naming it."""
    try:
        return path.stat().st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StoreError(f"cannot use the store file {path}: {exc.strerror}") from None


def _check_exists(url: URL) -> None:
    """Refuse a SQLite store file that does not exist (opening it would leave an empty file
    behind); other backends answer for themselves when connected."""
    if url.get_backend_name() != "sqlite":
        return
    path = sqlite_path(url)
    if path is not None and _mode(path) is None:
        raise StoreError(f"no store at {path}; create it with `shockslurm db upgrade --db {path}`")


def _sqlite_pragmas(engine: Engine, timeout_s: float) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # let us issue BEGIN ourselves (below)
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {int(timeout_s * 1000)}")
        cur.execute("PRAGMA journal_mode = WAL")
        cur.execute("PRAGMA synchronous = NORMAL")
        cur.execute("PRAGMA foreign_keys = ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def postgresql_timeouts(url: URL, timeout_s: float) -> dict[str, Any]:
    """psycopg connect arguments from `timeout_s`: connect, lock and statement timeouts, and TCP
    limits (a server gone from the network hung a statement ~15 minutes until 2026-12-03)."""
    ms = max(1, int(timeout_s * 1000))
    own = url.query.get("options") or ()
    own = own if isinstance(own, str) else " ".join(own)
    tcp = {"tcp_user_timeout": max(2000, ms), "keepalives": 1, "keepalives_idle":
           max(1, int(timeout_s)), "keepalives_interval": 1, "keepalives_count": 3}
    return {"connect_timeout": max(2, math.ceil(timeout_s)),   # libpq: whole seconds, >= 2
            "options": f"{own} -c lock_timeout={ms} -c statement_timeout={ms}".strip(),
            **{k: v for k, v in tcp.items() if k not in url.query}}    # the URL's own win


def make_engine(url: str, *, timeout_s: float = DEFAULT_TIMEOUT_S, **kwargs: Any) -> Engine:
    """An Engine for a SQLite path/URL or a PostgreSQL URL, with the store's connection settings;
    a statement waits at most `timeout_s` for a lock (and, on PostgreSQL, runs at most that
    long). Nothing is connected yet; `open_store` and `upgrade` connect and check."""
    parsed = parse_url(url)
    try:
        if parsed.get_backend_name() == "sqlite":
            _check_sqlite_file(parsed)
            engine = create_engine(parsed, **kwargs)
            _sqlite_pragmas(engine, timeout_s)
        else:
            connect_args = {**postgresql_timeouts(parsed, timeout_s), **kwargs.pop("connect_args", {})}
            engine = create_engine(parsed, pool_pre_ping=True, connect_args=connect_args,
                                   **kwargs)
        _name_the_store(engine)
    except (ArgumentError, NoSuchModuleError) as exc:
        raise StoreError(f"cannot use the store URL {_safe(parsed)}: {exc}") from None
    except ImportError as exc:   # a dialect whose driver is not installed
        backend, driver = parsed.get_backend_name(), exc.name or parsed.get_driver_name()
        raise StoreError(f"cannot use the store URL {_safe(parsed)}: its driver {driver} is not "
                         f"installed; {backend}:// uses the installed {INSTALLED[backend]} "
                         "driver") from None
    except ValueError as exc:   # a query parameter the dialect cannot convert
        raise StoreError(f"cannot use the store URL {_safe(parsed)}: a query parameter is "
                         f"malformed ({exc})") from None
    return engine


def _name_the_store(engine: Engine) -> None:
    """Every database error raised through `engine` remembers its store (`store_failure` names
    it): a command that meets one says which store, not only what the driver said."""
    @event.listens_for(engine, "handle_error")
    def _on_error(context: Any) -> None:
        if context.sqlalchemy_exception is not None:
            context.sqlalchemy_exception.shockslurm_store = _safe(engine.url)


def store_failure(exc: BaseException) -> str:
    """What a command says of a database error it did not expect: a damaged store ("database
    disk image is malformed") or tables changed outside shockslurm (a table or column missing)."""
    return (f"the store {getattr(exc, 'shockslurm_store', None) or '(--db)'} cannot be used: "
            f"{describe(exc)}; it is damaged or was changed outside shockslurm (for SQLite, "
            "`sqlite3 FILE 'PRAGMA integrity_check'` tells which): restore it from a backup, or "
            "start a new store")


def describe(exc: BaseException) -> str:
    """The driver's message of a database error, on one line."""
    orig = getattr(exc, "orig", None) or exc
    return " ".join(str(orig).split())


# a server that answers and refuses: retrying does not help
REFUSED_RE = re.compile(r"authentication failed|no password supplied|does not exist|"
                        r"no pg_hba\.conf entry|permission denied", re.I)


def _connect(engine: Engine) -> Connection:
    try:
        return engine.connect()
    except (DBAPIError, SQLAlchemyError) as exc:
        # worth a retry only when the store is unavailable (locked, unreachable, a mount not
        # there yet), not when it answers and refuses or is no database (SQLite's NOTADB)
        retry = is_unavailable(exc) and not REFUSED_RE.search(describe(exc))
        error = StoreUnavailable if retry else StoreError
        raise error(f"cannot reach the store {_safe(engine.url)}: {describe(exc)}") from None


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic Config pointing into the installed package (works outside the source tree)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str:
    """The newest schema revision this code knows."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def current_revision(engine: Engine) -> str | None:
    """The store's schema revision (None for an empty store)."""
    with _connect(engine) as conn:
        try:
            return MigrationContext.configure(conn).get_current_revision()
        except CommandError:                # alembic_version of two rows (edited by hand)
            raise StoreError(f"the store {_safe(engine.url)} cannot be used: its alembic_version "
                             "table holds more than one revision (one row belongs)") from None
        except SQLAlchemyError as exc:
            if is_unavailable(exc):
                raise StoreUnavailable(f"the store {_safe(engine.url)} cannot be read now: "
                                       f"{describe(exc)}") from None
            raise StoreError(f"the store {_safe(engine.url)} cannot be read: "
                             f"{describe(exc)}") from None


def _check_known(revision: str | None, engine: Engine) -> None:
    if revision is None:
        return
    known = {s.revision for s in ScriptDirectory.from_config(alembic_config()).walk_revisions()}
    if revision not in known:
        raise StoreError(f"the store {_safe(engine.url)} has schema revision {revision!r}, newer "
                         f"than this shockslurm knows (head {head_revision()!r}); upgrade "
                         "shockslurm before using this store")


def _is_readonly(exc: BaseException) -> bool:
    return any(word in describe(exc).lower() for word in ("readonly", "read-only"))


def upgrade(engine: Engine, revision: str = "head") -> str:
    """Create or upgrade the store in place to `revision`; returns the revision reached."""
    _check_known(current_revision(engine), engine)
    try:
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), revision)
    except StoreError:
        raise
    except (DBAPIError, SQLAlchemyError) as exc:
        if _is_readonly(exc):
            raise StoreError(f"the store {_safe(engine.url)} is read-only") from None
        error = StoreUnavailable if is_unavailable(exc) else StoreError
        raise error(f"the store {_safe(engine.url)} could not be upgraded: "
                    f"{describe(exc)}") from None
    reached = current_revision(engine)
    assert reached is not None
    return reached


def open_store(url: str, *, create: bool = False,
               timeout_s: float = DEFAULT_TIMEOUT_S) -> Engine:
    """An Engine on a store at this code's schema; `create` creates or upgrades it first.
    Raises `StoreUnavailable` when the store is unreachable, locked or times out, `StoreError`
    when it is newer than this code, damaged, or (without `create`) empty or older."""
    if not create:
        _check_exists(parse_url(url))
    engine = make_engine(url, timeout_s=timeout_s)
    try:
        if create:
            upgrade(engine)
            return engine
        revision = current_revision(engine)
        _check_known(revision, engine)
        if revision != head_revision():
            state = "empty" if revision is None else f"at schema revision {revision!r}"
            raise StoreError(f"the store {_safe(engine.url)} is {state}; run "
                             f"`shockslurm db upgrade --db URL` first")
        return engine
    except BaseException:
        # a failed open closes its connections: the daemon's start-up retries it every round
        # while the store is locked, and a pool left to the garbage collector keeps
        # its database files open (1,500 failed opens of a locked SQLite store: 78 descriptors
        # left open, 45 still after a full collection)
        engine.dispose()
        raise
