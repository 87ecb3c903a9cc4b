"""The schema as plain SQL, generated from the models, for DBAs who review DDL before a rollout.

`sql/schema-<dialect>.sql` in the repository is this output, frozen; a test fails when the models
change without regenerating it (`shockslurm db ddl --dialect D > sql/schema-D.sql`).
"""

from __future__ import annotations

from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Dialect
from sqlalchemy.schema import CreateIndex, CreateTable

from .models import Base

DIALECTS: dict[str, Dialect] = {"sqlite": sqlite.dialect(), "postgresql": postgresql.dialect()}


def generate_ddl(dialect: str) -> str:
    """CREATE TABLE / CREATE INDEX statements for every table, in dependency order."""
    if dialect not in DIALECTS:
        raise ValueError(f"unknown dialect {dialect!r} (known: {', '.join(DIALECTS)})")
    d = DIALECTS[dialect]
    parts = [f"-- shockslurm store schema ({dialect}), generated from shockslurm/store/models.py\n"
             "-- by `shockslurm db ddl`; do not edit by hand.\n"]
    for table in Base.metadata.sorted_tables:
        parts.append(str(CreateTable(table).compile(dialect=d)).strip() + ";\n")
        for index in sorted(table.indexes, key=lambda i: str(i.name)):
            parts.append(str(CreateIndex(index).compile(dialect=d)).strip() + ";\n")
    text = "\n".join(parts)
    return "\n".join(line.rstrip() for line in text.split("\n"))
