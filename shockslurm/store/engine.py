"""Engines for the store, and the checks that turn database failures into clear `StoreError`s.

Why: several processes write one store at once (the daemon, `shocksub`, reports from inside
training jobs), so SQLite runs in WAL mode with a generous busy timeout and every transaction
starts with BEGIN IMMEDIATE (a deferred transaction that later wants to write can fail at once
with "database is locked" whatever the timeout). The schema version comes from Alembic's own
table, so a store written by a newer shockslurm is refused instead of silently misread.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, event
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.engine.url import URL
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError, SQLAlchemyError

from ..errors import ShockslurmError

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
SQLITE_BUSY_TIMEOUT_MS = 30_000
SUPPORTED = ("sqlite", "postgresql")


class StoreError(ShockslurmError):
    """The store cannot be used: unreachable, malformed URL, read-only, or the wrong schema."""


def parse_url(url: str) -> URL:
    """A SQLAlchemy URL from `url`; a bare path (no `://`) means a SQLite file."""
    if "://" not in url:
        url = "sqlite:///" + str(Path(url).expanduser().resolve())
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise StoreError(f"not a database URL: {url!r} ({exc})") from None
    if parsed.get_backend_name() not in SUPPORTED:
        raise StoreError(f"unsupported store {parsed.get_backend_name()!r} in {_safe(parsed)}; use "
                         "a SQLite path/sqlite:///PATH or postgresql+psycopg://USER@HOST/DB")
    if parsed.get_backend_name() == "postgresql" and parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")  # psycopg 3 is the driver we ship
    return parsed


def _safe(url: URL) -> str:
    return url.render_as_string(hide_password=True)


def _check_sqlite_file(url: URL) -> None:
    """Refuse a SQLite file (or its directory) that cannot be written: WAL needs both.

    Permission bits are checked as well as `os.access`, because root passes `os.access` on a
    file whose owner made it read-only on purpose.
    """
    db = url.database
    if not db or db == ":memory:" or db.startswith("file:"):
        return
    path = Path(db)
    if path.exists():
        mode = path.stat().st_mode
        if not os.access(path, os.W_OK) or not mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):
            raise StoreError(f"the store file {path} is read-only; make it writable or use "
                             "another --db")
    parent = path.parent
    if not parent.is_dir():
        raise StoreError(f"cannot create the store {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise StoreError(f"the store directory {parent} is read-only (SQLite's WAL needs to "
                         "create files beside the store)")


def _sqlite_pragmas(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # let us issue BEGIN ourselves (below)
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA journal_mode = WAL")
        cur.execute("PRAGMA synchronous = NORMAL")
        cur.execute("PRAGMA foreign_keys = ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def make_engine(url: str, **kwargs: Any) -> Engine:
    """An Engine for a SQLite path/URL or a PostgreSQL URL, with the store's connection settings.

    Nothing is connected yet; `open_store` and `upgrade` connect and check.
    """
    parsed = parse_url(url)
    try:
        if parsed.get_backend_name() == "sqlite":
            _check_sqlite_file(parsed)
            engine = create_engine(parsed, **kwargs)
            _sqlite_pragmas(engine)
        else:
            engine = create_engine(parsed, pool_pre_ping=True, **kwargs)
    except (ArgumentError, NoSuchModuleError) as exc:
        raise StoreError(f"cannot use the store URL {_safe(parsed)}: {exc}") from None
    return engine


def describe(exc: BaseException) -> str:
    """The driver's message of a database error, on one line."""
    orig = getattr(exc, "orig", None) or exc
    return " ".join(str(orig).split())


def _connect(engine: Engine) -> Connection:
    try:
        return engine.connect()
    except (DBAPIError, SQLAlchemyError) as exc:
        raise StoreError(f"cannot reach the store {_safe(engine.url)}: {describe(exc)}") from None


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
        return MigrationContext.configure(conn).get_current_revision()


def _check_known(revision: str | None, engine: Engine) -> None:
    if revision is None:
        return
    known = {s.revision for s in ScriptDirectory.from_config(alembic_config()).walk_revisions()}
    if revision not in known:
        raise StoreError(f"the store {_safe(engine.url)} has schema revision {revision!r}, newer "
                         f"than this shockslurm knows (head {head_revision()!r}); upgrade "
                         "shockslurm before using this store")


def _is_readonly(exc: BaseException) -> bool:
    return "readonly" in describe(exc).lower() or "read-only" in describe(exc).lower()


def upgrade(engine: Engine, revision: str = "head") -> str:
    """Create or upgrade the store in place to `revision`; returns the revision reached."""
    _check_known(current_revision(engine), engine)
    try:
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), revision)
    except StoreError:
        raise
    except (DBAPIError, SQLAlchemyError) as exc:
        what = "is read-only" if _is_readonly(exc) else f"could not be upgraded: {describe(exc)}"
        raise StoreError(f"the store {_safe(engine.url)} {what}") from None
    reached = current_revision(engine)
    assert reached is not None
    return reached


def open_store(url: str, *, create: bool = False) -> Engine:
    """An Engine on a store at this code's schema; `create` creates or upgrades it first.

    Raises `StoreError` when the store is unreachable, newer than this code, or (without
    `create`) empty or older.
    """
    engine = make_engine(url)
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
