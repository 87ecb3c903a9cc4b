"""The daemon's side of the spool: ingest report files into the store, safely, as root.

A training job without a database URL writes one small JSON file per report into
`$SHOCKSLURM_SPOOL` (`train.reports.SpoolSink`: a dot-named temporary, then a rename to
`*.json`). The daemon runs `SpoolIngest.run(engine)` each round:
1. every `*.json` entry is read with `spool_read.read_entry` (no symlink followed, regular files
   with one name only, at most `MAX_REPORT_BYTES`, read as the file's owner when the daemon is
   root), all before the store is opened, up to `MAX_FILES_PER_ROUND` files and
   `MAX_BYTES_PER_ROUND` bytes held (a flood of files waits for later rounds);
2. each one is parsed and checked (`records.check_report`: well formed, registered job, good
   signature, not a replay) and its rows added; files are deleted only after the transaction
   holding their rows has committed, so a crash never loses a report (a file whose rows were
   committed just before the crash is then recognised as a replay and refused);
3. a refused file is removed from the spool and, when the rejected-reports area
   (`rejected.RejectedArea`, outside the spool) is usable, kept there with a `.reason`; a
   warning names the file and the claimed job. It never stops the ingest.

Reasons and log lines never carry file content: they are fixed phrases, the schema's own field
names, and the claimed job's integer ids (`safe_reason`). No torch import.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from ..train import records
from ..train.records import BadReport, add_rows, check_report
from .owned import SlurmOwner, accept_owned
from .rejected import RejectedArea, default_rejected_dir
from .spool_read import MAX_REPORT_BYTES, Read, open_spool, read_entry, report_names, shown

log = logging.getLogger("shockslurm.reports")

MAX_FILES_PER_ROUND = 10_000
MAX_BYTES_PER_ROUND = 16 * 2**20     # what one round holds in memory; the rest waits a round
MAX_REASON_CHARS = 300
_QUOTED = re.compile(r"""'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*\"""")
_NUMBER = re.compile(r"(?<![\w.-])-?\d[\d_.]*(?:[eE][+-]?\d+)?(?![\w-])")
_WORDS = ("v", "kind", "job_id", "job_pk", "cluster", "time_s", records.SIG_FIELD)


def _vocabulary() -> frozenset[str]:
    """Words of the report schema: the only quoted words a reason may keep."""
    kinds: dict[str, Any] = getattr(records, "_FIELDS", {})
    return frozenset(_WORDS) | set(kinds) | {f for fields in kinds.values() for f in fields}


def _claimed(report: Any) -> str:
    if not isinstance(report, dict):
        return ""
    ids = [f"{k} {report[k]}" for k in ("job_id", "job_pk")
           if type(report.get(k)) is int and abs(report[k]) < 2 ** 63]
    return f" (claimed {', '.join(ids)})" if ids else ""


def safe_reason(message: str, report: Any) -> str:
    """`message` (a BadReport's) with every value that could come from the file taken out:
    quoted text other than the schema's words, and numbers; then the claimed integer ids."""
    words = _vocabulary()

    def quoted(m: re.Match[str]) -> str:
        return m.group(0) if m.group(0)[1:-1] in words else "'…'"

    text = _NUMBER.sub("#", _QUOTED.sub(quoted, message))
    text = "".join(c if c.isprintable() else "?" for c in text)[:MAX_REASON_CHARS]
    return text + _claimed(report)


