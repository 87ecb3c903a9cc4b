"""The daemon's side of the spool: ingest report files into the store.

A training job without a database URL writes one small JSON file per report into
`$SHOCKSLURM_SPOOL` (atomically: a dot-named temporary, then a rename to `*.json`). The daemon
calls `ingest_spool(spool_dir, engine)` each round. Files are deleted only after the transaction
holding their rows has committed, so a crash never loses a report (a file whose rows were
committed just before the crash is then recognised as a replay and set aside, adding no row). A
malformed file (bad JSON, bad fields, unknown job) or a refused one (unsigned, a signature that
does not match the key registered for the job it names, or a copy of a report already stored:
`records.check_report`) is moved to `bad/` with a
`.reason` file beside it and a logged warning naming the claimed job; it never stops the ingest.
No torch import.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from .records import BadReport, add_rows, check_report

log = logging.getLogger("shockslurm.train")

BAD_DIR = "bad"


def _move_aside(path: Path, reason: str) -> None:
    bad = path.parent / BAD_DIR
    log.warning("shockslurm spool: moving malformed report %s to %s/: %s", path, BAD_DIR, reason)
    try:
        bad.mkdir(exist_ok=True)
        os.replace(path, bad / path.name)
        (bad / f"{path.name}.reason").write_text(reason + "\n")
    except OSError as exc:  # e.g. a read-only spool: leave the file, say so
        log.warning("shockslurm spool: could not move %s aside: %s", path, exc)


def pending(spool_dir: str | os.PathLike[str]) -> list[Path]:
    """Report files waiting, oldest name first (names start with a nanosecond time)."""
    directory = Path(spool_dir)
    if not directory.is_dir():
        return []
    return sorted(Path(e.path) for e in os.scandir(directory)
                  if e.is_file() and e.name.endswith(".json") and not e.name.startswith("."))


def ingest_spool(spool_dir: str | os.PathLike[str], engine: Engine, *,
                 limit: int = 10_000, allow_unsigned: bool = False) -> int:
    """Ingest up to `limit` report files; returns how many were committed (and deleted).

    `allow_unsigned`: accept unsigned reports of jobs registered without a report key (the
    daemon's `allow_unsigned_reports`); a job with a key always needs a good signature."""
    files = pending(spool_dir)[:limit]
    if not files:
        return 0
    done: list[Path] = []
    with Session(engine) as session:
        for path in files:
            try:
                raw = path.read_bytes()
            except FileNotFoundError:      # another ingester took it
                continue
            except OSError as exc:
                log.warning("shockslurm spool: cannot read %s: %s", path, exc)
                continue
            try:
                report: Any = json.loads(raw.decode("utf-8"))
            except (ValueError, RecursionError) as exc:  # bad UTF-8, bad JSON, >4300 digits, nesting
                _move_aside(path, f"not JSON: {str(exc)[:500]}")
                continue
            try:
                job_pk = check_report(session, report, allow_unsigned=allow_unsigned)
            except BadReport as exc:
                _move_aside(path, str(exc))
                continue
            except (ValueError, RecursionError) as exc:   # unencodable nested values
                _move_aside(path, f"cannot be checked: {type(exc).__name__}")
                continue
            add_rows(session, report, job_pk)
            done.append(path)
        session.commit()
    for path in done:   # only now: the rows are durable
        try:
            path.unlink()
        except FileNotFoundError:
            pass
    return len(done)
