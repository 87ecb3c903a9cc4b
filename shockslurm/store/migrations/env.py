"""Alembic environment inside the package: runs on the connection the caller hands over.

Why: `shockslurm db upgrade` and the tests call Alembic programmatically (no alembic.ini, no
logging configuration taken over), so the caller's Engine settings (SQLite pragmas, PostgreSQL
search_path) apply to migrations too.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from shockslurm.store.models import Base

target_metadata = Base.metadata


def run_migrations_online() -> None:
    connection = context.config.attributes.get("connection")
    if connection is None:  # the `alembic` command line, pointed at a URL in the config
        url = context.config.get_main_option("sqlalchemy.url")
        if url is None:
            raise RuntimeError("alembic: no connection given and no sqlalchemy.url configured")
        with create_engine(url).begin() as conn:
            context.configure(connection=conn, target_metadata=target_metadata,
                              render_as_batch=True)
            with context.begin_transaction():
                context.run_migrations()
        return
    context.configure(connection=connection, target_metadata=target_metadata,
                      render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    context.configure(url=context.config.get_main_option("sqlalchemy.url"),
                      target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    run_migrations_online()
