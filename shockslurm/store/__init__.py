"""The store: job, round, throughput and adaptation history in SQL (SQLite default, PostgreSQL).

Layers: `models` (tables), `engine` (URLs, connection settings, schema-version checks),
`repository` (the only writers), `migrations` (Alembic, shipped inside the package so an installed
shockslurm can create and upgrade its own store). The store imports `model` and nothing else from
the package: policies, the simulator and Slurm stay unaware of it, and `cli/` wires them together.
"""

from __future__ import annotations

from .database import (StoreError, StoreUnavailable, current_revision, head_revision, is_unavailable,
                     make_engine, open_store, upgrade)

__all__ = ["StoreError", "StoreUnavailable", "current_revision", "head_revision",
           "is_unavailable", "make_engine", "open_store",
           "upgrade"]