def _parse(data: bytes) -> tuple[Any, str | None]:
    """The decoded JSON value, or why not (never quoting the content)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None, "not UTF-8 text"
    try:
        return json.loads(text), None
    except json.JSONDecodeError as exc:   # .msg is one of json's fixed phrases
        return None, f"not JSON ({exc.msg}, line {exc.lineno} column {exc.colno})"
    except RecursionError:
        return None, "not JSON (nested too deeply)"
    except ValueError:                    # e.g. an integer over 4300 digits
        return None, "not JSON (a value cannot be converted)"


@dataclass
class SpoolIngest:
    """Ingests one spool directory each round; keeps what must be said only once."""

    spool_dir: str
    rejected_dir: str = ""                  # "" = `<spool_dir>.rejected`
    allow_unsigned: bool = False
    limit: int = MAX_FILES_PER_ROUND
    max_bytes: int = MAX_REPORT_BYTES
    max_round_bytes: int = MAX_BYTES_PER_ROUND
    cluster: str = "slurm"
    # this round's active Slurm jobs and their users (`owned.slurm_owners`): an unsigned report
    # of a plain sbatch job is accepted when its file's owner runs the job (`owned`)
    owners: dict[int, SlurmOwner] = field(default_factory=dict)
    _stuck: set[str] = field(default_factory=set, init=False)   # entries not removable
    _spool_problem: str | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.spool_dir = str(self.spool_dir)
        self.area = RejectedArea(self.rejected_dir or default_rejected_dir(self.spool_dir))

    def _say_problem(self, why: str) -> None:
        """One warning per problem with the spool directory (again once it changes)."""
        if why != self._spool_problem:
            log.warning("spool %s cannot be read (%s); not ingested", self.spool_dir, why)
            self._spool_problem = why

    def _open_spool(self) -> int | None:
        try:
            fd = open_spool(self.spool_dir)
        except FileNotFoundError:       # a typo in spool_dir, or not created yet
            self._say_problem("it does not exist")
            return None
        except OSError as exc:
            self._say_problem("a symbolic link" if os.path.islink(self.spool_dir)
                              else str(exc.strerror))
            return None
        self._spool_problem = None
        return fd

    def run(self, engine: Engine) -> int:
        """Ingest up to `limit` report files; returns how many were committed (and deleted).
        Raises only what the store raises (the caller retries next round)."""
        dir_fd = self._open_spool()
        if dir_fd is None:
            return 0
        try:
            names = report_names(dir_fd, self.limit + len(self._stuck))
            self._stuck &= set(names)
            todo = [n for n in names if n not in self._stuck][:self.limit]
            return self._ingest(engine, dir_fd, self._read(dir_fd, todo))
        finally:
            os.close(dir_fd)

    def _read(self, dir_fd: int, names: list[str]) -> list[Read]:
        """Each entry's checked content, oldest first, until `max_round_bytes` are held."""
        reads: list[Read] = []
        held = 0
        for name in names:
            if held >= self.max_round_bytes:
                break
            read = read_entry(dir_fd, name, self.max_bytes)
            if read is not None:
                reads.append(read)
                held += len(read.data or b"")
        return reads

    def _ingest(self, engine: Engine, dir_fd: int, reads: list[Read]) -> int:
        done: list[str] = []
        refused: list[tuple[Read, str]] = []
        with Session(engine) as session:
            for read in reads:
                report, job_pk, reason = self._check(session, read)
                if reason is not None:
                    refused.append((read, reason))
                    continue
                add_rows(session, report, job_pk)
                done.append(read.name)
            session.commit()
        for name in done:   # only now: the rows are durable
            try:
                os.unlink(name, dir_fd=dir_fd)
            except FileNotFoundError:
                pass
            except OSError as exc:    # swapped for a directory since: refused next round
                log.warning("spool: could not delete the stored report %r: %s", name,
                            exc.strerror or exc)
        self._refuse_all(dir_fd, refused)
        return len(done)

    def _check(self, session: Session, read: Read) -> tuple[Any, int, str | None]:
        """(report, its job's store key, None) when it can be stored, else (report or None,
        0, why)."""
        if read.data is None:
            return None, 0, read.problem or "not read"
        report, why = _parse(read.data)
        if why is not None:
            return None, 0, why
        try:
            return report, check_report(session, report, allow_unsigned=self.allow_unsigned), None
        except BadReport as exc:
            try:
                owned = accept_owned(session, report, read.owner, self.cluster, self.owners)
            except BadReport as again:
                return report, 0, safe_reason(str(again), report)
            if owned is not None:
                return report, owned, None
            return report, 0, safe_reason(str(exc), report)
        except (ValueError, TypeError, KeyError, RecursionError) as exc:  # odd nested values
            return report, 0, f"cannot be checked ({type(exc).__name__}){_claimed(report)}"

    def _refuse_all(self, dir_fd: int, refused: list[tuple[Read, str]]) -> None:
        if not refused:
            return
        area_fd = self.area.open() if any(not r.leave for r, _ in refused) else None
        try:
            for read, reason in refused:
                if read.leave:
                    self._stuck.add(read.name)
                    log.warning("spool: %s left in place: %s", shown(read.name), reason)
                else:
                    self._refuse(dir_fd, area_fd, read, reason)
        finally:
            if area_fd is not None:
                os.close(area_fd)

    def _refuse(self, dir_fd: int, area_fd: int | None, read: Read, reason: str) -> None:
        name = shown(read.name)
        kept = None
        if area_fd is not None:
            try:
                kept = self.area.keep(area_fd, read.name, name, read.data, reason)
            except OSError as exc:
                log.warning("spool: cannot keep a copy of refused %s (%s)", name, exc.strerror)
        where = f"kept as {self.area.path}/{kept}" if kept else "deleted"
        log.warning("spool: refused report %s (%s): %s", name, where, reason)
        try:
            os.unlink(read.name, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        except IsADirectoryError:
            self._remove_dir(dir_fd, read.name)
        except OSError as exc:
            self._stuck.add(read.name)
            log.warning("spool: cannot remove refused %s (%s); skipped from now on", name,
                        exc.strerror)

    def _remove_dir(self, dir_fd: int, name: str) -> None:
        try:
            os.rmdir(name, dir_fd=dir_fd)
        except OSError as exc:
            self._stuck.add(name)
            log.warning("spool: cannot remove the directory %s (%s); skipped from now on",
                        shown(name), exc.strerror)


def ingest_spool(spool_dir: str | os.PathLike[str], engine: Engine, *,
                 limit: int = MAX_FILES_PER_ROUND, allow_unsigned: bool = False,
                 rejected_dir: str | os.PathLike[str] = "") -> int:
    """One ingest of `spool_dir` (see `SpoolIngest`); returns the reports committed.

    `allow_unsigned`: accept unsigned reports of jobs registered without a report key (the
    daemon's `allow_unsigned_reports`); a job with a key always needs a good signature."""
    return SpoolIngest(str(spool_dir), str(rejected_dir), allow_unsigned=allow_unsigned,
                       limit=limit).run(engine)
